"""How far one Horovod job gets: throughput of its ring, minus resets, rollbacks and restarts.

Work is counted in single-worker hours: one worker training alone for an hour does 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoscaler.bench.params import Overheads, Workload


def throughput(workers: int, efficiency: float) -> float:
    """Work per hour of a ring of `workers`: each runs at `efficiency ** log2(workers)` of alone."""
    return workers * efficiency ** math.log2(workers) if workers > 0 else 0.0


@dataclass
class Unsaved:
    """Work done since the last periodic save (a commit in memory, or a checkpoint on disk)."""

    interval: float  # seconds of training between saves
    elapsed: float = 0.0  # training seconds since the last save
    work: float = 0.0

    def add(self, seconds: float, rate: float) -> None:
        total = self.elapsed + seconds
        if total >= self.interval:  # saved during this stretch, at a constant rate since
            self.elapsed = total % self.interval
            self.work = rate * self.elapsed
        else:
            self.elapsed = total
            self.work += rate * seconds

    def save(self) -> None:
        self.elapsed = self.work = 0.0


@dataclass
class Progress:
    """One job's ring over time. Times are seconds from the start of the trace, non-decreasing."""

    workload: Workload
    overheads: Overheads
    target: float  # work at which the job would be complete
    ring: int = 0
    at: float = 0.0
    stalled_until: float = 0.0  # a reset (rendezvous, failure detection) blocks training until then
    work: float = 0.0  # kept work (rollbacks subtracted)
    rolled_back: float = 0.0
    resets: int = 0
    graceful_removals: int = 0
    abrupt_failures: int = 0
    restarts: int = 0  # until the job was done
    restarts_after_completion: int = 0  # once done, a restart costs the job nothing: apart
    completed_at: float | None = None
    commit: Unsaved = field(init=False)
    checkpoint: Unsaved = field(init=False)
    cold: bool = False  # the next join restarts the job from its checkpoint
    last_reset: float | None = None
    # (t, work) at every change of pace: piecewise linear between points (a drop is a rollback)
    history: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])

    def __post_init__(self) -> None:
        self.commit = Unsaved(self.workload.commit_interval.total_seconds())
        self.checkpoint = Unsaved(self.workload.checkpoint_interval.total_seconds())

    @property
    def rate(self) -> float:
        """Work per second now (Horovod waits below --min-np)."""
        if self.ring < self.workload.min_workers:
            return 0.0
        return throughput(self.ring, self.workload.scaling_efficiency) / 3600

    @property
    def done(self) -> float:
        """The fraction of the job done, as its training script would report it."""
        return min(1.0, max(0.0, self.work / self.target))

    @property
    def committed(self) -> float:
        """The fraction of the job done as of the last commit: what the training script reports
        (rank 0 annotates after `state.commit()`; a failure rolls back to it)."""
        return min(1.0, max(0.0, (self.work - self.commit.work) / self.target))

    def advance(self, t: float) -> None:
        start, rate = max(self.at, self.stalled_until), self.rate
        if t > start and rate > 0:
            self._record(start)
            gained = rate * (t - start)
            if self.completed_at is None and self.work + gained >= self.target:
                self.completed_at = start + (self.target - self.work) / rate
            self.work += gained
            self.commit.add(t - start, rate)
            self.checkpoint.add(t - start, rate)
            self._record(t)
        self.at = max(self.at, t)

    def _record(self, t: float) -> None:
        if self.history[-1] != (t, self.work):
            self.history.append((t, self.work))

    def resize(self, t: float, workers: int) -> None:
        """Change the ring at no cost (the oracle)."""
        self.advance(t)
        self.ring = workers

    def join(self, t: float, count: int = 1) -> None:
        self.advance(t)
        load = self.workload.checkpoint_load.total_seconds() if self.cold else 0.0
        self.cold = False
        self.ring += count
        self._reset(t, self.overheads.join_reset.total_seconds() + load)

    def leave(self, t: float, graceful: bool, count: int = 1) -> None:
        self.advance(t)
        self.ring -= count
        if graceful:
            self.graceful_removals += count
        else:
            self.abrupt_failures += count
        if self.ring == 0:  # "No hosts from previous set remaining": the driver stops the job
            self.fail(t)
            return
        cost = self.overheads.graceful_reset.total_seconds()
        if not graceful:  # survivors block in a collective until Gloo times out, then roll back
            self._rollback(self.commit.work)
            cost += self.overheads.failure_detection.total_seconds()
        self._reset(t, cost)

    def fail(self, t: float) -> None:
        """The job dies: it restarts from its last checkpoint when it next gets workers."""
        self.advance(t)
        self.ring = 0
        self._rollback(self.checkpoint.work)
        if self.completed_at is None:
            self.restarts += 1
        else:
            self.restarts_after_completion += 1
        self.cold = True

    def _rollback(self, work: float) -> None:
        self.work -= work
        self.rolled_back += work
        self.commit.work = max(0.0, self.commit.work - work)
        self.checkpoint.work = max(0.0, self.checkpoint.work - work)
        self._record(self.at)

    def _reset(self, t: float, seconds: float) -> None:
        """Changes at one instant share one reset; a reset ends with the state committed."""
        if t == self.last_reset:
            self.stalled_until = max(self.stalled_until, t + seconds)
        else:
            self.stalled_until = max(self.stalled_until, t) + seconds
            self.resets += 1
            self.last_reset = t
        self.commit.save()
