"""The pass memo (core/memo.py): on random event streams a pass with the memo decides exactly
what a pass without it does, and it does reuse what did not change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from core_fixtures import NOW, job, node, notice, policies, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from test_core_invariants import clusters

from autoscaler.core import (
    NoticeKind,
    PassMemo,
    PolicySet,
    Scaler,
    ScalerKind,
    Snapshot,
    Worker,
    decide,
    track_idle,
)
from autoscaler.core.moment import Moment
from autoscaler.core.notices import classify

TICK = timedelta(microseconds=1)

# Policies whose rules read the clock: cooldown, backoff, min_idle, join_grace, a stuck scaler's
# age, a window that opens and closes, a maintenance horizon, a deadline with an anchor.
TIMED = [
    policies(),
    policies(
        scale_out={"cooldown": "2m", "backoff": "5m", "min_idle": "3m", "quantum": "power_of_two"},
        preemption={"rebalance": "drain", "join_grace": "4m", "maintenance_horizon": "10m"},
        scalers={"max_age": "7m"},  # above scale_out.timeout (6m)
    ),
    policies(
        windows=[
            {"name": "lunch", "schedule": "*/10 * * * *", "duration": "4m", "scale_out": False}
        ],
        cost={"budget_per_hour": 20},
    ),
    policies(on_demand={"min_on_demand": 1, "calm_after": "5m"}, scale_out={"min_idle": "1m"}),
]

STEPS = [timedelta(0), timedelta(seconds=5), timedelta(minutes=1), timedelta(minutes=4)]


def _job_event(draw, snap: Snapshot, now) -> Snapshot:
    """One change to one job, every other object kept as it was (as the observer does)."""
    jobs = list(snap.jobs)
    i = draw(st.integers(0, len(jobs) - 1))
    j = jobs[i]
    nodes = [n.name for n in snap.nodes]
    kind = draw(
        st.sampled_from(
            ["add", "remove", "scaler", "no_scaler", "grew", "failed", "drain", "ready", "copy"]
        )
    )
    if kind == "add":
        where = draw(st.sampled_from([*nodes, None]))
        k = max((w.index for w in j.workers), default=-1) + 1
        w = Worker(f"{j.name}-worker-{k}", where, f"{j.name}-worker-{k}", k, pending=where is None)
        j = replace(j, workers=(*j.workers, w))
    elif kind == "remove" and j.workers:
        j = replace(j, workers=j.workers[:-1])
    elif kind == "scaler":
        pods = tuple(w.pod for w in j.workers[-1:])
        which = draw(st.sampled_from(list(ScalerKind)))
        j = replace(j, scaler=Scaler(which, f"{j.name}-s{now.minute}", now, pods=pods))
    elif kind == "no_scaler":
        j = replace(j, scaler=None)
    elif kind == "grew":
        j = replace(j, last_scale_out_at=now)
    elif kind == "failed":
        j = replace(j, last_failed_scale_out_at=now)
    elif kind == "drain" and j.workers:
        j = replace(j, drained_hosts=j.drained_hosts ^ {j.workers[0].host})
    elif kind == "ready" and j.workers:
        j = replace(j, workers=(replace(j.workers[0], ready_since=now), *j.workers[1:]))
    elif kind == "copy":  # a new object, equal to the old one (a rebuilt job)
        j = replace(j)
    jobs[i] = j
    return replace(snap, jobs=tuple(jobs))


def _node_event(draw, snap: Snapshot, now) -> Snapshot:
    nodes = list(snap.nodes)
    i = draw(st.integers(0, len(nodes) - 1))
    n = nodes[i]
    kind = draw(st.sampled_from(["cordon", "used", "price", "copy", "notice", "withdraw"]))
    notices = snap.notices
    if kind == "cordon":
        nodes[i] = replace(n, schedulable=not n.schedulable)
    elif kind == "used":
        nodes[i] = replace(n, gpus_requested=draw(st.sampled_from([0, 1, 2, n.gpus_allocatable])))
    elif kind == "price":
        nodes[i] = replace(n, price_per_hour=draw(st.sampled_from([None, 1.0, 8.0, 30.0])))
    elif kind == "copy":
        nodes[i] = replace(n)
    elif kind == "notice":
        kind_of = draw(st.sampled_from(list(NoticeKind)))
        deadline = now + timedelta(minutes=draw(st.integers(0, 30)))
        notices = (*notices, replace(notice(n.name, kind_of, f"e{now}"), deadline=deadline))
    elif kind == "withdraw" and notices:
        notices = notices[1:]
    return replace(snap, nodes=tuple(nodes), notices=notices)


@st.composite
def streams(draw) -> tuple[PolicySet, list[tuple[Snapshot, object]]]:
    """A policy set, and the snapshots a daemon would see over a few minutes of events."""
    ps = draw(st.sampled_from(TIMED))
    snap = draw(clusters())
    now = NOW
    idle = dict(snap.idle_since)
    out = []
    for _ in range(draw(st.integers(2, 12))):
        now += draw(st.sampled_from(STEPS))
        for _ in range(draw(st.integers(0, 2))):
            event = draw(st.sampled_from([_job_event, _node_event]))
            snap = event(draw, snap, now)
        idle = track_idle(idle, snap.nodes, now)
        out.append((replace(snap, idle_since=idle), now))
    return ps, out


@settings(max_examples=400, deadline=None)
@given(stream=streams())
def test_with_the_memo_every_pass_decides_what_a_pass_without_it_does(stream) -> None:
    ps, passes = stream
    memo = PassMemo()
    for snap, now in passes:
        assert decide(snap, ps, now, memo) == decide(snap, ps, now)


def _cluster() -> Snapshot:
    nodes = [node(f"n{i}", used=4) for i in range(4)]
    jobs = [job(f"j{k}", placement=[f"n{k}", f"n{(k + 1) % 4}"]) for k in range(4)]
    return snapshot(nodes, jobs)


def test_an_unchanged_pass_reuses_every_plan_and_the_growth() -> None:
    memo, snap, ps = PassMemo(), _cluster(), policies()
    first = decide(snap, ps, NOW, memo)
    assert memo.replanned == 4 and memo.regrown
    again = decide(snap, ps, NOW + timedelta(seconds=5), memo)
    assert again == first
    assert memo.replanned == 0 and not memo.regrown


def test_a_changed_job_is_planned_again_alone() -> None:
    memo, snap, ps = PassMemo(), _cluster(), policies()
    decide(snap, ps, NOW, memo)
    changed = replace(snap.jobs[2], scaler=Scaler(ScalerKind.SCALE_OUT, "j2-s", NOW))
    decide(replace(snap, jobs=(*snap.jobs[:2], changed, snap.jobs[3])), ps, NOW, memo)
    assert memo.replanned == 1 and memo.regrown


def test_growth_decided_again_reuses_the_decisions_of_jobs_that_claim_nothing() -> None:
    memo, ps = PassMemo(), policies()
    nodes = [node(f"n{i}", used=4) for i in range(4)]
    at_max = [job(f"j{k}", hi=2, placement=[f"n{k}", f"n{(k + 1) % 4}"]) for k in range(4)]
    snap = snapshot(nodes, at_max)
    first = {d.job: d for d in decide(snap, ps, NOW, memo)}
    grown = replace(snap, nodes=(*snap.nodes, node("n9")))  # idle GPUs: growth decided again
    again = decide(grown, ps, NOW, memo)
    assert memo.regrown and memo.replanned == 0
    assert again == decide(grown, ps, NOW)
    assert all(d is first[d.job] for d in again)  # not made again


def test_a_notice_plans_again_only_the_jobs_on_its_node() -> None:
    memo, snap, ps = PassMemo(), _cluster(), policies()
    decide(snap, ps, NOW, memo)
    decide(replace(snap, notices=(notice("n0"),)), ps, NOW, memo)
    assert memo.replanned == 2  # j0 and j3 have a worker on n0


def test_time_alone_plans_again_when_a_rule_flips() -> None:
    """A scaler turns stuck at max_age: nothing else changes, the plan must."""
    ps = policies(scalers={"max_age": "10m"})
    memo, snap = PassMemo(), _cluster()
    stuck = replace(snap.jobs[0], scaler=Scaler(ScalerKind.SCALE_OUT, "j0-s", NOW))
    snap = replace(snap, jobs=(stuck, *snap.jobs[1:]))
    decide(snap, ps, NOW, memo)
    decide(snap, ps, NOW + timedelta(minutes=5), memo)
    assert memo.replanned == 0
    later = NOW + timedelta(minutes=11)
    assert decide(snap, ps, later, memo) == decide(snap, ps, later)
    assert memo.replanned == 1


def test_a_plan_is_kept_until_the_first_flip_its_rules_asked_about() -> None:
    """The memo needs no list of the time rules: any rule that reads the time through the plan's
    Moment has the plan made again when its answer flips, and one that shows the time itself
    (a stuck scaler's age) at every pass."""
    ps = policies()
    policy, j = ps.policies[0], job("j0", placement=["n0"])
    risk = classify((), policy.preemption, NOW)
    soon, later = NOW + timedelta(minutes=1), NOW + timedelta(minutes=5)
    memo = PassMemo()

    def plan_at(now: datetime, rule: Callable[[Moment], object]) -> object:
        memo.begin(ps, now)
        return memo.plan(j, policy, {}, frozenset(), risk, now, rule)

    def timed(m: Moment) -> object:
        return m.reached(later), m.passed(soon)

    assert plan_at(NOW, timed) == (False, False)
    assert plan_at(soon, timed) == (False, False) and memo.replanned == 0  # over just after
    assert plan_at(soon + TICK, timed) == (False, True) and memo.replanned == 1
    assert plan_at(later - TICK, timed) == (False, True) and memo.replanned == 0
    assert plan_at(later, timed) == (True, True) and memo.replanned == 1
    assert plan_at(later + timedelta(days=1), timed) == (True, True) and memo.replanned == 0

    def aged(m: Moment) -> object:
        return m.age(NOW)

    memo = PassMemo()
    for step in range(3):
        assert plan_at(NOW + step * TICK, aged) == step * TICK and memo.replanned == 1


def test_new_policies_or_time_going_back_forget_everything() -> None:
    memo, snap, ps = PassMemo(), _cluster(), policies()
    decide(snap, ps, NOW, memo)
    decide(snap, policies(), NOW, memo)
    assert memo.replanned == 4
    decide(snap, ps, NOW - timedelta(seconds=1), memo)
    assert memo.replanned == 4
