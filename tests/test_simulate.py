"""`simulate` replays spot traces through the real reconciler and core; its outputs add up."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from autoscaler.cli import main
from autoscaler.config import Config
from autoscaler.decisionlog import parse_ts, read_decisions
from autoscaler.sim.run import simulate
from autoscaler.sim.trace import TraceError, TraceEvent, parse_trace, synthetic_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
P3 = TRACES / "bamboo-p3-trace.csv"
needs_traces = pytest.mark.skipif(not P3.exists(), reason=f"Bamboo traces not found at {TRACES}")


@needs_traces
def test_bamboo_p3_every_notice_handled_without_abrupt_loss(tmp_path: Path) -> None:
    assert main(["simulate", "--trace", str(P3), "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    notices = summary["notices"]
    assert summary["duration_hours"] == pytest.approx(11.37, abs=0.01)
    assert notices["removals_with_workers"] > 50
    assert notices["handled_gracefully"] == notices["removals_with_workers"]
    assert notices["missed"] == 0 and notices["workers_lost_abruptly"] == 0
    assert summary["cost_usd"] < summary["on_demand_cost_usd"] / 2
    job = summary["jobs"]["default/bert"]
    assert all(n <= job["max_workers"] for _, n in job["workers_over_time"])
    assert summary["actuation_errors"] == 0
    events = list(read_decisions((tmp_path / "decisions.jsonl").read_text().splitlines()))
    assert {e["action"] for e in events} >= {"scale_out", "scale_in", "drain", "noop"}
    # every host a notice scales in was hidden from discovery at or before its scale-in
    drained_at: dict[str, str] = {}
    for e in events:
        if e["action"] == "drain":
            for host in e["hosts"]:
                drained_at.setdefault(host, e["ts"])
        if e["action"] == "scale_in" and e["reason"] == "preemption_notice":
            assert all(drained_at.get(h, "~") <= e["ts"] for h in e["hosts"]), e


def test_missed_notices_are_counted_as_abrupt_losses() -> None:
    config = Config.model_validate({"simulate": {"notice_miss_probability": 1.0}})
    summary = simulate(
        config, synthetic_trace(seed=3, hours=4), seed=3, decisions_out=io.StringIO()
    )
    n = summary["notices"]
    assert n["posted"] == 0 and n["not_delivered"] > 0
    assert n["missed"] > 0 and n["workers_lost_abruptly"] > 0


def test_same_seed_same_result() -> None:
    def once() -> dict:
        out = io.StringIO()
        summary = simulate(Config(), synthetic_trace(seed=7, hours=3), seed=7, decisions_out=out)
        summary.pop("wall_seconds")
        return {"summary": summary, "log": out.getvalue()}

    assert once() == once()


def test_default_simulate_needs_no_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate"]) == 0
    summary = json.loads((tmp_path / "simulate-out" / "summary.json").read_text())
    assert summary["trace"] == "synthetic(seed=1)" and summary["gpu_hours"]["spot"] > 0
    # the picture's data: spot nodes, notices, cost (sampled, ending at the total)
    assert max(n for _, n in summary["spot_nodes_over_time"]) == summary["nodes_max"]
    assert len(summary["notices_at"]) == summary["notices"]["posted"] > 0
    assert len(summary["cost_over_time"]) <= 501
    assert summary["cost_over_time"][-1][1] == pytest.approx(summary["cost_usd"], abs=0.01)
    assert (tmp_path / "simulate-out" / "summary.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("command", ["simulate", "bench"])
def test_without_matplotlib_no_picture_is_claimed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,node1\n0,add,node2\n3600000,remove,node1\n7200000,remove,node2\n")
    assert main([command, "--trace", str(trace), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "matplotlib is missing" in err and ".png" not in err.split("wrote")[-1]
    assert not list((tmp_path / "o").glob("*.png"))


def test_bad_trace_lines_are_reported_with_their_line() -> None:
    with pytest.raises(TraceError, match=r"t.csv:2: expected"):
        parse_trace("0,add,node1\n5,explode,node1\n", "t.csv")
    with pytest.raises(TraceError, match=r"t.csv:1: time 'x'"):
        parse_trace("x,add,node1\n", "t.csv")


def test_bad_trace_file_is_a_clear_cli_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("0,add\n")
    assert main(["simulate", "--trace", str(bad), "--out", str(tmp_path / "o")]) == 1
    assert "t.csv:1" in capsys.readouterr().err


def test_the_refill_to_min_does_not_hold_back_growth() -> None:
    # 18 nodes at t=0 (fresh, so min_idle holds growth beyond min); the job must not then wait a
    # whole cooldown because its refill to min was a scale-out
    trace = [TraceEvent(0.0, "add", f"node{i}") for i in range(1, 19)]
    trace.append(TraceEvent(3600.0, "remove", "node1"))
    out = io.StringIO()
    simulate(Config(), trace, seed=1, decisions_out=out)
    grown = [e for e in read_decisions(out.getvalue().splitlines()) if e["action"] == "scale_out"]
    assert grown[0]["reason"] == "below_min" and grown[1]["reason"] == "idle_capacity"
    refill_at, growth_at = (parse_ts(e["ts"]) for e in grown[:2])
    assert (growth_at - refill_at).total_seconds() < 120  # min_idle (60 s), not the 2-min cooldown
