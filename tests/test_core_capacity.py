"""Scale-out from idle GPUs: clamp, quantum, hysteresis, price cap, budgets, priority, fairness."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from core_fixtures import NOW, job, node, notice, only, policies, run, snapshot, workers

from autoscaler.core import Action, CapacityType, Reason, Scaler, ScalerKind


def grown(decisions, name: str = "ml/bert") -> int:
    return sum(d.count for d in decisions if d.action is Action.SCALE_OUT and d.job == name)


def reason_of(decisions, name: str = "ml/bert") -> Reason:
    return next(d.reason for d in decisions if d.job == name)


def test_whole_workers_of_idle_gpus_become_one_scale_out() -> None:
    ds = run(snapshot([node("a", gpus=8, used=3), node("b", gpus=4)], [job(hi=16, gpw=2)]))
    out = only(ds, Action.SCALE_OUT)[0]
    assert (out.count, out.from_workers, out.to_workers) == (4, 0, 4)  # 5//2 + 4//2
    assert out.reason is Reason.BELOW_MIN and set(out.nodes) == {"a", "b"}


def test_clamped_to_max_and_tagged() -> None:
    ds = run(snapshot([node("a", gpus=8)], [job(hi=3, placement=["a"])]))
    out = only(ds, Action.SCALE_OUT)[0]
    assert out.to_workers == 3 and Reason.CLAMP_MAX in out.tags


def test_job_at_max_is_a_noop_saying_so() -> None:
    ds = run(snapshot([node("a", gpus=8, used=2)], [job(hi=2, placement=["a", "a"])]))
    assert [(d.action, d.reason) for d in ds] == [(Action.NOOP, Reason.CLAMP_MAX)]


def test_idle_gpus_fewer_than_one_worker_needs() -> None:
    ds = run(
        snapshot(
            [node("a", gpus=8, used=5), node("b", gpus=8, used=6)], [job(gpw=4, placement=["a"])]
        )
    )
    assert grown(ds) == 0 and reason_of(ds) is Reason.NO_CAPACITY


def test_a_worker_never_spans_nodes() -> None:
    ds = run(
        snapshot(
            [node("a", gpus=4, used=2), node("b", gpus=4, used=2)], [job(gpw=4, placement=["a"])]
        )
    )
    assert grown(ds) == 0


def test_price_above_cap_is_not_used() -> None:
    nodes = [node("dear", gpus=8, price=40.0), node("cheap", gpus=2, used=1, price=4.0)]
    ps = policies(cost={"max_price_per_gpu_hour": 3.0})
    ds = run(snapshot(nodes, [job(hi=16, placement=["cheap"])]), ps)
    assert grown(ds) == 1 and only(ds, Action.SCALE_OUT)[0].nodes == ("cheap",)
    ds = run(snapshot([node("dear", gpus=8, price=40.0)], [job(placement=["x"])]), ps)
    assert grown(ds) == 0 and reason_of(ds) is Reason.PRICE_CAP


def test_unknown_price_is_excluded_only_when_a_cap_is_set() -> None:
    nodes = [node("a", price=None)]
    assert grown(run(snapshot(nodes, [job(placement=["x"])]))) > 0
    assert (
        grown(
            run(
                snapshot(nodes, [job(placement=["x"])]),
                policies(cost={"max_price_per_gpu_hour": 9}),
            )
        )
        == 0
    )


def test_cheapest_gpu_hour_first() -> None:
    nodes = [node("dear", gpus=1, price=5.0), node("cheap", gpus=1, price=1.0)]
    out = only(run(snapshot(nodes, [job(lo=0, hi=2, placement=["x"])])), Action.SCALE_OUT)[0]
    assert out.nodes == ("cheap",)


def test_capacity_types_can_exclude_on_demand() -> None:
    nodes = [node("od", capacity=CapacityType.ON_DEMAND)]
    ps = policies(scale_out={"capacity_types": ["spot"]})
    assert grown(run(snapshot(nodes, [job(placement=["x"])]), ps)) == 0


def test_power_of_two_quantum() -> None:
    ds = run(
        snapshot([node("a", gpus=3)], [job(hi=16, placement=["x", "y"])]),
        policies(scale_out={"quantum": "power_of_two"}),
    )
    assert only(ds, Action.SCALE_OUT)[0].to_workers == 4  # 2 -> 4, the third GPU stays idle
    ds = run(
        snapshot([node("a", gpus=1)], [job(hi=16, placement=["x", "y"])]),
        policies(scale_out={"quantum": "power_of_two"}),
    )
    assert grown(ds) == 0 and reason_of(ds) is Reason.QUANTUM


def test_multiple_of_quantum_and_off_quantum_start() -> None:
    ps = policies(scale_out={"quantum": {"multiple_of": 4}})
    ds = run(snapshot([node("a", gpus=8)], [job(hi=16, placement=["x"] * 3)]), ps)
    assert only(ds, Action.SCALE_OUT)[0].to_workers == 8  # 3 -> 4 -> 8


def test_quantum_never_overshoots_max() -> None:
    ps = policies(scale_out={"quantum": "power_of_two"})
    ds = run(snapshot([node("a", gpus=8)], [job(hi=6, placement=["x"] * 4)]), ps)
    assert grown(ds) == 0 and reason_of(ds) is Reason.QUANTUM


def test_max_step_limits_one_scaler() -> None:
    ds = run(
        snapshot([node("a", gpus=8)], [job(hi=16, placement=["x"])]),
        policies(scale_out={"max_step": 2}),
    )
    assert grown(ds) == 2


def test_min_idle_waits_for_capacity_to_settle() -> None:
    nodes = [node("a", gpus=4)]
    fresh = snapshot(nodes, [job(placement=["x"])], idle_since=NOW - timedelta(seconds=10))
    ds = run(fresh)
    assert grown(ds) == 0 and reason_of(ds) is Reason.MIN_IDLE
    assert (
        grown(run(snapshot(nodes, [job(placement=["x"])], idle_since=NOW - timedelta(minutes=2))))
        == 4
    )


def test_cooldown_after_a_change() -> None:
    j = job(placement=["x"], last_scale_out_at=NOW - timedelta(minutes=1))
    ds = run(snapshot([node("a", gpus=4)], [j]))
    assert grown(ds) == 0 and reason_of(ds) is Reason.COOLDOWN
    j = job(placement=["x"], last_scale_out_at=NOW - timedelta(minutes=6))
    assert grown(run(snapshot([node("a", gpus=4)], [j]))) == 4


def test_below_min_refills_without_cooldown_or_min_idle_but_only_to_min() -> None:
    j = job(lo=3, hi=8, placement=["x"], last_scale_out_at=NOW)
    fresh = snapshot([node("a", gpus=8)], [j], idle_since=NOW)
    out = only(run(fresh), Action.SCALE_OUT)[0]
    assert out.to_workers == 3 and out.reason is Reason.BELOW_MIN


def test_backoff_after_a_failed_scale_out() -> None:
    j = job(placement=["x"], last_failed_scale_out_at=NOW - timedelta(minutes=1))
    ds = run(snapshot([node("a", gpus=4)], [j]))
    assert grown(ds) == 0 and reason_of(ds) is Reason.BACKOFF
    later = replace(j, last_failed_scale_out_at=NOW - timedelta(minutes=3))  # backoff 2m
    assert grown(run(snapshot([node("a", gpus=4)], [later]))) == 4


def test_scaler_in_flight_blocks_scale_out() -> None:
    j = job(placement=["x"], scaler=Scaler(ScalerKind.SCALE_OUT, "s", NOW, ("bert-worker-1",)))
    ds = run(snapshot([node("a", gpus=4)], [j]))
    assert [(d.action, d.reason) for d in ds] == [(Action.NOOP, Reason.SCALER_IN_FLIGHT)]


def test_job_not_running_gets_no_scale_out() -> None:
    ds = run(snapshot([node("a", gpus=4)], [job(placement=["x"], running=False)]))
    assert reason_of(ds) is Reason.JOB_NOT_RUNNING


def test_scale_out_disabled_by_a_window() -> None:
    ps = policies(
        windows=[{"name": "freeze", "schedule": "0 12 * * *", "duration": "1h", "scale_out": False}]
    )
    ds = run(snapshot([node("a", gpus=4)], [job(placement=["x"])]), ps)
    assert reason_of(ds) is Reason.SCALE_OUT_DISABLED


def test_noticed_nodes_get_no_new_workers() -> None:
    ds = run(snapshot([node("a", gpus=4)], [job(placement=["x"])], [notice("a")]))
    assert grown(ds) == 0


def test_job_budget_per_hour() -> None:
    # 1 $/GPU-hour; the job already spends 2 $/h on node x; budget 5 -> 3 more workers
    nodes = [node("x", gpus=2, used=2, price=2.0), node("a", gpus=8, price=8.0)]
    ps = policies(cost={"budget_per_hour": 5.0})
    ds = run(snapshot(nodes, [job(hi=16, placement=["x", "x"])]), ps)
    assert grown(ds) == 3
    ds = run(
        snapshot(nodes, [job(hi=16, placement=["x", "x"])]), policies(cost={"budget_per_hour": 2.0})
    )
    assert grown(ds) == 0 and reason_of(ds) is Reason.BUDGET


def test_cluster_budget_is_shared_by_all_jobs() -> None:
    ps = policies()
    ps = ps.model_copy(update={"cluster_budget_per_hour": 3.0})
    jobs = [job("a", hi=8, placement=["x"]), job("b", hi=8, placement=["x"])]
    ds = run(
        snapshot([node("x", gpus=2, used=2, price=2.0), node("n", gpus=8, price=8.0)], jobs), ps
    )
    assert grown(ds, "ml/a") + grown(ds, "ml/b") == 1  # 2 $/h spent, 1 $/h left


def test_priority_first_then_fairness() -> None:
    low, high = (
        job("low", hi=8, placement=["x"], priority=0),
        job("high", hi=8, placement=["x"], priority=5),
    )
    ds = run(snapshot([node("n", gpus=3)], [low, high]))
    assert grown(ds, "ml/high") == 3 and grown(ds, "ml/low") == 0
    a, b = job("a", hi=8, placement=["x"] * 4), job("b", hi=8, placement=["x"])
    ds = run(snapshot([node("n", gpus=5)], [a, b]))
    assert (grown(ds, "ml/a"), grown(ds, "ml/b")) == (1, 4)  # water-filling: 5 and 5 of 8


def test_policy_priority_overrides_job_priority() -> None:
    ps = policies()
    ps = ps.model_validate(
        {
            "policies": [
                {"name": "vip", "priority": 10, "match": {"names": ["ml/b"]}},
                {"name": "default"},
            ]
        }
    )
    a, b = job("a", hi=8, placement=["x"], priority=3), job("b", hi=8, placement=["x"])
    ds = run(snapshot([node("n", gpus=2)], [a, b]), ps)
    assert grown(ds, "ml/b") == 2 and next(d.policy for d in ds if d.job == "ml/b") == "vip"


def test_scale_out_warns_when_the_operator_would_reuse_a_blacklisted_name() -> None:
    # worker-2 died abruptly and was removed; the next ScaleOut recreates index 2
    failed = frozenset({"bert-worker-2"})
    j = job(hi=8, placement=["x", "x"], failed_hosts=failed, reuses_names=True)
    out = only(run(snapshot([node("a", gpus=2)], [j])), Action.SCALE_OUT)[0]
    assert Reason.BLACKLIST_RISK in out.tags and "--blacklist-cooldown-range" in out.message
    fresh = job(hi=8, placement=["x", "x"], failed_hosts=failed)  # names never reused: no risk
    assert (
        Reason.BLACKLIST_RISK
        not in only(run(snapshot([node("a", gpus=2)], [fresh])), Action.SCALE_OUT)[0].tags
    )
    clean = job(
        hi=8, placement=["x", "x"], failed_hosts=frozenset({"bert-worker-9"}), reuses_names=True
    )
    assert (
        Reason.BLACKLIST_RISK
        not in only(run(snapshot([node("a", gpus=2)], [clean])), Action.SCALE_OUT)[0].tags
    )


def test_unbound_pending_workers_keep_their_room() -> None:
    # gpt's ScaleOut pod is Pending and not yet bound: the only idle GPU is where it will land
    scaling = replace(
        job("gpt", hi=8, placement=["x"]),
        workers=workers("gpt", ["x", None], pending=1),
        scaler=Scaler(ScalerKind.SCALE_OUT, "gpt-out", NOW, ("gpt-worker-1",)),
    )
    ds = run(
        snapshot(
            [node("x", gpus=1, used=1), node("n", gpus=1)],
            [scaling, job("bert", hi=8, placement=["x"])],
        )
    )
    assert grown(ds, "ml/bert") == 0


def test_a_scale_out_whose_pods_are_not_made_yet_keeps_their_room() -> None:
    # gpt's ScaleOut of 2 exists, the operator has made neither pod yet: the two idle GPUs are
    # theirs (given to bert too, gpt's pods would stay Pending and its ScaleOut roll back: the
    # fault suite's seed 12, a pass 0.7 s after the one that decided gpt's)
    nodes = [node("x", gpus=1, used=1), node("y", gpus=2)]
    gpt = replace(
        job("gpt", hi=8, placement=["x"]),
        scaler=Scaler(ScalerKind.SCALE_OUT, "gpt-out", NOW, unborn=2),
    )
    bert = job("bert", hi=8, placement=["x"])
    assert grown(run(snapshot(nodes, [gpt, bert])), "ml/bert") == 0
    # one made (Pending, unbound): one GPU is still free for bert
    made = replace(
        gpt,
        workers=workers("gpt", ["x", None], pending=1),
        scaler=replace(gpt.scaler, pods=("gpt-worker-1",), unborn=1),
    )
    assert grown(run(snapshot(nodes, [made, bert])), "ml/bert") == 0
    free = [node("x", gpus=1, used=1), node("y", gpus=3)]
    assert grown(run(snapshot(free, [made, bert])), "ml/bert") == 1


def test_after_a_rolled_back_scale_out_growth_asks_for_what_came() -> None:
    # bert's last ScaleOut was rolled back with 2 of its workers Running: the next asks for 2
    # (at least 1), under the policy's max_step too; a success lifts it (failed_with None)
    nodes = [node("a", gpus=8)]
    for failed_with, max_step, count in ((2, None, 2), (0, None, 1), (3, 2, 2), (None, None, 7)):
        bert = replace(job(hi=8, placement=["x"]), failed_with=failed_with)
        rules = policies(scale_out={"max_step": max_step}) if max_step else policies()
        assert grown(run(snapshot(nodes, [bert]), rules)) == count, (failed_with, max_step)


def test_scale_out_carries_the_policy_timeout() -> None:
    ds = run(
        snapshot([node("a", gpus=2)], [job(placement=["x"])]),
        policies(scale_out={"timeout": "90s"}),
    )
    assert only(ds, Action.SCALE_OUT)[0].timeout == timedelta(seconds=90)


def test_room_for_a_below_min_refill_is_held_while_its_scale_in_runs() -> None:
    # bert loses both workers on `a` (min 2): its ScaleIn is this pass's scaler, so it cannot grow
    # yet; gpt must not take the two GPUs bert's refill needs
    bert = job("bert", lo=2, hi=8, placement=["a", "a"])
    gpt = job("gpt", lo=1, hi=8, placement=["x"])
    nodes = [node("a", gpus=2, used=2), node("b", gpus=3), node("x", gpus=1, used=1)]
    ds = run(
        snapshot(nodes, [bert, gpt], [notice("a")]), policies(preemption={"keep_last_host": False})
    )
    assert only(ds, Action.SCALE_IN)[0].job == "ml/bert"
    assert grown(ds, "ml/gpt") == 1  # 3 idle GPUs - 2 held for bert


# --- unpriced nodes and shared-GPU nodes ---------------------------------------------------------
def test_unknown_types_spot_gets_the_worker_before_a_big_on_demand_node() -> None:
    # the shipped config used to price every unknown type at one figure per node: 3.06/8 per
    # GPU-hour for the on-demand node beat 0.91 for the spot one. Now unknown types are priced
    # per GPU-hour (x its GPUs), or not at all: either way the spot node comes first.
    for od, spot in ((None, None), (8 * 3.06, 0.91)):
        nodes = [
            node("od-8", gpus=8, price=od, capacity=CapacityType.ON_DEMAND),
            node("spot-1", gpus=1, price=spot),
        ]
        ds = run(snapshot(nodes, [job(lo=0, hi=1)]))
        assert only(ds, Action.SCALE_OUT)[0].nodes == ("spot-1",), (od, spot)


def test_an_unpriced_on_demand_node_ranks_after_an_unpriced_spot_node() -> None:
    # best fit alone would pick the on-demand node (1 GPU left against 8): without a price that
    # says so, on-demand is never taken for the cheaper one
    nodes = [
        node("od", gpus=8, used=7, price=None, capacity=CapacityType.ON_DEMAND),
        node("spot", gpus=8, price=None),
    ]
    ds = run(snapshot(nodes, [job(lo=0, hi=1)]))
    assert only(ds, Action.SCALE_OUT)[0].nodes == ("spot",)
    # a known on-demand price is a configured price: it competes on price as before
    nodes = [
        node("od", gpus=8, used=7, price=0.8, capacity=CapacityType.ON_DEMAND),
        node("spot", gpus=8, price=8.0),
    ]
    assert only(run(snapshot(nodes, [job(lo=0, hi=1)])), Action.SCALE_OUT)[0].nodes == ("od",)


def test_unpriced_nodes_stay_above_a_price_cap() -> None:
    nodes = [node("spot", gpus=1, price=None)]
    ds = run(snapshot(nodes, [job(lo=0, hi=1)]), policies(cost={"max_price_per_gpu_hour": 5.0}))
    assert grown(ds) == 0 and reason_of(ds) is Reason.PRICE_CAP


def test_shared_gpu_nodes_take_workers_only_where_the_policy_allows() -> None:
    shared = replace(node("share", gpus=4, price=4.0), shared_gpu=True)
    snap = snapshot([shared], [job(lo=0, hi=2)])
    assert grown(run(snap)) == 0 and reason_of(run(snap)) is Reason.NO_CAPACITY
    allowed = run(snap, policies(scale_out={"shared_gpu": True}))
    assert grown(allowed) == 2 and only(allowed, Action.SCALE_OUT)[0].nodes == ("share", "share")
    # a whole-GPU node next to it is used by either policy
    both = snapshot([shared, node("whole", gpus=1, price=8.0)], [job(lo=0, hi=2)])
    assert only(run(both), Action.SCALE_OUT)[0].nodes == ("whole",)
