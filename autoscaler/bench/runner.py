"""Run every policy on the same trace and workload."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from autoscaler.bench.baselines import on_demand_static, oracle, spot_static_restart
from autoscaler.bench.elastic import autoscaler, reactive_elastic
from autoscaler.bench.params import BenchParams
from autoscaler.bench.result import PolicyResult
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
) -> Bench:
    """`policies` drive the autoscaler (default: the built-in default policy)."""
    started = time.perf_counter()
    world = resolve(params, trace, trace_name, seed)
    runs: dict[str, Callable[[], PolicyResult]] = {
        "on_demand_static": lambda: on_demand_static(world),
        "spot_static_restart": lambda: spot_static_restart(world),
        "reactive_elastic": lambda: reactive_elastic(world),
        "autoscaler": lambda: autoscaler(world, policies, decisions_out),
        "oracle": lambda: oracle(world),
    }
    results = {name: run() for name, run in runs.items()}
    return Bench(params, world, results, time.perf_counter() - started)
