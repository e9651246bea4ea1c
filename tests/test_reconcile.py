"""The reconciler: decisions logged in order, drains applied first, failures isolated."""

from __future__ import annotations

import io
import json
import threading
import time
from dataclasses import replace
from datetime import datetime

from core_fixtures import NOW, job, node, notice, policies, snapshot
from support.waiting import wait_for

from autoscaler.core import Action, Decision, PolicySet, Snapshot, decide
from autoscaler.daemon.leader import AlwaysLeader
from autoscaler.daemon.loop import REST_PER_PASS, ReconcileLoop, WakeSignal
from autoscaler.daemon.metrics import Metrics
from autoscaler.fencing import Stale
from autoscaler.logs import file_logger
from autoscaler.reconcile import Reconciler


class FixedWorld:
    """An observer of one fixed snapshot and an actuator that records (and may refuse) actions."""

    dry_run = False

    def __init__(self, snap: Snapshot, refuse: str = "") -> None:
        self.snap, self.refuse, self.applied = snap, refuse, []

    def snapshot(self, now: datetime) -> Snapshot:
        return self.snap

    def apply(self, decision: Decision, now: datetime) -> None:
        if decision.job == self.refuse:
            raise ConnectionError("api down")
        self.applied.append((decision.job, decision.action))


def two_preempted_jobs() -> Snapshot:
    jobs = [job("a", placement=["n1", "n2"]), job("b", placement=["n1", "n2"])]
    return snapshot([node("n1"), node("n2")], jobs, [notice("n1")])


def test_every_drain_goes_before_any_scale_in() -> None:
    world = FixedWorld(two_preempted_jobs())
    Reconciler(world, world, PolicySet(), file_logger(io.StringIO())).tick(NOW)
    assert world.applied == [
        ("ml/a", Action.DRAIN),
        ("ml/b", Action.DRAIN),
        ("ml/a", Action.SCALE_IN),
        ("ml/b", Action.SCALE_IN),
    ]


class MeetingWorld(FixedWorld):
    """Each write waits until the other job's write of the same action is under way too: only
    writes that go out at once get through (a sequential pass breaks the barrier)."""

    def __init__(self, snap: Snapshot) -> None:
        super().__init__(snap)
        self.lock = threading.Lock()
        self.barriers = {a: threading.Barrier(2, timeout=5) for a in Action}

    def apply(self, decision: Decision, now: datetime) -> None:
        self.barriers[decision.action].wait()
        with self.lock:
            self.applied.append((decision.job, decision.action))


def test_departures_of_different_jobs_go_out_at_once_drains_first() -> None:
    world = MeetingWorld(two_preempted_jobs())
    reconciler = Reconciler(world, world, PolicySet(), file_logger(io.StringIO()), write_workers=2)
    reconciler.tick(NOW)
    assert reconciler.errors == 0
    assert [a for _, a in world.applied] == [Action.DRAIN] * 2 + [Action.SCALE_IN] * 2
    assert sorted(world.applied) == sorted(
        (j, a) for j in ("ml/a", "ml/b") for a in (Action.DRAIN, Action.SCALE_IN)
    )


def test_one_jobs_failure_does_not_stop_the_others() -> None:
    world = FixedWorld(two_preempted_jobs(), refuse="ml/a")
    out = io.StringIO()
    reconciler = Reconciler(world, world, PolicySet(), file_logger(out))
    reconciler.tick(NOW)
    assert world.applied == [("ml/b", Action.DRAIN), ("ml/b", Action.SCALE_IN)]
    assert reconciler.errors == 2 and out.getvalue().count('"actuation_failed"') == 2


def test_a_notice_waiting_after_deciding_stops_growth_not_departures() -> None:
    """A pass writes the departures it decided, then gives way before a scale-out (which is
    neither applied nor logged); the next pass grows."""
    jobs = [job("a", placement=["n1", "n2"]), job("b", placement=["n2"])]
    world = FixedWorld(snapshot([node("n1"), node("n2", used=3)], jobs, [notice("n1")]))
    out = io.StringIO()
    grow_now = policies(scale_out={"min_idle": "0s"})
    reconciler = Reconciler(world, world, grow_now, file_logger(out))
    asked = iter([False, False])  # before deciding, before acting; then a notice waits
    assert reconciler.tick(NOW, give_way=lambda: next(asked, True)) == []
    assert reconciler.gave_way
    assert world.applied == [("ml/a", Action.DRAIN), ("ml/a", Action.SCALE_IN)]
    assert '"scale_out"' not in out.getvalue()
    reconciler.tick(NOW)
    assert ("ml/b", Action.SCALE_OUT) in world.applied and '"scale_out"' in out.getvalue()


def two_growing_jobs() -> tuple[Snapshot, PolicySet]:
    jobs = [job("a", placement=["n1"]), job("b", placement=["n2"])]
    return snapshot([node("n1", used=1), node("n2", used=1)], jobs), policies(
        scale_out={"min_idle": "0s"}
    )


def test_growth_of_different_jobs_goes_out_at_once() -> None:
    """Not only departures: a full pass's other writes (scale-outs, undrains) of different jobs
    go out a batch at a time, so hundreds of them do not hold a waiting notice for long."""
    snap, grow_now = two_growing_jobs()
    world = MeetingWorld(snap)
    reconciler = Reconciler(world, world, grow_now, file_logger(io.StringIO()), write_workers=2)
    reconciler.tick(NOW)
    reconciler.finish(5)  # growth goes out behind the pass
    assert reconciler.errors == 0
    assert sorted(world.applied) == [("ml/a", Action.SCALE_OUT), ("ml/b", Action.SCALE_OUT)]


def test_a_notice_waiting_stops_growth_between_batches() -> None:
    """With one writer a batch is one write: a notice that comes after the first scale-out
    stops the second (not applied, not logged) until the next pass."""
    snap, grow_now = two_growing_jobs()
    world = FixedWorld(snap)
    out = io.StringIO()
    reconciler = Reconciler(world, world, grow_now, file_logger(out))
    asked = iter([False, False, False])  # before deciding, before acting, before the 1st write
    reconciler.tick(NOW, give_way=lambda: next(asked, True))
    assert reconciler.gave_way and world.applied == [("ml/a", Action.SCALE_OUT)]
    assert out.getvalue().count('"scale_out"') == 1


def test_a_pass_that_may_not_give_way_still_stops_growth_after_one_batch() -> None:
    """Notices have held the pass back long enough (`give_way` says no more): it decides and
    grows, but a notice waiting after its first batch stops the second; growth goes on a batch
    a pass, and no notice waits for all of it."""
    snap, grow_now = two_growing_jobs()
    world = FixedWorld(snap)
    reconciler = Reconciler(world, world, grow_now, file_logger(io.StringIO()))
    reconciler.tick(NOW, give_way=lambda: False, notice_waits=lambda: True)
    assert reconciler.gave_way and world.applied == [("ml/a", Action.SCALE_OUT)]
    reconciler.tick(NOW, give_way=lambda: False)  # no notice waits: the pass runs to the end
    assert not reconciler.gave_way and ("ml/b", Action.SCALE_OUT) in world.applied


class GatedWorld(FixedWorld):
    """Decisions of one action (ScaleIns unless told) wait at a gate until the test opens it."""

    def __init__(self, snap: Snapshot, refuse: str = "", gated: Action = Action.SCALE_IN) -> None:
        super().__init__(snap, refuse)
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.gated = gated

    def apply(self, decision: Decision, now: datetime) -> None:
        if decision.action is self.gated and not self.gate.wait(5):
            raise TimeoutError("the gate stayed shut")
        with self.lock:
            super().apply(decision, now)


def test_a_drain_the_other_writer_is_still_writing_is_dropped() -> None:
    """The responder and a pass decide the same drains (the pass's view is from before they
    landed): the second writer's are dropped while the first's go out, not written twice."""
    world = GatedWorld(two_preempted_jobs(), gated=Action.DRAIN)
    logs = io.StringIO()
    reconciler = Reconciler(world, world, PolicySet(), file_logger(logs), write_workers=2)
    drains = [d for d in decide(world.snap, PolicySet(), NOW) if d.action is Action.DRAIN]
    first = threading.Thread(target=reconciler.writes.act, args=(drains, NOW))
    first.start()
    wait_for(lambda: logs.getvalue().count('"drain"') == 2, 5, "the first writer's drains")
    reconciler.writes.act(drains, NOW)  # the second writer's: returns at once
    assert logs.getvalue().count("the same drain is under way") == 2
    world.gate.set()
    first.join(5)
    assert sorted(j for j, a in world.applied if a is Action.DRAIN) == ["ml/a", "ml/b"]


def test_the_fast_path_writes_scale_ins_behind_its_drains() -> None:
    """While a job's ScaleIn is still going out, a pass applies nothing of that job but drains
    (no second scaler); its end wakes the loop."""
    world = GatedWorld(two_preempted_jobs(), refuse="ml/b")
    written = threading.Event()
    reconciler = Reconciler(
        world,
        world,
        PolicySet(),
        file_logger(io.StringIO()),
        write_workers=2,
        on_written=written.set,
    )
    urgent = reconciler.react(NOW)
    assert {(d.job, d.action) for d in urgent} == {
        (j, a) for j in ("ml/a", "ml/b") for a in (Action.DRAIN, Action.SCALE_IN)
    }
    wait_for(lambda: world.applied == [("ml/a", Action.DRAIN)], 5, "ml/a's drain (ml/b's refused)")
    assert reconciler.tick(NOW) == [d for d in reconciler.tick(NOW) if d.action is Action.DRAIN]
    assert ("ml/a", Action.SCALE_IN) not in world.applied
    world.gate.set()
    reconciler.finish(5)
    assert written.is_set() and world.applied.count(("ml/a", Action.SCALE_IN)) == 1
    errors = reconciler.errors
    assert errors >= 2  # ml/b's refused drain and its refused ScaleIn, behind
    reconciler.tick(NOW)  # nothing is being written: the pass decides and applies them again
    assert world.applied.count(("ml/a", Action.SCALE_IN)) == 2


def test_the_fast_path_returns_before_its_drains_land_and_each_scale_in_follows_its_drain() -> None:
    """The responder takes the next notice while a react's writes go out (in a burst of notices
    0.1 s apart each waited for the drain PATCH before it); a job's ScaleIn still goes only
    after its own drain has ended, and settling waits for the drains too."""
    world = GatedWorld(two_preempted_jobs(), gated=Action.DRAIN)
    reconciler = Reconciler(world, world, PolicySet(), file_logger(io.StringIO()), write_workers=4)
    urgent = reconciler.react(NOW)  # returns with both drains held at the gate
    assert len(urgent) == 4 and world.applied == []
    reconciler.settle(lambda: False, 0.3)  # waits for the drains, which do not end
    assert world.applied == []
    world.gate.set()
    reconciler.settle(lambda: False, 5)
    order = [(j, a) for j, a in world.applied]
    for name in ("ml/a", "ml/b"):
        assert order.index((name, Action.DRAIN)) < order.index((name, Action.SCALE_IN))
    assert reconciler.errors == 0


class FocusedWorld(FixedWorld):
    """Sees the noticed jobs alone on the fast path, and says which snapshots were asked for."""

    def __init__(self, snap: Snapshot) -> None:
        super().__init__(snap)
        self.asked: list[str] = []

    def snapshot(self, now: datetime) -> Snapshot:
        self.asked.append("whole")
        return self.snap

    def noticed(self, now: datetime) -> Snapshot:
        self.asked.append("noticed")
        noticed = {n.node for n in self.snap.notices}
        jobs = tuple(j for j in self.snap.jobs if any(w.node in noticed for w in j.workers))
        return replace(self.snap, jobs=jobs)


def test_the_fast_path_reads_the_noticed_jobs_only_and_decides_as_the_pass_would() -> None:
    jobs = [job("a", placement=["n1", "n2"]), job("b", placement=["n2", "n3"])]
    world = FocusedWorld(snapshot([node("n1"), node("n2"), node("n3")], jobs, [notice("n1")]))
    reconciler = Reconciler(world, world, PolicySet(), file_logger(io.StringIO()))
    urgent = reconciler.react(NOW)
    assert world.asked == ["noticed"]
    whole = FixedWorld(world.snap)
    passed = Reconciler(whole, whole, PolicySet(), file_logger(io.StringIO())).tick(NOW)
    assert urgent and urgent == [d for d in passed if d.action in (Action.DRAIN, Action.SCALE_IN)]


def test_settle_waits_for_the_writes_behind_until_a_notice_comes() -> None:
    world = GatedWorld(two_preempted_jobs())
    reconciler = Reconciler(world, world, PolicySet(), file_logger(io.StringIO()), write_workers=2)
    reconciler.react(NOW)
    asked = threading.Event()

    def notice_waits() -> bool:
        asked.set()
        return True

    reconciler.settle(notice_waits, 5)  # returns at once: the notice is answered first
    assert asked.is_set() and not any(a is Action.SCALE_IN for _, a in world.applied)
    threading.Timer(0.2, world.gate.set).start()
    reconciler.settle(lambda: False, 5)  # until both ScaleIns are written
    assert sorted(j for j, a in world.applied if a is Action.SCALE_IN) == ["ml/a", "ml/b"]


def test_a_pass_hands_its_growth_off_and_a_notice_does_not_wait_for_it() -> None:
    """A pass does not wait for its ScaleOuts (two round trips each; tens of them held every
    notice that came meanwhile): the job is held while its ScaleOut is written (no second
    scaler), another job's notice is answered at once (its ScaleIn not queued behind growth),
    settling after a notice does not wait for growth, and finish does."""
    jobs = [job("a", placement=["n1"]), job("b", hi=2, placement=["n2", "n3"])]  # b at its max
    nodes = [node("n1", used=1), node("n2"), node("n3")]
    world = GatedWorld(snapshot(nodes, jobs), gated=Action.SCALE_OUT)
    written = threading.Event()
    grow_now = policies(scale_out={"min_idle": "0s"})
    reconciler = Reconciler(
        world, world, grow_now, file_logger(io.StringIO()), write_workers=2, on_written=written.set
    )
    decided = reconciler.tick(NOW)
    assert [d.job for d in decided if d.action is not Action.NOOP] == ["ml/a"]
    assert world.applied == [] and not reconciler.gave_way  # handed off, not waited for
    assert all(d.job != "ml/a" for d in reconciler.tick(NOW))  # held: no second scaler

    world.snap = replace(world.snap, notices=(notice("n2"),))
    urgent = reconciler.react(NOW)
    assert {(d.job, d.action) for d in urgent} == {
        ("ml/b", Action.DRAIN),
        ("ml/b", Action.SCALE_IN),
    }
    reconciler.settle(lambda: False, 5)  # the ScaleIn, not the gated growth
    assert sorted(world.applied) == [("ml/b", Action.DRAIN), ("ml/b", Action.SCALE_IN)]

    world.gate.set()
    reconciler.finish(5)
    assert world.applied.count(("ml/a", Action.SCALE_OUT)) == 1 and reconciler.errors == 0


def test_finishing_drops_the_writes_not_begun_in_one_line_and_lets_those_under_way_end() -> None:
    """At shutdown the Lease goes after `finish`: a ScaleOut begun after it would be refused
    NotLeader with an error line each (181 at one stop of a 5,000-node run). Those not begun
    when its time runs out are dropped and counted once; those under way end."""
    names = ("a", "b", "c")
    jobs = [job(n, placement=[f"n-{n}"]) for n in names]
    world = GatedWorld(
        snapshot([node(f"n-{n}", used=1) for n in names], jobs), gated=Action.SCALE_OUT
    )
    logs = io.StringIO()
    grow_now = policies(scale_out={"min_idle": "0s"})
    reconciler = Reconciler(world, world, grow_now, file_logger(logs), write_workers=2)
    reconciler.tick(NOW)  # three ScaleOuts handed off: two begin (two threads), one waits
    wait_for(lambda: logs.getvalue().count('"scale_out"') == 2, 5, "two ScaleOuts begun")
    reconciler.finish(0.1)
    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    assert [d["writes"] for d in lines if d["event"] == "writes_dropped"] == [1]
    world.gate.set()
    reconciler.finish(5)
    assert [action for _, action in world.applied] == [Action.SCALE_OUT] * 2  # the two begun
    assert reconciler.errors == 0 and '"actuation_failed"' not in logs.getvalue()


def test_a_pass_drops_what_it_decided_for_a_job_the_notice_path_wrote_since_its_snapshot() -> None:
    """The responder answers a notice beside a pass (daemon/responder.py). A pass that looked
    before it decided a ScaleOut for the job; written after the notice's ScaleIn, that scaler
    would be a second one, sized on workers the job no longer has: dropped, and logged. The
    pass's own drain and ScaleIn of one job are one writer's: both go
    (test_every_drain_goes_before_any_scale_in)."""
    jobs = [job("a", placement=["n1", "n2"])]
    world = FixedWorld(snapshot([node("n1", used=1), node("n2", used=1), node("n3")], jobs))
    out = io.StringIO()
    reconciler = Reconciler(world, world, policies(scale_out={"min_idle": "0s"}), file_logger(out))
    answered: list[Decision] = []

    def notice_meanwhile() -> bool:  # asked by the pass after its snapshot: the responder acts
        if not answered:
            world.snap = replace(world.snap, notices=(notice("n1"),))
            answered.extend(reconciler.react(NOW))
        return False

    decided = reconciler.tick(NOW, give_way=notice_meanwhile)
    assert ("ml/a", Action.SCALE_OUT) in {(d.job, d.action) for d in decided}
    assert {(d.job, d.action) for d in answered} == {
        ("ml/a", Action.DRAIN),
        ("ml/a", Action.SCALE_IN),
    }
    assert world.applied == [("ml/a", Action.DRAIN), ("ml/a", Action.SCALE_IN)]
    assert "decision_dropped" in out.getvalue()
    reconciler.tick(NOW)  # a pass that looked after the notice's writes acts again
    assert world.applied[-2:] == [("ml/a", Action.DRAIN), ("ml/a", Action.SCALE_IN)]


class ExpiringWorld(FixedWorld):
    """Every ScaleIn's server check expires before its create could land (a slow server)."""

    def apply(self, decision: Decision, now: datetime) -> None:
        if decision.action is Action.SCALE_IN:
            raise Stale("create scaleins not sent: the ScaleIn's victims was checked too long ago")
        super().apply(decision, now)


def test_a_departure_whose_check_expired_is_tried_again_after_its_own_back_off() -> None:
    """A ScaleIn that could not land while its check held is no failure (a failure grows the
    loop's back-off, which held a notice's ScaleIn for 67 s on a busy control plane). It is
    logged, held back for a back-off of its job's own (doubling: retried at once, hundreds of
    them kept a busy server too slow for any), and then asked for (`on_expired`) with the job
    free, on the pass's path and behind the responder's drains alike."""
    world = ExpiringWorld(two_preempted_jobs())
    logs = io.StringIO()
    scale_ins = [d for d in decide(world.snap, PolicySet(), NOW) if d.action is Action.SCALE_IN]
    asked: list[tuple[float, int]] = []  # per ask: when, and the ScaleIns a react could write
    reconciler = Reconciler(
        world,
        world,
        PolicySet(),
        file_logger(logs),
        write_workers=2,
        on_expired=lambda: asked.append(
            (time.monotonic(), len(reconciler.writes.not_writing(scale_ins)))
        ),
    )
    began = time.monotonic()
    reconciler.tick(NOW)
    assert logs.getvalue().count('"actuation_expired"') == 2 and asked == []  # not at once
    reconciler.tick(NOW)  # within the back-off: the drains go, the ScaleIns wait
    assert logs.getvalue().count("its last server check expired") == 2
    assert logs.getvalue().count('"actuation_expired"') == 2
    wait_for(lambda: len(asked) == 2, 5, "an ask per expired ScaleIn after its back-off")
    assert all(t - began >= 0.5 and free == 2 for t, free in asked)
    again = time.monotonic()
    reconciler.react(NOW)  # behind its drains; expired again: twice the wait
    wait_for(lambda: len(asked) == 4, 5, "an ask per ScaleIn behind")
    assert all(t - again >= 1.0 for t, _ in asked[2:]) and asked[-1][1] == 2
    assert reconciler.errors == 0 and '"actuation_failed"' not in logs.getvalue()


def loop_over(world: FixedWorld, wake: WakeSignal) -> ReconcileLoop:
    """The daemon's loop over `world`, acting alone, no coalescing of wakes."""
    reconciler = Reconciler(world, world, PolicySet(), file_logger(io.StringIO()))
    logger = file_logger(io.StringIO())
    return ReconcileLoop(
        reconciler, wake, AlwaysLeader(), lambda: True, Metrics(), logger, 0.0, 1.0
    )


class BusyWorld(FixedWorld):
    """A snapshot that spins `seconds` of its thread's CPU (a pass's work at scale); says when
    each began and ended, and the CPU it took."""

    def __init__(self, snap: Snapshot, seconds: float) -> None:
        super().__init__(snap)
        self.seconds = seconds
        self.looks: list[tuple[float, float, float]] = []

    def snapshot(self, now: datetime) -> Snapshot:
        began, cpu = time.monotonic(), time.thread_time()
        while time.thread_time() - cpu < self.seconds:
            pass
        self.looks.append((began, time.monotonic(), time.thread_time() - cpu))
        return self.snap


def test_passes_woken_back_to_back_rest_twice_their_cpu_between_them() -> None:
    """Churn wakes the loop without pause: a pass that took d seconds of CPU is followed by
    REST_PER_PASS * d without one, so the passes' CPU is at most a third of the time (the API
    server's cores are wanted for the notices' writes); the wakes meanwhile become the next
    pass."""
    world = BusyWorld(snapshot([node("n1")], [job("a", placement=["n1"])]), 0.1)
    wake = WakeSignal()
    loop = loop_over(world, wake)
    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(0.01):
            wake("pod event")

    churner = threading.Thread(target=churn)
    loop.start()
    churner.start()
    try:
        wait_for(lambda: len(world.looks) >= 4, 20, "four passes under churn")
    finally:
        stop.set()
        churner.join(5)
        loop.stop(5)
    for (_, ended, cpu), (after, _, _) in zip(world.looks, world.looks[1:], strict=False):
        assert after - ended >= REST_PER_PASS * cpu * 0.95


class WaitingWorld(FixedWorld):
    """A snapshot that waits `seconds` without a core (as for a slow server's answer)."""

    def __init__(self, snap: Snapshot, seconds: float) -> None:
        super().__init__(snap)
        self.seconds = seconds

    def snapshot(self, now: datetime) -> Snapshot:
        time.sleep(self.seconds)
        return self.snap


def test_a_pass_that_waited_for_the_server_is_not_rested_after() -> None:
    """The rest counts the pass's CPU: a pass whose time went waiting (its writes under API
    faults) took no core, and resting 2x its wall time after it held the next pass (and what
    only a pass answers) for seconds."""
    world = WaitingWorld(snapshot([node("n1")], [job("a", placement=["n1"])]), 0.5)
    loop = loop_over(world, WakeSignal())
    assert loop.run_pass(set())
    assert loop._pause() < 0.5  # 2x its CPU (milliseconds), not 2x its 0.5 s
