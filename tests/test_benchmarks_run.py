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
