"""Run every policy on the same trace and workload."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from autoscaler.bench.baselines import on_demand_only, oracle, spot_static_restart
from autoscaler.bench.elastic import autoscaler, reactive_elastic, uniform_progress
from autoscaler.bench.params import BenchParams
from autoscaler.bench.result import PolicyResult, Rule
from autoscaler.bench.world import World, resolve
from autoscaler.core import PolicySet
from autoscaler.sim.trace import TraceEvent


@dataclass
class Bench:
    params: BenchParams
    world: World
    results: dict[str, PolicyResult]  # in POLICIES order
    wall_seconds: float


def run_bench(
    params: BenchParams,
    trace: list[TraceEvent],
    trace_name: str,
    seed: int,
    policies: PolicySet | None = None,
    decisions_out: TextIO | None = None,
    starting: Callable[[str, int, int], None] | None = None,
    rule: Rule | None = None,
) -> Bench:
    """`policies` drive the autoscaler and uniform_progress (default: the built-in default
    policy); uniform_progress runs only with a deadline (params.deadline_hours), and the
    autoscaler then under `rule` if given, else its policies' own. `starting(name, i, n)` hears
    of each policy's run before it starts (a progress bar)."""
    started = time.perf_counter()
    world = resolve(params, trace, trace_name, seed)
    runs: dict[str, Callable[[], PolicyResult]] = {
        "on_demand_only": lambda: on_demand_only(world),
        "spot_static_restart": lambda: spot_static_restart(world),
        "reactive_elastic": lambda: reactive_elastic(world),
        "uniform_progress": lambda: uniform_progress(world, policies),
        "autoscaler": lambda: autoscaler(world, policies, decisions_out, rule),
        "oracle": lambda: oracle(world),
    }
    if world.deadline is None:  # the uniform-progress rule is about a deadline
        del runs["uniform_progress"]
    results: dict[str, PolicyResult] = {}
    for i, (name, run) in enumerate(runs.items()):
        if starting is not None:
            starting(name, i, len(runs))
        results[name] = run()
    return Bench(params, world, results, time.perf_counter() - started)
