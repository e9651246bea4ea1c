"""The committed benchmarks still run, on tiny sizes (their figures come from the full runs in
docs/benchmarks.md; here only that they work and keep their output keys)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_scale_runs_and_reports_its_keys(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = run("scale.py", "--sizes", "100:10", "--repeat", "1", "--no-kube", "--json", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    [size] = json.loads(out.read_text())["sizes"]
    assert size["nodes"] == 100 and size["decide"]["cpu_ms"] >= 0 and size["rss_peak_mb"] > 0


def test_notice_delay_runs() -> None:
    result = run("notice_delay.py", "-n", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "median" in result.stdout


def test_deadline_seeds_runs_the_gate_and_reports_its_keys(tmp_path: Path) -> None:
    out = tmp_path / "deadline.json"
    args = ["--family", "1", "--job-hours", "1", "--deadlines", "2", "--json", str(out)]
    result = run("deadline_seeds.py", *args)
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: the gate is broken
    report = json.loads(out.read_text())
    [row] = report["rows"]
    assert row["trace"] == "adversarial-1-16n" and row["deadline_hours"] == 2
    assert set(row["ours"]) == {"completion_hours", "met", "cost_to_target", "restarts", "resets"}
    aggregate = report["aggregate"]
    assert aggregate["runs"] == 1 and (result.returncode == 1) == bool(aggregate["gate_broken_by"])
