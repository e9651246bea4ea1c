"""The tree stays lint-clean, formatted and type-correct (ruff and mypy, configured in
pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / tool), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


TREE = ("autoscaler", "tests", "benchmarks")


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", *TREE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tree_is_formatted_by_ruff() -> None:
    result = run("ruff", "format", "--check", *TREE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
