"""The tree stays lint-clean, formatted, type-correct and simple enough (ruff, mypy and radon;
ruff and mypy configured in pyproject.toml)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


MAX_COMPLEXITY = 20  # radon's cyclomatic complexity (it counts boolean operators; ruff's C901 not)


def test_no_function_is_more_complex_than_the_limit() -> None:
    result = run("radon", "cc", "--json", "autoscaler")
    assert result.returncode == 0, result.stdout + result.stderr
    blocks = json.loads(result.stdout)
    assert blocks and all(isinstance(found, list) for found in blocks.values()), result.stdout
    too_complex = sorted(
        f"{path}:{block['lineno']} {block['name']}: {block['complexity']}"
        for path, found in blocks.items()
        for block in _with_closures(found)
        if block["complexity"] > MAX_COMPLEXITY
    )
    assert too_complex == []


def _with_closures(blocks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for block in blocks:
        yield block
        yield from _with_closures(block.get("closures") or [])
