"""Core rules a PyTorchJob (torchrun) needs, on plain data: a scale-in deletes doomed workers
wherever they are while shrinking still takes the top indices; a job that cannot be scaled gets
one noop saying why; every drain and scale-in for a notice carries the notice's deadline (the
checkpoint signal passes it on)."""

from __future__ import annotations

from datetime import timedelta

from core_fixtures import NOW, job, node, notice, only, policies, run, snapshot

from autoscaler.core import Action, Reason


def torch_job(**kw):
    return job(removes_highest_first=True, deletes_victims=True, **kw)


def test_a_doomed_middle_worker_is_scaled_in_by_name_when_its_kind_deletes_victims() -> None:
    j = torch_job(placement=["a", "b", "c"])
    ds = run(snapshot([node("a"), node("b"), node("c")], [j], [notice("b")]))
    assert only(ds, Action.SCALE_IN)[0].pods == ("bert-worker-1",)
    # the same job under mpi-operator's rule: only the top can go, the middle one is drained
    mpi = job(placement=["a", "b", "c"], removes_highest_first=True)
    ds = run(snapshot([node("a"), node("b"), node("c")], [mpi], [notice("b")]))
    assert only(ds, Action.SCALE_IN) == [] and only(ds, Action.DRAIN)[0].pods == ("bert-worker-1",)


def test_shrinking_to_max_still_takes_the_highest_indices() -> None:
    j = torch_job(hi=2, placement=["a", "b", "c", "d"])
    ds = run(snapshot([node(n) for n in "abcd"], [j]))
    scale_in = only(ds, Action.SCALE_IN)[0]
    assert scale_in.reason is Reason.CLAMP_MAX
    assert scale_in.pods == ("bert-worker-2", "bert-worker-3")


def test_a_notice_and_a_clamp_together_name_the_doomed_one_and_the_top() -> None:
    j = torch_job(hi=1, placement=["a", "b", "c"])
    ds = run(snapshot([node(n) for n in "abc"], [j], [notice("a")]))
    assert set(only(ds, Action.SCALE_IN)[0].pods) == {"bert-worker-0", "bert-worker-2"}


def test_an_unscalable_job_gets_one_alert_noop_and_nothing_else() -> None:
    why = "PyTorchJob has no spec.elasticPolicy"
    j = torch_job(placement=["a"], unscalable=why)
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))  # idle GPUs and a notice
    assert [(d.action, d.reason) for d in ds] == [(Action.NOOP, Reason.NOT_SCALABLE)]
    assert ds[0].message == why and Reason.NOT_SCALABLE.info.alert


def test_a_job_min_above_the_policy_max_is_left_alone_with_a_reason() -> None:
    j = torch_job(lo=3, hi=6, placement=["a", "a", "a"])
    ds = run(snapshot([node("a"), node("b")], [j]), policies(limits={"max_workers": 2}))
    assert [(d.action, d.reason) for d in ds] == [(Action.NOOP, Reason.NOT_SCALABLE)]
    assert "min (3 workers) is above policy 'default''s max (2)" in ds[0].message
    # within the policy's max, the same job scales as usual
    ds = run(snapshot([node("a"), node("b")], [j]), policies(limits={"max_workers": 4}))
    assert only(ds, Action.SCALE_OUT)


def test_drain_and_scale_in_carry_the_earliest_notice_deadline() -> None:
    soon, later = NOW + timedelta(seconds=30), NOW + timedelta(minutes=2)
    j = job(placement=["a", "b", "c"])
    ns = [notice("a", deadline=later), notice("b", nid="e2", deadline=soon)]
    ds = run(snapshot([node(n) for n in "abc"], [j], ns))
    assert only(ds, Action.DRAIN)[0].deadline == soon
    assert only(ds, Action.SCALE_IN)[0].deadline == soon
    # no deadline given: none invented
    ds = run(snapshot([node(n) for n in "abc"], [job(placement=["a", "b"])], [notice("a")]))
    assert only(ds, Action.DRAIN)[0].deadline is None


def test_a_notice_deletes_at_once_even_while_a_scale_is_in_flight() -> None:
    """Deleting by name queues nothing behind the scale in flight (e.g. the operator still making
    a replacement): the second doomed worker's SIGTERM must not wait for it."""
    from autoscaler.core import Scaler, ScalerKind

    flight = Scaler(ScalerKind.SCALE_OUT, "bert-replicas")
    j = torch_job(placement=["a", "b", "c"], scaler=flight)
    ds = run(snapshot([node(n) for n in "abc"], [j], [notice("b")]))
    assert only(ds, Action.SCALE_IN)[0].pods == ("bert-worker-1",)
    # a kind whose scale-in is a scaler object waits for the one in flight (drains meanwhile)
    hvd = job(placement=["a", "b", "c"], scaler=flight)
    ds = run(snapshot([node(n) for n in "abc"], [hvd], [notice("b")]))
    assert only(ds, Action.SCALE_IN) == [] and only(ds, Action.DRAIN)
