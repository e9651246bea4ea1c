"""The daemon as a service over a simulated cluster: wake-ups, metrics, probes, config reload."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from structlog.testing import CapturingLogger
from support.waiting import wait_for
from test_daemon_support import CONFIG, Recorder, World, config, daemon, events, http_get, metric

from autoscaler.core import Action, Decision, Notice, NoticeKind, Snapshot
from autoscaler.daemon import loop
from autoscaler.daemon.loop import WakeSignal
from autoscaler.daemon.service import Daemon, Parts
from autoscaler.notices_and_prices import NoticeWake, notice_wake
from autoscaler.reconcile import Reconciler


@pytest.fixture
def running() -> Iterator[tuple[Daemon, World, Recorder]]:
    world = World()
    recorder = Recorder(world)
    wake = WakeSignal()
    d, _ = daemon(config(), Parts(observer=world, actuator=recorder), wake)
    d.start()
    try:
        wait_for(lambda: recorder.applied, what="the first pass to scale out")
        yield d, world, recorder
    finally:
        d.stop()


def test_a_wake_reconciles_at_once_and_notices_are_measured(
    running: tuple[Daemon, World, Recorder],
) -> None:
    d, world, recorder = running
    assert recorder.actions() == ["scale_out"]  # 4 workers onto idle GPUs, from the start-up pass
    passes = d.loop.passes
    world.notice("node-0")
    woke = time.monotonic()
    d.wake(NoticeWake("test: notice on node-0"))
    wait_for(
        lambda: "scale_in" in recorder.actions(),
        timeout=2,
        what="the scale-in answering the notice",
    )
    acted = next(t for dec, t in recorder.applied if dec.action.value == "scale_in")
    assert acted - woke < 1.0  # the tick interval is 30 s: only the wake can explain this
    scale_in = {"action": "scale_in", "reason": "preemption_notice"}

    def scraped() -> str:
        status, text = http_get(d.endpoints.port, "/metrics")  # type: ignore[union-attr]
        assert status == 200
        return text

    # the pass is counted, and its decisions too, once it has applied them all
    wait_for(
        lambda: (
            d.loop.passes > passes
            and metric(scraped(), "spot_autoscaler_decisions_total", **scale_in) is not None
        ),
        timeout=2,
        what="the woken pass to complete",
    )
    assert d.loop.passes == passes + 1
    text = scraped()
    assert (
        metric(text, "spot_autoscaler_decisions_total", action="scale_out", reason="below_min") == 1
    )
    assert (
        metric(text, "spot_autoscaler_decisions_total", action="drain", reason="preemption_notice")
        == 1
    )
    assert metric(text, "spot_autoscaler_decisions_total", **scale_in) == 1
    assert metric(text, "spot_autoscaler_notices_total", source="test", kind="interruption") == 1
    assert metric(text, "spot_autoscaler_reaction_latency_seconds_count") == 1
    assert metric(text, "spot_autoscaler_reaction_latency_seconds_bucket", le="1.0") == 1
    # as seen by the full pass, which follows the fast path's ScaleIn (this world applies it
    # at once): the two workers of node-0 are gone
    assert metric(text, "spot_autoscaler_workers", training_job="default/bert") == 2
    assert metric(text, "spot_autoscaler_reconcile_duration_seconds_count") == d.loop.passes
    # the fast path answered it: its steps were timed (the writes behind it are not a step)
    for step in ("wait", "look", "decide"):
        assert (metric(text, "spot_autoscaler_fast_path_step_seconds_count", step=step) or 0) >= 1
    assert metric(text, "spot_autoscaler_leader") == 1  # no lock in these parts: it acts alone
    assert metric(text, "spot_autoscaler_errors_total", component="actuator") is None


def test_a_burst_of_wakes_is_one_pass(running: tuple[Daemon, World, Recorder]) -> None:
    d, _, _ = running
    wait_for(lambda: d.loop.passes >= 1)
    before = d.loop.passes
    for i in range(50):
        d.wake(f"pod event {i}")
    wait_for(lambda: d.loop.passes > before, what="a pass after the burst")
    time.sleep(0.2)  # would-be extra passes have had ten coalescing windows to show up
    assert d.loop.passes - before <= 2


class Stuck:
    """An observer that blocks until released, like a hung API call; counts the calls."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.release = threading.Event()
        self.block = False
        self.calls = 0

    def snapshot(self, now: datetime) -> Snapshot:
        self.calls += 1
        if self.block:
            self.release.wait(10)
        return self.world.snapshot(now)


def test_probes_follow_cache_sync_and_loop_liveness() -> None:
    world = World()
    stuck = Stuck(world)
    synced = threading.Event()
    # ticks every 0.2 s; /healthz gives up after 0.5 s of silence
    cfg = config(
        tick_interval=timedelta(seconds=0.2),
        liveness_timeout=timedelta(seconds=0.5),
        error_backoff_max=timedelta(seconds=0.1),
    )
    d, _ = daemon(
        cfg, Parts(observer=stuck, actuator=Recorder(world), synced=synced.is_set), WakeSignal()
    )
    d.start()
    try:
        port = d.endpoints.port  # type: ignore[union-attr]
        assert http_get(port, "/readyz") == (503, "caches not synced\n")
        assert http_get(port, "/healthz")[0] == 200  # alive while it waits for the caches
        assert stuck.calls == 0  # and it decides nothing on a half-filled cache
        synced.set()
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, what="ready once synced")
        wait_for(lambda: stuck.calls > 0, what="a pass once synced")
        stuck.block = True
        stalled = wait_for(
            lambda: http_get(port, "/healthz")[0] == 503 and http_get(port, "/healthz"),
            what="healthz to fail while the loop hangs",
        )
        assert "reconcile loop silent" in stalled[1]
        stuck.block = False
        stuck.release.set()
        wait_for(lambda: http_get(port, "/healthz")[0] == 200, what="healthz to recover")
        assert http_get(port, "/nope")[0] == 404
    finally:
        stuck.release.set()
        d.stop()


def reload_successful(port: int) -> float | None:
    """The daemon's last-reload gauge, scraped from /metrics now."""
    return metric(http_get(port, "/metrics")[1], "spot_autoscaler_config_last_reload_successful")


def test_reload_applies_new_policies_and_keeps_the_old_on_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    world = World()
    told: list[tuple[str, str]] = []
    parts = Parts(
        observer=world,
        actuator=Recorder(world),
        announce=lambda reason, message: told.append((reason, message)),
    )
    d, log = daemon(config(), parts, WakeSignal(), config_path=path)
    d.start()
    try:
        port = d.endpoints.port  # type: ignore[union-attr]
        assert reload_successful(port) == 1
        path.write_text(CONFIG + "bogus_section: 1\npolicies: [\n")
        wait_for(lambda: "config_rejected" in events(log), what="the broken file to be rejected")
        rejected = next(c for c in log.calls if c.args and c.args[0] == "config_rejected")
        assert rejected.kwargs["problems"] and rejected.kwargs["kept"] == "the previous config"
        assert [p.name for p in d.reconciler.policies.policies] == ["default"]
        assert d.reconciler.policies.policies[0].scale_out.cooldown.total_seconds() == 0
        # the same broken file is reported once, not at every reload
        assert d.reloader is not None
        assert not d.reloader.check() and not d.reloader.check()
        assert events(log).count("config_rejected") == 1
        _, text = http_get(port, "/metrics")
        assert metric(text, "spot_autoscaler_errors_total", component="config") == 1
        assert metric(text, "spot_autoscaler_config_last_reload_successful") == 0
        # one Warning on the daemon's own Pod, naming the file and the first problem
        assert [reason for reason, _ in told] == ["ConfigRejected"]
        assert str(path) in told[0][1] and "previous config" in told[0][1]

        changed = CONFIG.replace("cooldown: 0s}\n", "cooldown: 7m}\n  - name: gold\n")
        path.write_text(changed)
        wait_for(lambda: len(d.reconciler.policies.policies) == 2, what="the new policies")
        assert d.reconciler.policies.policies[0].scale_out.cooldown.total_seconds() == 420
        assert "config_reloaded" in events(log)
        assert reload_successful(port) == 1

        path.write_text(changed + "kubernetes: {namespaces: [ml]}\n")
        wait_for(lambda: "config_change_needs_restart" in events(log), what="a restart-only change")
        needs = next(c for c in log.calls if c.args and c.args[0] == "config_change_needs_restart")
        assert needs.kwargs["sections"] == ["kubernetes"]
    finally:
        d.stop()


def test_a_failing_observer_backs_off_and_recovers_without_ticks() -> None:
    world = World()

    class Flaky:
        calls = 0

        def snapshot(self, now: datetime) -> Snapshot:
            Flaky.calls += 1
            if Flaky.calls <= 2:
                raise ConnectionError("apiserver unreachable")
            return world.snapshot(now)

    recorder = Recorder(world)
    d, log = daemon(
        config(error_backoff_max=timedelta(seconds=0.05)),
        Parts(observer=Flaky(), actuator=recorder),
        WakeSignal(),
    )
    d.start()
    try:  # the tick is 30 s: only the loop's own retries can get it to the scale-out
        wait_for(lambda: recorder.applied, what="a pass after two failures")
        text = http_get(d.endpoints.port, "/metrics")[1]  # type: ignore[union-attr]
    finally:
        d.stop()
    assert metric(text, "spot_autoscaler_errors_total", component="reconcile") == 2
    assert events(log).count("reconcile_failed") == 2 and events(log).count("backing_off") == 2


def test_a_notice_is_answered_in_a_back_off_other_wakes_wait() -> None:
    # API trouble backs the loop off (1 s, 2 s, 4 s ... up to a minute), but a notice arriving
    # meanwhile is answered now, by the responder beside the loop, not after the back-off.
    # Other wakes wait for it (a failed write behind a pass wakes the loop as it ends: a hot
    # loop of retries otherwise).
    class Down:
        calls = 0

        def snapshot(self, now: datetime) -> Snapshot:
            Down.calls += 1
            raise ConnectionError("apiserver unreachable")

    wake = WakeSignal()
    d, log = daemon(
        config(error_backoff_max=timedelta(seconds=60)),
        Parts(observer=Down(), actuator=Recorder(World())),
        wake,
    )
    d.start()
    try:
        wait_for(lambda: events(log).count("backing_off") == 2, what="the second back-off (2 s)")
        before = Down.calls
        wake("a pod changed")
        with pytest.raises(AssertionError):
            wait_for(lambda: Down.calls > before, timeout=1.0, what="a pass for a plain wake")
        wake(NoticeWake("notice"))
        # only the responder logs this: a pass would be a reconcile_failed
        wait_for(lambda: "react_failed" in events(log), what="the responder's try at the notice")
    finally:
        d.stop()


def test_a_notice_does_not_wait_for_the_pass_under_way() -> None:
    """The responder answers a notice beside the pass (daemon/responder.py): here the pass is
    stuck writing a ScaleOut (as one deciding at 2,000 nodes is busy for a second) and the
    notice's drain goes out meanwhile. Its ScaleIn waits for the job's write under way: one
    scaler at a time. Without the responder the drain waits for the pass."""
    world = World(nodes=5, gpus=1)
    held, holding = threading.Event(), threading.Event()

    class HeldGrowth(Recorder):
        def apply(self, decision: Decision, now: datetime) -> None:
            if decision.action is Action.SCALE_OUT and "scale_out" in self.actions():
                holding.set()
                if not held.wait(10):
                    raise TimeoutError("the test never let the ScaleOut go")
            super().apply(decision, now)

    recorder = HeldGrowth(world)
    d, log = daemon(config(), Parts(observer=world, actuator=recorder), WakeSignal())
    d.start()
    try:
        wait_for(lambda: recorder.actions() == ["scale_out"], what="the start-up ScaleOut")
        busy = sorted({w.node for w in world.snapshot(datetime.now(UTC)).jobs[0].workers})
        assert len(busy) == 4  # at max, one GPU each: one node left idle
        world.notice(busy[0], "n-1")
        d.wake(NoticeWake("test: notice 1"))
        wait_for(holding.is_set, what="the pass after it, growing onto the idle node, held")
        drains = recorder.actions().count("drain")
        world.notice(busy[1], "n-2")
        d.wake(NoticeWake("test: notice 2"))
        wait_for(
            lambda: recorder.actions().count("drain") > drains,
            timeout=3,
            what="the second notice's drain while the pass is held",
        )
        assert not held.is_set()
        held.set()
        wait_for(
            lambda: recorder.actions().count("scale_in") == 2,
            what="the second notice's ScaleIn after the ScaleOut's write ended",
        )
    finally:
        held.set()
        d.stop()


def test_reload_hands_new_prices_to_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    world = World()
    seen: list[float | None] = []
    parts = Parts(
        observer=world,
        actuator=Recorder(world),
        reconfigure=lambda new: seen.append(new.prices.for_node("p3.2xlarge", spot=False)),
    )
    d, log = daemon(config(), parts, WakeSignal(), config_path=path)
    d.start()
    try:
        path.write_text(CONFIG + "prices: {on_demand: {p3.2xlarge: 3.06}}\n")
        wait_for(lambda: seen == [3.06], what="the new prices")
        assert "config_change_needs_restart" not in events(log)
    finally:
        d.stop()


def test_a_full_pass_gives_way_to_a_notice_and_is_not_starved_by_a_stream_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A notice that arrives while a full pass is deciding is answered first (the pass stops
    before acting and runs again); a notice on every pass still lets one finish once it has given
    way for GIVE_WAY_FOR seconds, so growth is late, never lost."""
    monkeypatch.setattr(loop, "GIVE_WAY_FOR", 0.3)
    world = World(nodes=2, gpus=2)
    recorder = Recorder(world)
    wake = WakeSignal()
    snapshots = [0]

    class NoticeEveryPass:
        def snapshot(self, now: datetime) -> Snapshot:
            snapshots[0] += 1
            node = f"node-{snapshots[0]}"
            wake(notice_wake(Notice(node, NoticeKind.INTERRUPTION, "aws-sqs", node)))
            return world.snapshot(now)

    d, log = daemon(config(), Parts(observer=NoticeEveryPass(), actuator=recorder), wake)
    started = time.monotonic()
    d.start()
    try:
        wait_for(lambda: d.loop.passes >= 2, what="full passes despite a notice every pass")
    finally:
        d.stop()
    assert "scale_out" in recorder.actions()  # growth happened, late
    assert snapshots[0] > 2 * d.loop.passes  # passes gave way (and reacted) before finishing
    assert time.monotonic() - started >= 2 * 0.3  # each finished only once its time was up
    text = d.metrics.exposition().decode()  # a pass cut short is not timed as a pass
    assert metric(text, "spot_autoscaler_reconcile_duration_seconds_count") == d.loop.passes


def test_a_tick_that_gives_way_applies_nothing() -> None:
    world = World()
    recorder = Recorder(world)
    reconciler = Reconciler(world, recorder, config().policy_set, CapturingLogger())
    now = datetime.now(UTC)
    assert reconciler.tick(now, give_way=lambda: True) == [] and reconciler.gave_way
    assert recorder.applied == []
    assert reconciler.tick(now) and not reconciler.gave_way
    assert recorder.actions() == ["scale_out"]
