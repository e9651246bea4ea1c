"""Karpenter v1.8.0 (its kwok cloud provider, support/karpenter.py) on the real control plane,
launching the GPU nodes that PyTorchJob workers run on (the real training-operator; kwok runs the
pods), and interrupting them as the AWS provider does: the NodeClaim deleted. Karpenter then
taints the node `karpenter.sh/disrupted:NoSchedule` and evicts its pods, honouring PDBs until the
NodePool's terminationGracePeriod, when it deletes them (docs/testing.md, "Karpenter v1.8.0").

The daemon (`spot-autoscaler run` under deploy/rbac.yaml's rules) reads the taint as a notice,
drains the worker from discovery and deletes it by name; its guard (a PDB over the job's
workers) holds Karpenter's eviction off meanwhile.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.karpenter import (
    CAPACITY_TYPE,
    DISRUPTED,
    INSTANCE_TYPE,
    NODEPOOL_LABEL,
    ON_DEMAND,
    POOL_VALUE,
    POOLS,
    SPOT,
    TERMINATION_TIME,
    Karpenter,
    daemon_beside,
    interrupt_worker,
    karpenter,
    karpenter_job,
    recording,
    summary,
    tainted,
)
from support.pytorch_cluster import NS, SETTLE, Cluster, cluster
from support.real_daemon import json_lines
from support.real_namespace import POOL, daemon_config, isolated
from support.waiting import wait_for

from autoscaler.adapters.kube.eviction_guard import guard_name
from autoscaler.annotations import DRAINED_ANNOTATION

pytestmark = pytest.mark.real_cluster
__all__ = ["cluster", "karpenter"]  # the fixtures

Obj = dict
N = 3  # interruptions in the daemon's test (benchmarks/karpenter_interruptions.py: 20)


# --- fixtures --------------------
PoolsFactory = Callable[..., None]


@pytest.fixture
def pools(cluster: Cluster, karpenter: Karpenter) -> Iterator[PoolsFactory]:
    """`pools(tgp=None)`: a spot NodePool (weight 10: preferred) and an on-demand one, both
    labelling their nodes with our pool and tainting them with our namespace's taint. Afterwards
    the test's pods go first (an empty node drains at once), then the NodePools and their nodes."""

    try:
        yield lambda tgp=None: karpenter.gpu_pools(NS, tgp)
    finally:
        cluster.cleanup()
        policy = client.PolicyV1Api(cluster.api)
        for pdb in policy.list_namespaced_pod_disruption_budget(NS).items:
            with contextlib.suppress(ApiException):
                policy.delete_namespaced_pod_disruption_budget(pdb.metadata.name, NS)
        for pool in POOLS:
            karpenter.delete_node_pool(pool)


@pytest.fixture(scope="module")
def daemon(karpenter: Karpenter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`spot-autoscaler run` as deployed, for the module's last tests; its logs' directory."""
    with daemon_beside(karpenter, tmp_path_factory.mktemp("daemon"), NS, daemon_config(NS)) as tmp:
        yield tmp


def guard(cluster: Cluster, job_name: str) -> None:
    """A PDB like the daemon's guard (maxUnavailable 0) over the job's workers, once the
    disruption controller has judged it (condition DisruptionAllowed, False either way: no
    disruption allowed, or its fail-safe while it cannot count the job's pods)."""
    policy = client.PolicyV1Api(cluster.api)
    selector = {
        "training.kubeflow.org/job-name": job_name,
        "training.kubeflow.org/replica-type": "worker",
    }
    body = {
        "metadata": {"name": guard_name(job_name)},
        "spec": {"selector": {"matchLabels": selector}, "maxUnavailable": 0},
    }
    policy.create_namespaced_pod_disruption_budget(NS, body)

    def judged() -> bool:
        status = policy.read_namespaced_pod_disruption_budget(guard_name(job_name), NS).status
        return any(c.type == "DisruptionAllowed" for c in (status and status.conditions) or ())

    wait_for(judged, SETTLE, "the disruption controller judging the guard")


def node_of(cluster: Cluster, job_name: str, index: int = 0) -> client.V1Node:
    pod = cluster.workers(job_name)[f"{job_name}-worker-{index}"]
    return cluster.core.read_node(pod.spec.node_name)


# --- launching --------------------
def test_a_pending_gpu_worker_gets_a_spot_node_from_the_preferred_pool_and_kwok_runs_it(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory
) -> None:
    pools()
    cluster.create(karpenter_job("launch"))
    cluster.wait_settled("launch", 1)
    node = node_of(cluster, "launch")
    labels = node.metadata.labels
    assert (labels[CAPACITY_TYPE], labels[NODEPOOL_LABEL]) == ("spot", SPOT)
    assert labels["node.kubernetes.io/instance-type"] == INSTANCE_TYPE
    assert labels[POOL] == POOL_VALUE and node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    # the instance's GPUs are in allocatable; capacity holds only what the NodeClaim asked for
    assert node.status.allocatable["nvidia.com/gpu"] == "1"
    assert node.spec.provider_id == f"kwok://{node.metadata.name}"
    # Karpenter syncs the Node first and writes the NodeClaim's status.nodeName after, in the
    # lifecycle controller's status patch (pkg/controllers/nodeclaim/lifecycle/registration.go
    # `Registration.Reconcile`): the Node can be settled while the claim does not name it yet
    claim = wait_for(
        lambda: next(
            (c for c in karpenter.node_claims(SPOT) if c.get("status", {}).get("nodeName")), None
        ),
        15,
        "the NodeClaim's status.nodeName",
    )
    assert len(karpenter.node_claims(SPOT)) == 1
    assert claim["status"]["nodeName"] == node.metadata.name
    # kubernetes.io/hostname is the NodeClaim's name, not the Node's (kwok cloudprovider.go
    # addInstanceLabels): pods must be joined to nodes by spec.nodeName
    assert labels["kubernetes.io/hostname"] == claim["metadata"]["name"] != node.metadata.name
    assert {t.key for t in node.spec.taints or []} == {isolated(NS)["key"]}
    assert labels["karpenter.sh/initialized"] == "true"


def test_a_worker_asking_for_on_demand_gets_a_node_of_the_on_demand_pool(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory
) -> None:
    pools()
    cluster.create(karpenter_job("od", capacity_type="on-demand"))
    cluster.wait_settled("od", 1)
    labels = node_of(cluster, "od").metadata.labels
    assert (labels[CAPACITY_TYPE], labels[NODEPOOL_LABEL]) == ("on-demand", ON_DEMAND)
    assert labels["eks-node-viewer/instance-price"] == "1.200000"  # the on-demand offering's
    assert karpenter.node_claims(SPOT) == []


# --- interruption, Karpenter alone --------------------
def test_an_interruption_taints_the_node_and_evicts_an_unguarded_worker_at_once(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory
) -> None:
    """Why the daemon needs its guard: without a PDB the eviction follows the taint within the
    same reconcile (terminator.go `Taint`, then `Drain`), far faster than any drain."""
    pools()
    cluster.create(karpenter_job("bare"))
    cluster.wait_settled("bare", 1)
    node = node_of(cluster, "bare").metadata.name
    claim = karpenter.claim_of(node)["metadata"]["name"]
    with (
        recording(cluster.core.list_node, field_selector=f"metadata.name={node}") as nodes,
        recording(cluster.core.list_namespaced_pod, NS) as pods,
    ):
        requested = karpenter.interrupt(node)
        evicted = wait_for(
            lambda: pods.first(lambda s: s.type == "DELETED"), SETTLE, "the worker evicted"
        )
        taint = nodes.first(lambda s: tainted(s.obj))
        assert taint is not None
        conditions = {c["type"]: c.get("reason") for c in evicted.obj["status"]["conditions"]}
        assert conditions["DisruptionTarget"] == "EvictionByEvictionAPI"
        assert evicted.at - taint.at < 2.0, "the eviction came long after the taint"
        assert taint.at > requested
        # a taint, no cordon; and a label taking it out of load balancers
        spec, labels = taint.obj["spec"], taint.obj["metadata"]["labels"]
        assert not spec.get("unschedulable")
        assert labels["node.kubernetes.io/exclude-from-external-load-balancers"] == "karpenter"
    # Karpenter sends its Events from a thread of their own: under load they come after the
    # eviction is seen
    events = wait_for(
        lambda: [
            e.message
            for e in karpenter.events(NS, "Evicted")
            if e.involved_object.name == "bare-worker-0"
        ],
        SETTLE,
        "Karpenter's Evicted Event",
    )
    assert events == ["Evicted pod: Forceful Termination"]
    # the operator makes the worker again and Karpenter launches a node for it; the old one goes
    wait_for(
        lambda: claim not in {c["metadata"]["name"] for c in karpenter.node_claims(SPOT)},
        SETTLE,
        "the NodeClaim gone",
    )


def test_a_pdb_guarded_worker_keeps_running_while_karpenter_drains_its_node(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory
) -> None:
    """No terminationGracePeriod: the drain waits on the guarded worker, and would forever
    (kubernetes-sigs/karpenter#1789)."""
    pools()
    cluster.create(karpenter_job("held"))
    cluster.wait_settled("held", 1)
    guard(cluster, "held")
    node = node_of(cluster, "held").metadata.name
    karpenter.interrupt(node)
    # Karpenter's drain found the worker and waits on it (Event "1 pods are waiting to be
    # evicted"); the budget refuses its evictions (the metric, when the first one has gone out:
    # docs/testing.md on when it does not). The Event naming the PDB never comes: it has the same
    # dedupe key (reason + node) and is dropped for 2 min (pkg/events/recorder.go).
    draining = wait_for(
        lambda: [
            e
            for e in karpenter.events("default", "FailedDraining")
            if e.involved_object.name == node
        ],
        SETTLE,
        "Karpenter draining the node",
    )
    assert [e.message for e in draining] == [
        "Failed to drain node, 1 pods are waiting to be evicted"
    ]
    taints = {(t.key, t.effect) for t in cluster.core.read_node(node).spec.taints or ()}
    assert (DISRUPTED, "NoSchedule") in taints
    pod = cluster.workers("held")["held-worker-0"]
    assert pod.metadata.deletion_timestamp is None and pod.status.phase == "Running"
    assert not any(c.type == "DisruptionTarget" for c in pod.status.conditions or ())


@pytest.mark.parametrize(
    ("tgp", "grace", "after"),
    [(6, 2, 4.0), (30, 30, 0.0)],
    ids=["tgp-6s-pod-grace-2s", "tgp-30s-pod-grace-30s"],
)
def test_a_termination_grace_period_deletes_a_guarded_worker_at_tgp_minus_its_own_grace(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory, tgp: int, grace: int, after: float
) -> None:
    """Forceful: at the NodeClaim's termination time minus the pod's terminationGracePeriodSeconds
    Karpenter DELETEs the pod, PDB or not (terminator.go `DeleteExpiringPods`). A pod grace equal
    to the TGP (30 s, the Kubernetes default, against a 30 s TGP) is deleted at once."""
    pools(f"{tgp}s")
    cluster.create(karpenter_job("forced", grace=grace))
    cluster.wait_settled("forced", 1)
    guard(cluster, "forced")
    node = node_of(cluster, "forced").metadata.name
    claim = karpenter.claim_of(node)["metadata"]["name"]
    with recording(cluster.core.list_namespaced_pod, NS) as pods:
        requested = karpenter.interrupt(node)
        deleting = wait_for(
            lambda: pods.first(lambda s: bool(s.obj["metadata"].get("deletionTimestamp"))),
            tgp + SETTLE,
            "the worker deleted",
        )
        assert not any(
            c["type"] == "DisruptionTarget" for c in deleting.obj["status"]["conditions"]
        )
    took = deleting.at - requested
    # the deadline is the NodeClaim's deletionTimestamp (whole seconds: up to 1 s before our
    # request) plus the TGP, so the delete may come up to 1 s before `after`
    assert after - 1.5 < took < after + 3.0, f"deleted {took:.1f} s after the interruption"
    [event] = wait_for(  # Karpenter's recorder posts Events on its own time, after the DELETE
        lambda: [
            e
            for e in karpenter.events(NS, "Disrupted")
            if e.involved_object.name == "forced-worker-0"
        ],
        SETTLE,
        "Karpenter's Disrupted Event on the worker",
    )
    assert "bypasses the PDB" in event.message
    # the deadline it worked to: the NodeClaim's deletion + TGP, as an annotation
    with contextlib.suppress(ApiException):  # gone already: then the Event must do
        stamp = karpenter.custom.get_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", claim
        )
        deleted = datetime.datetime.fromisoformat(stamp["metadata"]["deletionTimestamp"])
        deadline = datetime.datetime.fromisoformat(
            stamp["metadata"]["annotations"][TERMINATION_TIME]
        )
        assert deadline - deleted == datetime.timedelta(seconds=tgp)


# --- the daemon against Karpenter's interruptions --------------------
def test_the_daemon_drains_and_deletes_interrupted_workers_while_the_guard_holds_karpenter_off(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory, daemon: Path
) -> None:
    """N interruptions of a middle worker of a 3-worker job, no terminationGracePeriod: each time
    the daemon drains the worker from discovery and deletes it by name before any eviction
    lands; the operator makes it again and Karpenter launches a node for it."""
    pools()
    cluster.create(karpenter_job("kint", replicas=3, managed=True))
    cluster.wait_settled("kint", 3)
    policy = client.PolicyV1Api(cluster.api)
    wait_for(
        lambda: (
            policy.list_namespaced_pod_disruption_budget(
                NS, field_selector=f"metadata.name={guard_name('kint')}"
            ).items
        ),
        SETTLE,
        "the daemon's guard",
    )
    runs = [
        interrupt_worker(karpenter, cluster, "kint", "kint-worker-1", 3, DRAINED_ANNOTATION)
        for _ in range(N)
    ]
    figures = summary(runs)
    print(f"karpenter interruptions (N={N}, no TGP): {figures}")
    assert (figures["graceful"], figures["evicted"], figures["forced"]) == (N, 0, 0), runs
    assert figures["taint_to_drain"]["max"] < 5.0, figures
    decisions = [
        (d["action"], d["reason"], d["pods"])
        for d in json_lines(daemon / "out.log")
        if d.get("event") == "decision" and d.get("job") == f"{NS}/kint"
    ]
    assert decisions.count(("drain", "preemption_notice", ["kint-worker-1"])) == N


def test_with_a_30s_termination_grace_the_daemon_removes_the_worker_long_before_the_forced_delete(
    cluster: Cluster, karpenter: Karpenter, pools: PoolsFactory, daemon: Path
) -> None:
    """A 30 s TGP and a 20 s pod grace: Karpenter would delete the worker 10 s in; the daemon's
    drain and delete come first, and no eviction or forced delete reaches the worker."""
    pools("30s")
    cluster.create(karpenter_job("ktgp", replicas=3, managed=True, grace=20))
    cluster.wait_settled("ktgp", 3)
    wait_for(
        lambda: (
            client.PolicyV1Api(cluster.api)
            .list_namespaced_pod_disruption_budget(
                NS, field_selector=f"metadata.name={guard_name('ktgp')}"
            )
            .items
        ),
        SETTLE,
        "the daemon's guard",
    )
    run = interrupt_worker(karpenter, cluster, "ktgp", "ktgp-worker-1", 3, DRAINED_ANNOTATION)
    assert run.graceful and not run.forced and not run.evicted, run
    assert run.deleting is not None and run.deleting - run.requested < 10.0 - 2.0
