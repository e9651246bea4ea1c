"""Invariants that must hold for any snapshot, checked on random clusters (hypothesis)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from core_fixtures import NOW, policies
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core import (
    Action,
    GpuNode,
    Job,
    Notice,
    NoticeKind,
    Scaler,
    ScalerKind,
    Snapshot,
    Worker,
    decide,
    decide_departures,
)


@st.composite
def clusters(draw) -> Snapshot:
    n_nodes = draw(st.integers(1, 8))
    nodes = [
        GpuNode(
            f"n{i}",
            draw(st.sampled_from([1, 2, 4, 8])),
            0,
            price_per_hour=draw(st.sampled_from([None, 1.0, 8.0, 30.0])),
            schedulable=draw(st.booleans()) or i == 0,
        )
        for i in range(n_nodes)
    ]
    used = {n.name: 0.0 for n in nodes}
    jobs = []
    for j in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(0, 3))
        hi = draw(st.integers(lo, 8))
        gpw = draw(st.sampled_from([1, 2]))
        workers = []
        for w in range(draw(st.integers(0, hi + 2))):
            where = draw(st.sampled_from([n.name for n in nodes] + [None]))
            if where is not None:
                used[where] += gpw
            workers.append(
                Worker(f"j{j}-worker-{w}", where, f"j{j}-worker-{w}", w, pending=where is None)
            )
        scaler = draw(st.sampled_from([None, Scaler(ScalerKind.SCALE_OUT, f"j{j}-s", NOW)]))
        drained = (
            frozenset(
                draw(st.lists(st.sampled_from([w.host for w in workers] + ["gone"]), max_size=2))
            )
            if workers
            else frozenset()
        )
        jobs.append(
            Job(
                "ns",
                f"j{j}",
                lo,
                hi,
                gpw,
                workers=tuple(workers),
                scaler=scaler,
                priority=draw(st.integers(0, 2)),
                drained_hosts=drained,
                last_scale_out_at=draw(st.sampled_from([None, NOW - timedelta(minutes=1)])),
            )
        )
    nodes = [
        GpuNode(
            n.name,
            n.gpus_allocatable,
            min(used[n.name], n.gpus_allocatable + 4),
            price_per_hour=n.price_per_hour,
            schedulable=n.schedulable,
        )
        for n in nodes
    ]
    notices = [
        Notice(
            draw(st.sampled_from([n.name for n in nodes])),
            draw(st.sampled_from(list(NoticeKind))),
            "t",
            f"e{i}",
            deadline=NOW + timedelta(minutes=draw(st.integers(0, 30))),
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    return Snapshot(
        nodes=tuple(nodes),
        notices=tuple(notices),
        jobs=tuple(jobs),
        idle_since={n.name: NOW - timedelta(hours=1) for n in nodes},
    )


ps_options = st.sampled_from(
    [
        policies(),
        policies(scale_out={"quantum": "power_of_two"}, preemption={"rebalance": "drain"}),
        policies(
            cost={"max_price_per_gpu_hour": 2.0, "budget_per_hour": 20}, scale_out={"max_step": 2}
        ),
    ]
)


@settings(max_examples=300, deadline=None)
@given(snap=clusters(), ps=ps_options)
def test_decisions_keep_the_invariants(snap: Snapshot, ps) -> None:
    decisions = decide(snap, ps, NOW)
    jobs = {j.key: j for j in snap.jobs}
    noticed = {n.node for n in snap.notices}
    nodes = {n.name: n for n in snap.nodes}
    assert {d.job for d in decisions} == set(jobs)  # every job gets at least one decision
    scalers = Counter(d.job for d in decisions if d.action in (Action.SCALE_OUT, Action.SCALE_IN))
    assert all(n == 1 for n in scalers.values())  # at most one scaler per job per pass
    for d in decisions:
        j = jobs[d.job]
        pods = {w.pod for w in j.workers}
        if d.action in (Action.SCALE_OUT, Action.SCALE_IN):
            assert j.scaler is None and j.running  # never a second outstanding scaler
            assert d.count > 0 and d.from_workers == len(j.workers)
        if d.action is Action.SCALE_OUT:
            assert d.to_workers <= j.max_workers  # never above max
            assert not set(d.nodes) & noticed  # never onto a noticed node
            assert all(nodes[n].schedulable for n in d.nodes)
            assert d.to_workers == d.from_workers + d.count
        if d.action is Action.SCALE_IN:
            assert set(d.pods) <= pods and len(d.pods) == d.count  # names, all of them real
            # below min only when a hard notice forces it
            if d.to_workers < j.min_workers:
                assert d.reason.value in (
                    "preemption_notice",
                    "maintenance",
                    "karpenter_disruption",
                )
        if d.action is Action.DRAIN:
            assert set(d.pods) <= pods and not set(d.hosts) & j.drained_hosts
        if d.action is Action.UNDRAIN:
            assert set(d.hosts) <= j.drained_hosts


@settings(max_examples=100, deadline=None)
@given(snap=clusters())
def test_decide_is_deterministic(snap: Snapshot) -> None:
    assert decide(snap, policies(), NOW) == decide(snap, policies(), NOW)


def test_every_reason_and_notice_kind_carries_its_rules_metadata() -> None:
    """The orders the rules read from the members (they were side tables that a new member
    could silently miss)."""
    from autoscaler.core.model import NoticeKind, Reason, ReasonInfo

    assert all(isinstance(r.info, ReasonInfo) for r in Reason)

    def by(field: str) -> list[Reason]:
        ranked = [r for r in Reason if getattr(r.info, field) is not None]
        return sorted(ranked, key=lambda r: getattr(r.info, field))

    assert by("urgency") == [
        Reason.PREEMPTION_NOTICE,
        Reason.MAINTENANCE,
        Reason.KARPENTER_DISRUPTION,
        Reason.REBALANCE,
        Reason.CLAMP_MAX,
    ]
    assert by("why_not") == [
        Reason.MIN_IDLE,
        Reason.PRICE_CAP,
        Reason.BUDGET,
        Reason.REBALANCE,
        Reason.QUANTUM,
    ]
    assert [r for r in Reason if r.info.alert] == [
        Reason.SCALER_STUCK,
        Reason.DEADLINE_INFEASIBLE,
        Reason.NO_PROGRESS,
        Reason.UNKNOWN_POLICY,
        Reason.NOT_SCALABLE,
    ]
    assert Reason.CLAMP_MAX.info.message == "at max workers" and Reason.STEADY == "steady"
    hardness = {k: k.hardness for k in NoticeKind}
    assert hardness == {
        NoticeKind.REBALANCE: 0,
        NoticeKind.MAINTENANCE: 1,
        NoticeKind.DISRUPTION: 1,
        NoticeKind.INTERRUPTION: 2,
        NoticeKind.STATE_CHANGE: 2,
    }
    assert NoticeKind.parse("maintenance") is NoticeKind.MAINTENANCE


_DEPARTURES = (Action.DRAIN, Action.SCALE_IN, Action.CANCEL, Action.UNDRAIN)


@settings(max_examples=300, deadline=None)
@given(snap=clusters(), ps=ps_options, data=st.data())
def test_the_notice_fast_path_decides_what_the_full_pass_does(snap: Snapshot, ps, data) -> None:
    # any subset of jobs (the fast path picks those on noticed nodes): their departures are the
    # full pass's, action for action, so a full pass after the fast path has nothing to add
    keys = frozenset(data.draw(st.sets(st.sampled_from([j.key for j in snap.jobs]))))
    fast = decide_departures(snap, ps, NOW, keys)
    full = [d for d in decide(snap, ps, NOW) if d.job in keys]
    assert [d for d in fast if d.action in _DEPARTURES] == [
        d for d in full if d.action in _DEPARTURES
    ]
    assert {d.job for d in fast} <= keys
