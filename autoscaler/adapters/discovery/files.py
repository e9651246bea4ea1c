"""Small files other processes read while we write them: atomic, readable by all, idempotent."""

from __future__ import annotations

import os
from pathlib import Path

from autoscaler.atomic import atomic_write


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replace `path` atomically with `text`; False (and no write) when it already holds it.

    The mode is set before the rename: mkstemp's 0600 would hide the file from a launcher or
    horovodrun running as another user.
    """
    try:
        if path.read_text(encoding="utf-8") == text and (path.stat().st_mode & 0o777) == mode:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write(text)
        os.fchmod(f.fileno(), mode)
    return True


def remove_if_present(path: Path) -> bool:
    """Remove `path`; False when it was not there (removing is atomic: readers see it or not)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
