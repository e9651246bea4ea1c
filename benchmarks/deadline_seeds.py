"""The deadline rule against Uniform Progress on real and adversarial traces: the dominance gate.

For each trace and deadline (multiples of the job's on-demand time, default 1.5x and 2x) this
replays the autoscaler's `paced` rule and the `uniform_progress` baseline (autoscaler/bench/
dominance.py) and prints one row per trace, then the aggregate: deadlines missed where UP met
them, cost to the work target against UP (min / median / max), whole-job restarts, and every
trace that breaks the gate (a deadline UP meets and we miss, or a cost above UP's), also per
deadline and over the generated family alone. Exits 1 when the gate is broken.

The traces: those named on the command line (e.g. Bamboo's, read from ../shared/data/traces/),
and `--family N` adversarial ones (seeds 1..N: autoscaler/sim/adversarial.py), each
`--family-hours` long (default 2.5x the job) with 8, 16 or 24 spot nodes by seed. The job's max
is what the cluster holds: a generated trace's node count (one with no spot at all runs on
on-demand alone), a file's most nodes up at once; a trace with nothing to size the job by is
skipped, with its reason in the table and the aggregate's `skipped`.

    .venv/bin/python benchmarks/deadline_seeds.py ../shared/data/traces/bamboo-p3-trace.csv \\
        ../shared/data/traces/bamboo-g4dn-trace.csv --family 200 [--job-hours 4] \\
        [--deadlines 1.5 2] [--jobs 2] [--json FILE]

`--jobs N` replays N traces at a time in separate processes (the rows and figures are the same).
`--scarce` replays with scarce on-demand (autoscaler/bench/dominance.py `Scarcity`: nodes take
2-20 min, seeded, a fifth are refused, the pool holds a third of the job's max workers), and
`--scale-out-timeout MINUTES` sets the policy's `scale_out.timeout` (default 6). `--rule R` runs
ours under R (default paced), and `--anchor` gives ours the anchor config/example.yaml ships (UP
never has one): `--rule uniform_progress --anchor` is the shipped default against plain UP.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from autoscaler.bench.dominance import Row, Scarcity, Skipped, aggregate, compare, gate
from autoscaler.bench.params import BenchParams
from autoscaler.config import load_config
from autoscaler.core import PolicySet
from autoscaler.core.policy import OnDemandRules, Policy
from autoscaler.sim.adversarial import adversarial_trace
from autoscaler.sim.trace import TraceEvent, read_trace

EXAMPLE = Path(__file__).resolve().parents[1] / "config" / "example.yaml"
NODES = (8, 16, 24)  # spot nodes of a generated trace, by seed
FAMILY = "adversarial-"  # the generated traces' names start so


def traces(args: argparse.Namespace) -> Iterator[tuple[str, list[TraceEvent], int | None]]:
    """Each trace with the spot nodes its cluster has, where known: a generated trace's count
    (the job is sized by it, spot or none); a file's job is sized by the most it has up at once
    (Bamboo's name every new node anew: p3's 79 names are at most 32 nodes up)."""
    for path in args.traces:
        yield path.name, read_trace(path), None
    hours = args.family_hours or 2.5 * args.job_hours
    for seed in range(args.first_seed, args.first_seed + args.family):
        nodes = NODES[seed % len(NODES)]
        yield f"{FAMILY}{seed}-{nodes}n", adversarial_trace(seed, hours, nodes), nodes


def _compare(
    task: tuple[BenchParams, list[TraceEvent], str, float, dict[str, Any]],
) -> Row | Skipped:
    *positional, options = task
    return compare(*positional, **options)


def shipped_anchor() -> OnDemandRules:
    """The anchor config/example.yaml ships on its deadline policy (`min_on_demand`, `anchor`,
    `calm_after`, `calm_spot_workers`), without its `max_on_demand`: that cap is left as both
    rules have it, so the two runs differ by the anchor alone."""
    shipped = next(p for p in load_config(EXAMPLE).policy_set.policies if p.deadline is not None)
    return shipped.on_demand.model_copy(update={"max_on_demand": None})


def options(args: argparse.Namespace) -> dict[str, Any]:
    """compare's keywords for `--rule`, `--scarce`, `--anchor` (ours holds the shipped anchor;
    uniform_progress never has one) and `--scale-out-timeout` (with `scalers.max_age` past it,
    as check-config wants: a ScaleOut waiting for its pods is not stuck)."""
    out: dict[str, Any] = {"rule": args.rule, "scarcity": Scarcity() if args.scarce else None}
    if args.scale_out_timeout is None and not args.anchor:
        return out
    timeout = args.scale_out_timeout and timedelta(minutes=args.scale_out_timeout)
    anchor = shipped_anchor().model_dump() if args.anchor else None

    def policy(p: Policy) -> Policy:
        update: dict[str, Any] = {"on_demand": anchor} if anchor else {}
        if timeout:
            update["scale_out"] = p.scale_out.model_dump() | {"timeout": timeout}
            age = max(p.scalers.max_age, timeout + timedelta(minutes=5))
            update["scalers"] = p.scalers.model_dump() | {"max_age": age}
        return Policy.model_validate(p.model_dump() | update)

    rules = PolicySet()
    out["policies"] = rules.model_copy(update={"policies": [policy(p) for p in rules.policies]})
    return out


def _cell(v: object) -> str:
    if v is None:
        return "—"
    return f"{v:g}" if isinstance(v, float) else str(v)


def row_line(r: Row) -> str:
    o, u = r.ours, r.up
    return (
        f"| {r.trace} | {r.deadline_hours:g} | {_cell(u.completion_hours)} | "
        f"{_cell(o.completion_hours)} | {_cell(u.cost_to_target)} | {_cell(o.cost_to_target)} | "
        f"{_cell(r.cost_ratio)} | {u.restarts} / {o.restarts} | "
        f"{'; '.join(r.breaks) or 'ok'} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--job-hours", type=float, default=4.0)
    parser.add_argument("--deadlines", type=float, nargs="+", default=[1.5, 2.0])
    parser.add_argument("--family", type=int, default=0, help="adversarial traces (seeds)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--family-hours", type=float, help="default: 2.5 x --job-hours")
    parser.add_argument("--json", type=Path, help="also write rows and aggregate here")
    parser.add_argument("--jobs", type=int, default=1, help="traces replayed at a time")
    parser.add_argument("--scarce", action="store_true", help="scarce on-demand (Scarcity)")
    parser.add_argument("--scale-out-timeout", type=float, help="minutes (policy default: 6)")
    parser.add_argument(
        "--rule", choices=["paced", "uniform_progress"], default="paced", help="ours' rule"
    )
    parser.add_argument(
        "--anchor", action="store_true", help="ours holds the anchor config/example.yaml ships"
    )
    args = parser.parse_args()
    params = BenchParams().with_job_hours(args.job_hours)
    started = time.perf_counter()
    print(f"--job-hours {args.job_hours:g}, deadlines {args.deadlines} x the job's hours")
    print(f"scarce on-demand: {Scarcity() if args.scarce else 'no'}")
    if args.anchor:
        a = shipped_anchor()
        anchor = (
            f"the anchor config/example.yaml ships (min_on_demand {a.min_on_demand}, "
            f"{a.anchor}, calm_after {a.calm_after}, calm_spot_workers {a.calm_spot_workers})"
        )
    print(f"ours: rule {args.rule}, {anchor if args.anchor else 'no anchor'}")
    print("UP: rule uniform_progress, no anchor\n")
    print(
        "| trace | deadline x | UP done h | ours done h | UP $ to target | ours $ | ours/UP "
        "| restarts UP / ours | gate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    tasks = [
        (params, trace, name, multiple * args.job_hours, options(args) | {"nodes": nodes})
        for name, trace, nodes in traces(args)
        for multiple in args.deadlines
    ]
    rows: list[Row] = []
    skipped: list[Skipped] = []
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(_compare, tasks):  # in order, each as soon as it and those before are
            multiple = row.deadline_hours / args.job_hours
            if isinstance(row, Skipped):
                skipped.append(row)
                print(f"| {row.trace} | {multiple:g} |{' — |' * 6} skipped: {row.reason} |")
            else:
                rows.append(row)
                print(row_line(row).replace(f"| {row.deadline_hours:g} |", f"| {multiple:g} |"))
            sys.stdout.flush()
    summary = aggregate(rows)
    summary["skipped"] = [s.as_dict() for s in skipped]
    summary["by_deadline"] = {
        f"{m:g}x": aggregate([r for r in rows if r.deadline_hours == m * args.job_hours])
        for m in args.deadlines
    }
    summary["family"] = aggregate([r for r in rows if r.trace.startswith(FAMILY)])
    summary["wall_seconds"] = round(time.perf_counter() - started, 1)
    print("\n" + json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(
            json.dumps({"rows": [r.as_dict() for r in rows], "aggregate": summary}, indent=2) + "\n"
        )
    return 1 if gate(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
