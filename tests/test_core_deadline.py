"""The on-demand rules on plain data: the anchor, Uniform Progress with its hysteresis and Safety
Net, the paced rule that buys fewer workers than it, the bounds on throughput they read, the
alerts for what cannot be met, and a replay with a wrong model (throughput 20% below the
estimate, changeovers twice as long): the paced rule still meets every deadline UP meets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest
from core_fixtures import LONG_AGO, NOW, job, node, only, policies, run, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.core import Action, CapacityType, GpuNode, Job, Reason, Snapshot, Worker, decide
from autoscaler.core.pace import Pace

OD = CapacityType.ON_DEMAND
START = NOW - timedelta(hours=4)  # with `within: 10h` and no margin, the line is at 40%


def _deadline(within_h: float = 10, rule: str = "paced", margin: str = "0s", **on_demand) -> dict:
    return {
        "deadline": {"within": f"{within_h}h", "rule": rule, "margin": margin},
        "on_demand": on_demand,
    }


def _job(placement: list[str], progress: float | None, pace: Pace | None = None, **kw):
    return job(placement=placement, started_at=START, progress=progress, pace=pace, **kw)


def _full_spot(n: int = 8) -> list:
    return [node(f"s{i}", gpus=1, used=1) for i in range(n)]


def _spot_on(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


# 8 workers were seen doing 16% of the job an hour: 4 would do at least 8%, at most 16%
MEASURED = Pace(rates=((8, 0.16),))


# --- the anchor ----------------------------------------------------------------------------


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


def _aged(j, hours: float):
    """`j` with every worker Ready for `hours`."""
    since = NOW - timedelta(hours=hours)
    return replace(j, workers=tuple(replace(w, ready_since=since) for w in j.workers))


@pytest.mark.parametrize(
    ("spot", "age_h", "released"), [(4, 2, True), (4, 0.5, False), (3, 2, False)]
)
def test_the_anchor_leaves_while_spot_is_calm_and_only_then(
    spot: int, age_h: float, released: bool
) -> None:
    nodes = [*_full_spot(spot), node("od", gpus=1, used=1, capacity=OD)]
    j = _aged(job(placement=[*_spot_on(spot), "od"]), age_h)
    rules = policies(on_demand={"min_on_demand": 1, "calm_after": "1h"})
    scale_ins = only(run(snapshot(nodes, [j]), rules), Action.SCALE_IN)
    assert bool(scale_ins) is released
    if released:
        assert scale_ins[0].reason is Reason.CONSOLIDATE_TO_SPOT
        assert scale_ins[0].pods == (f"bert-worker-{spot}",)
        assert "spot is calm: 4 spot worker(s) up 1:00:00 or longer" in scale_ins[0].message


@pytest.mark.parametrize(("anchor", "held"), [("at_risk", False), ("always", True)])
def test_with_a_deadline_the_anchor_is_held_only_while_a_restart_would_cost_the_deadline(
    anchor: str, held: bool
) -> None:
    # 55% left, 6 h to go, 8 on-demand do 16%/h: 3.4 h; the slack, 2.6 h, is more than a
    # whole-job restart (30 min, starting again on on-demand): a wipe-out would not cost the
    # deadline
    nodes = [*_full_spot(7), node("od", gpus=1, used=1, capacity=OD)]
    j = _job([*_spot_on(7), "od"], progress=0.45, pace=MEASURED)
    rules = policies(**_deadline(min_on_demand=1, anchor=anchor))
    decisions = run(snapshot(nodes, [j]), rules)
    assert bool(only(decisions, Action.SCALE_IN)) is not held
    if not held:
        (out,) = only(decisions, Action.SCALE_IN)
        assert out.reason is Reason.CONSOLIDATE_TO_SPOT
        assert "no anchor: slack 2.6 h covers a whole-job restart (0.5 h)" in out.message


def test_the_anchor_comes_back_once_the_slack_is_below_a_restart() -> None:
    # 55% left in 6 h at 9.5%/h on 8: 5.8 h, 0.2 h short of a restart; nothing on-demand yet
    slow = Pace(rates=((8, 0.095),))
    j = _job(_spot_on(7), progress=0.45, pace=slow)
    decisions = run(snapshot(_full_spot(7), [j]), policies(**_deadline(min_on_demand=1)))
    (out,) = only(decisions, Action.SCALE_OUT)
    assert "< a whole-job restart" in out.message or out.reason is Reason.BEHIND_DEADLINE


@pytest.mark.parametrize(("spot", "anchored"), [(0, False), (1, True)])
def test_at_a_start_with_no_speed_the_anchor_is_asked_only_once_a_worker_runs_on_spot(
    spot: int, anchored: bool
) -> None:
    # the job's first pass (progress 0 on the line's start), nothing measured: with no worker on
    # spot a wipe-out takes nothing, so no anchor goes ahead of the line's own fill (a pass
    # later; asked first, it held that fill back a whole provisioning); with one, it is asked
    j = job(placement=_spot_on(spot), started_at=NOW, progress=0.0)
    rules = policies(**_deadline(rule="uniform_progress", min_on_demand=1))
    decisions = run(snapshot(_full_spot(spot), [j]), rules)
    scale_outs = only(decisions, Action.SCALE_OUT)
    assert bool(scale_outs) is anchored
    if anchored:
        (out,) = scale_outs
        assert (out.reason, out.count) == (Reason.ANCHOR_ON_DEMAND, 1)
        assert "no speed measured yet < a whole-job restart" in out.message
    else:
        assert "once a worker runs on spot" in decisions[0].message


# --- Uniform Progress (the baseline) ---------------------------------------------------------


@pytest.mark.parametrize(("progress", "expect"), [(0.3, Action.SCALE_OUT), (0.5, Action.NOOP)])
def test_uniform_progress_fills_to_max_below_the_line_and_uses_spot_only_above(
    progress: float, expect: Action
) -> None:
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=progress)])
    (out,) = run(snap, policies(**_deadline(rule="uniform_progress")))
    assert out.action is expect
    if expect is Action.SCALE_OUT:
        assert (out.reason, out.count) == (Reason.BEHIND_DEADLINE, 6)


@pytest.mark.parametrize(("failed_with", "count"), [(None, 6), (3, 3), (0, 1)])
def test_after_a_rolled_back_scale_out_on_demand_is_asked_for_in_what_came(
    failed_with: int | None, count: int
) -> None:
    # et-operator rolls a ScaleOut back whole when not all its workers run in time: a pool that
    # gives 3 of the 6 asked would give none, pass after pass (issue 36's scarcity stress)
    behind = replace(_job(_spot_on(2), progress=0.30), failed_with=failed_with)
    rules = policies(**_deadline(rule="uniform_progress"))
    (out,) = only(run(snapshot(_full_spot(2), [behind]), rules), Action.SCALE_OUT)
    assert (out.reason, out.count) == (Reason.BEHIND_DEADLINE, count)


@pytest.mark.parametrize(
    ("progress", "idle_spot", "removed"), [(0.41, 2, 0), (0.45, 0, 0), (0.45, 2, 2)]
)
def test_uniform_progress_leaves_on_demand_only_for_spot_and_only_ahead_of_two_changeovers(
    progress: float, idle_spot: int, removed: int
) -> None:
    # the line is at 40%, and two changeovers (2 x 5 min) later at 41.7%: at 41% the
    # on-demand workers stay whatever; at 45% they leave as spot takes their place, never idle
    nodes = [*_full_spot(2), node("od", gpus=3, used=3, capacity=OD)]
    nodes += [node(f"idle{i}", gpus=1) for i in range(idle_spot)]
    snap = snapshot(nodes, [_job([*_spot_on(2), "od", "od", "od"], progress=progress, hi=5)])
    rules = policies(**_deadline(rule="uniform_progress"))
    assert sum(len(d.pods) for d in only(run(snap, rules), Action.SCALE_IN)) == removed


@pytest.mark.parametrize("rule", ["uniform_progress", "paced"])
def test_the_safety_net_fills_to_max_once_on_demand_alone_would_barely_finish(rule: str) -> None:
    # ahead of the line (45% at 40%), but 55% at 9.2%/h is 6.0 h, + 2 x 5 min > the 6 h left
    slow = Pace(rates=((8, 0.092),))
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=0.45, pace=slow)])
    (out,) = only(run(snap, policies(**_deadline(rule=rule))), Action.SCALE_OUT)
    assert (out.reason, out.count) == (Reason.BEHIND_DEADLINE, 6)
    assert "slack -0.1 h" in out.message


def test_near_the_end_paced_nets_only_what_finishes_a_changeover_early_up_fills_to_max() -> None:
    # 30 min left, 10% to do, 8 seen at 28%/h: 21 min at 8 + 2 x 5 min > 30 min, the net fires.
    # The switch spends one changeover: 10% in the 25 min after it needs 24%/h, 7 workers at the
    # lower bound (7/8 x 28% = 24.5%): 6 more next to the one on on-demand; uniform_progress
    # fills to 8
    pace = Pace(rates=((8, 0.28),))
    nodes = [node("od", gpus=1, used=1, capacity=OD)]
    snap = snapshot(nodes, [_job(["od"], progress=0.9, pace=pace)])
    (out,) = only(run(snap, policies(**_deadline(within_h=4.5))), Action.SCALE_OUT)
    (up,) = only(run(snap, policies(**_deadline(4.5, "uniform_progress"))), Action.SCALE_OUT)
    assert (out.reason, out.count, up.count) == (Reason.BEHIND_DEADLINE, 6, 7)
    assert "slack -0.0 h" in out.message


# --- paced: fewer workers than UP, never later --------------------------------------------------


def test_paced_acts_as_uniform_progress_until_a_speed_is_measured() -> None:
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=0.3)])
    (out,) = only(run(snap, policies(**_deadline())), Action.SCALE_OUT)
    assert out.count == 6 and "no speed measured yet" in out.message


def test_paced_buys_only_the_workers_that_catch_up_with_the_line() -> None:
    # the line's 10%/h, and 1% behind closed over 6 changeovers (30 min): 12%/h; a ring of n
    # does between 2n% and 16% an hour, 5 are estimated at 12.6%: 2 on spot, 3 on-demand (UP
    # buys 6)
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=0.39, pace=MEASURED)])
    (out,) = only(run(snap, policies(**_deadline())), Action.SCALE_OUT)
    (up,) = only(run(snap, policies(**_deadline(rule="uniform_progress"))), Action.SCALE_OUT)
    assert (out.reason, out.count, up.count) == (Reason.BEHIND_DEADLINE, 3, 6)


@pytest.mark.parametrize(("spot", "progress", "removed"), [(2, 0.41, 0), (3, 0.5, 3), (5, 0.41, 3)])
def test_paced_keeps_what_it_bought_in_the_band_and_lets_it_go_above(
    spot: int, progress: float, removed: int
) -> None:
    # in the band (40% to 41.7%): 2 spot + 3 on-demand hold the line, all stay (5 spot alone
    # would: then none); well above it, on-demand is cut to what paces 80% of the line (3 spot)
    nodes = [*_full_spot(spot), node("od", gpus=3, used=3, capacity=OD)]
    j = _job([*_spot_on(spot), "od", "od", "od"], progress=progress, pace=MEASURED)
    decisions = run(snapshot(nodes, [j]), policies(**_deadline()))
    assert sum(len(d.pods) for d in only(decisions, Action.SCALE_IN)) == removed


def test_above_the_band_paced_lets_on_demand_go_for_idle_spot_as_uniform_progress_does() -> None:
    # 50% at a 40% line: above ep(t + 2 d̂); 1 spot + 7 on-demand at max 8, 6 idle spot nodes.
    # paced's 80% pace alone would keep 2 on-demand (1 + 2 estimated at ~9%/h > 8%/h); UP lets
    # all but what spot cannot replace go (8 - 1 - 6 = 1): paced keeps no more than UP would
    nodes = [*_full_spot(1), node("od", gpus=7, used=7, capacity=OD)]
    nodes += [node(f"idle{i}", gpus=1) for i in range(6)]
    j = _job([*_spot_on(1), *["od"] * 7], progress=0.5, pace=MEASURED)
    for rule in ("paced", "uniform_progress"):
        (out,) = only(run(snapshot(nodes, [j]), policies(**_deadline(rule=rule))), Action.SCALE_IN)
        assert out.count == 6, rule


@pytest.mark.parametrize(("idle", "removed"), [(0, 0), (1, 1)])
def test_while_on_demand_is_scarce_paced_keeps_its_on_demand_as_uniform_progress_does(
    idle: int, removed: int
) -> None:
    # at max 6, above the band: paced alone would cut its 3 on-demand workers (3 spot pace 80%
    # of the line); on-demand took 25 min lately: they stay, and leave only for idle spot that
    # takes their place, as under UP
    nodes = [*_full_spot(3), node("od", gpus=3, used=3, capacity=OD)]
    nodes += [node(f"idle{i}", gpus=1) for i in range(idle)]
    scarce = replace(MEASURED, on_demand_wait=1500)
    j = _job([*_spot_on(3), "od", "od", "od"], progress=0.5, pace=scarce, hi=6)
    plenty = run(snapshot(nodes, [replace(j, pace=MEASURED)]), policies(**_deadline()))
    assert sum(len(d.pods) for d in only(plenty, Action.SCALE_IN)) == 3  # on-demand not scarce
    for rule in ("paced", "uniform_progress"):
        decisions = run(snapshot(nodes, [j]), policies(**_deadline(rule=rule)))
        assert sum(len(d.pods) for d in only(decisions, Action.SCALE_IN)) == removed, rule


def _need(rule: str, j: Job, nodes: list[GpuNode], changeover: str, on_demand: dict) -> tuple:
    """(want, keep) of on-demand workers under `rule` for `j` on `nodes`."""
    from autoscaler.core.deadline import Fleet, on_demand_need

    deadline = {"within": "10h", "rule": rule, "margin": "0s", "changeover": changeover}
    (policy,) = policies(deadline=deadline, on_demand=on_demand).policies
    need = on_demand_need(j, policy, Fleet.of(j, list(j.workers), {n.name: n for n in nodes}), NOW)
    assert need is not None
    return need.want, need.keep


@settings(max_examples=300, deadline=None)
@given(
    progress=st.floats(0.0, 0.99),
    spot=st.integers(0, 8),
    on_demand=st.integers(0, 8),
    idle=st.integers(0, 8),
    rate=st.sampled_from([None, 0.05, 0.1, 0.16, 0.3]),
    changeover=st.sampled_from(["5m", "20m"]),
    anchor=st.integers(0, 2),
    cap=st.sampled_from([2, 8]),
)
def test_in_every_state_paced_wants_and_keeps_no_more_on_demand_than_uniform_progress(
    progress: float,
    spot: int,
    on_demand: int,
    idle: int,
    rate: float | None,
    changeover: str,
    anchor: int,
    cap: int,
) -> None:
    # what paced is built on: its throughput model only ever buys fewer (over a whole trace it
    # can still cost more, as the trajectories part: docs/deadlines.md)
    on_demand = min(on_demand, 8 - spot)
    nodes = [*_full_spot(spot), *[node(f"idle{i}", gpus=1) for i in range(idle)]]
    if on_demand:
        nodes.append(node("od", gpus=on_demand, used=on_demand, capacity=OD))
    pace = None if rate is None else Pace(rates=((8, rate),))
    j = _job([*_spot_on(spot), *["od"] * on_demand], progress=progress, pace=pace)
    rules = {"min_on_demand": min(anchor, cap), "max_on_demand": cap, "anchor": "always"}
    paced, up = (_need(r, j, nodes, changeover, rules) for r in ("paced", "uniform_progress"))
    assert paced[0] <= up[0] and paced[1] <= up[1], (paced, up)


def test_never_below_min_when_removing_on_demand() -> None:
    nodes = [node("od", gpus=3, used=3, capacity=OD)]
    snap = snapshot(nodes, [_job(["od"] * 3, progress=0.99, pace=MEASURED, lo=3)])
    assert not only(run(snap, policies(**_deadline())), Action.SCALE_IN)


def test_a_scaler_in_flight_waits_for_it() -> None:
    from autoscaler.core import Scaler, ScalerKind

    j = _job(["s0"], progress=0.0, scaler=Scaler(ScalerKind.SCALE_OUT, "x", NOW))
    decisions = run(snapshot(_full_spot(1), [j]), policies(**_deadline()))
    assert [d.reason for d in decisions] == [Reason.SCALER_IN_FLIGHT]


# --- throughput bounds -----------------------------------------------------------------------


def test_throughput_is_bounded_never_extrapolated_linearly() -> None:
    pace = Pace(rates=((4, 0.1),))
    assert pace.lower(16, 0.5) == pytest.approx(0.2)  # not 0.4: two doublings at +41% each
    assert pace.upper(16) == pytest.approx(0.4)  # no ring does more per worker than a smaller
    assert pace.lower(2, 0.5) == pytest.approx(0.05) and pace.upper(2) == pytest.approx(0.1)
    assert pace.lower(2, 0.5) <= pace.estimate(2, 0.5) <= pace.upper(2)
    assert Pace().lower(8, 0.5) == 0.0 and Pace().upper(8) is None


def test_the_changeover_is_the_floor_or_what_the_job_showed() -> None:
    assert Pace().changeover_hours(1 / 6) == pytest.approx(1 / 6)
    slow = Pace(slowest_start=900, commit_gap=300)  # a 15 min start, 5 min between commits
    assert slow.changeover_hours(1 / 6) == pytest.approx(1 / 3)


def test_scarce_on_demand_raises_the_changeover_up_to_an_hour() -> None:
    # a worker Pending 15 min, or a recent one that went unstarted after its 25 min timeout:
    # on-demand takes at least that long now, whatever the starts measured (3 min)
    measured = Pace(slowest_start=180, commit_gap=60)
    assert measured.changeover_hours(1 / 12) == pytest.approx(1 / 12)
    assert measured.changeover_hours(1 / 12, pending=900) == pytest.approx(16 / 60)
    timed_out = replace(measured, on_demand_wait=1500)
    assert timed_out.changeover_hours(1 / 12) == pytest.approx(26 / 60)
    # bounded: a worker Pending for hours waits for something else than provisioning
    assert measured.changeover_hours(1 / 12, pending=5 * 3600) == pytest.approx(61 / 60)


def _waiting(minutes: float | None, pace: Pace) -> Snapshot:
    """2 workers on spot and one on-demand worker asked for `minutes` ago and still Pending
    (None: asked for at an unknown time), 47% done at 40% of the line: ahead of it, and 53% at
    9.2%/h (5.76 h) + 2 x 5 min leaves 0.07 h of the 6 h; a PyTorchJob's replicas raise, so no
    scaler waits for it."""
    j = _job([*_spot_on(2), None], progress=0.47, pace=pace)  # type: ignore[list-item]
    created = None if minutes is None else NOW - timedelta(minutes=minutes)
    pending = replace(j.workers[-1], pending=True, created_at=created)
    return snapshot(_full_spot(2), [replace(j, workers=(*j.workers[:2], pending))])


@pytest.mark.parametrize("rule", ["uniform_progress", "paced"])
def test_an_on_demand_worker_pending_15_min_makes_the_safety_net_fire_earlier(rule: str) -> None:
    slow = Pace(rates=((8, 0.092),))
    rules = policies(**_deadline(rule=rule))
    # asked for 4 min ago: d̂ is the 5 min floor, the slack 0.07 h, nothing more is bought
    for minutes in (4, None):
        assert not only(run(_waiting(minutes, slow), rules), Action.SCALE_OUT)
    # Pending 15 min: d̂ is 15 min, 5.76 h + 2 x 0.25 h > 6 h: the net fires
    (out,) = only(run(_waiting(15, slow), rules), Action.SCALE_OUT)
    # to max under both rules (paced's net: 53% in 5.75 h needs more than 8's 9.2%/h)
    assert (out.reason, out.count) == (Reason.BEHIND_DEADLINE, 5)
    assert "2 x 0.25 h changeover: slack -0.3 h" in out.message
    assert "d̂ 0.25 h raised by scarce on-demand: an on-demand worker Pending 15 min" in out.message


def test_a_timed_out_scale_out_keeps_the_changeover_raised_and_says_so() -> None:
    # its workers went unstarted after the 25 min timeout: d̂ 25 min, the net fires
    gone = Pace(rates=((8, 0.092),), slowest_start=120, on_demand_wait=1500)
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=0.47, pace=gone)])
    (out,) = only(run(snap, policies(**_deadline())), Action.SCALE_OUT)
    assert out.reason is Reason.BEHIND_DEADLINE
    assert "raised by scarce on-demand: a recent on-demand worker waited 25 min" in out.message


# --- what cannot be met ------------------------------------------------------------------------


def test_a_deadline_without_progress_is_an_alert_and_keeps_only_the_anchor() -> None:
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=None)])
    decisions = run(snap, policies(**_deadline()))
    (noop,) = [d for d in decisions if d.action is Action.NOOP]
    assert noop.reason is Reason.NO_PROGRESS
    assert "spot-autoscaler.io/progress" in noop.message


def test_progress_that_never_moves_is_infeasible_and_spends_no_more_on_demand() -> None:
    stuck = Pace(rates=((8, 0.16),), stalled_hours=1.5)
    nodes = [*_full_spot(2), node("od", gpus=3, used=3, capacity=OD)]
    snap = snapshot(nodes, [_job([*_spot_on(2), "od", "od", "od"], progress=0.1, pace=stuck)])
    (out,) = only(run(snap, policies(**_deadline())), Action.SCALE_IN)
    assert out.count == 3 and out.tags == (Reason.DEADLINE_INFEASIBLE,)
    assert "progress 10% has not moved in 1.5 h" in out.message


def test_past_the_deadline_is_infeasible_and_fills_within_the_cap() -> None:
    snap = snapshot(_full_spot(2), [_job(_spot_on(2), progress=0.5, pace=MEASURED)])
    (out,) = only(run(snap, policies(**_deadline(within_h=3, max_on_demand=4))), Action.SCALE_OUT)
    assert out.count == 4 and out.tags == (Reason.DEADLINE_INFEASIBLE,)
    assert "past the deadline less its margin" in out.message


def test_a_deadline_already_behind_the_line_at_the_start_says_by_how_much() -> None:
    # started 10 minutes ago, due in 2 h: 8 workers need at least 6.25 h for all of it
    just = replace(
        _job(_spot_on(2), progress=0.0, pace=MEASURED), started_at=NOW - timedelta(minutes=10)
    )
    decisions = run(snapshot(_full_spot(2), [just]), policies(**_deadline(within_h=2)))
    (out,) = only(decisions, Action.SCALE_OUT)
    assert out.count == 6 and out.tags == (Reason.DEADLINE_INFEASIBLE,)
    assert "100% left needs at least 6.2 h at 8 workers (max 8), 1.8 h left: short by" in (
        out.message
    )


def test_an_on_demand_cap_below_the_need_is_infeasible_and_stays_within_the_cap() -> None:
    # 60% in 6 h; at most 2 on-demand workers (seen doing 5%/h together): 12 h
    two = Pace(rates=((2, 0.05),))
    snap = snapshot([], [_job([], progress=0.4, pace=two)])
    (out,) = only(run(snap, policies(**_deadline(max_on_demand=2))), Action.SCALE_OUT)
    assert out.count == 2 and out.tags == (Reason.DEADLINE_INFEASIBLE,)
    assert "(max_on_demand 2), 6.0 h left: short by 6.0 h" in out.message


@pytest.mark.parametrize(
    ("budget", "od_price", "count"), [(None, 3.0, 6), (10, 3.0, 2), (10, None, 0)]
)
def test_on_demand_spend_stays_within_the_policys_budget(
    budget: float | None, od_price: float | None, count: int
) -> None:
    # behind the line, UP would fill to max (6 on-demand); $10/h, 2 spot at $1: 2 at $3 fit;
    # with no on-demand price known none does (unknown prices count as above the budget)
    nodes = [node(f"s{i}", gpus=1, used=1, price=1.0) for i in range(2)]
    nodes.append(node("od-other", gpus=1, used=1, price=od_price, capacity=OD))
    rules = policies(**_deadline(rule="uniform_progress"), cost={"budget_per_hour": budget})
    (out,) = run(snapshot(nodes, [_job(_spot_on(2), progress=0.3)]), rules)
    assert out.count == count
    if count == 0:
        assert out.reason is Reason.BUDGET and "on-demand price unknown" in out.message


def test_once_the_cap_is_reached_the_shortfall_is_a_noop_alert_a_warning_event_tells() -> None:
    two = Pace(rates=((2, 0.05),))
    nodes = [node("od", gpus=2, used=2, capacity=OD)]
    snap = snapshot(nodes, [_job(["od", "od"], progress=0.4, pace=two)])
    (out,) = run(snap, policies(**_deadline(max_on_demand=2)))
    assert out.action is Action.NOOP and out.reason is Reason.DEADLINE_INFEASIBLE
    assert out.reason.info.alert and "short by 6.0 h" in out.message


def test_the_deadline_keys_are_validated() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="exactly one of deadline.at and deadline.within"):
        policies(deadline={"within": "1h", "at": "2026-12-01T00:00:00Z"})
    with pytest.raises(ValidationError, match="time zone"):
        policies(deadline={"at": "2026-12-01T00:00:00"})
    with pytest.raises(ValidationError, match="exceeds max_on_demand"):
        policies(on_demand={"min_on_demand": 3, "max_on_demand": 1})
    with pytest.raises(ValidationError, match="scaling"):
        policies(deadline={"within": "1h", "scaling": 1.5})


# --- a replay with a wrong model ----------------------------------------------------------------


def throughput(workers: int, efficiency: float) -> float:
    """Work per hour of a ring: each worker at `efficiency ** log2(workers)` of its lone speed."""
    return workers * efficiency ** math.log2(workers) if workers > 0 else 0.0


STEP = 60.0  # seconds per pass
MAX = 8
EFFICIENCY = 0.9
WORK = throughput(MAX, EFFICIENCY) * 3.0  # the job: 3 h on 8 on-demand workers
CHANGEOVER = 360.0  # what the policy takes a changeover to be (s)


@dataclass
class _Replay:
    """One elastic job through `decide`, pass by pass: spot nodes as a schedule says, an
    on-demand node for each worker left Pending after `provision`, a new worker Ready after
    `startup`, and every change of the ring stalling training for `stall`. The job trains at
    `truth` times the speed its pace claims."""

    rule: str
    anchor: int
    spot: list[int]  # spot nodes up, per pass
    truth: float = 0.8
    provision: float = 480.0  # with `stall`: a changeover of 12 min, twice the policy's 6
    stall: float = 240.0
    startup: float = 60.0
    work: float = 0.0
    ring: int = 0
    stalled_until: float = 0.0
    workers: dict[str, list] = field(default_factory=dict)  # pod -> [node, ready_at]
    made: int = 0
    od_nodes: int = 0

    def policies(self, deadline_h: float):
        return policies(
            deadline={
                "within": f"{deadline_h}h",
                "rule": self.rule,
                "changeover": f"{CHANGEOVER:.0f}s",
            },
            on_demand={"min_on_demand": self.anchor},
            scale_out={"min_idle": "0s", "cooldown": "0s"},
        )

    def pace(self) -> Pace:
        claimed = [(n, throughput(n, EFFICIENCY) / WORK) for n in (1, MAX)]
        return Pace(rates=tuple(claimed))

    def run(self, deadline_h: float) -> float | None:
        """When the job was done (hours), or None."""
        rules = self.policies(deadline_h)
        for i, up in enumerate(self.spot):
            t = i * STEP
            self._train(t)
            if self.work >= WORK:
                return t / 3600
            self._world(t, up)
            for d in decide(self._snapshot(t, up), rules, NOW + timedelta(seconds=t)):
                self._apply(d, t)
        return None

    def _train(self, t: float) -> None:
        if self.ring and t > self.stalled_until:
            speed = self.truth * throughput(self.ring, EFFICIENCY) / 3600
            self.work += speed * min(STEP, t - self.stalled_until)

    def _ring_changed(self, t: float) -> None:
        self.ring = sum(1 for _, ready in self.workers.values() if ready <= t)
        self.stalled_until = t + self.stall

    def _world(self, t: float, up: int) -> None:
        gone = [p for p, (n, _) in self.workers.items() if n.startswith("s") and int(n[1:]) >= up]
        for pod in gone:
            del self.workers[pod]
        for w in self.workers.values():
            if w[0] == "" and w[1] <= t:  # provisioned: its own on-demand node
                self.od_nodes += 1
                w[0], w[1] = f"od{self.od_nodes}", t + self.startup
        joined = [w for w in self.workers.values() if w[0] and t - STEP < w[1] <= t]
        if gone or joined:
            self._ring_changed(t)

    def _snapshot(self, t: float, up: int) -> Snapshot:
        used = {n for n, _ in self.workers.values()}
        nodes = [GpuNode(f"s{i}", 1, 1 if f"s{i}" in used else 0) for i in range(up)]
        nodes += [GpuNode(n, 1, 1, capacity_type=OD) for n in sorted(used) if n.startswith("od")]
        workers = tuple(
            Worker(pod, n or None, pod, int(pod.split("-")[-1]), pending=not n or ready > t)
            for pod, (n, ready) in self.workers.items()
        )
        j = Job(
            "ml",
            "bert",
            1,
            MAX,
            workers=workers,
            started_at=NOW,
            progress=min(1.0, self.work / WORK),
            pace=self.pace(),
        )
        return Snapshot(tuple(nodes), (), (j,), {n.name: LONG_AGO for n in nodes})

    def _apply(self, d, t: float) -> None:
        if d.action is Action.SCALE_OUT:
            for i in range(d.count):
                self.made += 1
                where = d.nodes[i] if i < len(d.nodes) else ""
                ready = t + (self.startup if where else self.provision)
                self.workers[f"bert-worker-{self.made}"] = [where, ready]
        elif d.action is Action.SCALE_IN:
            for pod in d.pods:
                self.workers.pop(pod, None)
            self._ring_changed(t)


@st.composite
def _spot_schedules(draw) -> list[int]:
    """Spot nodes up per pass: spells of 10 minutes to 3 hours at 0 to MAX nodes."""
    out: list[int] = []
    while len(out) < 8 * 60:
        out += [draw(st.integers(0, MAX))] * draw(st.integers(10, 180))
    return out[: 8 * 60]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spot=_spot_schedules(), multiple=st.sampled_from([1.5, 2.0]))
def test_a_wrong_model_still_meets_every_deadline_uniform_progress_meets(
    spot: list[int], multiple: float
) -> None:
    # the job trains 20% slower than its pace says, and a changeover takes twice the policy's
    deadline = 3.0 / 0.8 * multiple  # the true on-demand time, 1.5x and 2x
    up = _Replay("uniform_progress", 0, spot).run(deadline)
    ours = _Replay("paced", 1, spot).run(deadline)
    if up is not None and up <= deadline:
        assert ours is not None and ours <= deadline, (up, ours)
