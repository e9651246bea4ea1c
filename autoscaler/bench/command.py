"""`spot-autoscaler bench`: every policy on one spot trace; bench.json, bench.md, bench.png."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from autoscaler.atomic import atomic_write
from autoscaler.bench.params import BenchParams, ParamsError, load_params
from autoscaler.bench.report import markdown, plot, summary
from autoscaler.bench.result import Setup
from autoscaler.bench.runner import run_bench
from autoscaler.config import load_config
from autoscaler.core import PolicySet
from autoscaler.sim.trace import read_trace
from autoscaler.terminal import progress_bar

EXIT_OK = 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="compare the autoscaler with baselines and an oracle on a spot trace",
        description="Replay a spot trace (t_ms,add|remove,nodeN) for on_demand_only, "
        "spot_static_restart, reactive_elastic, autoscaler and oracle on the same workload (with "
        "a deadline also uniform_progress, and the autoscaler paces to it under the config's rule, "
        "or --rule); write "
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
        help="every job due D hours after the start (default: params' deadline_hours, else the "
        "config's deadline.within): adds uniform_progress, and the autoscaler paces to it under "
        "the config's deadline and on_demand settings (on-demand nodes from a simulated Karpenter)",
    )
    p.add_argument(
        "--rule",
        choices=["paced", "uniform_progress"],
        help="the autoscaler's deadline rule (default: each policy's deadline.rule)",
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
    policies = load_config(args.config).policy_set if args.config else None
    deadline = args.deadline or params.deadline_hours or _config_deadline(policies)
    if args.rule is not None and deadline is None:
        raise ParamsError("--rule needs a deadline: --deadline H, or a policy's deadline.within")
    params = params.model_copy(update={"deadline_hours": deadline})
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

        bench = run_bench(
            params, trace, str(args.trace), args.seed, policies, log, starting, args.rule
        )
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
    for note in _unused_deadlines(policies, bench.results["autoscaler"].setups):
        console.print(f"note: {note}", markup=False)
    console.print(f"wrote {args.out}/{', '.join(wrote)} in {result['wall_seconds']} s")
    return EXIT_OK


def _config_deadline(policies: PolicySet | None) -> float | None:
    """Hours: the one `deadline.within` the config's policies give (a replay starts at 0, so an
    absolute `deadline.at` needs --deadline); None if no policy has a deadline."""
    deadlines = [p for p in policies.policies if p.deadline is not None] if policies else []
    absolute = [p.name for p in deadlines if p.deadline and p.deadline.within is None]
    if absolute:
        raise ParamsError(f"policy {absolute[0]}: deadline.at is absolute; give --deadline H")
    within = {p.deadline.within for p in deadlines if p.deadline and p.deadline.within}
    if len(within) > 1:
        raise ParamsError("the policies' deadline.within differ; give --deadline H")
    return within.pop().total_seconds() / 3600 if within else None


def _unused_deadlines(policies: PolicySet | None, setups: dict[str, Setup]) -> list[str]:
    """The config's deadline policies no bench job ran under: their rule is not what ran."""
    ran = {s.policy for s in setups.values()}
    return [
        f"policy {p.name}'s deadline (rule {p.deadline.rule}) governs no bench job; "
        + ", ".join(f"{job} ran {s.policy}'s rule {s.rule}" for job, s in setups.items())
        for p in (policies.policies if policies else [])
        if p.deadline is not None and p.name not in ran
    ]
