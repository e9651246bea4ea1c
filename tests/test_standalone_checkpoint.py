"""The checkpoint signal in standalone mode: `<discovery file>.notice`, written before the
discovery file loses a noticed host, read by the training side (autoscaler.notice)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import CapturingLogger, capture_logs

from autoscaler.adapters.standalone import OwnedDiscoveryActuator, StandaloneObserver
from autoscaler.adapters.standalone.signal import notice_path
from autoscaler.config import parse_config
from autoscaler.config.discovery import StandaloneSettings
from autoscaler.core import Action, Decision, Reason
from autoscaler.notice import STANDALONE_SUFFIX, Watch, decode
from autoscaler.notices_and_prices import NoticeBoard
from autoscaler.reconcile import Reconciler

POLICIES = """
policies: [{name: e2e, scale_out: {min_idle: 0s, cooldown: 0s}, preemption: {join_grace: 0s}}]
default_policy: e2e
"""
HOSTS = "[{name: a, price_per_hour: 1.0}, {name: b, price_per_hour: 1.0}, {name: c}]"
DEADLINE = "2031-05-01T12:00:30+00:00"


def settings(tmp_path: Path, hosts: str = HOSTS, max_workers: int = 3) -> StandaloneSettings:
    return parse_config(f"""
standalone:
  hosts: {hosts}
  job: {{name: toy, min_workers: 1, max_workers: {max_workers}}}
  discovery_file: {tmp_path / "hosts"}
  notice_dir: {tmp_path / "notices"}
  notice_poll: 0.05s
  join_grace: 0s
""").standalone


class Mode:
    """Observer + actuator + reconciler as the daemon wires them, ticked by hand; every write
    of the discovery file records what the notice file held at that moment."""

    def __init__(self, s: StandaloneSettings, dry_run: bool = False) -> None:
        self.settings = s
        self.observer = StandaloneObserver(s, NoticeBoard(), lambda _: None)
        self.actuator = OwnedDiscoveryActuator(s, dry_run=dry_run)
        self.reconciler = Reconciler(
            self.observer, self.actuator, parse_config(POLICIES).policy_set, CapturingLogger()
        )
        self.notice_file = notice_path(s.discovery_file)
        # (hosts written to discovery, the notice file's hosts at that moment)
        self.writes: list[tuple[list[str], list[str] | None]] = []
        real_write = self.actuator.file.write

        def spying_write(proposed: Any, now: datetime) -> Any:
            self.writes.append(([h.host for h in proposed], self.noticed()))
            return real_write(proposed, now)

        self.actuator.file.write = spying_write  # type: ignore[method-assign]

    def tick(self, now: datetime | None = None) -> list[Decision]:
        assert self.observer.notice_dir is not None
        self.observer.notice_dir.scan()
        return self.reconciler.tick(now or datetime.now(UTC))

    def hosts(self) -> list[str]:
        path = self.settings.discovery_file
        return [line.split(":")[0] for line in path.read_text().split()] if path.exists() else []

    def noticed(self) -> list[str] | None:
        """The notice file's hosts; None without the file."""
        try:
            return list(decode(self.notice_file.read_text()).hosts)
        except FileNotFoundError:
            return None

    def notice(self, host: str, deadline: str | None = None) -> None:
        assert self.settings.notice_dir is not None
        self.settings.notice_dir.mkdir(exist_ok=True)
        body = json.dumps({"kind": "interruption", "deadline": deadline}) if deadline else ""
        (self.settings.notice_dir / f"{host}.json").write_text(body)

    def withdraw(self, host: str) -> None:
        assert self.settings.notice_dir is not None
        (self.settings.notice_dir / f"{host}.json").unlink()


@pytest.fixture
def mode(tmp_path: Path) -> Iterator[Mode]:
    m = Mode(settings(tmp_path))
    m.observer.start()
    yield m
    m.observer.stop()


def test_the_file_sits_beside_the_discovery_file(tmp_path: Path) -> None:
    assert notice_path(tmp_path / "hosts") == tmp_path / f"hosts{STANDALONE_SUFFIX}"


def test_a_notice_names_its_host_before_discovery_loses_it(mode: Mode) -> None:
    mode.tick()
    assert mode.hosts() == ["a", "b", "c"] and mode.noticed() is None

    mode.notice("b", DEADLINE)
    out = mode.tick()
    assert [(d.action, d.reason) for d in out][:1] == [(Action.DRAIN, Reason.PREEMPTION_NOTICE)]
    assert mode.hosts() == ["a", "c"]
    # the write that took b out of discovery found b in the notice file already
    assert (["a", "c"], ["b"]) in mode.writes
    assert mode.writes[-1][1] == ["b"]
    sent = decode(mode.notice_file.read_text())
    assert sent.deadline == datetime.fromisoformat(DEADLINE)
    assert (sent.reason, sent.job) == ("preemption_notice", "standalone/toy")
    assert sent.issued is not None
    assert mode.notice_file.stat().st_mode & 0o777 == 0o644  # other users' launchers read it

    mode.tick()  # the notice stands: the file stays, unchanged
    assert mode.noticed() == ["b"] and decode(mode.notice_file.read_text()) == sent


def test_withdrawing_the_notice_removes_the_file_before_the_host_returns(mode: Mode) -> None:
    mode.tick()
    mode.notice("b")
    mode.tick()
    assert mode.noticed() == ["b"]
    mode.withdraw("b")
    mode.tick()
    assert mode.hosts() == ["a", "c", "b"]
    # the scale-out that put b back found no notice naming it
    assert mode.writes[-1] == (["a", "c", "b"], None)
    mode.tick()
    assert mode.noticed() is None


def test_a_second_notice_adds_its_host_and_the_earliest_deadline_counts(mode: Mode) -> None:
    mode.tick()
    mode.notice("c", "2031-05-01T12:02:00+00:00")
    mode.tick()
    mode.notice("b", DEADLINE)
    mode.tick()
    assert mode.hosts() == ["a"]
    sent = decode(mode.notice_file.read_text())
    assert sent.hosts == ("b", "c")
    assert sent.deadline == datetime.fromisoformat(DEADLINE)
    mode.withdraw("c")  # b's notice still stands: both stay (c is not in discovery anyway)
    mode.tick()
    assert mode.hosts() == ["a", "c"]  # c back: out of the notice first
    assert mode.noticed() == ["b"]
    mode.withdraw("b")
    mode.tick()
    mode.tick()
    assert mode.noticed() is None and mode.hosts() == ["a", "c", "b"]


def test_a_notice_without_a_deadline_says_none(mode: Mode) -> None:
    mode.tick()
    mode.notice("a")
    mode.tick()
    sent = decode(mode.notice_file.read_text())
    assert (sent.hosts, sent.deadline) == (("a",), None)


@pytest.mark.skipif(
    "deadline" not in {f.name for f in dataclasses.fields(Decision)},
    reason="Decision has no deadline field yet",
)
def test_the_decisions_deadline_wins(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.discovery_file.write_text("a:1\nb:1\n")
    actuator = OwnedDiscoveryActuator(s)
    at = datetime(2031, 1, 1, tzinfo=UTC)
    decision = drain(("b#0",), ("b",), deadline=at)
    actuator.apply(decision, datetime.now(UTC))
    assert decode(notice_path(s.discovery_file).read_text()).deadline == at


def test_without_the_decisions_deadline_the_hosts_notice_gives_it(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.discovery_file.write_text("a:1\nb:1\n")
    assert s.notice_dir is not None
    s.notice_dir.mkdir()
    (s.notice_dir / "b.json").write_text(json.dumps({"deadline": DEADLINE}))
    OwnedDiscoveryActuator(s).apply(drain(("b#0",), ("b",)), datetime.now(UTC))
    assert decode(notice_path(s.discovery_file).read_text()).deadline == datetime.fromisoformat(
        DEADLINE
    )


def test_the_training_side_reads_it_for_its_own_host(mode: Mode) -> None:
    mode.tick()
    on_b, on_a = Watch(mode.notice_file, host="b"), Watch(mode.notice_file, host="a")
    assert on_b.pending() is None
    mode.notice("b", DEADLINE)
    mode.tick()
    seen = on_b.pending()
    assert seen is not None and seen.hosts == ("b",)
    assert on_a.pending() is None and on_a.pending(for_any=True) == seen
    mode.withdraw("b")
    mode.tick()
    assert on_b.pending() is None


def test_departures_without_a_notice_write_none(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.discovery_file.write_text("a:1\nb:1\n")
    actuator = OwnedDiscoveryActuator(s)
    actuator.apply(drain(("b#0",), ("b",), reason=Reason.CLAMP_MAX), datetime.now(UTC))
    assert s.discovery_file.read_text() == "a:1\n"
    assert not notice_path(s.discovery_file).exists()


def test_a_host_the_guard_keeps_is_not_named(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.discovery_file.write_text("a:1\nb:1\n")
    actuator = OwnedDiscoveryActuator(s)
    actuator.apply(drain(("a#0", "b#0"), ("a", "b")), datetime.now(UTC))
    assert s.discovery_file.read_text() == "a:1\n"  # never empty
    assert decode(notice_path(s.discovery_file).read_text()).hosts == ("b",)


def test_a_dry_run_writes_no_notice(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.discovery_file.write_text("a:1\nb:1\n")
    with capture_logs() as logs:
        OwnedDiscoveryActuator(s, dry_run=True).apply(drain(("b#0",), ("b",)), datetime.now(UTC))
    assert not notice_path(s.discovery_file).exists()
    assert any(e["event"] == "checkpoint_notice_dry_run" and e["hosts"] == ["b"] for e in logs)


def test_a_restarted_daemon_keeps_the_file_until_the_notice_goes(mode: Mode) -> None:
    mode.tick()
    mode.notice("b")
    mode.tick()
    again = Mode(mode.settings)  # a new daemon: reads the file back
    assert again.actuator.notice.hosts == ("b",)
    again.tick()
    assert again.noticed() == ["b"]
    mode.withdraw("b")
    again.tick()
    again.tick()
    assert again.noticed() is None and again.hosts() == ["a", "c", "b"]


@pytest.mark.parametrize("garbage", ["{not json", '{"hosts": 5}', "\n"])
def test_a_garbled_file_at_start_is_replaced_at_the_next_notice(
    tmp_path: Path, garbage: str
) -> None:
    s = settings(tmp_path)
    s.discovery_file.write_text("a:1\nb:1\n")
    notice_path(s.discovery_file).write_text(garbage)
    actuator = OwnedDiscoveryActuator(s)
    assert actuator.notice.hosts == ()
    actuator.apply(drain(("b#0",), ("b",)), datetime.now(UTC))
    assert decode(notice_path(s.discovery_file).read_text()).hosts == ("b",)


def test_the_signal_is_timely_on_the_fast_path(mode: Mode) -> None:
    """react(): the fast path's drain writes the notice file too (a full pass follows)."""
    mode.tick()
    t0 = datetime.now(UTC)
    mode.notice("c", (t0 + timedelta(seconds=30)).isoformat())
    assert mode.observer.notice_dir is not None
    mode.observer.notice_dir.scan()
    mode.reconciler.react(t0)
    assert mode.noticed() == ["c"] and mode.hosts() == ["a", "b"]


def drain(
    pods: tuple[str, ...],
    hosts: tuple[str, ...],
    reason: Reason = Reason.PREEMPTION_NOTICE,
    **extra: Any,
) -> Decision:
    return Decision(
        job="standalone/toy",
        action=Action.DRAIN,
        reason=reason,
        policy="p",
        from_workers=2,
        to_workers=2 - len(pods),
        count=len(pods),
        pods=pods,
        hosts=hosts,
        nodes=hosts,
        **extra,
    )
