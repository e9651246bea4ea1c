"""Wrappers around the observer and actuator: metrics, and no action without the lease."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from autoscaler.core import Action, Decision, Job, Notice, Shield, Snapshot
from autoscaler.daemon.metrics import Metrics
from autoscaler.fencing import NotLeader
from autoscaler.reconcile import Observer, noticed_view
from autoscaler.writes import Actuator, Keeper

__all__ = ["GuardedActuator", "MeasuredObserver", "NoticeTracker", "NotLeader"]

NoticeKey = tuple[str, str]  # (source, id): what makes a notice distinct


class NoticeTracker:
    """Counts each notice once, and times it until a drain or scale-in on its node is applied.

    A notice is open while its node has workers (not already terminating) and nothing answered
    it. If they go first (the node died, a node handler evicted them), it is counted as lost:
    those workers may have left Horovod abruptly. Withdrawn while the workers stay, it is just
    forgotten."""

    def __init__(
        self, metrics: Metrics, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._open: dict[NoticeKey, Notice] = {}  # on a node with workers, not yet answered
        self._known: set[NoticeKey] = set()
        metrics.unanswered_age.set_function(self.oldest_open_age)

    def seen(self, notices: Iterable[Notice], busy_nodes: set[str], whole: bool = True) -> None:
        """`busy_nodes`: the nodes with live workers of the snapshot's jobs; `whole`: of every
        job (else only of the jobs on noticed nodes: the fast path's)."""
        current: set[NoticeKey] = set()
        for notice in notices:
            key = (notice.source, notice.id)
            current.add(key)
            if key not in self._known:
                self._metrics.notices.labels(notice.source, notice.kind.value).inc()
                if notice.node in busy_nodes:
                    self._open[key] = notice
        self._known = current  # withdrawn or expired notices are forgotten: memory stays bounded
        for key, notice in list(self._open.items()):
            if key not in current and not whole:
                continue  # its node's workers are not in a partial view: the next whole one
            if notice.node not in busy_nodes:
                if self._open.pop(key, None) is not None:  # not answered meanwhile (threads)
                    self._metrics.notices_lost.labels(notice.source, notice.kind.value).inc()
            elif key not in current:
                self._open.pop(key, None)

    @property
    def tracking(self) -> bool:
        """Notices seen last time or still unanswered: the next snapshot must be compared."""
        return bool(self._open) or bool(self._known)

    def answered(self, nodes: Iterable[str], at: datetime) -> None:
        nodes = set(nodes)
        for key, notice in list(self._open.items()):
            # pop, not del: drains of two jobs on one node may answer it at once (threads)
            answered = notice.node in nodes and self._open.pop(key, None) is not None
            if answered and notice.received_at is not None:
                self._metrics.reaction.observe(max(0.0, (at - notice.received_at).total_seconds()))

    def oldest_open_age(self) -> float:
        """Read at scrape time: a notice waiting on a hung pass still ages."""
        received = [n.received_at for n in list(self._open.values()) if n.received_at]
        return max(0.0, (self._clock() - min(received)).total_seconds()) if received else 0.0


class MeasuredObserver:
    def __init__(self, inner: Observer, metrics: Metrics, tracker: NoticeTracker) -> None:
        self._inner = inner
        self._metrics = metrics
        self._tracker = tracker

    def snapshot(self, now: datetime) -> Snapshot:
        snapshot = self._inner.snapshot(now)
        self._track(snapshot, whole=True)
        self._metrics.set_workers(snapshot.jobs)
        self._metrics.set_nodes(snapshot.nodes)
        return snapshot

    def noticed(self, now: datetime) -> Snapshot:
        """The fast path's snapshot: its jobs are all that have workers on noticed nodes, all the
        tracker reads; the gauges wait for the next whole one."""
        snapshot = noticed_view(self._inner, now)
        self._track(snapshot, whole=False)
        return snapshot

    def _track(self, snapshot: Snapshot, whole: bool) -> None:
        if snapshot.notices or self._tracker.tracking:  # a scan of every worker: only when needed
            busy = {
                w.node for job in snapshot.jobs for w in job.workers if w.node and not w.terminating
            }
            self._tracker.seen(snapshot.notices, busy, whole)


class GuardedActuator:
    """Applies a decision only while this replica leads; counts failures; times notice reactions."""

    def __init__(
        self,
        inner: Actuator,
        is_leader: Callable[[], bool],
        metrics: Metrics,
        tracker: NoticeTracker,
    ) -> None:
        self._inner = inner
        self.dry_run = inner.dry_run
        self._is_leader = is_leader
        self._metrics = metrics
        self._tracker = tracker

    def apply(self, decision: Decision, now: datetime) -> None:
        if not self._is_leader():
            raise NotLeader("the lease lapsed during this pass")
        try:
            self._inner.apply(decision, now)
        except NotLeader:  # a write refused by the fence: the lease lapsed mid-pass, no failure
            raise
        except Exception:
            self._metrics.error("actuator")
            raise
        if decision.action in (Action.DRAIN, Action.SCALE_IN):
            self._tracker.answered(decision.nodes, datetime.now(UTC))

    def keep(self, jobs: list[Job], now: datetime, writes: int, shield: Shield) -> bool:
        if not isinstance(self._inner, Keeper) or not self._is_leader():
            return True  # standing objects are the leader's to keep, like every write
        try:
            return self._inner.keep(jobs, now, writes, shield)
        except NotLeader:
            raise
        except Exception:
            self._metrics.error("actuator")
            raise
