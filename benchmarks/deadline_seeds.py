"""`spot-autoscaler bench` with a deadline over several seeds: min/median/max per policy.

The seed draws which notices go missing and where the static job starts; the deadline policies'
figures move with it. For each trace and seed this runs the same `run_bench` the CLI runs and
prints, per policy, completion hours, cost to target and restarts as min / median / max.

    .venv/bin/python benchmarks/deadline_seeds.py ../shared/data/traces/bamboo-p3-trace.csv \
        ../shared/data/traces/bamboo-g4dn-trace.csv [--job-hours 4] [--deadline 8] \
        [--seeds 1 2 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from autoscaler.bench.params import BenchParams
from autoscaler.bench.report import summary
from autoscaler.bench.runner import run_bench
from autoscaler.sim.trace import read_trace

FIGURES = ("completion_hours", "cost_to_target_usd", "restarts")


def spread(values: list[float | None]) -> list[float] | None:
    """[min, median, max], or None when any run never got there."""
    if any(v is None for v in values):
        return None
    known = [float(v) for v in values if v is not None]
    return [round(min(known), 2), round(statistics.median(known), 2), round(max(known), 2)]


def trace_figures(path: Path, params: BenchParams, seeds: list[int]) -> dict[str, Any]:
    trace = read_trace(path)
    runs = [summary(run_bench(params, trace, str(path), seed))["policies"] for seed in seeds]
    return {
        name: {f: spread([run[name][f] for run in runs]) for f in FIGURES}
        | {"met_deadline": all(run[name]["met_deadline"] for run in runs)}
        for name in runs[0]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--job-hours", type=float, default=4.0)
    parser.add_argument("--deadline", type=float, default=8.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    params = BenchParams().with_job_hours(args.job_hours)
    params = params.model_copy(update={"deadline_hours": args.deadline})
    result = {p.name: trace_figures(p, params, args.seeds) for p in args.traces}
    for trace, policies in result.items():
        head = f"--job-hours {args.job_hours:g} --deadline {args.deadline:g}"
        print(f"{trace}: {head}, seeds {args.seeds}")
        print("| policy | completion h | cost to target $ | restarts | met deadline |")
        print("|---|---|---|---|---|")
        for name, f in policies.items():
            cells = ["—" if f[k] is None else " / ".join(f"{v:g}" for v in f[k]) for k in FIGURES]
            print(f"| {name} | {' | '.join(cells)} | {'yes' if f['met_deadline'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
