"""`spot-autoscaler bench`: every policy on one spot trace; bench.json, bench.md, bench.png."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from autoscaler.atomic import atomic_write
from autoscaler.bench.params import BenchParams, load_params
from autoscaler.bench.report import markdown, plot, summary
from autoscaler.bench.runner import run_bench
from autoscaler.config import load_config
from autoscaler.sim.trace import read_trace
from autoscaler.terminal import progress_bar

EXIT_OK = 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="compare the autoscaler with baselines and an oracle on a spot trace",
        description="Replay a spot trace (t_ms,add|remove,nodeN) for on_demand_only, "
        "spot_static_restart, reactive_elastic, autoscaler and oracle on the same workload (with "
        "--deadline also uniform_progress, and the autoscaler paces to the deadline); write "
        "DIR/bench.json, DIR/bench.md, DIR/bench.png and the autoscaler's DIR/decisions.jsonl.",
    )
    p.add_argument("--trace", type=Path, required=True, help="spot availability trace file")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder")
    p.add_argument("--seed", type=int, default=1, help="seed: missed notices, static placement")
    p.add_argument("--params", type=Path, help="workload/model YAML (see docs/benchmarks.md)")
    p.add_argument("--config", type=Path, help="policy YAML for the autoscaler; default: built-in")
    p.add_argument(
        "--job-hours",
        type=_hours,
        metavar="H",
        help="job size: the work max_workers on on-demand do in H hours (default: params, 4)",
    )
    p.add_argument(
        "--deadline",
        type=_hours,
        metavar="D",
        help="every job due D hours after the start: adds uniform_progress, and the autoscaler "
        "paces to it with one worker on on-demand (on-demand nodes from a simulated Karpenter)",
    )
    p.set_defaults(func=cmd_bench)


def _hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not hours > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"hours must be a positive number, not {text!r}")
    return hours


def cmd_bench(args: argparse.Namespace) -> int:
    """A bad params file raises ParamsError: the CLI prints it and exits 2."""
    params = load_params(args.params) if args.params else BenchParams()
    if args.job_hours is not None:
        params = params.with_job_hours(args.job_hours)
    if args.deadline is not None:
        params = params.model_copy(update={"deadline_hours": args.deadline})
    policies = load_config(args.config).policy_set if args.config else None
    trace = read_trace(args.trace)
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    with (
        atomic_write(args.out / "decisions.jsonl") as log,
        progress_bar(
            console, "{task.description:<20}", "{task.completed}/{task.total} policies"
        ) as bar,
    ):
        task = bar.add_task("starting", total=None)

        def starting(name: str, done: int, total: int) -> None:
            bar.update(task, description=name, completed=done, total=total)

        bench = run_bench(params, trace, str(args.trace), args.seed, policies, log, starting)
    result = summary(bench)
    with atomic_write(args.out / "bench.json") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    table = markdown(result)
    with atomic_write(args.out / "bench.md") as f:
        f.write(table)
    wrote = ["bench.json", "bench.md", "decisions.jsonl"]
    try:
        plot(bench, args.out / "bench.png")
        wrote.insert(2, "bench.png")
    except ImportError:
        console.print(
            "no plot: matplotlib is missing (pip install 'spot-autoscaler[bench]')", markup=False
        )
    console.print(table, soft_wrap=True, markup=False)
    console.print(f"wrote {args.out}/{', '.join(wrote)} in {result['wall_seconds']} s")
    return EXIT_OK
