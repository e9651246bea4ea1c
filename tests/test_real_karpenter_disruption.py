"""Karpenter v1.8.0's voluntary disruption (consolidation) against the daemon, for real.

A NodePool that first allows only on-demand capacity runs each worker on an on-demand node;
it is then opened to spot and told to consolidate at once, so Karpenter replaces each on-demand
node by a cheaper spot one (single-node consolidation, reason Underutilized; pkg/controllers/
disruption/consolidation.go `computeConsolidation`: an on-demand candidate whose pool allows
spot is replaced by spot). Its disruption controller taints the live node, launches the
replacement, and only once that is Initialized deletes the NodeClaim, whose drain evicts the pods
(pkg/controllers/disruption/queue.go `StartCommand`, `waitOrTerminate`).

The daemon runs without its eviction guard here: a guard (a PDB allowing no disruption) would
keep Karpenter from picking the node at all (pkg/utils/pdb/pdb.go `CanEvictPods`), so
the do-not-disrupt annotation is what protects, and the drain is what moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.karpenter import (
    CAPACITY_TYPE,
    KARPENTER,
    POOL_VALUE,
    Karpenter,
    daemon_beside,
    has_eviction,
    karpenter,
    karpenter_job,
    recording,
    tainted,
)
from support.pytorch_cluster import NS, Cluster, cluster
from support.real_daemon import json_lines
from support.real_namespace import POOL, daemon_config, isolated
from support.waiting import wait_for

from autoscaler.annotations import DO_NOT_DISRUPT, DRAINED_ANNOTATION, SHIELD_MARK
from autoscaler.core.policy import POLICY_LABEL

pytestmark = pytest.mark.real_cluster
__all__ = ["cluster", "karpenter"]  # the fixtures

MIXED = "ka-mixed"
CONSOLIDATED = 60.0  # the 10 s disruption poll, the 15 s consolidationTTL, a launch, a drain
# `move` lets Karpenter move its jobs (the one worker goes: no last host kept); `hold` protects
MOVE = (
    "{name: move, scale_out: {enabled: false}, "
    "preemption: {join_grace: 0s, voluntary: drain, keep_last_host: false}}"
)


@pytest.fixture(scope="module")
def daemon(karpenter: Karpenter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    config = daemon_config(NS, MOVE).replace(
        "  watch_timeout: 30s", "  guard_evictions: false\n  watch_timeout: 30s"
    )
    with daemon_beside(karpenter, tmp_path_factory.mktemp("daemon"), NS, config) as tmp:
        yield tmp


@pytest.fixture
def pool(cluster: Cluster, karpenter: Karpenter) -> Iterator[None]:
    """An on-demand-only NodePool of our GPU type, its nodes for our namespace only."""
    karpenter.node_pool(MIXED, ["on-demand"], labels={POOL: POOL_VALUE}, taints=[isolated(NS)])
    try:
        yield
    finally:
        cluster.cleanup()
        karpenter.delete_node_pool(MIXED)


def consolidate(karpenter: Karpenter) -> None:
    """Open the pool to spot and let it consolidate at once, every node at a time."""
    pool = karpenter.custom.get_cluster_custom_object(*KARPENTER, "nodepools", MIXED)
    requirements = pool["spec"]["template"]["spec"]["requirements"]
    for r in requirements:
        if r["key"] == CAPACITY_TYPE:
            r["values"] = ["spot", "on-demand"]
    patch = {
        "spec": {
            "template": {"spec": {"requirements": requirements}},
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": "0s",
                "budgets": [{"nodes": "100%"}],
            },
        }
    }
    karpenter.custom.patch_cluster_custom_object(*KARPENTER, "nodepools", MIXED, patch)


def managed(name: str, policy: str) -> dict:
    body = karpenter_job(name, managed=True)
    body["metadata"]["labels"][POLICY_LABEL] = policy
    return body


def test_consolidation_never_evicts_a_protected_worker_while_it_moves_an_unprotected_one(
    cluster: Cluster, karpenter: Karpenter, pool: None, daemon: Path
) -> None:
    """Two 1-worker jobs on on-demand nodes; only `kprot` is managed (policy hold: protect).
    Karpenter consolidates `kfree`'s node (its worker evicted, "Evicted pod: Underutilized")
    and never `kprot`'s: the daemon's do-not-disrupt blocks it. (Its Event DisruptionBlocked
    is not asserted: Karpenter keeps one per reason and node for 2 min, and the first may say
    "Node is nominated for a pending pod".)"""
    cluster.create(managed("kprot", "hold"))
    cluster.create(karpenter_job("kfree"))
    cluster.wait_settled("kprot", 1)
    cluster.wait_settled("kfree", 1)
    pod = cluster.workers("kprot")["kprot-worker-0"]
    assert pod.spec.node_selector.get(CAPACITY_TYPE) is None
    protected_node, uid = pod.spec.node_name, pod.metadata.uid
    assert cluster.core.read_node(protected_node).metadata.labels[CAPACITY_TYPE] == "on-demand"

    def shielded() -> bool:
        notes = cluster.workers("kprot")["kprot-worker-0"].metadata.annotations or {}
        return notes.get(DO_NOT_DISRUPT) == "true" and notes.get(SHIELD_MARK) == "true"

    wait_for(shielded, 30.0, "the daemon's do-not-disrupt on kprot-worker-0")
    free = cluster.workers("kfree")["kfree-worker-0"]
    assert DO_NOT_DISRUPT not in (free.metadata.annotations or {})  # not ours to protect
    with (
        recording(
            cluster.core.list_namespaced_pod,
            NS,
            field_selector=f"metadata.name={pod.metadata.name}",
        ) as pods,
        recording(
            cluster.core.list_node, field_selector=f"metadata.name={protected_node}"
        ) as nodes,
    ):
        consolidate(karpenter)
        evicted = lambda: [  # noqa: E731
            e for e in karpenter.events(NS, "Evicted") if e.involved_object.name == "kfree-worker-0"
        ]
        [event] = wait_for(evicted, CONSOLIDATED, "kfree's worker consolidated away")
        assert event.message == "Evicted pod: Underutilized"
        assert pods.first(lambda s: has_eviction(s.obj) or s.type == "DELETED") is None
        assert nodes.first(lambda s: tainted(s.obj)) is None
    now = cluster.workers("kprot")["kprot-worker-0"]
    assert now.metadata.uid == uid and now.metadata.deletion_timestamp is None
    decisions = [
        d
        for d in json_lines(daemon / "out.log")
        if d.get("event") == "decision" and d.get("job") == f"{NS}/kprot"
    ]
    assert not [d for d in decisions if d["action"] in ("drain", "scale_in")], decisions


def test_consolidation_of_a_worker_the_policy_lets_move_drains_it_before_karpenter_evicts(
    cluster: Cluster, karpenter: Karpenter, pool: None, daemon: Path
) -> None:
    """Policy `move` (voluntary: drain): Karpenter's taint on the live node is a voluntary
    disruption; the daemon hides the worker from discovery and deletes it by name before any
    eviction reaches it (decision reason karpenter_disruption); the worker is made again on
    Karpenter's spot replacement, and the daemon does not drain it again (no relaunch loop)."""
    cluster.create(managed("kmove", "move"))
    cluster.wait_settled("kmove", 1)
    before = cluster.workers("kmove")["kmove-worker-0"]
    node, uid = before.spec.node_name, before.metadata.uid
    assert DO_NOT_DISRUPT not in (before.metadata.annotations or {})
    with (
        recording(
            cluster.core.list_namespaced_pod, NS, field_selector="metadata.name=kmove-worker-0"
        ) as pods,
        recording(cluster.core.list_node, field_selector=f"metadata.name={node}") as nodes,
    ):
        consolidate(karpenter)
        mine = lambda s: s.obj["metadata"].get("uid") == uid  # noqa: E731
        wait_for(
            lambda: pods.first(lambda s: mine(s) and s.type == "DELETED"),
            CONSOLIDATED,
            "kmove-worker-0 moved",
        )
        taint = nodes.first(lambda s: tainted(s.obj))
        assert taint is not None
        assert not taint.obj["metadata"].get("deletionTimestamp")  # voluntary: a live node
        deleting = pods.first(
            lambda s: mine(s) and bool(s.obj["metadata"].get("deletionTimestamp"))
        )
        assert deleting is not None
        assert pods.first(lambda s: mine(s) and has_eviction(s.obj)) is None, "evicted"
    cluster.wait_settled("kmove", 1)
    moved = cluster.workers("kmove")["kmove-worker-0"]
    assert cluster.core.read_node(moved.spec.node_name).metadata.labels[CAPACITY_TYPE] == "spot"
    wait_for(
        lambda: (
            "kmove-worker-0"
            not in (cluster.job("kmove")["metadata"].get("annotations") or {}).get(
                DRAINED_ANNOTATION, "[]"
            )
        ),
        30.0,
        "kmove-worker-0 shown to discovery again",
    )
    decisions = [
        (d["action"], d["reason"], d["pods"])
        for d in json_lines(daemon / "out.log")
        if d.get("event") == "decision" and d.get("job") == f"{NS}/kmove" and d["action"] != "noop"
    ]
    assert ("drain", "karpenter_disruption", ["kmove-worker-0"]) in decisions, decisions
    assert sum(a == "drain" for a, _, _ in decisions) == 1, decisions  # no second move
