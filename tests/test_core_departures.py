"""Preemption, drains, scale-in victims, undrain, below-min and clamp-max rules of the core."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from core_fixtures import NOW, job, node, notice, only, policies, run, snapshot, workers

from autoscaler.core import (
    Action,
    NoticeKind,
    PassMemo,
    Reason,
    Scaler,
    ScalerKind,
    Worker,
    decide,
)
from autoscaler.core.policy import POLICY_LABEL


def test_interruption_drains_then_scales_in_exactly_the_pods_on_that_node() -> None:
    j = job(placement=["a", "b", "a", "c"])
    ds = run(snapshot([node("a"), node("b"), node("c")], [j], [notice("a")]))
    drain, scale_in = only(ds, Action.DRAIN), only(ds, Action.SCALE_IN)
    assert [d.action for d in ds] == [Action.DRAIN, Action.SCALE_IN]  # drain first
    assert drain[0].hosts == ("bert-worker-0", "bert-worker-2")
    assert scale_in[0].pods == ("bert-worker-0", "bert-worker-2")  # names, never a count
    assert (scale_in[0].from_workers, scale_in[0].to_workers, scale_in[0].count) == (4, 2, 2)
    assert scale_in[0].reason is Reason.PREEMPTION_NOTICE and scale_in[0].nodes == ("a",)


def test_two_notices_for_one_node_make_one_drain_and_one_scale_in() -> None:
    j = job(placement=["a", "b"])
    ns = [
        notice("a", nid="sqs-1"),
        notice("a", nid="taint"),
        notice("a", NoticeKind.REBALANCE, "r"),
    ]
    ds = run(snapshot([node("a"), node("b")], [j], ns))
    assert len(only(ds, Action.DRAIN)) == 1 and len(only(ds, Action.SCALE_IN)) == 1
    assert only(ds, Action.SCALE_IN)[0].pods == ("bert-worker-0",)


def test_notice_for_a_node_without_workers_changes_nothing_and_gets_no_new_workers() -> None:
    j = job(hi=4, placement=["b"])
    ds = run(snapshot([node("a", gpus=8), node("b", gpus=1, used=1)], [j], [notice("a")]))
    assert not only(ds, Action.DRAIN) and not only(ds, Action.SCALE_IN)
    assert [(d.action, d.reason) for d in ds] == [(Action.NOOP, Reason.REBALANCE)]


def test_job_at_min_with_a_notice_still_drains_and_says_below_min() -> None:
    j = job(lo=2, hi=4, placement=["a", "b"])
    ds = run(snapshot([node("a"), node("b", gpus=1, used=1)], [j], [notice("a")]))
    scale_in = only(ds, Action.SCALE_IN)[0]
    assert scale_in.to_workers == 1 and Reason.BELOW_MIN in scale_in.tags


def test_preemption_is_not_delayed_by_cooldown_or_backoff() -> None:
    j = job(placement=["a", "b"], last_scale_out_at=NOW, last_failed_scale_out_at=NOW)
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.SCALE_IN)


def test_scaler_in_flight_defers_the_scale_in_but_not_the_drain() -> None:
    scaler = Scaler(ScalerKind.SCALE_OUT, "bert-out-1", NOW, ("bert-worker-5",))
    j = job(placement=["a", "b"], scaler=scaler)
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0",)
    assert not only(ds, Action.SCALE_IN)
    noop = only(ds, Action.NOOP)[0]
    assert noop.reason is Reason.SCALER_IN_FLIGHT and Reason.PREEMPTION_NOTICE in noop.tags


def test_a_scale_in_already_covering_the_victims_is_not_repeated() -> None:
    scaler = Scaler(ScalerKind.SCALE_IN, "bert-in-1", NOW, ("bert-worker-0",))
    j = job(placement=["a", "b"], scaler=scaler, drained_hosts=frozenset({"bert-worker-0"}))
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert not only(ds, Action.SCALE_IN) and not only(ds, Action.DRAIN)
    assert not only(ds, Action.UNDRAIN)


def test_job_not_running_drains_but_waits_to_scale_in() -> None:
    j = job(placement=["a", "b"], running=False)
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.DRAIN) and not only(ds, Action.SCALE_IN)
    assert only(ds, Action.NOOP)[0].reason is Reason.JOB_NOT_RUNNING


def test_when_every_host_is_doomed_one_is_kept_so_horovod_does_not_stop() -> None:
    later = NOW + timedelta(minutes=2)
    j = job(lo=2, placement=["a", "b"])
    ns = [notice("a", deadline=NOW + timedelta(seconds=30)), notice("b", nid="e2", deadline=later)]
    ds = run(snapshot([node("a"), node("b")], [j], ns))
    drain = only(ds, Action.DRAIN)[0]
    assert drain.hosts == ("bert-worker-0",)  # b lives longer: its worker stays visible
    assert Reason.LAST_HOST_KEPT in drain.tags and Reason.BELOW_MIN in drain.tags


def test_keep_last_host_can_be_turned_off() -> None:
    j = job(placement=["a"])
    ds = run(
        snapshot([node("a")], [j], [notice("a")]), policies(preemption={"keep_last_host": False})
    )
    assert only(ds, Action.SCALE_IN)[0].to_workers == 0


def test_rebalance_only_avoids_by_default() -> None:
    j = job(hi=2, placement=["a"])
    ds = run(
        snapshot([node("a"), node("b", gpus=1, used=1)], [j], [notice("a", NoticeKind.REBALANCE)])
    )
    assert not only(ds, Action.DRAIN)
    assert only(ds, Action.NOOP)[0].reason is Reason.REBALANCE


def test_rebalance_drain_policy_leaves_early_but_never_below_min() -> None:
    j = job(lo=2, hi=8, placement=["a", "a", "b"])
    ps = policies(preemption={"rebalance": "drain"})
    ds = run(
        snapshot([node("a"), node("b", gpus=1, used=1)], [j], [notice("a", NoticeKind.REBALANCE)]),
        ps,
    )
    scale_in = only(ds, Action.SCALE_IN)[0]
    assert scale_in.reason is Reason.REBALANCE and scale_in.to_workers == 2
    assert Reason.CLAMP_MIN in scale_in.tags


def test_a_voluntary_disruption_keeps_protected_workers_and_places_nothing_new_there() -> None:
    j = job(hi=2, placement=["a"])
    ds = run(
        snapshot([node("a"), node("b", gpus=1, used=1)], [j], [notice("a", NoticeKind.DISRUPTION)])
    )
    assert not only(ds, Action.DRAIN) and not only(ds, Action.SCALE_IN)
    assert not only(ds, Action.SCALE_OUT)  # a's idle GPUs are on a node that goes


def test_a_voluntary_disruption_the_policy_lets_move_drains_first_even_below_min() -> None:
    j = job(lo=2, hi=8, placement=["a", "b"])
    ps = policies(preemption={"voluntary": "drain", "keep_last_host": False})
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a", NoticeKind.DISRUPTION)]), ps)
    assert [d.action for d in ds][:2] == [Action.DRAIN, Action.SCALE_IN]
    drain, scale_in = only(ds, Action.DRAIN)[0], only(ds, Action.SCALE_IN)[0]
    assert drain.reason is scale_in.reason is Reason.KARPENTER_DISRUPTION
    assert drain.hosts == scale_in.pods == ("bert-worker-0",)  # the node goes: min cannot hold
    assert Reason.BELOW_MIN in scale_in.tags


def test_an_interruption_on_the_same_node_outranks_a_voluntary_disruption() -> None:
    j = job(placement=["a", "b"])
    ps = policies(preemption={"voluntary": "drain"})
    both = [notice("a", NoticeKind.DISRUPTION), notice("a", nid="e2")]
    ds = run(snapshot([node("a"), node("b")], [j], both), ps)
    assert only(ds, Action.DRAIN)[0].reason is Reason.PREEMPTION_NOTICE


def test_maintenance_is_hard_only_when_near() -> None:
    j = job(placement=["a", "b"])
    far = notice("a", NoticeKind.MAINTENANCE, deadline=NOW + timedelta(days=2))
    near = notice("a", NoticeKind.MAINTENANCE, deadline=NOW + timedelta(minutes=5))
    assert not only(run(snapshot([node("a"), node("b")], [j], [far])), Action.DRAIN)
    assert (
        only(run(snapshot([node("a"), node("b")], [j], [near])), Action.SCALE_IN)[0].reason
        is Reason.MAINTENANCE
    )


def test_state_change_is_hard() -> None:
    j = job(placement=["a", "b"])
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a", NoticeKind.STATE_CHANGE)]))
    assert only(ds, Action.SCALE_IN)[0].pods == ("bert-worker-0",)


def test_withdrawn_notice_undrains_a_host_whose_node_is_healthy() -> None:
    j = job(placement=["a", "b"], drained_hosts=frozenset({"bert-worker-0"}))
    ds = run(snapshot([node("a", used=1), node("b", used=1)], [j]))
    undrain = only(ds, Action.UNDRAIN)[0]
    assert undrain.hosts == ("bert-worker-0",) and undrain.reason is Reason.NOTICE_WITHDRAWN


def test_drained_host_on_an_unschedulable_node_stays_drained() -> None:
    j = job(placement=["a", "b"], drained_hosts=frozenset({"bert-worker-0"}))
    assert not only(run(snapshot([node("a", schedulable=False), node("b")], [j])), Action.UNDRAIN)


def test_drained_host_that_left_the_job_is_forgotten() -> None:
    j = job(placement=["b"], drained_hosts=frozenset({"bert-worker-7"}))
    undrain = only(run(snapshot([node("b", used=1)], [j])), Action.UNDRAIN)[0]
    assert undrain.reason is Reason.HOST_GONE and undrain.hosts == ("bert-worker-7",)


def test_hosts_a_scale_in_removes_are_forgotten_together_once_its_last_pod_is_gone() -> None:
    """The operator deletes a ScaleIn's pods one at a time: one undrain per pod was a PATCH and
    an Event each. The gone ones wait while a drained worker it names is still there."""
    named = ("bert-worker-0", "bert-worker-7")
    scaler = Scaler(ScalerKind.SCALE_IN, "bert-in-1", NOW, named)
    going = job(placement=["a", "b"], scaler=scaler, drained_hosts=frozenset(named))
    ds = run(snapshot([node("a"), node("b")], [going], [notice("a")]))
    assert not only(ds, Action.UNDRAIN)
    gone = replace(going, workers=going.workers[1:])  # worker-0 left too
    undrain = only(run(snapshot([node("a"), node("b")], [gone], [notice("a")])), Action.UNDRAIN)
    assert [(d.reason, d.hosts) for d in undrain] == [(Reason.HOST_GONE, named)]


def test_above_max_scales_in_pending_first_then_dearest_nodes() -> None:
    placed = workers("bert", ["cheap", "dear", "cheap"])
    j = replace(
        job(hi=2),
        workers=(*placed, Worker("bert-worker-3", None, "bert-worker-3", 3, pending=True)),
    )
    nodes = [node("cheap", price=4.0), node("dear", price=16.0)]
    ds = run(snapshot(nodes, [j]))
    scale_in = only(ds, Action.SCALE_IN)[0]
    assert scale_in.reason is Reason.CLAMP_MAX
    assert scale_in.pods == ("bert-worker-1", "bert-worker-3")
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-1", "bert-worker-3")


def test_a_window_lowering_max_scales_in() -> None:
    j = job(hi=4, placement=["a", "a", "a"])
    ps = policies(
        windows=[
            {
                "name": "day",
                "schedule": "0 8 * * 1-5",
                "duration": "10h",
                "limits": {"max_workers": 1},
            }
        ]
    )
    assert only(run(snapshot([node("a", used=3)], [j]), ps), Action.SCALE_IN)[0].to_workers == 1
    night = NOW.replace(hour=22)
    assert not only(run(snapshot([node("a", used=3)], [j]), ps, now=night), Action.SCALE_IN)


def test_a_replacement_that_just_joined_does_not_free_the_kept_host() -> None:
    # worker-0 on doomed `a` was kept; its replacement worker-1 has run for 10 s only
    fresh = Worker(
        "bert-worker-1", "b", "bert-worker-1", 1, ready_since=NOW - timedelta(seconds=10)
    )
    j = replace(job(placement=["a"]), workers=(*workers("bert", ["a"]), fresh))
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert not only(ds, Action.DRAIN) and not only(ds, Action.SCALE_IN)
    kept = next(d for d in ds if d.reason is Reason.LAST_HOST_KEPT)
    assert kept.action is Action.NOOP and kept.hosts == ("bert-worker-0",)
    assert Reason.PREEMPTION_NOTICE in kept.tags
    settled = replace(fresh, ready_since=NOW - timedelta(seconds=45))
    j = replace(j, workers=(*workers("bert", ["a"]), settled))
    assert only(run(snapshot([node("a"), node("b")], [j], [notice("a")])), Action.DRAIN)[
        0
    ].hosts == ("bert-worker-0",)


def test_a_kept_doomed_host_is_refilled_as_if_gone() -> None:
    # the job's only host is doomed and kept; the refill must not wait for cooldown or min_idle
    j = job(lo=1, hi=4, placement=["a"], last_scale_out_at=NOW)
    ds = run(snapshot([node("a", used=1), node("b", gpus=2)], [j], [notice("a")], idle_since=NOW))
    assert only(ds, Action.NOOP)[0].reason is Reason.LAST_HOST_KEPT
    out = only(ds, Action.SCALE_OUT)[0]
    assert out.reason is Reason.BELOW_MIN and out.count == 1


def test_hosts_that_joined_together_are_survivors_for_each_other() -> None:
    # at the job's start every host is new: a survivor as old as the doomed host holds its state
    start = NOW - timedelta(seconds=3)
    placed = tuple(replace(w, ready_since=start) for w in workers("bert", ["a", "b"]))
    j = replace(job(placement=["a", "b"]), workers=placed)
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0",)
    assert Reason.LAST_HOST_KEPT not in only(ds, Action.DRAIN)[0].tags


# --- operators that remove the highest indices (mpi-operator) -----------------------------------
def test_a_doomed_worker_below_the_top_is_drained_but_never_scaled_in() -> None:
    j = job(placement=["a", "b", "c"], removes_highest_first=True)
    ds = run(snapshot([node("a"), node("b"), node("c")], [j], [notice("b")]))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-1",)
    assert not only(ds, Action.SCALE_IN)  # lowering replicas would remove bert-worker-2


def test_only_the_doomed_workers_at_the_top_are_scaled_in() -> None:
    j = job(placement=["a", "b", "c", "c"], removes_highest_first=True)
    ds = run(snapshot([node("a"), node("b"), node("c")], [j], [notice("a"), notice("c", nid="e2")]))
    assert only(ds, Action.DRAIN)[0].pods == ("bert-worker-0", "bert-worker-2", "bert-worker-3")
    [scale_in] = only(ds, Action.SCALE_IN)
    assert scale_in.pods == ("bert-worker-2", "bert-worker-3") and scale_in.to_workers == 2


def test_clamp_max_takes_the_highest_indices_when_the_operator_removes_those() -> None:
    # the usual order shrinks by pending pods first (bert-worker-0 here): not for this operator
    plain = job(hi=2, placement=["a", "b", "c"])
    plain = replace(plain, workers=(replace(plain.workers[0], pending=True), *plain.workers[1:]))
    nodes = [node("a", gpus=1), node("b", gpus=1), node("c", gpus=1)]
    assert only(run(snapshot(nodes, [plain])), Action.SCALE_IN)[0].pods == ("bert-worker-0",)
    top = replace(plain, removes_highest_first=True)
    assert only(run(snapshot(nodes, [top])), Action.SCALE_IN)[0].pods == ("bert-worker-2",)


def test_a_job_pinned_to_no_policy_still_leaves_a_noticed_node_but_does_not_grow() -> None:
    """A typo in the policy label must not cost workers abruptly, nor add any on a guess."""
    pinned = job(placement=["a", "b"], labels={POLICY_LABEL: "defualt"})
    noticed = run(snapshot([node("a"), node("b")], [pinned], [notice("a")]))
    assert [(d.action, d.policy) for d in noticed] == [
        (Action.DRAIN, "default"),
        (Action.SCALE_IN, "default"),
    ]
    [growth] = run(snapshot([node("a"), node("b")], [pinned]))
    assert (growth.action, growth.reason) == (Action.NOOP, Reason.UNKNOWN_POLICY)
    assert "'defualt' names no policy" in growth.message
    spelt = job(placement=["a", "b"], labels={POLICY_LABEL: "default"})
    assert only(run(snapshot([node("a"), node("b")], [spelt])), Action.SCALE_OUT)


# --- the kept last host and the launcher's report of Horovod's rank assignment ------------------
def _every_host_replaced(
    ready_for: float, assigned_for: float | None, deadline_in: float | None
) -> tuple:
    """Old `a` doomed (the job's only settled host); replacement worker-1 on `b`, ready
    `ready_for` s, in the report's assignment for `assigned_for` s (None: not assigned)."""
    fresh = Worker(
        "bert-worker-1", "b", "bert-worker-1", 1, ready_since=NOW - timedelta(seconds=ready_for)
    )
    assigned = {"bert-worker-0": NOW - timedelta(hours=1)}
    if assigned_for is not None:
        assigned["bert-worker-1"] = NOW - timedelta(seconds=assigned_for)
    j = replace(
        job(placement=["a"]),
        workers=(*workers("bert", ["a"]), fresh),
        assigned_hosts=frozenset(assigned),
        assigned_since=assigned,
    )
    deadline = NOW + timedelta(seconds=deadline_in) if deadline_in is not None else None
    return snapshot([node("a"), node("b")], [j], [notice("a", deadline=deadline)])


def _kept(ds: list) -> bool:
    return any(d.reason is Reason.LAST_HOST_KEPT for d in ds) and not only(ds, Action.DRAIN)


def test_a_replacement_settled_in_the_assignment_frees_the_kept_host_before_join_grace() -> None:
    # in the assignment for 16 s (> assigned_settle 15 s), though in the job for 18 s only
    ds = run(_every_host_replaced(ready_for=18, assigned_for=16, deadline_in=120))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0",)
    assert Reason.LAST_HOST_KEPT not in only(ds, Action.DRAIN)[0].tags


def test_a_replacement_still_joining_its_reset_keeps_the_host_while_the_deadline_is_far() -> None:
    # assigned 3 s ago: its join's reset may still run, and a removal announced then is dropped
    assert _kept(run(_every_host_replaced(ready_for=5, assigned_for=3, deadline_in=120)))
    # past join_grace (no report would free it), the report still says it only just joined
    assert _kept(run(_every_host_replaced(ready_for=45, assigned_for=3, deadline_in=120)))


def test_near_its_deadline_the_kept_host_goes_if_a_replacement_is_assigned_at_all() -> None:
    # 8 s left (< release_margin 10 s): the drain is graceful if the replacement has synced, and
    # dropped by Horovod (as if kept) if it is still joining
    ds = run(_every_host_replaced(ready_for=5, assigned_for=2, deadline_in=8))
    assert only(ds, Action.DRAIN)[0].hosts == ("bert-worker-0",)
    ps = policies(preemption={"release_margin": "5s"})
    assert _kept(run(_every_host_replaced(ready_for=5, assigned_for=2, deadline_in=8), ps))


def test_near_its_deadline_the_kept_host_stays_if_no_replacement_is_assigned() -> None:
    # draining it would leave Horovod no host of the previous assignment: the job would stop,
    # where its death with the replacement assigned costs a rollback (or a restart) only
    assert _kept(run(_every_host_replaced(ready_for=5, assigned_for=None, deadline_in=3)))
    # and without any report there is no evidence: join_grace stays the bound
    snap = _every_host_replaced(ready_for=5, assigned_for=2, deadline_in=3)
    j = replace(snap.jobs[0], assigned_hosts=None, assigned_since={})
    assert _kept(run(replace(snap, jobs=(j,))))


def test_an_unknown_deadline_never_releases_the_kept_host_early() -> None:
    assert _kept(run(_every_host_replaced(ready_for=5, assigned_for=2, deadline_in=None)))


def test_hosts_assigned_together_are_survivors_for_each_other() -> None:
    # at the job's start both hosts entered the assignment at once: b holds a's state
    start = NOW - timedelta(seconds=3)
    placed = tuple(replace(w, ready_since=start) for w in workers("bert", ["a", "b"]))
    since = {w.host: start for w in placed}
    j = replace(
        job(placement=["a", "b"]),
        workers=placed,
        assigned_hosts=frozenset(since),
        assigned_since=since,
    )
    ds = run(snapshot([node("a"), node("b")], [j], [notice("a")]))
    assert Reason.LAST_HOST_KEPT not in only(ds, Action.DRAIN)[0].tags


def test_the_plan_is_redone_when_the_replacement_settles_or_the_margin_is_reached() -> None:
    ps = policies()
    # assigned 2 s ago + assigned_settle 15 s; a deadline 12 s away less release_margin 10 s
    for deadline_in, flip in ((60, 13), (12, 2)):
        snap = _every_host_replaced(ready_for=5, assigned_for=2, deadline_in=deadline_in)
        memo, at = PassMemo(), NOW + timedelta(seconds=flip)
        decide(snap, ps, NOW, memo)
        decide(snap, ps, at - timedelta(microseconds=1), memo)
        assert memo.replanned == 0
        assert decide(snap, ps, at, memo) == decide(snap, ps, at)
        assert memo.replanned == 1
