"""The simulated cluster's on-demand pool (a Karpenter stand-in) and the progress jobs report."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from autoscaler.config import Config
from autoscaler.config.schema import OnDemandPool, SimJob
from autoscaler.core import Action, CapacityType, Decision, Reason
from autoscaler.sim.cluster import JobProgress, NodePool, SimNode, SimulatedCluster
from autoscaler.sim.run import EPOCH, Accounts, sim_cluster

JOB = "default/train"
PRICE = 3.06  # on-demand, per node-hour (one GPU per node)
DELAY, TTL = timedelta(seconds=90), timedelta(seconds=30)


def _at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def _cluster(
    max_nodes: int | None = None, timeout: timedelta = timedelta(minutes=3)
) -> SimulatedCluster:
    template = SimNode("", 1, CapacityType.ON_DEMAND, PRICE, "p3.2xlarge", pooled=True)
    pool = NodePool(
        OnDemandPool(provisioning_delay=DELAY, empty_node_ttl=TTL, max_nodes=max_nodes), template
    )
    return SimulatedCluster(
        [SimJob(name="train", min_workers=1, max_workers=8)],
        pod_startup=timedelta(seconds=45),
        scale_out_timeout=timeout,
        scale_in_grace=timedelta(seconds=5),
        pool=pool,
    )


def _scale_out(cluster: SimulatedCluster, now: datetime, count: int) -> None:
    """A ScaleOut with no nodes: more workers than idle capacity holds (the deadline rule's)."""
    job = cluster.snapshot(now).jobs[0]
    to = len(job.workers) + count
    decision = Decision.about(job, Action.SCALE_OUT, Reason.BEHIND_DEADLINE, "t", to, count=count)
    cluster.apply(decision, now)


def _scale_in(cluster: SimulatedCluster, now: datetime, pod: str) -> None:
    job = cluster.snapshot(now).jobs[0]
    to = len(job.workers) - 1
    decision = Decision.about(job, Action.SCALE_IN, Reason.AHEAD_OF_DEADLINE, "t", to, pods=(pod,))
    cluster.apply(decision, now)


def _pooled(cluster: SimulatedCluster) -> list[str]:
    return sorted(n.name for n in cluster.nodes.values() if n.pooled)


def _run(cluster: SimulatedCluster, accounts: Accounts, until: float) -> None:
    """Let the cluster change on its own up to `until` seconds, accounting as replay does."""
    while (own := cluster.next_change()) is not None and own <= _at(until):
        accounts.advance(cluster, own)
        cluster.advance(own)
    accounts.advance(cluster, _at(until))
    cluster.advance(_at(until))


def test_a_pod_no_node_takes_gets_an_on_demand_node_after_the_delay_billed_whole() -> None:
    cluster, accounts = _cluster(), Accounts()
    _scale_out(cluster, _at(0), 2)  # nodes=(): beyond any idle capacity
    _run(cluster, accounts, 89)
    assert _pooled(cluster) == [] and len(cluster.claims) == 2 and accounts.cost_usd == 0
    _run(cluster, accounts, 90)
    assert _pooled(cluster) == ["on-demand-pool-1", "on-demand-pool-2"]
    assert all(p.node in _pooled(cluster) for p in cluster.pods.values())
    _run(cluster, accounts, 90 + 45)
    assert all(p.running for p in cluster.pods.values())
    assert cluster.jobs[JOB].scaler is None  # the ScaleOut succeeded
    _run(cluster, accounts, 90 + 3600)
    assert accounts.cost_usd == pytest.approx(2 * PRICE)  # two nodes for the hour since they came
    assert accounts.gpu_hours == {"on-demand": pytest.approx(2.0)}


def test_an_empty_pool_node_is_paid_until_its_ttl_then_removed() -> None:
    cluster, accounts = _cluster(), Accounts()
    _scale_out(cluster, _at(0), 2)
    _run(cluster, accounts, 600)
    victim = sorted(cluster.pods)[0]
    _scale_in(cluster, _at(600), victim)
    _run(cluster, accounts, 605)  # the ScaleIn's grace: the pod is deleted, its node is empty
    assert len(cluster.pods) == 1 and len(_pooled(cluster)) == 2
    assert cluster.next_change() == _at(605) + TTL
    _run(cluster, accounts, 605 + 29)
    assert len(_pooled(cluster)) == 2
    _run(cluster, accounts, 3600)
    assert len(_pooled(cluster)) == 1
    # one node from 90 s to the end, the emptied one from 90 s to its removal 30 s after 605 s
    paid_seconds = (3600 - 90) + (605 + 30 - 90)
    assert accounts.cost_usd == pytest.approx(PRICE * paid_seconds / 3600)


def test_the_pool_never_exceeds_its_node_cap() -> None:
    cluster, accounts = _cluster(max_nodes=2), Accounts()
    _scale_out(cluster, _at(0), 3)
    assert len(cluster.claims) == 2
    _run(cluster, accounts, 150)
    assert len(_pooled(cluster)) == 2 and cluster.claims == []
    assert sum(p.node is None for p in cluster.pods.values()) == 1  # waits: the cap is reached


def test_a_scale_out_rolled_back_before_its_node_arrives_cancels_the_provisioning() -> None:
    cluster, accounts = _cluster(timeout=timedelta(seconds=60)), Accounts()
    _scale_out(cluster, _at(0), 1)
    assert len(cluster.claims) == 1
    _run(cluster, accounts, 60)
    assert cluster.pods == {} and cluster.scale_outs_failed == 1
    assert cluster.claims == []
    _run(cluster, accounts, 3600)
    assert _pooled(cluster) == [] and accounts.cost_usd == 0


def test_a_pod_bound_to_spot_meanwhile_needs_no_on_demand_node() -> None:
    cluster, accounts = _cluster(), Accounts()
    _scale_out(cluster, _at(0), 1)
    cluster.add_node(SimNode("spot-1", 1, CapacityType.SPOT, 0.91, "p3.2xlarge"))
    _run(cluster, accounts, 10)  # the next tick: the scheduler binds the pod to the new node
    _run(cluster, accounts, 3600)
    assert _pooled(cluster) == [] and cluster.claims == []
    assert next(iter(cluster.pods.values())).node == "spot-1"


def test_an_empty_pool_node_is_preferred_to_an_idle_spot_node_until_it_goes() -> None:
    # the worker template's preferred on-demand affinity: a pod scheduled within the TTL reuses
    # the on-demand node; once it is gone, the next pod binds to spot
    cluster, accounts = _cluster(), Accounts()
    _scale_out(cluster, _at(0), 1)
    _run(cluster, accounts, 600)
    cluster.add_node(SimNode("spot-1", 1, CapacityType.SPOT, 0.91, "p3.2xlarge"))
    _scale_in(cluster, _at(600), "train-worker-0")
    _run(cluster, accounts, 610)
    _scale_out(cluster, _at(610), 1)
    assert cluster.pods["train-worker-1"].node == "on-demand-pool-1"
    _run(cluster, accounts, 700)
    _scale_in(cluster, _at(700), "train-worker-1")
    _run(cluster, accounts, 800)
    _scale_out(cluster, _at(800), 1)
    assert _pooled(cluster) == [] and cluster.pods["train-worker-2"].node == "spot-1"


def test_simulate_has_no_pool_by_default() -> None:
    assert Config().simulate.on_demand_pool is None
    assert sim_cluster(Config()).pool is None


class _Reported:
    def progress(self, job: str, now: datetime) -> JobProgress:
        return JobProgress(EPOCH, (now - EPOCH).total_seconds() / 36000, 0.05)


def test_the_snapshot_carries_the_progress_jobs_report() -> None:
    config = Config.model_validate({"simulate": {"jobs": [{"name": "train", "max_workers": 4}]}})
    job = sim_cluster(config, progress=_Reported()).snapshot(_at(3600)).jobs[0]
    assert (job.started_at, job.progress, job.progress_rate) == (EPOCH, pytest.approx(0.1), 0.05)
    bare = sim_cluster(config).snapshot(_at(3600)).jobs[0]
    assert (bare.started_at, bare.progress, bare.progress_rate) == (None, None, None)


def _scarce(seed: int, **settings: object) -> SimulatedCluster:
    template = SimNode("", 1, CapacityType.ON_DEMAND, PRICE, "p3.2xlarge", pooled=True)
    pool = NodePool(OnDemandPool.model_validate({"empty_node_ttl": "30s", **settings}), template)
    return SimulatedCluster(
        [SimJob(name="train", min_workers=1, max_workers=8)],
        pod_startup=timedelta(seconds=45),
        scale_out_timeout=timedelta(hours=2),
        scale_in_grace=timedelta(seconds=5),
        pool=pool,
        seed=seed,
    )


def test_scarce_nodes_take_a_seeded_delay_between_the_bounds() -> None:
    delays = []
    for seed in range(1, 9):
        cluster = _scarce(seed, provisioning_delay="2m", provisioning_delay_max="20m")
        _scale_out(cluster, _at(0), 1)
        delays.append((cluster.claims[0].ready_at - _at(0)).total_seconds())
    assert all(120 <= d <= 1200 for d in delays) and len(set(delays)) == len(delays)
    again = _scarce(3, provisioning_delay="2m", provisioning_delay_max="20m")
    _scale_out(again, _at(0), 1)
    assert (again.claims[0].ready_at - _at(0)).total_seconds() == delays[2]  # seeded


def test_a_refused_node_never_joins_and_its_pods_get_a_new_claim() -> None:
    cluster, accounts = _scarce(1, provisioning_delay="2m", refusal_probability=1.0), Accounts()
    _scale_out(cluster, _at(0), 2)
    _run(cluster, accounts, 3600)
    assert _pooled(cluster) == [] and accounts.cost_usd == 0  # refused: nothing paid
    assert cluster.claims_refused >= 2 * 29 and len(cluster.claims) == 2  # retried every 2 min
    assert not any(p.running for p in cluster.pods.values())


def test_a_delay_max_below_the_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="provisioning_delay_max is below"):
        OnDemandPool.model_validate({"provisioning_delay": "5m", "provisioning_delay_max": "2m"})
