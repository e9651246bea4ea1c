"""What one policy did over the trace: cost, each job's progress, and series for the plot."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from autoscaler.bench.progress import Progress


@dataclass
class Meter:
    """GPUs paid for and workers running, as they change; cost integrates at the GPU price."""

    price_per_gpu_hour: float
    gpus: float = 0.0
    at: float = 0.0
    total: float = 0.0
    cost: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    workers: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])

    def hold(self, t: float, gpus: float) -> None:
        self.advance(t)
        self.gpus = gpus

    def running(self, t: float, workers: int) -> None:
        if self.workers[-1][0] == t:
            self.workers[-1] = (t, workers)
        else:
            self.workers.append((t, workers))

    def advance(self, t: float) -> None:
        self.total += self.gpus * self.price_per_gpu_hour * (t - self.at) / 3600
        self.at = t
        self.cost.append((t, self.total))


@dataclass
class PolicyResult:
    name: str
    cost_usd: float
    jobs: list[Progress]
    workers: list[tuple[float, int]]  # running workers of all jobs: a step series
    cost: list[tuple[float, float]]  # cumulative cost: piecewise linear between points
    actuation_errors: int = 0

    @classmethod
    def metered(cls, name: str, meter: Meter, jobs: list[Progress], end: float) -> PolicyResult:
        meter.advance(end)
        for p in jobs:
            p.advance(end)
        return cls(name, meter.total, jobs, meter.workers, meter.cost)

    @property
    def work_done(self) -> float:
        return sum(p.work for p in self.jobs)

    @property
    def completion(self) -> float | None:
        """Seconds until every job reached its target, or None if one did not."""
        done = [p.completed_at for p in self.jobs]
        return None if any(t is None for t in done) else max(t for t in done if t is not None)

    def cost_at(self, t: float) -> float:
        return interpolate(self.cost, t)

    def work_over_time(self) -> list[tuple[float, float]]:
        """Every job's kept work, summed, as a piecewise-linear series (a drop is a rollback)."""
        if len(self.jobs) == 1:
            return self.jobs[0].history
        times = sorted({t for p in self.jobs for t, _ in p.history})
        return [(t, sum(interpolate(p.history, t) for p in self.jobs)) for t in times]


def interpolate(series: list[tuple[float, float]], t: float) -> float:
    """A piecewise-linear series at `t`: 0 before it starts, its last value after it ends."""
    times = [p[0] for p in series]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return 0.0
    if i == len(series):
        return series[-1][1]
    (t0, v0), (t1, v1) = series[i - 1], series[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
