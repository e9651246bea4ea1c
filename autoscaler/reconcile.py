"""One reconcile pass: observe -> snapshot -> decide -> hand the decisions to `writes.Writes`,
which applies and logs them (daemon and simulator).

Level-triggered: everything the core needs is rebuilt from the observer each pass, except the
`min_idle` clocks (restart-safe: they only restart). Actuator errors are logged per decision and
never end the loop; the next pass sees the world again and retries what is still needed.
The core reuses the last pass's plans where nothing changed (core/memo.py); every
CHECK_EVERY-th pass decides once more without them and compares: the memo's safety net.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any, Protocol, runtime_checkable

from autoscaler.core import (
    Action,
    Decision,
    GpuNode,
    Job,
    PassMemo,
    PolicySet,
    Shield,
    ShieldMemo,
    Snapshot,
    decide,
    decide_departures,
    track_idle,
)
from autoscaler.writes import Actuator, Mark, Writes, never

CHECK_EVERY = 30  # passes: one in so many also decides without the memo and compares
Look = Callable[[datetime], Snapshot]
_URGENT = (Action.DRAIN, Action.SCALE_IN)  # what the fast path writes of its decisions


class Observer(Protocol):
    def snapshot(self, now: datetime) -> Snapshot: ...


@runtime_checkable
class NoticeObserver(Protocol):
    """An observer that can also build just what a notice's departures read: every node and
    notice, and the jobs with a worker on a noticed node (the fast path's snapshot)."""

    def noticed(self, now: datetime) -> Snapshot: ...


def noticed_view(observer: Observer, now: datetime) -> Snapshot:
    """The fast path's snapshot: the whole one from an observer that cannot make less."""
    if isinstance(observer, NoticeObserver):
        return observer.noticed(now)
    return observer.snapshot(now)


class Reconciler:
    def __init__(
        self,
        observer: Observer,
        actuator: Actuator,
        policies: PolicySet,
        logger: Any,
        on_decision: Callable[[Decision], None] | None = None,
        write_workers: int = 1,
        on_written: Callable[[], None] = lambda: None,
        on_expired: Callable[[], None] = lambda: None,
        on_step: Callable[[str, float], None] = lambda step, seconds: None,
    ) -> None:
        self.observer = observer
        self._on_step = on_step  # the fast path's steps, timed: `_look`, `react`
        self.policies = policies
        self.logger = logger
        self.writes = Writes(actuator, logger, on_decision, write_workers, on_written, on_expired)
        self.idle_since: dict[str, datetime] = {}
        self._idle_of: tuple[GpuNode, ...] | None = None  # the nodes idle_since was tracked for
        self.memo = PassMemo()
        self.memo_mismatches = 0  # passes whose memo disagreed with a full decide (a bug)
        self._passes = 0
        self.gave_way = False  # the last tick stopped for a waiting notice (see tick)
        self._managed: list[Job] = []
        self._shield: Shield = {}  # their pods Karpenter must leave alone
        self._shields = ShieldMemo()
        # the observer's memos are not for two threads: the notice responder (react) waits
        # for a pass's snapshot, not for its decisions or writes
        self._observing = threading.Lock()

    def _look(self, look: Look, now: datetime, timed: bool = False) -> tuple[Snapshot, Mark]:
        """A snapshot, and the writes' mark from before it (writes.Writes._claim); `timed`: the
        fast path's, whose wait for the other thread's and own look are steps (`on_step`)."""
        began = time.perf_counter()
        with self._observing:
            locked, mark, snapshot = time.perf_counter(), self.writes.mark(), look(now)
        if timed:
            self._on_step("wait", locked - began)
            self._on_step("look", time.perf_counter() - locked)
        return snapshot, mark

    @property
    def actuator(self) -> Actuator:
        return self.writes.actuator

    @property
    def errors(self) -> int:
        """Writes that failed so far (the pass's and those behind the fast path)."""
        return self.writes.errors

    @property
    def kept(self) -> bool:
        """False: standing objects are left over (keep_more, or the next pass)."""
        return self.writes.kept

    def tick(
        self,
        now: datetime,
        give_way: Callable[[], bool] = never,
        notice_waits: Callable[[], bool] = never,
    ) -> list[Decision]:
        """One full pass. `give_way()` is asked before deciding, before acting and before each
        write that answers no notice (growth, alerts, standing objects): True (a notice is
        waiting) ends the pass there with `gave_way` set and the rest not applied (nor logged);
        the caller answers the notice on the fast path and runs the pass again. A pass the
        caller no longer lets give way (it has for long enough: growth must not starve) still
        stops after its first batch of such writes when `notice_waits()`: a pass deciding tens
        of ScaleOuts (fresh nodes' GPUs idle together) held every notice for all of them."""
        self.gave_way = False  # also when the snapshot fails: that pass counts as a pass
        snapshot, mark = self._look(self.observer.snapshot, now)
        if snapshot.nodes is not self._idle_of:  # the same nodes: the same clocks, kept
            self.idle_since = track_idle(self.idle_since, snapshot.nodes, now)
            self._idle_of = snapshot.nodes
        self.gave_way = give_way()
        if not self.gave_way:
            decisions = self.writes.not_writing(
                self._decide(replace(snapshot, idle_since=self.idle_since), now)
            )
            self.gave_way = give_way()
        if self.gave_way or not self.writes.act(decisions, now, give_way, notice_waits, mark):
            self.gave_way = True
            return []
        self.writes.forget({j.key for j in snapshot.jobs}, mark)
        self._managed = [j for j in snapshot.jobs if self.policies.for_job(j) is not None]
        self._shield = self._shields.shield(self._managed, self.policies)
        if give_way():
            self.writes.kept = False  # left for keep_more, once no notice waits
        else:
            self.writes.keep(self._managed, now, self._shield)
        return decisions

    def _decide(self, snapshot: Snapshot, now: datetime) -> list[Decision]:
        """`decide` with the memo; on every CHECK_EVERY-th pass also without it: when the two
        differ, the memo missed an input (a bug): logged, counted, forgotten, and the full
        pass's decisions are the ones acted on."""
        decisions = decide(snapshot, self.policies, now, self.memo)
        self._passes += 1
        if self._passes % CHECK_EVERY:
            return decisions
        full = decide(snapshot, self.policies, now)
        if full != decisions:
            self.memo_mismatches += 1
            self.memo = PassMemo()
            differ = sorted({d.job for d in set(full) ^ set(decisions)})
            self.logger.error("memo_mismatch", jobs=differ[:20], differing=len(differ))
        return full

    def react(self, now: datetime) -> list[Decision]:
        """The notice fast path (the responder's thread, beside a pass under way): drains and
        ScaleIns of the jobs with workers on noticed nodes only, decided as the full pass would
        (`decide_departures`). Growth, other jobs and standing objects wait for the next pass."""
        snapshot, mark = self._look(partial(noticed_view, self.observer), now, timed=True)
        looked = time.perf_counter()
        noticed = {n.node for n in snapshot.notices}
        keys = frozenset(j.key for j in snapshot.jobs if any(w.node in noticed for w in j.workers))
        if not keys:
            return []
        decided = decide_departures(snapshot, self.policies, now, keys)
        self._on_step("decide", time.perf_counter() - looked)
        urgent = self.writes.not_writing([d for d in decided if d.action in _URGENT])
        self.writes.answer(urgent, now, mark)  # behind this thread: the next notice's react
        return urgent

    def settle(self, stop: Callable[[], bool], timeout: float) -> None:
        """Wait for the fast path's writes: at most `timeout` s, only while `stop()` is False."""
        self.writes.settle(stop, timeout)

    def finish(self, timeout: float) -> None:
        """Wait (at most `timeout` s) for the writes behind the fast path and the passes; those not
        begun by then are dropped, counted in one line (the caller lets go of the Lease next)."""
        self.writes.settle(never, timeout, growth=True)
        if dropped := self.writes.drop_waiting():
            self.logger.info("writes_dropped", writes=dropped, why="the daemon is stopping")

    def keep_more(self, now: datetime) -> bool:
        """A few more standing-object writes for the jobs of the last pass; True when done."""
        self.writes.keep(self._managed, now, self._shield)
        return self.writes.kept
