"""One reconcile pass: observe -> snapshot -> decide -> actuate -> log (daemon and simulator).

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
from concurrent.futures import Future, ThreadPoolExecutor, wait
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
    Snapshot,
    decide,
    decide_departures,
    track_idle,
)
from autoscaler.decisionlog import log_decision

_APPLY_ORDER = {
    Action.DRAIN: 0,
    Action.CANCEL: 1,  # before the operator picks the scaler up
    Action.SCALE_IN: 2,
    Action.SCALE_OUT: 3,
    Action.UNDRAIN: 4,
    Action.NOOP: 5,
}


# What a pass may write while a notice waits: the departures (a full pass makes them too), in
# this order; each of different jobs at once (one decision per job and action).
_DEPARTURES = (Action.DRAIN, Action.CANCEL, Action.SCALE_IN)
_ANSWERS_NOTICES = frozenset(_DEPARTURES)


def _never() -> bool:
    return False


_SETTLE_POLL = 0.02  # seconds between looks for a waiting notice while writes settle
_KEEP_WRITES = 5  # standing-object writes per pass: ~5-20 ms each on a real API server
CHECK_EVERY = 30  # passes: one in so many also decides without the memo and compares


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


class Actuator(Protocol):
    """Carries out one decision. A dry-run actuator only says what it would do."""

    dry_run: bool

    def apply(self, decision: Decision, now: datetime) -> None: ...


@runtime_checkable
class Keeper(Protocol):
    """An actuator that also keeps standing objects true for the managed jobs each pass (e.g.
    the Kubernetes one's PodDisruptionBudgets)."""

    def keep(self, jobs: list[Job], now: datetime, writes: int) -> bool:
        """At most `writes` API writes; True when nothing was left for a later pass."""
        ...


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
    ) -> None:
        self.observer = observer
        self.actuator = actuator
        self.policies = policies
        self.logger = logger
        self.on_decision = on_decision
        self.idle_since: dict[str, datetime] = {}
        self._idle_of: tuple[GpuNode, ...] | None = None  # the nodes idle_since was tracked for
        self._last_noop: dict[str, tuple[str, tuple[str, ...]]] = {}  # job -> (reason, tags)
        self.errors = 0
        self.memo = PassMemo()
        self.memo_mismatches = 0  # passes whose memo disagreed with a full decide (a bug)
        self._passes = 0
        self.gave_way = False  # the last tick stopped for a waiting notice (see tick)
        self.kept = True  # False: standing objects are left over (keep_more, or the next pass)
        self._managed: list[Job] = []
        # writes of different jobs are independent: with more than one worker they go out at
        # once instead of queueing behind each other's round trips (departures race nodes'
        # deaths; a ScaleIn is three: the server check's reads and the create)
        self._pool = (
            ThreadPoolExecutor(write_workers, thread_name_prefix="writer")
            if write_workers > 1
            else None
        )
        self._batch = max(1, write_workers)
        # the fast path's ScaleIns, written behind its drains (react): job -> its write. Until
        # it ends, nothing but drains is applied for that job (one scaler at a time, and a cache
        # that has not seen the write must not make a second); its end calls `on_written`.
        # Their own workers: a slow ScaleIn must never hold the next notice's drains.
        self._behind = (
            ThreadPoolExecutor(write_workers, thread_name_prefix="behind")
            if write_workers > 1
            else None
        )
        self._writing: dict[str, Future[bool]] = {}
        self._writing_lock = threading.Lock()
        self._on_written = on_written

    def tick(
        self,
        now: datetime,
        give_way: Callable[[], bool] = _never,
        notice_waits: Callable[[], bool] = _never,
    ) -> list[Decision]:
        """One full pass. `give_way()` is asked before deciding, before acting and before each
        write that answers no notice (growth, alerts, standing objects): True (a notice is
        waiting) ends the pass there with `gave_way` set and the rest not applied (nor logged);
        the caller answers the notice on the fast path and runs the pass again. A pass the
        caller no longer lets give way (it has for long enough: growth must not starve) still
        stops after its first batch of such writes when `notice_waits()`: a pass deciding tens
        of ScaleOuts (fresh nodes' GPUs idle together) held every notice for all of them."""
        self.gave_way = False  # also when the snapshot fails: that pass counts as a pass
        snapshot = self.observer.snapshot(now)
        if snapshot.nodes is not self._idle_of:  # the same nodes: the same clocks, kept
            self.idle_since = track_idle(self.idle_since, snapshot.nodes, now)
            self._idle_of = snapshot.nodes
        self.gave_way = give_way()
        if not self.gave_way:
            decisions = self._not_writing(
                self._decide(replace(snapshot, idle_since=self.idle_since), now)
            )
            self.gave_way = give_way()
        if self.gave_way or not self._act(decisions, now, give_way, notice_waits):
            self.gave_way = True
            return []
        self._managed = [j for j in snapshot.jobs if self.policies.for_job(j) is not None]
        if give_way():
            self.kept = False  # left for keep_more, once no notice waits
        else:
            self._keep(self._managed, now)
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
        """The notice fast path, before a full pass: drains and ScaleIns of the jobs with workers
        on noticed nodes only, decided as the full pass would (`decide_departures`). Growth,
        other jobs and standing objects wait for the pass that follows."""
        snapshot = noticed_view(self.observer, now)
        noticed = {n.node for n in snapshot.notices}
        keys = frozenset(j.key for j in snapshot.jobs if any(w.node in noticed for w in j.workers))
        if not keys:
            return []
        decided = decide_departures(snapshot, self.policies, now, keys)
        urgent = self._not_writing(
            [d for d in decided if d.action in (Action.DRAIN, Action.SCALE_IN)]
        )
        drains = [d for d in urgent if d.action is Action.DRAIN]
        self._act(drains, now)
        # the next notice's drains must not wait for these (a ScaleIn is three round trips)
        self._write_behind([d for d in urgent if d.action is Action.SCALE_IN], now)
        return urgent

    def _not_writing(self, decisions: list[Decision]) -> list[Decision]:
        """Without the decisions, drains aside, of jobs whose ScaleIn is still being written:
        the pass after its end decides them again."""
        with self._writing_lock:
            writing = set(self._writing)
        if not writing:
            return decisions
        return [d for d in decisions if d.action is Action.DRAIN or d.job not in writing]

    def _write_behind(self, decisions: list[Decision], now: datetime) -> None:
        """Log and apply in the pool without waiting (at once when there is none)."""
        if self._behind is None:
            self._act(decisions, now)
            return
        for decision in decisions:
            if self.on_decision is not None:
                self.on_decision(decision)
            with self._writing_lock:
                future = self._behind.submit(self._log_and_apply, decision, now)
                self._writing[decision.job] = future
            future.add_done_callback(partial(self._written, decision.job))

    def _written(self, job: str, future: Future[bool]) -> None:
        with self._writing_lock:
            del self._writing[job]
        self._count_failed(future.exception() is not None or not future.result())
        self._on_written()

    def settle(self, stop: Callable[[], bool], timeout: float) -> None:
        """Wait for the writes going out behind the fast path: at most `timeout` seconds, and
        only while `stop()` is False (asked every _SETTLE_POLL seconds)."""
        deadline = time.monotonic() + timeout
        while not stop() and (left := deadline - time.monotonic()) > 0:
            with self._writing_lock:
                pending = list(self._writing.values())
            if not pending:
                return
            wait(pending, min(left, _SETTLE_POLL))

    def finish(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for writes still going out behind the fast path."""
        self.settle(_never, timeout)

    def _act(
        self,
        decisions: list[Decision],
        now: datetime,
        give_way: Callable[[], bool] = _never,
        notice_waits: Callable[[], bool] = _never,
    ) -> bool:
        """Log and apply: every action, and the noops a person must hear of once per episode.
        False when it stopped for a waiting notice before a write that answers none (growth,
        an alert): those are neither applied nor logged, and the next pass decides them again.
        After one batch of those, a waiting notice stops it even when `give_way` would not."""
        to_apply: list[Decision] = []
        for decision in decisions:
            if decision.action is not Action.NOOP:
                to_apply.append(decision)
            elif decision.reason.info.alert:  # logged when its Event goes out
                if self._worth_logging(decision, record=False):
                    to_apply.append(decision)
            elif self._worth_logging(decision):
                self._log(decision, now)
            if self.on_decision is not None:
                self.on_decision(decision)
        # Every job's drain before any scaler: a drain is what races the node's death, and it
        # must not wait behind other jobs' API writes. Within a job, drain still precedes scale-in.
        done: list[bool] = []
        for action in _DEPARTURES:
            done += self._apply_at_once([d for d in to_apply if d.action is action], now)
        # the rest (growth, undrains, alerts), an action at a time, a batch of different jobs
        # at once: hundreds of undrains after a wave of ScaleIns must not hold a waiting notice
        # for more than one batch's round trip
        rest = [d for d in to_apply if d.action not in _ANSWERS_NOTICES]
        batches = 0
        for action in sorted({d.action for d in rest}, key=_APPLY_ORDER.__getitem__):
            of_action = [d for d in rest if d.action is action]
            for start in range(0, len(of_action), self._batch):
                if give_way() or (batches and notice_waits()):
                    self._count_failed(done.count(False))
                    return False
                done += self._apply_at_once(of_action[start : start + self._batch], now)
                batches += 1
        self._count_failed(done.count(False))
        return True

    def _count_failed(self, writes: int) -> None:
        """`errors` grows from the loop's thread and from the writes behind the fast path."""
        with self._writing_lock:
            self.errors += writes

    def _apply_at_once(self, decisions: list[Decision], now: datetime) -> list[bool]:
        """Decisions of different jobs, concurrently when there is a pool."""
        if self._pool is None or len(decisions) < 2:
            return [self._log_and_apply(d, now) for d in decisions]
        return list(self._pool.map(lambda d: self._log_and_apply(d, now), decisions))

    def _log_and_apply(self, decision: Decision, now: datetime) -> bool:
        self._worth_logging(decision)  # an action ends its job's noop episode
        self._log(decision, now)
        return self._apply(decision, now)

    def _log(self, decision: Decision, now: datetime) -> None:
        log_decision(self.logger, decision, now=now, dry_run=self.actuator.dry_run)

    def keep_more(self, now: datetime) -> bool:
        """A few more standing-object writes for the jobs of the last pass; True when done."""
        self._keep(self._managed, now)
        return self.kept

    def _keep(self, managed: list[Job], now: datetime) -> None:
        """Standing objects, a few writes at a time (after the decisions): thousands may be
        missing at start-up, and the next notice's drain must not queue behind them all."""
        self.kept = True
        if not isinstance(self.actuator, Keeper):
            return
        try:
            self.kept = self.actuator.keep(managed, now, _KEEP_WRITES)
        except Exception as exc:  # like a decision's failure: logged, retried after a back-off
            self._count_failed(1)
            self.logger.error("keep_failed", error=f"{type(exc).__name__}: {exc}")

    def _apply(self, decision: Decision, now: datetime) -> bool:
        """Carry out one decision; False if it failed (logged)."""
        try:
            self.actuator.apply(decision, now)
            return True
        except Exception as exc:  # an adapter's failure must not stop the other decisions
            self.logger.error(
                "actuation_failed",
                job=decision.job,
                action=decision.action.value,
                error=f"{type(exc).__name__}: {exc}",
            )
            return False

    def _worth_logging(self, decision: Decision, record: bool = True) -> bool:
        """Log every action; log a noop only when its reason for that job changes (`record`:
        remember that it was logged)."""
        if decision.action is not Action.NOOP:
            if record:
                self._last_noop.pop(decision.job, None)
            return True
        key = (decision.reason.value, tuple(t.value for t in decision.tags))
        if self._last_noop.get(decision.job) == key:
            return False
        if record:
            self._last_noop[decision.job] = key
        return True
