"""While a kind's view is behind the server (Snapshot.stale), only notice departures go out, and
only for workers on noticed nodes (core/freshness.py): plain data, no cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_fixtures import NOW, job, node, notice, only, policies, run, snapshot

from autoscaler.core import Action, Decision, Reason, Scaler, ScalerKind, decide_departures

STALE = frozenset({"Pod"})


def stale(snap):
    return replace(snap, stale=STALE)


def test_a_fresh_view_decides_as_before() -> None:
    snap = snapshot([node("a"), node("b")], [job(hi=8, placement=["a"])])
    assert run(snap) == run(replace(snap, stale=frozenset()))
    assert only(run(snap), Action.SCALE_OUT)


def test_growth_waits_for_the_view() -> None:
    snap = stale(snapshot([node("a"), node("b")], [job(hi=8, placement=["a"])]))
    [d] = run(snap)
    assert d.action is Action.NOOP and d.reason is Reason.STALE_VIEW
    assert Reason.IDLE_CAPACITY in d.tags and "Pod" in d.message


def test_a_clamp_to_max_on_a_stale_view_removes_nobody() -> None:
    """The view may still hold pods an earlier ScaleIn deleted: counting them removes healthy
    workers (the 28 -> 24 of issue 26)."""
    j = job(hi=2, placement=["a", "a", "b", "b"])
    assert only(run(snapshot([node("a"), node("b")], [j])), Action.SCALE_IN)  # fresh: clamps
    decisions = run(stale(snapshot([node("a"), node("b")], [j])))
    assert not only(decisions, Action.SCALE_IN) and not only(decisions, Action.DRAIN)
    assert {d.reason for d in decisions} == {Reason.STALE_VIEW}
    assert {t for d in decisions for t in d.tags} >= {Reason.CLAMP_MAX}


def on_stale(decisions: list[Decision]) -> list[Decision]:
    """As a stale view lets them out: tagged `stale_view`."""
    return [replace(d, tags=(*d.tags, Reason.STALE_VIEW)) for d in decisions]


def test_a_notice_still_drains_and_scales_in_its_own_workers_at_once() -> None:
    j = job(placement=["a", "b", "a"])
    fresh = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    held = run(stale(snapshot([node("a"), node("b")], [j], [notice("a")])))
    assert only(held, Action.DRAIN) == on_stale(only(fresh, Action.DRAIN))
    assert only(held, Action.SCALE_IN) == on_stale(only(fresh, Action.SCALE_IN))
    assert only(held, Action.SCALE_IN)[0].pods == ("bert-worker-0", "bert-worker-2")


@pytest.mark.parametrize("views", [{"Node"}, {"Pod"}, {"et-operator"}])
def test_a_departure_let_out_on_a_stale_view_says_so(views: set[str]) -> None:
    """The actuator reads the tag: every worker such a drain names is on a noticed node, and
    the notice may be one the server no longer has, so it confirms each node's notice there
    first (adapters/kube/confirm.py). A fresh view's departures carry no such tag: a clamp's
    worker in them needs no notice."""
    j = job(hi=2, placement=["b", "c", "a", "d"])
    snap = snapshot([node(n) for n in "abcd"], [j], [notice("a")])
    fresh = run(snap)
    assert not any(Reason.STALE_VIEW in d.tags for d in fresh)
    held = run(replace(snap, stale=frozenset(views)))
    departures = only(held, Action.DRAIN) + only(held, Action.SCALE_IN)
    assert [d.action for d in departures] == [Action.DRAIN, Action.SCALE_IN]
    assert all(d.tags.count(Reason.STALE_VIEW) == 1 for d in departures)
    assert all(d.pods == ("bert-worker-2",) and d.nodes == ("a",) for d in departures)


def test_a_departure_for_a_notice_and_a_clamp_keeps_only_the_noticed_workers() -> None:
    """Above max with a notice: the noticed worker goes now, the clamp waits for the view."""
    j = job(hi=2, placement=["b", "c", "a", "d"])
    nodes = [node(n) for n in "abcd"]
    fresh = run(snapshot(nodes, [j], [notice("a")]))
    [fresh_in] = only(fresh, Action.SCALE_IN)
    assert len(fresh_in.pods) == 2 and "bert-worker-2" in fresh_in.pods  # the notice + a clamp
    held = run(stale(snapshot(nodes, [j], [notice("a")])))
    [scale_in] = only(held, Action.SCALE_IN)
    [drain] = only(held, Action.DRAIN)
    assert scale_in.pods == ("bert-worker-2",) and scale_in.count == 1
    assert (scale_in.from_workers, scale_in.to_workers) == (4, 3)
    assert scale_in.nodes == ("a",) and scale_in.reason is fresh_in.reason
    assert drain.pods == ("bert-worker-2",) and drain.hosts == ("bert-worker-2",)


def test_the_fast_path_holds_the_same() -> None:
    j = job(hi=2, placement=["b", "c", "a", "d"])
    snap = stale(snapshot([node(n) for n in "abcd"], [j], [notice("a")]))
    fast = decide_departures(snap, policies(), NOW, frozenset({j.key}))
    full = run(snap)
    for action in (Action.DRAIN, Action.SCALE_IN):
        assert only(fast, action) == only(full, action)


def test_an_undrain_waits_for_the_view() -> None:
    """A withdrawn notice on a stale node view may not be withdrawn at all."""
    j = replace(job(placement=["a", "b"]), drained_hosts=frozenset({"bert-worker-0"}))
    snap = snapshot([node("a"), node("b")], [j])
    assert only(run(snap), Action.UNDRAIN)
    held = run(stale(snap))
    assert not only(held, Action.UNDRAIN)
    [d] = [d for d in held if Reason.NOTICE_WITHDRAWN in d.tags]
    assert d.reason is Reason.STALE_VIEW


@pytest.mark.parametrize("views", [{"Node"}, {"et-operator"}, {"cce", "Pod"}])
def test_a_view_the_job_reads_behind_holds_its_growth(views: set[str]) -> None:
    snap = snapshot([node("a"), node("b")], [job(hi=8, placement=["a"])])
    [d] = run(replace(snap, stale=frozenset(views)))
    assert d.reason is Reason.STALE_VIEW


def test_another_backends_view_behind_holds_nothing_of_this_job() -> None:
    snap = snapshot([node("a"), node("b")], [job(hi=8, placement=["a"])])  # an et-operator job
    assert run(replace(snap, stale=frozenset({"cce", "mpi-operator"}))) == run(snap)


def test_a_replacement_for_noticed_workers_still_goes_out() -> None:
    """The last settled host waits in discovery for its replacement: that ScaleOut answers the
    notice, while the pods and scalers it is counted on are current."""
    j = job(hi=4, placement=["a"])
    snap = snapshot([node("a"), node("b")], [j], [notice("a")])
    fresh = run(snap)
    assert only(fresh, Action.SCALE_OUT)
    nodes_behind = replace(snap, stale=frozenset({"Node"}))
    assert only(run(nodes_behind), Action.SCALE_OUT) == only(fresh, Action.SCALE_OUT)
    # pods (or the job's own kinds) behind: the count could miss workers already added
    assert not only(run(stale(snap)), Action.SCALE_OUT)


def test_cancelling_our_scaler_still_goes_out() -> None:
    """A cancel only ever prevents a removal (a ScaleIn whose pods are all gone)."""
    ghost = Scaler(
        ScalerKind.SCALE_IN, "bert-in", NOW, ("bert-worker-9",), ours=True, started=False
    )
    j = replace(job(placement=["a", "b"]), scaler=ghost)
    fresh = run(snapshot([node("a"), node("b")], [j]))
    held = run(stale(snapshot([node("a"), node("b")], [j])))
    assert only(fresh, Action.CANCEL) and only(held, Action.CANCEL) == only(fresh, Action.CANCEL)


def test_a_held_decision_names_the_job_and_the_counts_it_had() -> None:
    snap = stale(snapshot([node("a"), node("b")], [job(hi=8, placement=["a"])]))
    [d] = run(snap)
    assert isinstance(d, Decision) and d.job == "ml/bert"
    assert (d.from_workers, d.to_workers, d.count) == (1, 1, 0)
