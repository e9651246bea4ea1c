"""Policies without a cluster model: fixed on-demand, fixed spot with restarts, the oracle."""

from __future__ import annotations

import random
from itertools import groupby

from autoscaler.bench.progress import throughput
from autoscaler.bench.result import Meter, PolicyResult
from autoscaler.bench.world import BenchJob, World, ceil_div


def on_demand_only(world: World) -> PolicyResult:
    """Max workers on on-demand nodes the whole time: never preempted, paid from the start."""
    meter = Meter(world.gpu_price(spot=False))
    meter.hold(0.0, sum(j.max_workers * j.spec.gpus_per_worker for j in world.jobs))
    start = world.overheads.pod_startup.total_seconds()
    progress = world.progress()
    for job in world.jobs:
        progress[job.key].join(start, job.max_workers)
    meter.running(start, sum(j.max_workers for j in world.jobs))
    return PolicyResult.metered("on_demand_only", meter, list(progress.values()), world.end)


def oracle(world: World) -> PolicyResult:
    """Knows the trace: every available spot node runs a worker (up to max) at zero overhead."""
    meter = Meter(world.gpu_price(spot=True))
    progress = world.progress()
    for t, nodes in world.available:
        counts = share(nodes * world.instance.gpus, world.jobs)
        for job, n in zip(world.jobs, counts, strict=True):
            progress[job.key].resize(t, n)
        gpus = sum(n * j.spec.gpus_per_worker for j, n in zip(world.jobs, counts, strict=True))
        meter.hold(t, gpus)
        meter.running(t, sum(counts))
    return PolicyResult.metered("oracle", meter, list(progress.values()), world.end)


def share(gpus: float, jobs: tuple[BenchJob, ...]) -> list[int]:
    """Workers per job that maximise total throughput on `gpus` GPUs: greedy on the marginal gain
    per GPU, optimal while every job's throughput is concave in its workers."""
    counts = [0] * len(jobs)
    left = gpus
    while True:
        best: tuple[float, int] | None = None
        for i, job in enumerate(jobs):
            spec = job.spec
            if counts[i] >= job.max_workers or spec.gpus_per_worker > left + 1e-9:
                continue
            e = spec.scaling_efficiency
            gain = (throughput(counts[i] + 1, e) - throughput(counts[i], e)) / spec.gpus_per_worker
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, i)
        if best is None:
            return counts
        counts[best[1]] += 1
        left -= jobs[best[1]].spec.gpus_per_worker


def spot_static_restart(world: World) -> PolicyResult:
    """A fixed count of spot workers. A preempted node kills the job; it restarts from its last
    checkpoint once enough nodes are free (nodes picked at random, seeded)."""
    rng = random.Random(world.seed)
    gpn = world.instance.gpus
    meter = Meter(world.gpu_price(spot=True))
    progress = world.progress()
    up: set[str] = set()
    held: dict[str, set[str]] = {j.key: set() for j in world.jobs}
    join_at: dict[str, float] = {}  # job -> when its pods run (it holds nodes meanwhile)
    running: set[str] = set()

    def account(t: float) -> None:
        gpus = sum(j.static_workers * j.spec.gpus_per_worker for j in world.jobs if held[j.key])
        meter.hold(t, gpus)
        meter.running(t, sum(j.static_workers for j in world.jobs if j.key in running))

    def start_pending(until: float, strictly_before: bool) -> None:
        for key, t in sorted(join_at.items(), key=lambda kv: kv[1]):
            if t < until or (t == until and not strictly_before):
                del join_at[key]
                job = next(j for j in world.jobs if j.key == key)
                progress[key].join(t, job.static_workers)
                running.add(key)
                account(t)

    for t, group in groupby(world.trace, key=lambda e: e.t):
        events = list(group)
        start_pending(t, strictly_before=True)
        for e in (e for e in events if e.kind == "remove"):
            up.discard(e.node)
            for job in world.jobs:
                if e.node not in held[job.key]:
                    continue
                if job.key in running:
                    p = progress[job.key]  # the node's workers die; the job dies with them
                    on_node = int(gpn // job.spec.gpus_per_worker)
                    p.abrupt_failures += min(job.static_workers, on_node)
                    p.fail(t)
                    running.discard(job.key)
                held[job.key].clear()
                join_at.pop(job.key, None)
        start_pending(t, strictly_before=False)
        up.update(e.node for e in events if e.kind == "add")
        busy = set().union(*held.values())
        for job in world.jobs:
            need = ceil_div(job.static_workers * job.spec.gpus_per_worker, gpn)
            free = sorted(up - busy)
            if held[job.key] or len(free) < need:
                continue
            held[job.key] = set(rng.sample(free, need))
            busy |= held[job.key]
            join_at[job.key] = t + world.overheads.pod_startup.total_seconds()
        account(t)
    start_pending(world.end, strictly_before=False)
    return PolicyResult.metered("spot_static_restart", meter, list(progress.values()), world.end)
