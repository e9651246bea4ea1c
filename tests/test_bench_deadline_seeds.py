"""benchmarks/deadline_seeds.py on a tiny family: the same rows one process or two at a time, and
the gate's figures per deadline and over the generated family alone."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from autoscaler.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "seeds.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "deadline_seeds.py"), *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: the gate is broken
    return result, json.loads(out.read_text())


def _report(tmp_path: Path, jobs: int) -> dict:
    args = ["--family", "2", "--job-hours", "1", "--deadlines", "1.5", "2", "--jobs", str(jobs)]
    return _run(tmp_path, *args)[1]


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


def test_a_trace_with_no_spot_runs_on_on_demand_and_one_with_nothing_to_size_is_skipped(
    tmp_path: Path,
) -> None:
    # seed 198 has no spot node at all (its job is sized by the generator's 8 nodes); a trace
    # that only removes names no node up, and nothing gives its count: skipped, the run goes on
    empty = tmp_path / "removes-only.csv"
    empty.write_text("0,remove,node1\n")
    args = [str(empty), "--family", "1", "--first-seed", "198", "--job-hours", "1"]
    result, report = _run(tmp_path, *args, "--deadlines", "1.5")
    assert result.returncode == 0
    reason = "no spot node in the trace and no node count"
    assert f"| removes-only.csv | 1.5 |{' — |' * 6} skipped: {reason} |" in result.stdout
    assert report["aggregate"]["skipped"] == [
        {"trace": "removes-only.csv", "deadline_hours": 1.5, "reason": reason}
    ]
    [row] = report["rows"]
    assert (row["trace"], row["max_workers"]) == ("adversarial-198-8n", 8)
    assert row["up"]["met"] and row["ours"]["met"]


def test_anchor_gives_ours_the_anchor_the_example_config_ships_and_rule_its_rule() -> None:
    spec = importlib.util.spec_from_file_location("seeds", ROOT / "benchmarks/deadline_seeds.py")
    assert spec is not None and spec.loader is not None
    seeds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seeds)
    args = argparse.Namespace(
        rule="uniform_progress", anchor=True, scarce=False, scale_out_timeout=None
    )
    out = seeds.options(args)
    assert out["rule"] == "uniform_progress"
    (policy,) = out["policies"].policies
    shipped = next(
        p for p in load_config(ROOT / "config/example.yaml").policy_set.policies if p.deadline
    )
    assert shipped.on_demand.min_on_demand == 1 and shipped.on_demand.anchor == "at_risk"
    # the anchor as shipped; its max_on_demand (a cap both rules would share) is left out
    assert policy.on_demand == shipped.on_demand.model_copy(update={"max_on_demand": None})
    assert "policies" not in seeds.options(argparse.Namespace(**{**vars(args), "anchor": False}))
