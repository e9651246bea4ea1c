"""`bench`: every policy on one trace; the oracle bounds them, and the failure modes show up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.bench.params import BenchParams
from autoscaler.bench.report import summary
from autoscaler.bench.runner import run_bench
from autoscaler.bench.world import resolve
from autoscaler.cli import main
from autoscaler.sim.trace import TraceEvent, synthetic_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
P3 = TRACES / "bamboo-p3-trace.csv"
POLICIES = ["on_demand_only", "spot_static_restart", "reactive_elastic", "autoscaler", "oracle"]
METRICS = {
    "cost_usd",
    "work_done",
    "cost_per_work",
    "completion_hours",
    "cost_to_target_usd",
    "met_deadline",
    "rolled_back_work",
    "resets",
    "graceful_removals",
    "abrupt_failures",
    "restarts",
    "restarts_after_completion",
    "mean_workers",
    "actuation_errors",
    "deadline_setup",
    "vs_oracle",
}


def _trace() -> list[TraceEvent]:
    return synthetic_trace(seed=4, hours=4, max_nodes=10)


def _bench(params: BenchParams | None = None) -> dict:
    bench = run_bench(params or BenchParams(), _trace(), "synthetic-p3", seed=4)
    return summary(bench)


def test_each_policy_run_is_announced_before_it_starts() -> None:
    """What `bench`'s progress bar shows: the policy being run, and how many are done."""
    heard: list[tuple[str, int, int]] = []
    params = BenchParams.model_validate({"jobs": [{"target_on_demand_hours": 0.5}]})
    bench = run_bench(params, _trace(), "t", seed=4, starting=lambda *a: heard.append(a))
    assert [name for name, _, _ in heard] == list(bench.results)
    assert [(i, n) for _, i, n in heard] == [(i, len(bench.results)) for i in range(len(heard))]


@pytest.fixture(scope="module")
def default_run() -> dict:
    # the default target (4 h of on-demand work) is sized for Bamboo's 11-hour traces
    return _bench(BenchParams.model_validate({"jobs": [{"target_on_demand_hours": 1}]}))


def test_oracle_bounds_cost_per_work_exactly_when_scaling_is_linear() -> None:
    # Every policy pays at least for the GPU time it trains on; the oracle pays for nothing else.
    params = BenchParams.model_validate({"jobs": [{"scaling_efficiency": 1.0}]})
    policies = _bench(params)["policies"]
    oracle = policies["oracle"]["cost_per_work"]
    for name, p in policies.items():
        assert p["cost_per_work"] >= oracle, name


def test_oracle_bounds_every_policy_with_the_default_model(default_run: dict) -> None:
    policies = default_run["policies"]
    oracle = policies["oracle"]
    for name, p in policies.items():
        assert p["cost_per_work"] >= oracle["cost_per_work"], name
        if name != "on_demand_only":  # more workers than spot offers: it may finish first
            assert p["work_done"] <= oracle["work_done"], name


def test_on_demand_only_is_never_preempted(default_run: dict) -> None:
    p = default_run["policies"]["on_demand_only"]
    losses = (p["graceful_removals"], p["abrupt_failures"], p["restarts"], p["rolled_back_work"])
    assert losses == (0, 0, 0, 0)
    assert p["resets"] == 1  # the start
    assert p["completion_hours"] == pytest.approx(1.0, abs=0.02)  # the target is sized on it


def test_reactive_fails_abruptly_where_the_autoscaler_drains(default_run: dict) -> None:
    policies = default_run["policies"]
    reactive, ours = policies["reactive_elastic"], policies["autoscaler"]
    static = policies["spot_static_restart"]
    assert reactive["abrupt_failures"] > 0 and reactive["rolled_back_work"] > 0
    assert reactive["graceful_removals"] == 0
    assert ours["graceful_removals"] > 0
    assert ours["abrupt_failures"] == 0 and ours["rolled_back_work"] == 0
    assert ours["actuation_errors"] == 0
    assert static["restarts"] > 0 and static["rolled_back_work"] > 0


def test_missed_notices_turn_into_abrupt_failures() -> None:
    params = BenchParams.model_validate({"notices": {"miss_probability": 1.0}})
    ours = _bench(params)["policies"]["autoscaler"]
    assert ours["abrupt_failures"] > 0 and ours["graceful_removals"] == 0


@pytest.mark.skipif(not P3.exists(), reason=f"Bamboo traces not found at {TRACES}")
def test_bench_cli_writes_json_table_and_plot(tmp_path: Path) -> None:
    assert main(["bench", "--trace", str(P3), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert list(result["policies"]) == POLICIES
    for name, p in result["policies"].items():
        assert set(p) == METRICS, name
        assert set(p["vs_oracle"]) == {"cost_usd", "work_done", "cost_per_work", "completion_hours"}
    assert result["policies"]["oracle"]["vs_oracle"]["cost_per_work"] == 1.0
    assert result["instance"]["name"] == "p3.2xlarge" and result["spot_nodes"]["max"] == 32
    assert set(result["targets"]) == {
        "cost_per_work_vs_oracle",
        "completion_vs_oracle",
        "cheaper_than_on_demand_only",
        "better_than_reactive_elastic",
        "better_than_spot_static_restart",
    }
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    assert "| autoscaler |" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "decisions.jsonl").stat().st_size > 0


def test_g4dn_trace_name_picks_g4dn_prices() -> None:
    world = resolve(BenchParams(), _trace(), "bamboo-g4dn-trace.csv", seed=1)
    assert world.instance.name == "g4dn.xlarge"
    assert world.instance.on_demand_price_per_hour == pytest.approx(0.526)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("jobs:\n  - scaling_efficiency: 2\n", "jobs.0.scaling_efficiency"),
        ("notices:\n  lead_tme: 30s\n", "notices.lead_tme: Extra inputs are not permitted"),
        ("instance: p5.48xlarge\n", "unknown instance 'p5.48xlarge'"),
        ("overheads: [1, 2\n", "bad YAML"),
        ("jobs:\n  - gpus_per_worker: 2\n", "do not fit on a p3.2xlarge"),
    ],
)
def test_bad_params_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(text)
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,node1\n600000,remove,node1\n")
    out = tmp_path / "o"
    assert main(["bench", "--trace", str(trace), "--params", str(params), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "params error" in err and expected in err
