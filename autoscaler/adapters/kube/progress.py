"""What one worker of a job does per hour, from how its progress annotation moved.

The training script reports only the fraction done; a deadline needs the pace too. Between two
readings at least `_WINDOW` apart, the pace is the progress made over the worker-hours that ran
meanwhile (running workers integrated over the snapshots in between). A reading lower than the
last (a restart from a checkpoint) starts the window again. State lives here, per job, and is
rebuilt after a restart within one window: no pace until then, and the core keeps the anchor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from autoscaler.core.model import Job

_WINDOW = timedelta(minutes=5)


@dataclass(slots=True)
class _Window:
    since: datetime
    progress: float
    worker_hours: float = 0.0
    last_at: datetime | None = None
    last_running: int = 0
    rate: float | None = None  # fraction of the job per worker-hour, from the last full window


class ProgressRates:
    def __init__(self) -> None:
        self._jobs: dict[str, _Window] = {}

    def with_rate(self, job: Job, now: datetime) -> Job:
        """`job` with its measured pace (None until a window has passed with progress made)."""
        if job.progress is None:
            self._jobs.pop(job.key, None)
            return job
        window = self._jobs.get(job.key)
        if window is None or job.progress < window.progress:
            rate = window.rate if window is not None else None
            window = self._jobs[job.key] = _Window(now, job.progress, rate=rate)
        if window.last_at is not None:
            hours = max(0.0, (now - window.last_at).total_seconds() / 3600)
            window.worker_hours += window.last_running * hours
        window.last_at = now
        window.last_running = sum(1 for w in job.workers if not w.pending)
        made = job.progress - window.progress
        if now - window.since >= _WINDOW and made > 0 and window.worker_hours > 0:
            window.rate = made / window.worker_hours
            window.since, window.progress, window.worker_hours = now, job.progress, 0.0
        return replace(job, progress_rate=window.rate) if window.rate is not None else job

    def forget_except(self, keys: set[str]) -> None:
        for gone in self._jobs.keys() - keys:
            del self._jobs[gone]
