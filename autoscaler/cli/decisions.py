"""`spot-autoscaler decisions`: decision log lines as a table or JSON lines, filtered."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from contextlib import closing
from datetime import UTC, datetime

from rich.console import Console

from autoscaler.cli.exits import EXIT_FAILED, EXIT_OK
from autoscaler.core.policy import parse_duration
from autoscaler.decisionlog import (
    STDIN,
    Filter,
    ReadStats,
    log_lines,
    parse_ts,
    read_decisions,
    render_table,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decisions",
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
