"""A job's pace, measured from how its progress annotation moved (core/pace.py reads it).

The training script reports only the fraction done, at its commits; a deadline needs the pace
too. Per job, from the readings of the snapshots:
- the fraction one worker does per hour (`progress_rate`): the progress made over the
  worker-hours that ran, between readings at least `_WINDOW` apart;
- the rate of the whole ring at each size it ran at (`Pace.rates`): between the first and the last
  move of the progress while the same running workers trained, once those are `_RING_WINDOW` or
  more apart; the slowest of the last `_KEEP` such stretches per size (a lower bound: resets in a
  stretch slow it, never speed it up);
- the slowest of the last `_KEEP` worker starts (from the pod's creation, or first seen Pending,
  to Ready: node provisioning and pod start-up), and apart the longest of the last `_KEEP` waits
  for on-demand: workers that started off spot, and workers gone while still Pending off spot
  (never started: a ScaleOut that timed out, a node refused or a pool at its limit; their wait
  counts at least the timeout they carried). Apart, so spot workers that start in a minute do
  not age out what on-demand took; later on-demand workers do, so one slow node does not hold
  d̂ up for good (and while d̂ is up, the net buys on-demand sooner: what ages it out comes).
  Then the longest of the last `_KEEP` gaps between two moves of the progress
  (what a failure loses since the last commit), the worst recent restart (a reading lower than
  the last, which also starts the windows again), and the hours workers ran since the progress
  last moved.
State lives here, per job, and is rebuilt after a restart: no pace until a window has passed,
and the core then acts as Uniform Progress does. The daemon's observer and the simulator keep one
each; it reads only the core's model, so it sits in the core (the simulator loads no adapter).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from autoscaler.core.model import Job
from autoscaler.core.pace import Pace

_WINDOW = timedelta(minutes=5)
_RING_WINDOW = timedelta(minutes=3)
_KEEP = 5


@dataclass(slots=True)
class _Window:
    since: datetime
    progress: float
    worker_hours: float = 0.0
    last_at: datetime | None = None
    last_running: int = 0
    rate: float | None = None  # fraction of the job per worker-hour, from the last full window


@dataclass(slots=True)
class _Ring:
    """The running workers' stretch: their count, and the first and last move of progress."""

    size: int
    first: tuple[datetime, float] | None = None
    last: tuple[datetime, float] | None = None


def _recent() -> deque[float]:
    return deque(maxlen=_KEEP)


@dataclass(slots=True)
class _History:
    window: _Window
    ring: _Ring
    progress: float
    moved_at: datetime | None = None  # the last move of progress (while workers ran)
    read_at: datetime | None = None
    stalled_hours: float = 0.0
    rates: dict[int, deque[float]] = field(default_factory=dict)
    starts: deque[float] = field(default_factory=_recent)
    on_demand: deque[float] = field(default_factory=_recent)  # waits off spot, started or not
    gaps: deque[float] = field(default_factory=_recent)
    restarts: deque[float] = field(default_factory=_recent)
    pending_since: dict[str, tuple[datetime, bool]] = field(default_factory=dict)  # on spot?

    def pace(self) -> Pace:
        return Pace(
            rates=tuple(sorted((n, min(xs)) for n, xs in self.rates.items())),
            slowest_start=max(self.starts, default=0.0),
            on_demand_wait=max(self.on_demand, default=0.0),
            commit_gap=max(self.gaps, default=0.0),
            restart_loss=max(self.restarts, default=0.0),
            stalled_hours=self.stalled_hours,
        )


class ProgressRates:
    def __init__(self) -> None:
        self._jobs: dict[str, _History] = {}

    def with_rate(self, job: Job, now: datetime, spot: frozenset[str] = frozenset()) -> Job:
        """`job` with its measured pace (its per-worker rate None until a window has passed with
        progress made); `spot`: the spot nodes' names (a worker elsewhere waited for on-demand)."""
        if job.progress is None:
            self._jobs.pop(job.key, None)
            return job
        running = _ring(job)
        history = self._jobs.get(job.key)
        if history is None:
            history = self._jobs[job.key] = _History(
                _Window(now, job.progress), _Ring(running), job.progress
            )
        _worker_rate(history, job, now)
        _starts(history, job, now, spot)
        _ring_rate(history, job.progress, running, now)
        rate = history.window.rate
        job = replace(job, pace=history.pace())
        return replace(job, progress_rate=rate) if rate is not None else job

    def forget_except(self, keys: set[str]) -> None:
        for gone in self._jobs.keys() - keys:
            del self._jobs[gone]


def _ring(job: Job) -> int:
    """The workers in Horovod's ring: running and not drained."""
    return sum(1 for w in job.workers if not w.pending and w.host not in job.drained_hosts)


def _worker_rate(history: _History, job: Job, now: datetime) -> None:
    """The fraction one worker does per hour, over windows of at least `_WINDOW`."""
    assert job.progress is not None
    window = history.window
    if job.progress < window.progress:
        window = history.window = _Window(now, job.progress, rate=window.rate)
    if window.last_at is not None:
        hours = max(0.0, (now - window.last_at).total_seconds() / 3600)
        window.worker_hours += window.last_running * hours
    window.last_at = now
    window.last_running = sum(1 for w in job.workers if not w.pending)
    made = job.progress - window.progress
    if now - window.since >= _WINDOW and made > 0 and window.worker_hours > 0:
        window.rate = made / window.worker_hours
        window.since, window.progress, window.worker_hours = now, job.progress, 0.0


def _starts(history: _History, job: Job, now: datetime, spot: frozenset[str]) -> None:
    """How long workers took from their creation (or first seen Pending) to Ready; and apart,
    for those off spot, that and how long the ones gone while Pending had waited by then."""
    pending = history.pending_since
    for w in job.workers:
        if w.pending:
            since, _ = pending.get(w.pod, (w.created_at or now, False))
            pending[w.pod] = (since, w.node in spot)
        elif w.pod in pending:
            since, _ = pending.pop(w.pod)
            waited = max(0.0, ((w.ready_since or now) - since).total_seconds())
            history.starts.append(waited)
            if w.node not in spot:
                history.on_demand.append(waited)
    for gone in pending.keys() - {w.pod for w in job.workers}:
        since, on_spot = pending.pop(gone)
        if not on_spot:
            history.on_demand.append(max(0.0, (now - since).total_seconds()))


def _ring_rate(history: _History, progress: float, running: int, now: datetime) -> None:
    """The ring's rate per size, the gaps between moves, restarts and stalls."""
    moved = progress > history.progress
    if history.read_at is not None and history.ring.size > 0 and not moved:
        history.stalled_hours += (now - history.read_at).total_seconds() / 3600
    history.read_at = now
    if progress < history.progress:  # a restart from a checkpoint
        history.restarts.append(history.progress - progress)
        history.ring, history.moved_at = _Ring(running), None
    elif moved:
        history.stalled_hours = 0.0
        if history.moved_at is not None and history.ring.size == running > 0:
            history.gaps.append((now - history.moved_at).total_seconds())
        history.moved_at = now
    history.progress = progress
    ring = history.ring
    if running != ring.size:
        _close(history)
        history.ring = _Ring(running)
        return
    if moved and running > 0:
        if ring.first is None:
            ring.first = (now, progress)
        else:
            ring.last = (now, progress)
    if ring.first and ring.last and ring.last[0] - ring.first[0] >= _RING_WINDOW:
        _close(history)
        history.ring = _Ring(running, first=ring.last)


def _close(history: _History) -> None:
    """Keep the ring's stretch as a rate sample if it was long enough."""
    ring = history.ring
    if ring.size <= 0 or ring.first is None or ring.last is None:
        return
    (t0, p0), (t1, p1) = ring.first, ring.last
    if t1 - t0 >= _RING_WINDOW and p1 > p0:
        rate = (p1 - p0) / ((t1 - t0).total_seconds() / 3600)
        history.rates.setdefault(ring.size, _recent()).append(rate)
