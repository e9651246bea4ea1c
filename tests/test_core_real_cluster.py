"""Core rules that follow how et-operator and Horovod really behave (issue: work on a real cluster).

Each test names the upstream behaviour it guards against: a ScaleIn whose pods are all gone makes
et-operator delete every worker; Horovod needs a host of its previous rank assignment; scalers can
hang forever; et-operator names new workers from status.targetWorkers.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from core_fixtures import NOW, job, node, notice, only, policies, run, snapshot, workers
from pydantic import ValidationError

from autoscaler.core import Action, Reason, Scaler, ScalerKind


def _scale_in(pods: tuple[str, ...], *, ours: bool = True, started: bool = False) -> Scaler:
    return Scaler(ScalerKind.SCALE_IN, "bert-in-1", NOW, pods, ours=ours, started=started)


def test_terminating_pods_are_drained_but_never_named_in_a_scale_in() -> None:
    # NTH/Karpenter evicted worker-0 already: a ScaleIn naming only it could outlive it
    placed = workers("bert", ["a", "a", "b"])
    gone = (replace(placed[0], terminating=True), placed[1], placed[2])
    ds = run(snapshot([node("a"), node("b")], [replace(job(), workers=gone)], [notice("a")]))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0", "bert-worker-1")
    assert only(ds, Action.SCALE_IN)[0].pods == ("bert-worker-1",)


def test_no_scale_in_when_every_doomed_pod_is_already_terminating() -> None:
    placed = workers("bert", ["a", "b"])
    gone = (replace(placed[0], terminating=True), placed[1])
    ds = run(snapshot([node("a"), node("b")], [replace(job(), workers=gone)], [notice("a")]))
    assert only(ds, Action.DRAIN) and not only(ds, Action.SCALE_IN)


def test_an_unstarted_scale_in_of_ours_whose_pods_are_gone_is_cancelled() -> None:
    # worker-0 vanished (node died) before et-operator ran our ScaleIn for it
    j = job(placement=["b"], scaler=_scale_in(("bert-worker-9",)))
    ds = run(snapshot([node("b")], [j]))
    cancel = only(ds, Action.CANCEL)
    assert len(cancel) == 1 and cancel[0].reason is Reason.VICTIMS_GONE
    assert cancel[0].pods == ("bert-worker-9",) and "every worker" in cancel[0].message
    assert not only(ds, Action.SCALE_OUT)  # the scaler still exists this pass


def test_a_scale_in_is_not_cancelled_if_started_foreign_or_a_victim_lives() -> None:
    for scaler in (
        _scale_in(("bert-worker-9",), started=True),  # victims frozen: safe to finish
        _scale_in(("bert-worker-9",), ours=False),  # someone else's: never ours to delete
        _scale_in(("bert-worker-9", "bert-worker-0")),  # worker-0 still runs
    ):
        j = job(placement=["b"], scaler=scaler)
        assert not only(run(snapshot([node("b")], [j])), Action.CANCEL), scaler


def test_a_scale_in_the_operator_just_took_up_is_left_to_it_for_a_moment() -> None:
    # et-operator deletes the victims (grace 0) and writes status.toDeletePods after, in its
    # deferred status update (scaler.go executeScaling): between the two, the victims look
    # gone before it ran, and a cancel would erase a ScaleIn that did its work
    taken = replace(_scale_in(("bert-worker-9",)), picked_up_at=NOW - timedelta(seconds=1))
    j = job(placement=["b"], scaler=taken)
    assert not only(run(snapshot([node("b")], [j])), Action.CANCEL)
    # still not started seconds later: the operator is not running it, and it would wipe the job
    later = run(snapshot([node("b")], [j]), now=NOW + timedelta(seconds=4))
    assert [d.reason for d in only(later, Action.CANCEL)] == [Reason.VICTIMS_GONE]


def test_a_scale_in_whose_only_live_victim_is_terminating_is_cancelled() -> None:
    placed = workers("bert", ["a", "b"])
    j = replace(
        job(scaler=_scale_in(("bert-worker-0",))),
        workers=(replace(placed[0], terminating=True), placed[1]),
    )
    assert only(run(snapshot([node("a"), node("b")], [j])), Action.CANCEL)


def test_the_kept_host_stays_until_the_replacement_is_in_a_rank_assignment() -> None:
    # worker-0 on doomed `a` is the only old host; worker-1 has run for an hour, but the launcher
    # has not started a Horovod worker on it yet: dropping worker-0 would stop the job
    placed = workers("bert", ["a", "b"])
    j = replace(job(), workers=placed, assigned_hosts=frozenset({"bert-worker-0"}))
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert not only(ds, Action.DRAIN)
    assert only(ds, Action.NOOP)[0].reason is Reason.LAST_HOST_KEPT
    j = replace(j, assigned_hosts=frozenset({"bert-worker-0", "bert-worker-1"}))
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0",)


def test_an_assigned_replacement_frees_the_kept_host_before_join_grace() -> None:
    fresh = replace(workers("bert", ["a", "b"])[1], ready_since=NOW - timedelta(seconds=2))
    j = replace(
        job(),
        workers=(workers("bert", ["a"])[0], fresh),
        assigned_hosts=frozenset({"bert-worker-0", "bert-worker-1"}),
    )
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0",)


def test_a_scaler_older_than_max_age_is_reported_stuck() -> None:
    old = Scaler(ScalerKind.SCALE_IN, "bert-in-1", NOW - timedelta(minutes=20), ("bert-worker-1",))
    j = job(placement=["a", "b"], scaler=old)
    ds = run(snapshot([node("a"), node("b")], [j]))
    stuck = only(ds, Action.NOOP)[0]
    assert stuck.reason is Reason.SCALER_STUCK and "bert-in-1" in stuck.message
    assert "docs/kubernetes.md#stuck-scalers" in stuck.message
    ps = policies(scalers={"max_age": "30m"})
    assert (
        only(run(snapshot([node("a"), node("b")], [j]), ps), Action.NOOP)[0].reason
        is Reason.SCALER_IN_FLIGHT
    )


def test_a_stuck_scaler_also_shows_when_a_notice_waits_behind_it() -> None:
    old = Scaler(ScalerKind.SCALE_OUT, "bert-out-1", NOW - timedelta(hours=1))
    j = job(placement=["a", "b"], scaler=old)
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.DRAIN)
    assert only(ds, Action.NOOP)[0].reason is Reason.SCALER_STUCK


def test_new_worker_names_follow_the_operators_highest_target_index() -> None:
    # et-operator counts workers that died without a scaler (status.targetWorkers)
    j = job(placement=["a", "a"], next_index=7)
    assert j.next_pod_names(2) == ("bert-worker-7", "bert-worker-8")
    assert job(placement=["a", "a"]).next_pod_names(1) == ("bert-worker-2",)


def test_max_age_must_exceed_the_scale_out_timeout() -> None:
    with pytest.raises(ValidationError, match="scalers.max_age"):
        policies(scalers={"max_age": "5m"}, scale_out={"timeout": "10m"})


def test_workers_in_their_grace_period_count_neither_against_max_nor_for_min() -> None:
    # after a ScaleIn, et-operator's deleted pods stay Terminating for their grace period while
    # the replacements run: the job is at max, not above it; clamping would name healthy ones
    placed = workers("bert", ["a", "a", "b", "b"])
    going = (replace(placed[0], terminating=True), replace(placed[1], terminating=True))
    j = replace(job(hi=2), workers=(*going, placed[2], placed[3]))
    assert not only(run(snapshot([node("a"), node("b")], [j])), Action.SCALE_IN)
    # one live worker too many: that one goes, never one already going
    j = replace(job(hi=1), workers=(*going, placed[2], placed[3]))
    scale_in = only(run(snapshot([node("a"), node("b")], [j])), Action.SCALE_IN)
    assert len(scale_in) == 1 and scale_in[0].reason is Reason.CLAMP_MAX
    assert scale_in[0].pods == ("bert-worker-3",)
