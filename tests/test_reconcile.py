"""The reconciler: decisions logged in order, drains applied first, failures isolated."""

from __future__ import annotations

import io
import threading
from datetime import datetime

from core_fixtures import NOW, job, node, notice, policies, snapshot

from autoscaler.core import Action, Decision, PolicySet, Snapshot
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
