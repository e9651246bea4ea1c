"""The tree stays lint-clean, formatted, type-correct and simple enough (ruff, mypy and radon;
ruff and mypy configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from radon.visitors import Class, ComplexityVisitor, Function

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


MAX_COMPLEXITY = 15  # radon's cyclomatic complexity (it counts boolean operators; ruff's C901 not)


def test_no_function_is_more_complex_than_the_limit() -> None:
    sources = sorted((ROOT / "autoscaler").rglob("*.py"))
    assert len(sources) > 50
    too_complex = [
        f"{path.relative_to(ROOT)}:{name}"
        for path in sources
        for name in _too_complex(path.read_text(), MAX_COMPLEXITY)
    ]
    assert too_complex == []


def test_the_reconciler_only_observes_decides_and_hands_off() -> None:
    """Issue 38: write scheduling lives in autoscaler/writes.py; the Reconciler stays small."""
    lines = (ROOT / "autoscaler" / "reconcile.py").read_text().count("\n")
    assert lines < 200


def test_the_complexity_check_sees_methods_closures_and_boolean_operators() -> None:
    branches = "\n".join(
        f"            if x == {i} and y:\n                return {i}" for i in range(8)
    )
    source = f"class Outer:\n    def method(self, x, y):\n        def inner():\n{branches}\n"
    assert _too_complex(source, 16) == ["inner: 17"]
    assert _too_complex(source, 17) == []


def _too_complex(source: str, limit: int) -> list[str]:
    """Every function, method and closure in `source` above `limit`, as "name: complexity"."""
    visitor = ComplexityVisitor.from_code(source)
    return [
        f"{f.fullname}: {f.complexity}"
        for f in _functions(visitor.functions, visitor.classes)
        if f.complexity > limit
    ]


def _functions(functions: Iterable[Function], classes: Iterable[Class]) -> Iterator[Function]:
    """`functions` with their closures, and the methods of `classes` and of their inner classes
    (radon scores each on its own: an outer function's figure leaves out its closures')."""
    for function in functions:
        yield function
        yield from _functions(function.closures, ())
    for cls in classes:
        yield from _functions(cls.methods, cls.inner_classes)
