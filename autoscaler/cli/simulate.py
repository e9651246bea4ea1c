"""`spot-autoscaler simulate`: replay a spot trace through the decision core, no cluster needed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from autoscaler.atomic import atomic_write
from autoscaler.cli.exits import EXIT_OK
from autoscaler.config import Config, load_config
from autoscaler.core.policy import parse_duration
from autoscaler.sim.plot import plot_summary
from autoscaler.sim.run import simulate
from autoscaler.sim.trace import read_trace, synthetic_trace
from autoscaler.terminal import progress_bar


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        description="Replay a spot trace (t_ms,add|remove,nodeN) or a seeded synthetic one through "
        "the decision core; write DIR/decisions.jsonl and DIR/summary.json.",
    )
    p.add_argument("--trace", type=Path, help="trace file; default: a synthetic trace from --seed")
    p.add_argument(
        "--seed", type=int, default=1, help="seed of the synthetic trace and missed notices"
    )
    p.add_argument("--config", type=Path, help="policy YAML; default: built-in defaults")
    p.add_argument("--out", type=Path, default=Path("simulate-out"), help="output folder")
    p.add_argument("--lead-time", type=parse_duration, help="notice lead time (default 120s)")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else Config()
    if args.lead_time is not None:
        config = config.model_copy(
            update={
                "simulate": config.simulate.model_copy(update={"notice_lead_time": args.lead_time})
            }
        )
    s = config.simulate.synthetic
    trace = (
        read_trace(args.trace)
        if args.trace
        else synthetic_trace(
            args.seed,
            s.hours,
            s.max_nodes,
            s.mean_up_hours,
            s.mean_down_hours,
            s.wave_every_hours,
            s.wave_fraction,
        )
    )
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    with (
        atomic_write(args.out / "decisions.jsonl") as log,
        progress_bar(console, "simulating", "{task.fields[at]}") as bar,
    ):
        task = bar.add_task("sim", total=1.0, at="")

        def progress(t: float, end: float) -> None:
            bar.update(task, completed=t / end if end else 1.0, at=f"{t / 3600:5.2f} h")

        summary = simulate(config, trace, args.seed, log, progress)
    summary = {
        "trace": str(args.trace) if args.trace else f"synthetic(seed={args.seed})",
        **summary,
    }
    with atomic_write(args.out / "summary.json") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    wrote = ["decisions.jsonl", "summary.json"]
    try:
        plot_summary(summary, args.out / "summary.png")
        wrote.append("summary.png")
    except ImportError:
        console.print("no picture: matplotlib is missing (pip install 'spot-autoscaler[bench]')")
    _print_summary(console, summary, args.out, wrote)
    return EXIT_OK


def _print_summary(console: Console, summary: dict, out: Path, wrote: list[str]) -> None:
    n, gpu_h = summary["notices"], summary["gpu_hours"]
    cost, on_demand = summary["cost_usd"], summary["on_demand_cost_usd"]
    saved = f"{1 - cost / on_demand:.0%}" if on_demand else "-"
    lines = [
        f"[bold]{summary['trace']}[/]: {summary['duration_hours']} h, "
        f"up to {summary['nodes_max']} spot nodes",
        *(
            f"  {key}: mean {job['mean_workers']} workers "
            f"(min {job['min_workers']}, max {job['max_workers']})"
            for key, job in summary["jobs"].items()
        ),
        f"  GPU-hours spot {gpu_h['spot']}, on-demand {gpu_h['on-demand']}; "
        f"cost ${cost} vs ${on_demand} on-demand ({saved} saved)",
        f"  notices {n['posted']}: {n['handled_gracefully']} node(s) drained in time, "
        f"{n['missed']} missed; workers {n['workers_removed_gracefully']} left gracefully, "
        f"{n['workers_lost_abruptly']} abruptly",
        f"  wrote {out}/{', '.join(wrote)} in {summary['wall_seconds']} s",
    ]
    for line in lines:
        console.print(line)
