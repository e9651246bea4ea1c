"""A progress bar for long commands: on a terminal only (piped output and logs stay clean), and
gone once the command is done."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(console: Console, label: str, detail: str) -> Progress:
    """`label` and `detail` are rich column formats, e.g. "{task.description}"."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn(detail),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
