"""The on-demand rules on plain data: the anchor, the paced deadline rule, Can't Be Late's uniform
progress, their bounds, and the alerts for what cannot be met."""

from __future__ import annotations

from datetime import timedelta

import pytest
from core_fixtures import NOW, job, node, only, policies, run, snapshot

from autoscaler.core import Action, CapacityType, Reason

OD = CapacityType.ON_DEMAND
START = NOW - timedelta(hours=4)


def _deadline(within_h: float = 10, rule: str = "paced", margin: str = "0s", **on_demand) -> dict:
    return {
        "deadline": {"within": f"{within_h}h", "rule": rule, "margin": margin},
        "on_demand": on_demand,
    }


def _job(placement: list[str], progress: float | None, rate: float | None = 0.01, **kw):
    return job(placement=placement, started_at=START, progress=progress, progress_rate=rate, **kw)


def _full_spot(n: int = 8) -> list:
    return [node(f"s{i}", gpus=1, used=1) for i in range(n)]


def test_the_anchor_is_added_past_idle_capacity_when_no_worker_runs_on_demand() -> None:
    nodes = [node("s0", gpus=2, used=2)]
    decisions = run(
        snapshot(nodes, [job(placement=["s0", "s0"])]), policies(on_demand={"min_on_demand": 1})
    )
    (out,) = only(decisions, Action.SCALE_OUT)
    assert (out.reason, out.count, out.nodes) == (Reason.ANCHOR_ON_DEMAND, 1, ())
    assert out.timeout is not None  # a provisioning that never comes is rolled back


def test_an_anchor_on_demand_is_kept_and_not_doubled() -> None:
    nodes = [node("s0", gpus=2, used=2), node("od", gpus=1, used=1, capacity=OD)]
    snap = snapshot(nodes, [job(placement=["s0", "s0", "od"])])
    decisions = run(snap, policies(on_demand={"min_on_demand": 1}))
    assert not only(decisions, Action.SCALE_OUT) and not only(decisions, Action.SCALE_IN)


def test_a_pending_worker_counts_as_the_coming_on_demand_one() -> None:
    nodes = [node("s0", gpus=2, used=2)]
    j = job(placement=["s0", "s0", None])  # type: ignore[list-item]
    decisions = run(snapshot(nodes, [j]), policies(on_demand={"min_on_demand": 1}))
    assert not only(decisions, Action.SCALE_OUT)


def test_idle_spot_comes_before_any_on_demand() -> None:
    nodes = [node("s0", gpus=4, used=1)]
    snap = snapshot(nodes, [_job(["s0"], progress=0.1)])
    (out,) = only(run(snap, policies(**_deadline(min_on_demand=1))), Action.SCALE_OUT)
    assert out.reason is Reason.IDLE_CAPACITY and out.nodes == ("s0", "s0", "s0")


def test_behind_the_pace_adds_just_the_missing_workers_on_demand() -> None:
    # 60% left in 6 h at 2% per worker-hour: 5 workers, which is also max: no time to wait for
    # spot; 2 on spot, so 3 on-demand
    snap = snapshot(_full_spot(2), [_job(["s0", "s1"], progress=0.4, rate=0.02, hi=5)])
    (out,) = only(run(snap, policies(**_deadline())), Action.SCALE_OUT)
    assert (out.reason, out.count, out.nodes) == (Reason.BEHIND_DEADLINE, 3, ())
    assert "needs 5 worker(s)" in out.message


def test_behind_the_pace_waits_for_spot_while_on_demand_alone_could_still_finish() -> None:
    # the same job with max 8: 8 on-demand workers would finish in 3.75 h of the 6 left (1.6x)
    snap = snapshot(_full_spot(2), [_job(["s0", "s1"], progress=0.4, rate=0.02)])
    (out,) = run(snap, policies(**_deadline()))
    assert out.action is Action.NOOP
    assert "could finish 1.6x over: waiting for spot" in out.message


@pytest.mark.parametrize(("hi", "removed"), [(6, 0), (10, 2)])
def test_on_demand_workers_stay_until_the_slack_is_well_clear(hi: int, removed: int) -> None:
    # 60% left in 6 h at 2%: on-demand alone finishes with slack 1.25x at max 6 (inside the
    # band: all three stay), 2x at max 10 (clear: down to the anchor)
    nodes = [*_full_spot(2), node("od", gpus=3, used=3, capacity=OD)]
    snap = snapshot(nodes, [_job(["s0", "s1", "od", "od", "od"], progress=0.4, rate=0.02, hi=hi)])
    decisions = run(snap, policies(**_deadline(min_on_demand=1)))
    assert sum(len(d.pods) for d in only(decisions, Action.SCALE_IN)) == removed


def test_on_pace_with_spot_adds_nothing() -> None:
    # 60% left in 6 h at 2% per worker-hour needs 5: all five on spot
    snap = snapshot(_full_spot(5), [_job([f"s{i}" for i in range(5)], progress=0.4, rate=0.02)])
    decisions = run(snap, policies(**_deadline()))
    assert not only(decisions, Action.SCALE_OUT) and not only(decisions, Action.SCALE_IN)


def test_ahead_removes_on_demand_workers_first_newest_first_down_to_the_anchor() -> None:
    # needs 5 (x1.2 spare = 6): 6 on spot cover it, so of 3 on-demand only the anchor stays
    nodes = [*_full_spot(6), node("od", gpus=3, used=3, capacity=OD)]
    placement = [f"s{i}" for i in range(6)] + ["od"] * 3
    snap = snapshot(nodes, [_job(placement, progress=0.4, rate=0.02, hi=10)])
    (out,) = only(run(snap, policies(**_deadline(min_on_demand=1))), Action.SCALE_IN)
    assert out.reason is Reason.AHEAD_OF_DEADLINE
    assert out.pods == ("bert-worker-8", "bert-worker-7")


def test_the_on_demand_cap_bounds_spend_whatever_the_deadline_says() -> None:
    snap = snapshot(_full_spot(1), [_job(["s0"], progress=0.0, rate=0.02)])
    (out,) = only(run(snap, policies(**_deadline(max_on_demand=2))), Action.SCALE_OUT)
    assert out.count == 2


def test_an_impossible_deadline_is_an_alert_and_stays_within_max() -> None:
    # 100% left in 1 h at 2% per worker-hour: 50 workers, max 8
    snap = snapshot(_full_spot(8), [_job([f"s{i}" for i in range(8)], progress=0.0, rate=0.02)])
    decisions = run(snap, policies(**_deadline(within_h=5)))
    (noop,) = [d for d in decisions if d.action is Action.NOOP]
    assert noop.reason is Reason.DEADLINE_INFEASIBLE and noop.reason.info.alert
    assert "50 workers needed, max 8" in noop.message


def test_an_impossible_deadline_still_fills_to_max_on_demand() -> None:
    snap = snapshot(_full_spot(2), [_job(["s0", "s1"], progress=0.0, rate=0.02)])
    (out,) = only(run(snap, policies(**_deadline(within_h=5))), Action.SCALE_OUT)
    assert out.count == 6 and out.tags == (Reason.DEADLINE_INFEASIBLE,)


def test_a_deadline_without_progress_is_an_alert_and_keeps_only_the_anchor() -> None:
    snap = snapshot(_full_spot(2), [_job(["s0", "s1"], progress=None)])
    decisions = run(snap, policies(**_deadline()))
    (noop,) = [d for d in decisions if d.action is Action.NOOP]
    assert noop.reason is Reason.NO_PROGRESS
    assert "spot-autoscaler.io/progress" in noop.message


def test_never_below_min_when_removing_on_demand() -> None:
    nodes = [node("od", gpus=3, used=3, capacity=OD)]
    snap = snapshot(nodes, [_job(["od"] * 3, progress=0.99, rate=0.02, lo=3)])
    assert not only(run(snap, policies(**_deadline())), Action.SCALE_IN)


@pytest.mark.parametrize(("progress", "expect"), [(0.3, Action.SCALE_OUT), (0.5, Action.NOOP)])
def test_uniform_progress_fills_to_max_below_the_line_and_uses_spot_only_above(
    progress: float, expect: Action
) -> None:
    # 4 h of 10: the line is at 40%
    snap = snapshot(_full_spot(2), [_job(["s0", "s1"], progress=progress)])
    (out,) = run(snap, policies(**_deadline(rule="uniform_progress")))
    assert out.action is expect
    if expect is Action.SCALE_OUT:
        assert (out.reason, out.count) == (Reason.BEHIND_DEADLINE, 6)


@pytest.mark.parametrize(("progress", "removed"), [(0.45, 0), (0.48, 3)])
def test_uniform_progress_keeps_on_demand_until_ahead_by_the_margin(
    progress: float, removed: int
) -> None:
    # 4 h of 10 (less a 30 min margin): the line is at 42.1%, and 30 min of it is 5.3%
    nodes = [*_full_spot(2), node("od", gpus=3, used=3, capacity=OD)]
    snap = snapshot(nodes, [_job(["s0", "s1", "od", "od", "od"], progress=progress)])
    rules = policies(**_deadline(rule="uniform_progress", margin="30m"))
    assert sum(len(d.pods) for d in only(run(snap, rules), Action.SCALE_IN)) == removed


def _aged(j, hours: float):
    """`j` with every worker Ready for `hours`."""
    from dataclasses import replace

    since = NOW - timedelta(hours=hours)
    return replace(j, workers=tuple(replace(w, ready_since=since) for w in j.workers))


@pytest.mark.parametrize(
    ("spot", "age_h", "released"), [(4, 2, True), (4, 0.5, False), (3, 2, False)]
)
def test_the_anchor_leaves_while_spot_is_calm_and_only_then(
    spot: int, age_h: float, released: bool
) -> None:
    nodes = [*_full_spot(spot), node("od", gpus=1, used=1, capacity=OD)]
    j = _aged(job(placement=[*(f"s{i}" for i in range(spot)), "od"]), age_h)
    rules = policies(on_demand={"min_on_demand": 1, "calm_after": "1h"})
    scale_ins = only(run(snapshot(nodes, [j]), rules), Action.SCALE_IN)
    assert bool(scale_ins) is released
    if released:
        assert scale_ins[0].reason is Reason.CONSOLIDATE_TO_SPOT
        assert scale_ins[0].pods == (f"bert-worker-{spot}",)
        assert "spot is calm: 4 spot worker(s) up 1:00:00 or longer" in scale_ins[0].message


def test_a_scaler_in_flight_waits_for_it() -> None:
    from autoscaler.core import Scaler, ScalerKind

    j = _job(["s0"], progress=0.0, rate=0.02, scaler=Scaler(ScalerKind.SCALE_OUT, "x", NOW))
    decisions = run(snapshot(_full_spot(1), [j]), policies(**_deadline()))
    assert [d.reason for d in decisions] == [Reason.SCALER_IN_FLIGHT]


def test_the_deadline_keys_are_validated() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="exactly one of deadline.at and deadline.within"):
        policies(deadline={"within": "1h", "at": "2026-12-01T00:00:00Z"})
    with pytest.raises(ValidationError, match="time zone"):
        policies(deadline={"at": "2026-12-01T00:00:00"})
    with pytest.raises(ValidationError, match="exceeds max_on_demand"):
        policies(on_demand={"min_on_demand": 3, "max_on_demand": 1})
