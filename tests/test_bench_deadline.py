"""`bench --deadline`: the deadline policies on an on-demand pool, and what bench.json says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.bench.elastic import autoscaler
from autoscaler.bench.params import BenchParams
from autoscaler.bench.report import summary
from autoscaler.bench.runner import run_bench
from autoscaler.bench.world import resolve
from autoscaler.cli import main
from autoscaler.core import PolicySet
from autoscaler.core.policy import OnDemandRules, Policy
from autoscaler.sim.trace import TraceEvent, synthetic_trace

DEADLINE_POLICIES = [
    "on_demand_only",
    "spot_static_restart",
    "reactive_elastic",
    "uniform_progress",
    "autoscaler",
    "oracle",
]
HOUR = 3600.0


def _params(job: dict[str, object] | None = None, **extra: object) -> BenchParams:
    spec = {"target_on_demand_hours": 1, **(job or {})}
    return BenchParams.model_validate({"jobs": [spec], **extra})


def _wipe_out() -> list[TraceEvent]:
    """Six spot nodes, all gone from 1 h to 2 h, back until 4 h."""
    nodes = [f"node{i}" for i in range(1, 7)]
    return (
        [TraceEvent(0.0, "add", n) for n in nodes]
        + [TraceEvent(HOUR, "remove", n) for n in nodes]
        + [TraceEvent(2 * HOUR, "add", n) for n in nodes]
        + [TraceEvent(4 * HOUR, "remove", n) for n in nodes]
    )


@pytest.fixture(scope="module")
def deadline_run() -> dict:
    trace = synthetic_trace(seed=4, hours=4, max_nodes=10)
    return summary(run_bench(_params(deadline_hours=2), trace, "synthetic-p3", seed=4))


def test_a_deadline_adds_uniform_progress_and_says_who_met_it(deadline_run: dict) -> None:
    assert deadline_run["deadline_hours"] == 2
    policies = deadline_run["policies"]
    assert list(policies) == DEADLINE_POLICIES
    for name, p in policies.items():
        assert isinstance(p["met_deadline"], bool), name
        done = p["completion_hours"]
        assert p["met_deadline"] == (done is not None and done <= 2), name
        assert p["restarts"] >= 0 and (p["cost_to_target_usd"] is None) == (done is None), name
    assert policies["on_demand_only"]["met_deadline"] and policies["oracle"]["met_deadline"]
    assert policies["autoscaler"]["actuation_errors"] == 0
    assert policies["uniform_progress"]["actuation_errors"] == 0


def test_without_a_deadline_the_policies_and_figures_stay() -> None:
    trace = synthetic_trace(seed=4, hours=4, max_nodes=10)
    result = summary(run_bench(_params(), trace, "synthetic-p3", seed=4))
    assert result["deadline_hours"] is None
    assert "uniform_progress" not in result["policies"]
    assert all(p["met_deadline"] is None for p in result["policies"].values())


def test_job_hours_sizes_the_job() -> None:
    params = BenchParams().with_job_hours(2.5)
    assert [j.target_on_demand_hours for j in params.jobs] == [2.5]


def test_bench_cli_with_a_deadline_writes_the_new_keys(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("".join(f"{e.t * 1000:.0f},{e.kind},{e.node}\n" for e in _wipe_out()))
    out = tmp_path / "o"
    argv = ["bench", "--trace", str(trace), "--out", str(out), "--job-hours", "1"]
    assert main([*argv, "--deadline", "3"]) == 0
    result = json.loads((out / "bench.json").read_text())
    assert result["deadline_hours"] == 3
    assert result["params"]["jobs"][0]["target_on_demand_hours"] == 1
    assert list(result["policies"]) == DEADLINE_POLICIES
    assert all(isinstance(p["met_deadline"], bool) for p in result["policies"].values())
    table = (out / "bench.md").read_text()
    assert "| uniform_progress |" in table and "Deadline 3 h after the start: met by" in table
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "nan"])
def test_a_bad_deadline_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--trace", str(tmp_path / "t.csv"), "--deadline", bad])
    assert exit_.value.code == 2


def _anchor(anchor: str) -> PolicySet:
    """The default policy under `paced` with a one-worker anchor held as `anchor` says."""
    on_demand = OnDemandRules(min_on_demand=1, anchor=anchor)  # type: ignore[arg-type]
    return PolicySet(policies=[Policy(name="default", on_demand=on_demand)])


def _anchored(params: BenchParams, trace: list[TraceEvent], anchor: str) -> dict:
    world = resolve(params, trace, "wipe-out-p3", 1)
    result = autoscaler(world, _anchor(anchor), rule="paced")
    done = result.completion
    return {
        "restarts": sum(p.restarts for p in result.jobs),
        "abrupt": sum(p.abrupt_failures for p in result.jobs),
        "met": done is not None and done <= 6 * HOUR,
        "cost": result.cost_at(done) if done is not None else None,
        "errors": result.actuation_errors,
    }


def test_an_anchor_held_always_survives_a_spot_wipe_out_without_a_restart() -> None:
    # max one above the spot peak: the anchor's ScaleOuts bind to idle spot nodes while there are
    # any (as the kube-scheduler does with a preferred on-demand affinity), so the anchor gets an
    # on-demand node only once spot is full; at max with spot alone it would have no room
    params = _params({"max_workers": 7}, deadline_hours=6)
    policies = summary(run_bench(params, _wipe_out(), "wipe-out-p3", seed=1))["policies"]
    assert policies["reactive_elastic"]["restarts"] > 0  # spot alone: the ring is lost
    always = _anchored(params, _wipe_out(), "always")
    assert always["restarts"] == 0 and always["abrupt"] == 0
    assert always["errors"] == 0 and always["met"]


def test_an_anchor_that_does_not_pay_is_not_held() -> None:
    # a 1 h job due in 6 h: a restart (30 min) fits in the slack many times over, so no anchor
    # is held; the wipe-out restarts the job once, which still finishes in time, for less
    params = _params({"max_workers": 7}, deadline_hours=6)
    always = _anchored(params, _wipe_out(), "always")
    at_risk = _anchored(params, _wipe_out(), "at_risk")
    assert at_risk["restarts"] == 1 and at_risk["met"]
    assert at_risk["cost"] < always["cost"]


def test_at_max_on_spot_alone_only_the_first_wipe_out_restarts_the_job() -> None:
    # max = the spot peak: until spot first runs short the anchor's ScaleOuts bind to idle spot
    # nodes, and an anchor asked for at the notice comes after the nodes are gone
    # (docs/deadlines.md, "Not covered"); from then on it stays and later wipe-outs cost nothing
    nodes = [f"node{i}" for i in range(1, 7)]
    events = [TraceEvent(0.0, "add", n) for n in nodes]
    for gone, back in [(HOUR, 1.5 * HOUR), (3 * HOUR, 3.5 * HOUR)]:
        events += [TraceEvent(gone, "remove", n) for n in nodes]
        events += [TraceEvent(back, "add", n) for n in nodes]
    events += [TraceEvent(5 * HOUR, "remove", n) for n in nodes]
    params = _params({"max_workers": 6, "target_on_demand_hours": 3}, deadline_hours=8)
    policies = summary(run_bench(params, events, "wipe-outs-p3", seed=1))["policies"]
    assert policies["reactive_elastic"]["restarts"] >= 2
    world = resolve(params, events, "wipe-outs-p3", 1)
    assert autoscaler(world, _anchor("always"), rule="paced").restarts == 1


def _bench_cli(tmp_path: Path, config: str | None, *extra: str) -> tuple[int, dict, str]:
    trace = tmp_path / "t.csv"
    trace.write_text("".join(f"{e.t * 1000:.0f},{e.kind},{e.node}\n" for e in _wipe_out()))
    argv = ["bench", "--trace", str(trace), "--out", str(tmp_path / "o"), "--job-hours", "1"]
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        argv += ["--config", str(tmp_path / "c.yaml")]
    code = main([*argv, *extra])
    if code != 0:
        return code, {}, ""
    out = tmp_path / "o"
    return code, json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text()


PACED_ANCHORED = """
policies:
  - name: default
    on_demand: {min_on_demand: 1, anchor: always, max_on_demand: 5}
    deadline: {within: 3h, rule: paced}
"""


def test_bench_runs_the_configs_rule_and_anchor_and_names_them(tmp_path: Path) -> None:
    # no --deadline: the config's deadline.within (3 h) is the bench's
    code, result, table = _bench_cli(tmp_path, PACED_ANCHORED)
    assert code == 0 and result["deadline_hours"] == 3
    policies = result["policies"]
    assert policies["autoscaler"]["deadline_setup"] == {
        "train": {
            "policy": "default",
            "rule": "paced",
            "anchor": {"min_on_demand": 1, "held": "always"},
            "max_on_demand": 5,
        }
    }
    # the baseline keeps the cap but, as in the paper, no anchor
    up = policies["uniform_progress"]["deadline_setup"]["train"]
    assert up["rule"] == "uniform_progress" and up["anchor"]["min_on_demand"] == 0
    assert up["max_on_demand"] == 5
    assert (
        "autoscaler ran `paced` with anchor 1 (always) (policy default, max_on_demand 5)" in table
    )
    assert policies["reactive_elastic"]["deadline_setup"] is None


def test_rule_overrides_the_configs_rule_and_the_default_rule_is_uniform_progress(
    tmp_path: Path,
) -> None:
    code, result, table = _bench_cli(tmp_path, PACED_ANCHORED, "--rule", "uniform_progress")
    assert code == 0
    setup = result["policies"]["autoscaler"]["deadline_setup"]["train"]
    assert setup["rule"] == "uniform_progress" and setup["anchor"]["min_on_demand"] == 1
    code, result, table = _bench_cli(tmp_path, None, "--deadline", "3")
    setup = result["policies"]["autoscaler"]["deadline_setup"]["train"]
    assert (setup["rule"], setup["anchor"]["min_on_demand"]) == ("uniform_progress", 0)
    assert "autoscaler ran `uniform_progress` with anchor none (policy default)" in table


def test_rule_without_a_deadline_is_a_usage_error(tmp_path: Path) -> None:
    assert _bench_cli(tmp_path, None, "--rule", "paced")[0] == 2
    absolute = "policies:\n  - name: default\n    deadline: {at: '2030-01-01T00:00:00Z'}\n"
    assert _bench_cli(tmp_path, absolute)[0] == 2


def test_a_deadline_policy_no_bench_job_runs_under_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = """
policies:
  - name: due
    match: {labels: {deadline: friday}}
    deadline: {within: 3h, rule: paced}
  - name: default
"""
    code, result, _ = _bench_cli(tmp_path, config)
    assert code == 0
    assert result["policies"]["autoscaler"]["deadline_setup"]["train"]["policy"] == "default"
    err = capsys.readouterr().err
    assert "note: policy due's deadline (rule paced) governs no bench job" in err


def test_a_trace_shorter_than_the_deadline_holds_its_last_state_until_then() -> None:
    # six spot nodes for half an hour, then nothing more happens: they stay up
    trace = [TraceEvent(0.0, "add", f"node{i}") for i in range(1, 7)]
    trace.append(TraceEvent(HOUR / 2, "remove", "node6"))
    params = _params({"target_on_demand_hours": 1.5}, deadline_hours=4)
    assert resolve(params, trace, "short-p3", 1).end >= 4 * HOUR
    policies = summary(run_bench(params, trace, "short-p3", seed=1))["policies"]
    for name in ("uniform_progress", "autoscaler", "reactive_elastic", "oracle"):
        assert policies[name]["met_deadline"], name
        assert policies[name]["completion_hours"] > 0.5, name
