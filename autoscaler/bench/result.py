"""What one policy did over the trace: cost, each job's progress, and series for the plot."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Literal

from autoscaler.bench.progress import Progress
from autoscaler.core.policy import Policy

Rule = Literal["paced", "uniform_progress"]


@dataclass(frozen=True, slots=True)
class Setup:
    """The deadline rule and the on-demand anchor a job's policy ran: a report names them."""

    policy: str
    rule: Rule
    min_on_demand: int
    anchor: Literal["always", "at_risk"]
    max_on_demand: int | None

    @classmethod
    def of(cls, policy: Policy) -> Setup:
        assert policy.deadline is not None
        od = policy.on_demand
        return cls(policy.name, policy.deadline.rule, od.min_on_demand, od.anchor, od.max_on_demand)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "rule": self.rule,
            "anchor": {"min_on_demand": self.min_on_demand, "held": self.anchor},
            "max_on_demand": self.max_on_demand,
        }


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
    setups: dict[str, Setup] = field(default_factory=dict)  # job name -> its deadline setup

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
    def restarts(self) -> int:
        """Whole-job restarts until each job was done (or to the end, for a job never done)."""
        return sum(p.restarts for p in self.jobs)

    @property
    def restarts_after(self) -> int:
        """Whole-job restarts of jobs already done: they cost the job nothing."""
        return sum(p.restarts_after_completion for p in self.jobs)

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
