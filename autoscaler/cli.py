"""`spot-autoscaler` command line: each subcommand is a small function returning an exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from autoscaler import __version__
from autoscaler.atomic import atomic_write
from autoscaler.bench.command import add_parser as _add_bench
from autoscaler.bench.params import ParamsError
from autoscaler.config import Config, ConfigError, check_config, load_config
from autoscaler.core.policy import parse_duration
from autoscaler.daemon.command import add_parser as _add_run
from autoscaler.decisionlog import (
    STDIN,
    Filter,
    LogInputError,
    ReadStats,
    log_lines,
    parse_ts,
    read_decisions,
    render_table,
)
from autoscaler.programs.discovery_sidecar import add_parser as _add_discovery_sidecar
from autoscaler.programs.discovery_sidecar import add_scripts_parser as _add_discovery_scripts
from autoscaler.programs.node_agent import add_parser as _add_node_agent
from autoscaler.sim.plot import plot_summary
from autoscaler.sim.run import simulate
from autoscaler.sim.trace import TraceError, read_trace, synthetic_trace
from autoscaler.terminal import progress_bar

# 2: the command line, a config or params file, or a named input that cannot be opened;
# 1: anything that went wrong while running; 141: stdout closed early (as `cat` under `head`).
EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG, EXIT_PIPE_CLOSED = 0, 1, 2, 141


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever goes wrong ends in one line on stderr and an exit code, never a
    traceback (`--debug` shows one for errors we did not foresee)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except ParamsError as exc:
        print(f"params error:\n{exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except LogInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except BrokenPipeError:
        _detach_stdout()
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        return 130
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        if args.debug:
            raise
        if exc.filename is None:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except Exception as exc:
        if args.debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (--debug shows where)", file=sys.stderr)
        return EXIT_FAILED


def _detach_stdout() -> None:
    """The reader went away (`| head`): point stdout at /dev/null so that the interpreter's
    flush at exit has nowhere to fail and prints no "Exception ignored" traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spot-autoscaler",
        description="Scale elastic Horovod jobs on spot GPUs from preemption notices, idle "
        "capacity and cost policies.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _COMMANDS:
        register(sub)
    return parser


# --- simulate ----------------------------------------------------------------------------------
def _add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay spot availability through the core (no cluster, no cloud)",
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


# --- check-config -------------------------------------------------------------------------------
def _add_check_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-config", help="validate a policy YAML file; list every problem")
    p.add_argument("file", type=Path)
    p.set_defaults(func=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Exit 2 on problems; warnings are printed (stderr) but the file is still OK (exit 0)."""
    try:
        config, warnings = check_config(args.file, now=datetime.now(UTC))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{args.file}: {len(exc.problems)} problem(s)", file=sys.stderr)
        return EXIT_BAD_CONFIG
    for warning in warnings:
        print(warning, file=sys.stderr)
    names = ", ".join(p.name for p in config.policy_set.policies)
    noted = f", {len(warnings)} warning(s)" if warnings else ""
    print(f"{args.file}: OK ({len(config.policy_set.policies)} policies: {names}){noted}")
    return EXIT_OK


# --- decisions ----------------------------------------------------------------------------------
def _add_decisions(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decisions",
        help="show decision log lines as a table, filtered",
        description="Read decision logs (plain or gzip, rotated files oldest first, a directory's "
        "decisions.jsonl*, or - for stdin) and show the decisions as a table or JSON lines. Exit 1 "
        "when the input holds no decision at all.",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="log files; default: stdin")
    p.add_argument("--job", help="ns/name, or a bare job name")
    p.add_argument("--reason", help="reason code (matches the primary reason or a tag)")
    p.add_argument("--action", choices=["scale_out", "scale_in", "drain", "undrain", "noop"])
    p.add_argument("--since", type=_since, help="ISO time, or a duration back from now (e.g. 1h)")
    p.add_argument("--json", action="store_true", help="print the matching lines as JSON lines")
    p.set_defaults(func=cmd_decisions)


def _since(value: str) -> datetime:
    ts = parse_ts(value)
    if ts is not None:
        return ts
    try:
        return datetime.now(UTC) - parse_duration(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time or a duration: {value!r}") from None


def cmd_decisions(args: argparse.Namespace) -> int:
    keep = Filter(job=args.job, reason=args.reason, action=args.action, since=args.since)
    stats = ReadStats()
    with closing(log_lines(args.files)) as lines:
        events = (e for e in read_decisions(lines, stats) if keep.keeps(e))
        if args.json:
            out: Iterable[str] = (json.dumps(e) + "\n" for e in events)
        else:
            console = _table_console()
            with console.capture() as table:
                render_table(events, console)
            # no table at all when nothing in the input was a decision (not an empty one)
            out = table.get().splitlines(keepends=True) if stats.decisions else []
        # line by line: a reader gone away (`| head`) shows as BrokenPipeError, which main
        # ends quietly; one large write can be cut short without any error
        for line in out:
            sys.stdout.write(line)
        sys.stdout.flush()
    inputs = ", ".join(args.files) or STDIN
    if stats.skipped:
        print(
            f"{inputs}: {len(stats.skipped)} of {stats.lines} line(s) are not decisions",
            file=sys.stderr,
        )
    if not stats.decisions:
        print(f"{inputs}: no decision lines (is this a decision log?)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


_UNWRAPPED = 10_000  # columns of a piped table: wide enough that no row ever folds


def _table_console() -> Console:
    """The terminal's width on a terminal; piped, rows never wrap (one row, one line)."""
    console = Console()
    return console if console.is_terminal else Console(width=_UNWRAPPED, no_color=True)


_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_run,
    _add_simulate,
    _add_bench,
    _add_check_config,
    _add_decisions,
    _add_node_agent,
    _add_discovery_sidecar,
    _add_discovery_scripts,
]

if __name__ == "__main__":
    sys.exit(main())
