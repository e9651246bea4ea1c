"""How a pass's decisions are written: in what order, in what batches, on which threads.

The Reconciler observes and decides; this carries the decisions out and logs them:
- departures first (drains, then cancels, then ScaleIns), each action's decisions of different
  jobs at once: a drain races its node's death and must not queue behind other jobs' writes;
- growth (ScaleOuts) handed to its own threads and not waited for: a ScaleOut is two round trips
  (the server's count of the job's workers, then the create) and a pass deciding tens of them
  held every notice that came meanwhile (1,000 nodes with churn: p99 2.5 s before a notice's
  pass began, docs/benchmarks.md);
- the rest (undrains, alerts) a batch of different jobs at a time, asking between batches
  whether a waiting notice should have the loop (`give_way`, `notice_waits`);
- the fast path's drains and ScaleIns written behind it on threads of their own, a job's
  ScaleIn after its drain: the responder takes the next notice meanwhile; a job with a write
  behind (ScaleIn or ScaleOut) is held (only its drains go) until that write ends;
- two writers at once (the notice responder beside a pass: daemon/loop.py): each writes under a
  `Mark` taken before its snapshot, and a decision (drains aside) for a job the other wrote since
  is dropped: it was made on a view without that write (`_claim`);
- standing objects (PodDisruptionBudgets) a few writes at a time;
- every action logged, a noop once per episode (its reason for that job changes); failures
  logged and counted, never raised: the next pass sees the world again;
- a write whose server check expired before it could land (`fencing.Stale`: a slow server) is
  no failure, so it does not grow the loop's back-off (which held one notice's ScaleIn for 67 s
  on a busy control plane). That job's action is held back and asked for again (`on_expired`)
  after a back-off of its own, as a workqueue's per-item rate limiter does: retried at once,
  hundreds of expired ScaleIns re-read the server together and kept it too slow for any of them
  (2,000 nodes: 116 expiries in a minute).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime
from functools import partial
from typing import Any, Protocol, runtime_checkable

from autoscaler.core import Action, Decision, Job, Shield
from autoscaler.decisionlog import log_decision
from autoscaler.fencing import Stale

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
_SETTLE_POLL = 0.02  # seconds between looks for a waiting notice while writes settle
_KEEP_WRITES = 5  # standing-object writes per pass: ~5-20 ms each on a real API server
_EXPIRED_FIRST, _EXPIRED_MAX = 0.5, 8.0  # seconds a job's expired action waits, doubling


def never() -> bool:
    return False


class Mark:
    """Where the writes stood when a writer began to look (before its snapshot): compared by
    identity, so one writer's own writes never make its later decisions stale."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = seq


class Actuator(Protocol):
    """Carries out one decision. A dry-run actuator only says what it would do."""

    dry_run: bool

    def apply(self, decision: Decision, now: datetime) -> None: ...


@runtime_checkable
class Keeper(Protocol):
    """An actuator that also keeps standing objects true for the managed jobs each pass (e.g.
    the Kubernetes one's PodDisruptionBudgets)."""

    def keep(self, jobs: list[Job], now: datetime, writes: int, shield: Shield) -> bool:
        """At most `writes` API writes; True when nothing was left for a later pass. `shield`:
        the pods Karpenter's voluntary disruption must leave alone (core/voluntary.py)."""
        ...


class Writes:
    def __init__(
        self,
        actuator: Actuator,
        logger: Any,
        on_decision: Callable[[Decision], None] | None = None,
        workers: int = 1,
        on_written: Callable[[], None] = lambda: None,
        on_expired: Callable[[], None] = lambda: None,
    ) -> None:
        self.actuator = actuator
        self.logger = logger
        self.on_decision = on_decision
        self.errors = 0
        self.kept = True  # False: standing objects are left over (keep_more, or the next pass)
        self._last_noop: dict[str, tuple[str, tuple[str, ...]]] = {}  # job -> (reason, tags)
        # writes of different jobs are independent: with more than one worker they go out at
        # once instead of queueing behind each other's round trips (departures race nodes'
        # deaths; a ScaleIn is three: the server check's reads and the create)
        self._pool = _pool(workers, "writer")
        self._batch = max(1, workers)
        # writes behind: job -> its write (the fast path's ScaleIns, a pass's ScaleOuts). Until
        # it ends, nothing but drains is applied for that job (one scaler at a time, and a cache
        # that has not seen the write must not make a second); its end calls `on_written`.
        # Their own workers, apart from the drains': a slow scaler never holds a notice's drains,
        # and ScaleIns apart from growth: a notice's ScaleIn never queues behind tens of ScaleOuts.
        self._behind = _pool(workers, "behind")
        self._growth = _pool(workers, "growth")
        # the fast path's drains: apart from the pass's writer pool, whose batches of undrains
        # must not hold them
        self._answers = _pool(workers, "answer")
        self._answering: set[Future[bool | None]] = set()  # its drains under way
        self._writing: dict[str, Future[bool | None]] = {}
        self._departing: set[str] = set()  # jobs of `_writing` whose write is a ScaleIn
        self._lock = threading.Lock()
        self._on_written = on_written
        self._on_expired = on_expired
        self._seq = 0  # writes claimed so far
        self._last_write: dict[str, tuple[int, Mark | None]] = {}  # job -> its last claim
        self._busy: Counter[str] = Counter()  # job -> its writes under way, drains aside
        self._drains_going: Counter[tuple[str, str]] = Counter()  # (job, host) being drained
        # (job, action) whose last try expired -> (tries expired in a row, not again before)
        self._expired: dict[tuple[str, Action], tuple[int, float]] = {}

    # --- a pass's decisions ---------------------------------------------------------------------
    def act(
        self,
        decisions: list[Decision],
        now: datetime,
        give_way: Callable[[], bool] = never,
        notice_waits: Callable[[], bool] = never,
        mark: Mark | None = None,
    ) -> bool:
        """Log and apply: every action, and the noops a person must hear of once per episode.
        False when it stopped for a waiting notice before a write that answers none (growth,
        an alert): those are neither applied nor logged, and the next pass decides them again.
        After one batch of those, a waiting notice stops it even when `give_way` would not.
        `mark`: the writer's, from before the snapshot the decisions were made on."""
        to_apply = self._to_apply(decisions, now)
        # Every job's drain before any scaler: a drain is what races the node's death, and it
        # must not wait behind other jobs' API writes. Within a job, drain still precedes scale-in.
        done: list[bool | None] = []
        for action in _DEPARTURES:
            done += self._apply_at_once([d for d in to_apply if d.action is action], now, mark)
        finished = self._apply_rest(to_apply, now, done, give_way, notice_waits, mark)
        self._count_failed(done.count(False))
        return finished

    def _to_apply(self, decisions: list[Decision], now: datetime) -> list[Decision]:
        """The actions, and the alerts worth telling; the other noops are logged here."""
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
        return to_apply

    def _apply_rest(
        self,
        to_apply: list[Decision],
        now: datetime,
        done: list[bool | None],
        give_way: Callable[[], bool],
        notice_waits: Callable[[], bool],
        mark: Mark | None,
    ) -> bool:
        """Growth, undrains and alerts, an action at a time, a batch of different jobs at once:
        hundreds of undrains after a wave of ScaleIns must not hold a waiting notice for more
        than one batch's round trip. False when it stopped for a waiting notice."""
        rest = [d for d in to_apply if d.action not in _ANSWERS_NOTICES]
        rest = self._hand_off_growth(rest, now, mark)
        batches = 0
        for action in sorted({d.action for d in rest}, key=_APPLY_ORDER.__getitem__):
            of_action = [d for d in rest if d.action is action]
            for start in range(0, len(of_action), self._batch):
                if give_way() or (batches and notice_waits()):
                    return False
                done += self._apply_at_once(of_action[start : start + self._batch], now, mark)
                batches += 1
        return True

    def _hand_off_growth(
        self, rest: list[Decision], now: datetime, mark: Mark | None
    ) -> list[Decision]:
        """The ScaleOuts to their own threads, not waited for; what is left to write now (the
        other writes of a job whose ScaleOut is going out wait for it: the next pass)."""
        if self._growth is None:
            return rest
        self._submit(self._growth, [d for d in rest if d.action is Action.SCALE_OUT], now, mark)
        return self.not_writing([d for d in rest if d.action is not Action.SCALE_OUT])

    # --- writes behind: the fast path's ScaleIns, a pass's growth --------------------------------
    def not_writing(self, decisions: list[Decision]) -> list[Decision]:
        """Without the decisions, drains aside, of jobs whose scaler is still being written:
        the pass after its end decides them again."""
        with self._lock:
            writing = set(self._writing)
        if not writing:
            return decisions
        return [d for d in decisions if d.action is Action.DRAIN or d.job not in writing]

    def answer(self, decisions: list[Decision], now: datetime, mark: Mark | None) -> None:
        """The fast path's drains and ScaleIns, written behind it (at once when there is no
        pool): the responder takes the next notice while they go out. It waited for each
        react's drain PATCH before: in a burst of notices 0.1 s apart, p90 0.3 s from a notice
        to the react that answered it (2,000 nodes). A job's ScaleIn goes after its drain."""
        drains = [d for d in decisions if d.action is Action.DRAIN]
        scale_ins = [d for d in decisions if d.action is Action.SCALE_IN]
        if self._answers is None:
            self.act(drains, now, mark=mark)
            self._write_behind(scale_ins, now, mark)
            return
        self._tell(drains)
        with self._lock:
            drains = [d for d in drains if self._claim(d, mark)]
        going = {}
        for decision in drains:
            future = self._answers.submit(self._log_and_apply, decision, now)
            with self._lock:
                self._answering.add(future)
            future.add_done_callback(partial(self._drained, decision))
            going[decision.job] = future
        self._write_behind(scale_ins, now, mark, going)

    def _write_behind(
        self,
        decisions: list[Decision],
        now: datetime,
        mark: Mark | None,
        after: dict[str, Future[bool | None]] | None = None,
    ) -> None:
        """The fast path's ScaleIns: log and apply in the pool without waiting (at once when
        there is none), each after its job's write in `after` (its drain) ended."""
        if self._behind is None:
            self.act(decisions, now, mark=mark)
            return
        self._tell(decisions)
        self._submit(self._behind, decisions, now, mark, after or {})

    def _tell(self, decisions: list[Decision]) -> None:
        if self.on_decision is not None:
            for decision in decisions:
                self.on_decision(decision)

    def _submit(
        self,
        pool: ThreadPoolExecutor,
        decisions: list[Decision],
        now: datetime,
        mark: Mark | None,
        after: dict[str, Future[bool | None]] | None = None,
    ) -> None:
        for decision in decisions:
            with self._lock:
                if not self._claim(decision, mark):
                    continue
                first = (after or {}).get(decision.job)
                future = pool.submit(self._after, first, decision, now)
                self._writing[decision.job] = future
                if decision.action is Action.SCALE_IN:
                    self._departing.add(decision.job)
            future.add_done_callback(partial(self._written, decision))

    # --- two writers: a pass and the notice responder --------------------------------------------
    def mark(self) -> Mark:
        """Taken by a writer before it looks at the world (its snapshot)."""
        with self._lock:
            return Mark(self._seq)

    def forget(self, jobs: set[str], mark: Mark) -> None:
        """After a full pass: the claims, made before its `mark`, of jobs its snapshot no longer
        has (finished or deleted) can make no decision stale any more."""
        with self._lock:
            for job in self._last_write.keys() - jobs:
                if self._last_write[job][0] <= mark.seq:
                    del self._last_write[job]
            for key in [k for k in self._expired if k[0] not in jobs]:
                del self._expired[key]

    def _claim(self, decision: Decision, mark: Mark | None) -> bool:
        """Under `_lock`: whether `decision` may be written now; if so it is its job's last
        claim. Refused (logged; the next pass decides again) as `_refusal` says. A drain answers
        a notice whatever the view; an alert (a noop's Event) changes no job."""
        if decision.action is Action.NOOP:
            return True
        if decision.action is Action.DRAIN:
            why = self._drain_refusal(decision)
        else:
            why = self._refusal(decision.job, mark)
        why = why or self._expiry_refusal(decision)
        if why:
            self.logger.info(
                "decision_dropped", job=decision.job, action=decision.action.value, why=why
            )
            return False
        if decision.action is Action.DRAIN:
            self._drains_going.update((decision.job, h) for h in decision.hosts)
        else:
            self._busy[decision.job] += 1
        self._seq += 1
        self._last_write[decision.job] = (self._seq, mark)
        return True

    def _drain_refusal(self, decision: Decision) -> str:
        """A drain goes whatever the view, unless the same one is going out: the other writer
        (the responder beside a pass) took its snapshot before that drain landed."""
        going = decision.hosts and all(
            self._drains_going[(decision.job, h)] for h in decision.hosts
        )
        return "the same drain is under way" if going else ""

    def _refusal(self, job: str, mark: Mark | None) -> str:
        """Why a write of `job` may not go now ('' if it may): another writer wrote the job
        since `mark`, so the decision was made on a view without that write (a ScaleOut sized
        before a notice's ScaleIn, a second ScaleIn for the same notice); or another write of
        the job is under way (a second scaler)."""
        last = self._last_write.get(job)
        if mark is not None and last is not None and last[0] > mark.seq and last[1] is not mark:
            return "the job was written since this view of it"
        if self._busy[job] or job in self._writing:
            return "a write of the job is under way"
        return ""

    def _expiry_refusal(self, decision: Decision) -> str:
        """Under `_lock`: why the job's action waits ('' if it need not): its last try's
        check expired, and its back-off has not run out."""
        expired = self._expired.get((decision.job, decision.action))
        left = expired[1] - time.monotonic() if expired else 0.0
        return f"its last server check expired: tried again in {left:.1f} s" if left > 0 else ""

    def _written(self, decision: Decision, future: Future[bool | None]) -> None:
        with self._lock:
            del self._writing[decision.job]
            self._departing.discard(decision.job)
        if self._counted(decision, future):
            self._on_written()

    def _counted(self, decision: Decision, future: Future[bool | None]) -> bool:
        """A write behind that ended, counted as `_apply_at_once` counts one; False if it was
        dropped at shutdown (drop_waiting: not begun, not failed)."""
        if future.cancelled():
            return False
        done = future.result() if future.exception() is None else False
        self._count_failed(done is False)
        if done is None:  # the job is free again: its next react or pass may write it
            self._retry_later(decision)
        return True

    def _after(
        self, first: Future[bool | None] | None, decision: Decision, now: datetime
    ) -> bool | None:
        """`decision` once `first` (its job's drain) has ended, whatever came of it."""
        if first is not None:
            wait([first])
        return self._log_and_apply(decision, now)

    def _drained(self, decision: Decision, future: Future[bool | None]) -> None:
        """The end of a drain written behind the fast path."""
        with self._lock:
            self._answering.discard(future)
        self._counted(decision, future)

    def _retry_later(self, decision: Decision) -> None:
        """Ask for `decision`'s job again (`on_expired`) once its back-off has run out."""
        with self._lock:
            _, after = self._expired.get((decision.job, decision.action), (0, 0.0))
        timer = threading.Timer(max(0.0, after - time.monotonic()), self._on_expired)
        timer.daemon = True
        timer.start()

    def _expiry(self, decision: Decision, expired: bool) -> None:
        """Count a try of a departure (whose write rests on a server check)."""
        key = (decision.job, decision.action)
        with self._lock:
            if not expired:
                self._expired.pop(key, None)
                return
            tries = self._expired.get(key, (0, 0.0))[0] + 1
            wait = min(_EXPIRED_MAX, _EXPIRED_FIRST * 2 ** (tries - 1))
            self._expired[key] = (tries, time.monotonic() + wait)

    def settle(self, stop: Callable[[], bool], timeout: float, growth: bool = False) -> None:
        """Wait for the drains and ScaleIns going out behind the fast path (and the growth
        behind passes too with `growth`): at most `timeout` seconds, and only while `stop()` is
        False (asked every _SETTLE_POLL seconds)."""
        deadline = time.monotonic() + timeout
        while not stop() and (left := deadline - time.monotonic()) > 0:
            with self._lock:
                pending = [f for j, f in self._writing.items() if growth or j in self._departing]
                pending += self._answering
            if not pending:
                return
            wait(pending, min(left, _SETTLE_POLL))

    def drop_waiting(self) -> int:
        """At shutdown, before the Lease goes: the writes behind the passes and the fast path
        not begun yet are cancelled; how many. Begun after the release, each would be refused
        NotLeader with an error line of its own (181 at one stop of a 5,000-node run)."""
        with self._lock:
            waiting = [*self._writing.values(), *self._answering]
        return sum(future.cancel() for future in waiting)

    # --- standing objects -----------------------------------------------------------------------
    def keep(self, managed: list[Job], now: datetime, shield: Shield) -> None:
        """Standing objects, a few writes at a time (after the decisions): thousands may be
        missing at start-up, and the next notice's drain must not queue behind them all."""
        self.kept = True
        if not isinstance(self.actuator, Keeper):
            return
        try:
            self.kept = self.actuator.keep(managed, now, _KEEP_WRITES, shield)
        except Exception as exc:  # like a decision's failure: logged, retried after a back-off
            self._count_failed(1)
            self.logger.error("keep_failed", error=f"{type(exc).__name__}: {exc}")

    # --- one write ------------------------------------------------------------------------------
    def _count_failed(self, writes: int) -> None:
        """`errors` grows from the loop's thread and from the writes behind the fast path."""
        with self._lock:
            self.errors += writes

    def _apply_at_once(
        self, decisions: list[Decision], now: datetime, mark: Mark | None
    ) -> list[bool | None]:
        """Decisions of different jobs, concurrently when there is a pool; those refused by
        `_claim` are left out (not failures). As `_apply` says for each."""
        with self._lock:
            decisions = [d for d in decisions if self._claim(d, mark)]
        if self._pool is None or len(decisions) < 2:
            done = [self._log_and_apply(d, now) for d in decisions]
        else:
            done = list(self._pool.map(lambda d: self._log_and_apply(d, now), decisions))
        for decision, result in zip(decisions, done, strict=True):
            if result is None:
                self._retry_later(decision)
        return done

    def _log_and_apply(self, decision: Decision, now: datetime) -> bool | None:
        """A claimed decision (`_claim`): logged, applied, its claim let go; as `_apply`."""
        try:
            self._worth_logging(decision)  # an action ends its job's noop episode
            self._log(decision, now)
            return self._apply(decision, now)
        finally:
            self._let_go(decision)

    def _let_go(self, decision: Decision) -> None:
        """The end of a claimed decision's write (`_claim`)."""
        if decision.action is Action.DRAIN:
            with self._lock:
                self._drains_going.subtract((decision.job, h) for h in decision.hosts)
                self._drains_going = +self._drains_going
        elif decision.action is not Action.NOOP:
            with self._lock:
                self._busy[decision.job] -= 1
                if self._busy[decision.job] <= 0:
                    del self._busy[decision.job]

    def _log(self, decision: Decision, now: datetime) -> None:
        log_decision(self.logger, decision, now=now, dry_run=self.actuator.dry_run)

    def _apply(self, decision: Decision, now: datetime) -> bool | None:
        """Carry out one decision; False if it failed, None if its server check expired first
        (logged; `on_expired` once its claim is gone and its back-off has run out)."""
        try:
            self.actuator.apply(decision, now)
            if decision.action in _ANSWERS_NOTICES:
                self._expiry(decision, expired=False)
            return True
        except Stale as exc:
            self._expiry(decision, expired=True)
            self.logger.warning(
                "actuation_expired", job=decision.job, action=decision.action.value, why=str(exc)
            )
            return None
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


def _pool(workers: int, name: str) -> ThreadPoolExecutor | None:
    return ThreadPoolExecutor(workers, thread_name_prefix=name) if workers > 1 else None
