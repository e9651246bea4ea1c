"""benchmarks/deadline_seeds.py on a tiny family: the same rows one process or two at a time, and
the gate's figures per deadline and over the generated family alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report(tmp_path: Path, jobs: int) -> dict:
    out = tmp_path / f"seeds-{jobs}.json"
    args = ["--family", "2", "--job-hours", "1", "--deadlines", "1.5", "2", "--jobs", str(jobs)]
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "deadline_seeds.py"), *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: the gate is broken
    return json.loads(out.read_text())


def test_two_processes_give_the_same_rows_in_order_and_figures_per_deadline(
    tmp_path: Path,
) -> None:
    one, two = _report(tmp_path, 1), _report(tmp_path, 2)
    assert one["rows"] == two["rows"]
    assert [(r["trace"], r["deadline_hours"]) for r in two["rows"]] == [
        ("adversarial-1-16n", 1.5),
        ("adversarial-1-16n", 2.0),
        ("adversarial-2-24n", 1.5),
        ("adversarial-2-24n", 2.0),
    ]
    aggregate = two["aggregate"]
    assert {k: v["runs"] for k, v in aggregate["by_deadline"].items()} == {"1.5x": 2, "2x": 2}
    assert aggregate["family"]["runs"] == 4 and aggregate["runs"] == 4
