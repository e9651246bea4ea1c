"""The decision log: a JSON line per decision, and the reader behind `spot-autoscaler decisions`."""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from collections import Counter
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autoscaler.core.model import Decision

EVENT = "decision"


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def decision_fields(decision: Decision, *, now: datetime, dry_run: bool) -> dict[str, Any]:
    """The fields of a decision line (structlog adds `event` and `level`)."""
    return {
        "ts": iso(now),
        "job": decision.job,
        "action": decision.action.value,
        "count": decision.count,
        "from_workers": decision.from_workers,
        "to_workers": decision.to_workers,
        "pods": list(decision.pods),
        "hosts": list(decision.hosts),
        "nodes": list(decision.nodes),
        "reason": decision.reason.value,
        "tags": [t.value for t in decision.tags],
        "policy": decision.policy,
        "dry_run": dry_run,
        "message": decision.message,
    }


def log_decision(logger: Any, decision: Decision, *, now: datetime, dry_run: bool) -> None:
    logger.info(EVENT, **decision_fields(decision, now=now, dry_run=dry_run))


@dataclass
class ReadStats:
    lines: int = 0
    decisions: int = 0
    skipped: list[int] = field(default_factory=list)  # line numbers that were not decisions


def read_decisions(
    lines: Iterable[str], stats: ReadStats | None = None
) -> Iterator[dict[str, Any]]:
    """Decision events from JSON lines; other events and unparsable lines are counted, not fatal."""
    stats = stats if stats is not None else ReadStats()
    for number, line in enumerate(lines, start=1):
        stats.lines += 1
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            stats.skipped.append(number)
            continue
        if not isinstance(event, dict) or event.get("event") != EVENT:
            stats.skipped.append(number)
            continue
        stats.decisions += 1
        yield event


STDIN = "-"
_GZIP_MAGIC = b"\x1f\x8b"
_ROTATION = re.compile(r"\.(\d+)(?:\.gz)?$")  # logrotate's name.1, name.2.gz: higher is older


class LogInputError(Exception):
    """A named input cannot be read as a log (no such file, a directory without logs)."""


def log_lines(names: Sequence[str]) -> Generator[str, None, None]:
    """The lines of every input, oldest first: plain or gzip (told by content, not by name),
    `-` for stdin, a directory for the `decisions.jsonl*` in it. Rotated files (`x.2.gz`,
    `x.1`, `x`) are read in rotation order whatever order they are named in, so a shell glob
    gives the log from its start. Bytes that are not UTF-8 become U+FFFD: such a line is counted
    as not a decision rather than stopping the read."""
    for name in _in_rotation_order(_expand(names or [STDIN])):
        if name == STDIN:
            yield from _stdin_lines()
            continue
        try:
            with Path(name).open("rb") as raw:
                binary = gzip.GzipFile(fileobj=raw) if _gzipped(raw) else raw
                yield from io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
        except (OSError, EOFError) as exc:  # missing, unreadable, a truncated or corrupt gzip
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise LogInputError(f"{name}: {reason}") from None


def _stdin_lines() -> Iterator[str]:
    binary = getattr(sys.stdin, "buffer", None)
    if binary is None:  # replaced by a text stream (tests, embedding)
        yield from sys.stdin
        return
    wrapper = io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
    try:
        yield from wrapper
    finally:
        wrapper.detach()  # stdin is not ours to close


def _gzipped(raw: io.BufferedReader) -> bool:
    return raw.peek(2)[:2] == _GZIP_MAGIC


def _expand(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        path = Path(name)
        if name != STDIN and path.is_dir():
            logs = sorted(str(p) for p in path.glob("decisions.jsonl*") if p.is_file())
            if not logs:
                raise LogInputError(f"{name}: a directory with no decisions.jsonl* in it")
            out.extend(logs)
        else:
            out.append(name)
    return out


def _in_rotation_order(names: list[str]) -> list[str]:
    def age(name: str) -> int:
        match = _ROTATION.search(name)
        return int(match.group(1)) if match else 0

    return sorted(names, key=age, reverse=True)  # stable: unrotated names keep their order


@dataclass(frozen=True)
class Filter:
    job: str | None = None  # exact `ns/name`, or a bare name matching any namespace
    reason: str | None = None  # primary reason or any tag
    action: str | None = None
    since: datetime | None = None

    def keeps(self, event: dict[str, Any]) -> bool:
        job = str(event.get("job", ""))
        if self.job and job != self.job and job.split("/")[-1] != self.job:
            return False
        if (
            self.reason
            and self.reason != event.get("reason")
            and self.reason not in event.get("tags", [])
        ):
            return False
        if self.action and event.get("action") != self.action:
            return False
        if self.since is not None:
            ts = parse_ts(event.get("ts"))
            if ts is None or ts < self.since:
                return False
        return True


def parse_ts(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def render_table(events: Iterable[dict[str, Any]], console: Console) -> int:
    table = Table(show_lines=False, header_style="bold", pad_edge=False)
    for column in ("time", "job", "action", "n", "workers", "reason", "policy", "pods/hosts/nodes"):
        table.add_column(column, no_wrap=column != "pods/hosts/nodes", overflow="fold")
    shown = 0
    for e in events:
        names = Counter(str(w) for w in (e.get("pods") or e.get("hosts") or e.get("nodes") or []))
        who = [f"{name} x{n}" if n > 1 else name for name, n in names.items()]
        if len(who) > 3:
            who = [*who[:3], f"+{len(who) - 3} more"]
        reason = e.get("reason", "")
        if e.get("tags"):
            reason += f" (+{', '.join(e['tags'])})"
        action = e.get("action", "") + (" [dry-run]" if e.get("dry_run") else "")
        cells = (
            str(e.get("ts", "")).replace("T", " ").removesuffix("Z")[:19],
            str(e.get("job", "")),
            action,
            str(e.get("count", "")),
            f"{e.get('from_workers', '?')}->{e.get('to_workers', '?')}",
            reason,
            str(e.get("policy", "")),
            ", ".join(who),
        )
        table.add_row(*(Text(c) for c in cells))  # log content is never Rich markup
        shown += 1
    console.print(table)
    return shown
