"""One benchmark's world, resolved: the trace as available spot nodes over time, the node type,
each job's sizes and work target, and the horizon every policy is measured over."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autoscaler.bench.params import BenchParams, Instance, Notices, Overheads, ParamsError, Workload
from autoscaler.bench.progress import Progress, throughput
from autoscaler.config.schema import OnDemandPool
from autoscaler.sim.run import horizon
from autoscaler.sim.trace import TraceEvent

NAMESPACE = "default"  # where the simulated jobs live: keys are "default/<name>"


@dataclass(frozen=True, slots=True)
class BenchJob:
    spec: Workload
    max_workers: int
    static_workers: int
    target: float  # work (single-worker hours) that completes the job

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.spec.name}"


@dataclass(frozen=True, slots=True)
class World:
    trace: list[TraceEvent]
    trace_name: str
    seed: int
    end: float  # seconds: every policy is measured over [0, end] (at least to the deadline)
    available: list[tuple[float, int]]  # spot nodes up, as a step series
    instance: Instance
    jobs: tuple[BenchJob, ...]
    overheads: Overheads
    notices: Notices
    deadline: float | None  # seconds after the start every job must be done by
    pool: OnDemandPool  # on-demand nodes for the deadline policies' pending pods

    def gpu_price(self, spot: bool) -> float:
        node = self.instance.spot_price_per_hour if spot else self.instance.on_demand_price_per_hour
        return node / self.instance.gpus

    def progress(self) -> dict[str, Progress]:
        """A fresh progress model per job, by job key."""
        return {j.key: Progress(j.spec, self.overheads, j.target) for j in self.jobs}

    @property
    def mean_available(self) -> float:
        return time_mean(self.available, self.end)


def resolve(
    params: BenchParams,
    trace: list[TraceEvent],
    trace_name: str,
    seed: int,
    nodes: int | None = None,
) -> World:
    """The world of `trace`; a job without max_workers is sized by `nodes`, the spot nodes the
    trace's cluster has when that is known (a generated trace's count), else by the most the
    trace has up at once."""
    instance = params.instance_for(trace_name)
    deadline = None if params.deadline_hours is None else params.deadline_hours * 3600
    end = horizon(trace, params.overheads.tick, deadline or 0.0)  # a short trace holds to it
    available = availability(trace)
    peak = max(max(n for _, n in available), nodes or 0)
    mean = time_mean(available, end)
    jobs = []
    for spec in params.jobs:
        per_node = int(instance.gpus // spec.gpus_per_worker)
        if per_node < 1:
            raise ParamsError(
                f"job {spec.name}: {spec.gpus_per_worker:g} GPUs per worker do not "
                f"fit on a {instance.name} ({instance.gpus} GPUs)"
            )
        hi = spec.max_workers or peak * per_node
        if spec.min_workers > hi:
            raise ParamsError(f"job {spec.name}: min_workers {spec.min_workers} > max_workers {hi}")
        static = spec.static_workers or min(hi, max(spec.min_workers, int(mean * per_node)))
        target = throughput(hi, spec.scaling_efficiency) * spec.target_on_demand_hours
        jobs.append(BenchJob(spec, hi, static, target))
    return World(
        trace,
        trace_name,
        seed,
        end,
        available,
        instance,
        tuple(jobs),
        params.overheads,
        params.notices,
        deadline,
        params.on_demand_pool,
    )


def availability(trace: list[TraceEvent]) -> list[tuple[float, int]]:
    """(t, spot nodes up after every event at t), starting at (0, 0)."""
    up: set[str] = set()
    series = [(0.0, 0)]
    for e in trace:
        if e.kind == "add":
            up.add(e.node)
        elif e.kind == "remove":
            up.discard(e.node)
        if series[-1][0] == e.t:
            series[-1] = (e.t, len(up))
        else:
            series.append((e.t, len(up)))
    return series


def time_mean(series: Sequence[tuple[float, float]], end: float) -> float:
    """Mean over [0, end] of a step series of (t, value)."""
    if end <= 0:
        return 0.0
    total = 0.0
    for (t0, v), (t1, _) in zip(series, [*series[1:], (end, 0)], strict=True):
        total += v * max(0.0, min(t1, end) - t0)
    return total / end


def merge_steps(series: list[list[tuple[float, int]]]) -> list[tuple[float, int]]:
    """The sum of several step series, as one."""
    points = sorted({t for s in series for t, _ in s})
    out: list[tuple[float, int]] = []
    index = [0] * len(series)
    for t in points:
        total = 0
        for i, s in enumerate(series):
            while index[i] + 1 < len(s) and s[index[i] + 1][0] <= t:
                index[i] += 1
            total += s[index[i]][1] if s and s[index[i]][0] <= t else 0
        out.append((t, total))
    return out


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b - 1e-9)
