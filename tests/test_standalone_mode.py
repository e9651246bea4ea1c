"""Standalone mode through the real reconcile path: config + owned file + notice files -> file."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import CapturingLogger, capture_logs

from autoscaler.adapters.standalone import OwnedDiscoveryActuator, StandaloneObserver
from autoscaler.config import parse_config
from autoscaler.config.discovery import StandaloneSettings
from autoscaler.core import Action, Decision, Notice, NoticeKind, PolicySet, Reason
from autoscaler.notices_and_prices import NoticeBoard
from autoscaler.reconcile import Reconciler

POLICIES = """
policies: [{name: e2e, scale_out: {min_idle: 0s, cooldown: 0s}, preemption: {join_grace: 0s}}]
default_policy: e2e
"""


def settings(tmp_path: Path, hosts: str, job: str, **extra: Any) -> StandaloneSettings:
    rest = "".join(f"\n  {k}: {v}" for k, v in extra.items())
    cfg = parse_config(f"""
standalone:
  hosts: {hosts}
  job: {job}
  discovery_file: {tmp_path / "hosts"}
  notice_dir: {tmp_path / "notices"}
  notice_poll: 0.05s{rest}
""")
    return cfg.standalone


def actuator_on_file(
    tmp_path: Path, hosts: str, job: str, listed: str
) -> tuple[Path, OwnedDiscoveryActuator]:
    """The owned discovery file, already listing LISTED, and an actuator that writes it."""
    s = settings(tmp_path, hosts, job)
    s.discovery_file.write_text(listed)
    return s.discovery_file, OwnedDiscoveryActuator(s)


class Standalone:
    """Observer + actuator + reconciler as the daemon wires them, ticked by hand."""

    def __init__(self, s: StandaloneSettings, policies: PolicySet, dry_run: bool = False) -> None:
        self.settings = s
        self.board = NoticeBoard()
        self.wakes: list[str] = []
        self.observer = StandaloneObserver(s, self.board, self.wakes.append)
        self.actuator = OwnedDiscoveryActuator(s, dry_run=dry_run)
        self.log = CapturingLogger()
        self.reconciler = Reconciler(self.observer, self.actuator, policies, self.log)

    def tick(self, now: datetime | None = None) -> list[Decision]:
        assert self.observer.notice_dir is not None
        self.observer.notice_dir.scan()
        return self.reconciler.tick(now or datetime.now(UTC))

    def hosts(self) -> list[str]:
        path = self.settings.discovery_file
        return path.read_text().split() if path.exists() else []

    def notice(self, host: str, text: str = "") -> None:
        assert self.settings.notice_dir is not None
        self.settings.notice_dir.mkdir(exist_ok=True)
        (self.settings.notice_dir / f"{host}.json").write_text(text)

    def withdraw(self, host: str) -> None:
        assert self.settings.notice_dir is not None
        (self.settings.notice_dir / f"{host}.json").unlink()


@pytest.fixture
def policies() -> PolicySet:
    return parse_config(POLICIES).policy_set


@pytest.fixture
def three(tmp_path: Path, policies: PolicySet) -> Iterator[Standalone]:
    s = settings(
        tmp_path,
        "[{name: localhost, price_per_hour: 1.0}, {name: 127.0.0.1, price_per_hour: 1.0},"
        " {name: vm, price_per_hour: 2.0}]",
        "{name: toy, min_workers: 1, max_workers: 3}",
        join_grace="0s",
    )
    mode = Standalone(s, policies)
    mode.observer.start()
    yield mode
    mode.observer.stop()


def test_a_job_and_hosts_are_required(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="standalone.job"):
        StandaloneObserver(StandaloneSettings(), NoticeBoard(), lambda _: None)
    with pytest.raises(ValueError, match="standalone.job"):
        OwnedDiscoveryActuator(StandaloneSettings())


def test_the_snapshot_reads_the_file_back(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        "[{name: a, slots: 4, capacity_type: on-demand, price_per_hour: 8}, {name: b, slots: 4}]",
        "{name: bert, namespace: ml, min_workers: 1, max_workers: 4, gpus_per_worker: 2}",
    )
    s.discovery_file.write_text("b:4\na:2\nstray:2\n")
    observer = StandaloneObserver(s, NoticeBoard(), lambda _: None)
    snap = observer.snapshot(datetime.now(UTC))
    nodes = {n.name: n for n in snap.nodes}
    assert (nodes["a"].gpus_requested, nodes["a"].idle_gpus, nodes["a"].price_per_hour) == (2, 2, 8)
    assert (nodes["b"].gpus_requested, nodes["b"].idle_gpus) == (4, 0)
    assert "stray" not in nodes  # not ours to place on, but its worker stays a worker
    (job,) = snap.jobs
    assert (job.key, job.backend, job.gpus_per_worker) == ("ml/bert", "standalone", 2.0)
    assert [(w.pod, w.host, w.index) for w in job.workers] == [
        ("b#0", "b", 0),
        ("b#1", "b", 1),
        ("a#0", "a", 2),
        ("stray#0", "stray", 3),
    ]
    assert job.drained_hosts == frozenset() and job.scaler is None and job.running
    assert job.last_scale_out_at is None  # a hand-made file records no joins: no cooldown


def test_notices_come_from_the_board_and_the_directory(tmp_path: Path) -> None:
    s = settings(tmp_path, "[{name: a}, {name: b}]", "{name: j, max_workers: 2}")
    board = NoticeBoard()
    now = datetime.now(UTC)
    board.post(Notice("a", NoticeKind.REBALANCE, "aws-sqs", "m-1", received_at=now))
    observer = StandaloneObserver(s, board, lambda _: None)
    observer.start()
    try:
        assert observer.synced()
        (tmp_path / "notices" / "b.json").write_text("")
        assert observer.notice_dir is not None
        observer.notice_dir.scan()
        assert {(n.node, n.source) for n in observer.snapshot(now).notices} == {
            ("a", "aws-sqs"),
            ("b", "notice-dir"),
        }
    finally:
        observer.stop()


def test_it_fills_the_file_then_a_notice_drains_its_host_and_a_withdrawal_brings_it_back(
    three: Standalone,
) -> None:
    out = three.tick()
    assert [d.action for d in out] == [Action.SCALE_OUT]
    assert sorted(three.hosts()) == ["127.0.0.1:1", "localhost:1", "vm:1"]

    three.notice("vm")
    out = three.tick()
    assert [(d.action, d.reason) for d in out] == [
        (Action.DRAIN, Reason.PREEMPTION_NOTICE),
        (Action.SCALE_IN, Reason.PREEMPTION_NOTICE),
    ]
    assert sorted(three.hosts()) == ["127.0.0.1:1", "localhost:1"]
    assert [d.action for d in three.tick()] == [Action.NOOP]  # level: nothing left to do

    three.withdraw("vm")
    out = three.tick()
    assert [(d.action, d.nodes) for d in out] == [(Action.SCALE_OUT, ("vm",))]
    assert three.hosts()[-1] == "vm:1"  # the newcomer goes last: older hosts keep low ranks


def test_every_noticed_host_but_one_leaves(three: Standalone) -> None:
    three.tick()
    for host, year in (("localhost", 2029), ("127.0.0.1", 2029), ("vm", 2030)):
        three.notice(host, f'{{"deadline": "{year}-01-01T00:00:00"}}')
    out = three.tick()
    assert Reason.LAST_HOST_KEPT in out[0].tags
    assert three.hosts() == ["vm:1"]  # the latest deadline stays


def test_the_file_guard_holds_without_the_core_keeping_a_host(tmp_path: Path) -> None:
    s = settings(tmp_path, "[{name: a}, {name: b}]", "{name: j, max_workers: 2}", join_grace="0s")
    reckless = parse_config(
        POLICIES.replace("join_grace: 0s}", "join_grace: 0s, keep_last_host: false}")
    ).policy_set
    mode = Standalone(s, reckless)
    mode.tick()
    mode.notice("a")
    mode.notice("b")
    with capture_logs() as logs:
        mode.tick()
    assert mode.hosts() == ["a:1"]  # never empty: Horovod would stop the job
    assert any(e["event"] == "discovery_last_host_kept" and e["host"] == "a" for e in logs)


def test_a_kept_host_leaves_only_once_its_replacement_settled(
    tmp_path: Path, policies: PolicySet
) -> None:
    s = settings(tmp_path, "[{name: a}, {name: b}]", "{name: j, max_workers: 2}", join_grace="30s")
    mode = Standalone(s, policies)
    t0 = datetime.now(UTC)
    mode.tick(t0)
    assert mode.hosts() == ["a:1", "b:1"]
    later = t0 + timedelta(seconds=60)
    mode.notice("b")
    mode.tick(later)
    assert mode.hosts() == ["a:1"]
    mode.withdraw("b")
    mode.notice("a")
    mode.tick(later)  # a is kept by the core (the only host), b is added
    assert mode.hosts() == ["a:1", "b:1"]
    out = mode.tick(later + timedelta(seconds=10))  # the core now drains a; b is still joining
    assert [d.action for d in out] == [Action.DRAIN, Action.SCALE_IN]
    assert mode.hosts() == ["a:1", "b:1"]
    mode.tick(later + timedelta(seconds=31))
    assert mode.hosts() == ["b:1"]


def test_with_horovods_assignment_reported_the_kept_host_leaves_once_the_replacement_synced(
    tmp_path: Path,
) -> None:
    # policy join_grace 30 s as shipped: only the report frees `a` before it
    ps = parse_config(POLICIES.replace("join_grace: 0s", "join_grace: 30s")).policy_set
    s = settings(tmp_path, "[{name: a}, {name: b}]", "{name: j, max_workers: 2}", join_grace="30s")
    mode = Standalone(s, ps)
    mode.notice("b")  # b is not up yet (as benchmarks/preemption.py marks a host that is not)

    def report(at: datetime, **since: datetime) -> None:
        lines = [f"scanned {int(at.timestamp())}"] + [
            f"{h} {int(t.timestamp())}" for h, t in since.items()
        ]
        s.assigned_file.write_text("\n".join(lines) + "\n")

    t0 = datetime.now(UTC).replace(microsecond=0)
    mode.tick(t0)
    assert mode.hosts() == ["a:1"]
    later = t0 + timedelta(minutes=5)
    mode.withdraw("b")
    mode.notice("a", f'{{"deadline": "{(later + timedelta(seconds=30)).isoformat()}"}}')
    report(later, a=t0)
    mode.tick(later)  # a is kept (the only host), b is added
    assert mode.hosts() == ["a:1", "b:1"]
    report(later + timedelta(seconds=3), a=t0, b=later + timedelta(seconds=3))
    mode.tick(later + timedelta(seconds=4))  # b assigned, still in its join's reset: a stays
    assert mode.hosts() == ["a:1", "b:1"]
    report(later + timedelta(seconds=18), a=t0, b=later + timedelta(seconds=3))
    mode.tick(later + timedelta(seconds=18))  # b assigned 15 s: a goes, 12 s before its deadline
    assert mode.hosts() == ["b:1"]


def test_multi_slot_hosts_hold_several_workers(tmp_path: Path, policies: PolicySet) -> None:
    s = settings(
        tmp_path,
        "[{name: a, slots: 4}, {name: b, slots: 4, price_per_hour: 9}]",
        "{name: j, min_workers: 1, max_workers: 3, gpus_per_worker: 2}",
        join_grace="0s",
    )
    mode = Standalone(s, policies)
    mode.tick()
    assert sorted(mode.hosts()) == ["a:4", "b:2"]
    mode.notice("b")
    mode.tick()
    assert mode.hosts() == ["a:4"]


def test_scale_in_takes_out_exactly_the_named_workers(tmp_path: Path) -> None:
    file, actuator = actuator_on_file(
        tmp_path,
        "[{name: a, slots: 4}, {name: b, slots: 2}]",
        "{name: j, max_workers: 3, gpus_per_worker: 2}",
        listed="a:4\nb:2\n",
    )
    now = datetime.now(UTC)
    actuator.apply(_decision(Action.SCALE_IN, pods=("a#1",)), now)
    assert file.read_text() == "a:2\nb:2\n"
    actuator.apply(_decision(Action.DRAIN, pods=("b#0",), hosts=("b",)), now)
    assert file.read_text() == "a:2\n"
    actuator.apply(_decision(Action.SCALE_IN, pods=("b#0",)), now)  # already gone: no-op
    actuator.apply(_decision(Action.UNDRAIN, hosts=("b",)), now)
    assert file.read_text() == "a:2\n"
    actuator.apply(_decision(Action.SCALE_OUT, count=2, nodes=("b", "a")), now)
    assert file.read_text() == "a:4\nb:2\n"


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    s = settings(tmp_path, "[{name: a}]", "{name: j, max_workers: 1}")
    decision = _decision(Action.SCALE_OUT, count=1, nodes=("a",))
    OwnedDiscoveryActuator(s, dry_run=True).apply(decision, datetime.now(UTC))
    assert not s.discovery_file.exists()


def test_decisions_for_another_job_are_refused(tmp_path: Path) -> None:
    s = settings(tmp_path, "[{name: a}]", "{name: j, max_workers: 1}")
    with pytest.raises(ValueError, match="standalone/j"):
        OwnedDiscoveryActuator(s).apply(_decision(Action.SCALE_OUT, job="x/y"), datetime.now(UTC))


def test_a_restarted_daemon_sees_the_same_world(three: Standalone, policies: PolicySet) -> None:
    three.tick()
    three.notice("vm")
    three.tick()
    now = datetime.now(UTC)
    again = StandaloneObserver(three.settings, NoticeBoard(), lambda _: None)
    again.start()
    try:
        assert again.snapshot(now).jobs == three.observer.snapshot(now).jobs
        assert {n.node for n in again.snapshot(now).notices} == {"vm"}
    finally:
        again.stop()


def _decision(action: Action, job: str = "standalone/j", **fields: Any) -> Decision:
    return Decision(
        job=job,
        action=action,
        reason=Reason.STEADY,
        policy="p",
        from_workers=0,
        to_workers=0,
        **fields,
    )


def test_a_scale_in_after_its_drain_removes_nothing_more(tmp_path: Path) -> None:
    # two workers on `a`; a#1 is drained (its slots leave at once), then its ScaleIn arrives: a#0,
    # the host kept for Horovod, must stay
    file, actuator = actuator_on_file(
        tmp_path,
        "[{name: a, slots: 4}, {name: b, slots: 4}]",
        "{name: j, max_workers: 4, gpus_per_worker: 2}",
        listed="a:4\nb:4\n",
    )
    now = datetime.now(UTC)
    actuator.apply(_decision(Action.DRAIN, pods=("a#1",), hosts=("a",)), now)
    assert file.read_text() == "a:2\nb:4\n"
    actuator.apply(_decision(Action.SCALE_IN, pods=("a#1",)), now)
    assert file.read_text() == "a:2\nb:4\n"
