"""On-demand fallback through Karpenter, as docs/deadlines.md ("EKS with Karpenter") tells users to
set it up, on the real control plane with Karpenter v1.8.0's kwok provider (support/karpenter.py)
and the real training-operator: the worker template of that section (read from the doc) and the
NodePools of deploy/karpenter/gpu-nodepools.yaml, with only what kwok cannot have swapped (the
EC2NodeClass, the karpenter.k8s.aws/* requirement) and our namespace's isolation added.

The daemon (`spot-autoscaler run` under deploy/rbac.yaml's rules) runs a deadline policy; a job
behind its line gets on-demand workers past idle spot capacity: a replicas raise whose pods stay
Pending until Karpenter's on-demand node for them has booted. Meanwhile the daemon counts them as
on-demand workers on their way (its decision line says so) and asks for no more.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.karpenter import (
    CAPACITY_TYPE,
    INSTANCE_TYPE,
    NODE_CLASS,
    NODEPOOL_LABEL,
    POOL_VALUE,
    Karpenter,
    daemon_beside,
    karpenter,
    recording,
    remove_test_objects,
)
from support.pytorch_cluster import NS, SETTLE, WORKER_SELECTOR, Cluster, cluster, pytorch_job
from support.real_daemon import json_lines
from support.real_namespace import POOL, daemon_config, isolated
from support.waiting import wait_for

from autoscaler.annotations import PROGRESS_ANNOTATION

pytestmark = pytest.mark.real_cluster
__all__ = ["cluster", "karpenter"]  # the fixtures

Obj = dict
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "deadlines.md"
NODE_POOLS = ROOT / "deploy" / "karpenter" / "gpu-nodepools.yaml"
SPOT_POOL, ON_DEMAND_POOL = "gpu-spot", "gpu-on-demand"
# on-demand nodes boot this long after their NodeClaim is launched (KWOKNodeClass
# nodeRegistrationDelay, kwok/cloudprovider/cloudprovider.go `Create`): long enough to see the
# daemon leave the Pending workers alone for many passes (its tick: 2 s)
BOOT = 15.0
SLOW_CLASS = "slow-boot"
POLICY = (
    "{name: deadline, deadline: {within: 2h, margin: 0s}, on_demand: {max_on_demand: 2},"
    " preemption: {join_grace: 0s}}"
)
JOB = "odf"
MAX = 4  # max workers: room for more than max_on_demand, so a miscount would show


# --- the recipe ----------------------------------------------------------------------------------
def worker_template_recipe() -> Obj:
    """The worker pod template fragment of docs/deadlines.md's "EKS with Karpenter" section."""
    text = DOC.read_text()
    section = text[text.index("### EKS with Karpenter") : text.index("### ACK (and CCE)")]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    recipe: Obj = yaml.safe_load(block)
    return recipe


def kwok_node_pools(namespace: str) -> list[Obj]:
    """deploy/karpenter/gpu-nodepools.yaml for the kwok provider: its NodeClass (on-demand nodes
    boot in BOOT seconds) and our GPU instance type in place of the AWS ones, and our pool label
    and namespace taint on their nodes; everything else as shipped."""
    pools = [p for p in yaml.safe_load_all(NODE_POOLS.read_text()) if p]
    for pool in pools:
        template = pool["spec"]["template"]
        spec = template["spec"]
        slow = pool["metadata"]["name"] == ON_DEMAND_POOL
        spec["nodeClassRef"] = {**NODE_CLASS, "name": SLOW_CLASS if slow else NODE_CLASS["name"]}
        aws = [r for r in spec["requirements"] if r["key"].startswith("karpenter.k8s.aws/")]
        assert aws, "the recipe's GPU requirement moved: update this test"
        spec["requirements"] = [r for r in spec["requirements"] if r not in aws] + [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [INSTANCE_TYPE]}
        ]
        spec["taints"] = [*spec.get("taints", []), isolated(namespace)]
        template.setdefault("metadata", {}).setdefault("labels", {})[POOL] = POOL_VALUE
    return pools


def recipe_job(name: str, replicas: int) -> Obj:
    """A PyTorchJob under the `deadline` policy with the doc's worker template merged in."""
    body = pytorch_job(name, POOL_VALUE, replicas=replicas, hi=MAX, policy="deadline")
    template = body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    recipe = worker_template_recipe()
    template.setdefault("metadata", {}).setdefault("annotations", {}).update(
        recipe["metadata"]["annotations"]
    )
    template["spec"]["affinity"] = recipe["spec"]["affinity"]
    template["spec"]["tolerations"] += recipe["spec"]["tolerations"]
    return body


def test_the_recipe_reads_as_the_test_applies_it() -> None:
    """Not on a cluster: the doc's worker template and the shipped NodePools parse, and the pools
    are the two the doc names (the real-cluster test below applies them)."""
    recipe = worker_template_recipe()
    assert recipe["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    [term] = recipe["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["preference"]["matchExpressions"] == [
        {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]}
    ]
    pools = {p["metadata"]["name"]: p for p in kwok_node_pools(NS)}
    assert sorted(pools) == sorted([SPOT_POOL, ON_DEMAND_POOL])
    assert "deploy/karpenter/gpu-nodepools.yaml" in DOC.read_text()


# --- fixtures --------------------
@pytest.fixture
def recipe_pools(cluster: Cluster, karpenter: Karpenter) -> Iterator[list[str]]:
    """The recipe's NodePools (and the slow-booting KWOKNodeClass of the on-demand one); after the
    test the pods go first, then the pools and their nodes, then the class."""
    group, version = NODE_CLASS["group"], "v1alpha1"
    with contextlib.suppress(ApiException):  # 409: made by an earlier test
        karpenter.custom.create_cluster_custom_object(
            group,
            version,
            "kwoknodeclasses",
            {
                "apiVersion": f"{group}/{version}",
                "kind": NODE_CLASS["kind"],
                "metadata": {"name": SLOW_CLASS},
                "spec": {"nodeRegistrationDelay": f"{BOOT:g}s"},
            },
        )
    names = []
    try:
        for pool in kwok_node_pools(NS):
            names.append(pool["metadata"]["name"])
            karpenter.create_node_pool(pool)
        yield names
    finally:
        remove_test_objects(cluster)
        for name in names:
            karpenter.delete_node_pool(name)
        with contextlib.suppress(ApiException):
            karpenter.custom.delete_cluster_custom_object(
                group, version, "kwoknodeclasses", SLOW_CLASS
            )


@pytest.fixture(scope="module")
def daemon(karpenter: Karpenter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`spot-autoscaler run` as deployed, with the `deadline` policy; its logs' directory."""
    config = daemon_config(NS, POLICY)
    with daemon_beside(karpenter, tmp_path_factory.mktemp("daemon"), NS, config) as logs:
        yield logs


def idle_spot_node(cluster: Cluster) -> str:
    """A spot node of the recipe's spot pool with nothing on it: Karpenter launches it for a pod
    that asks for spot, which then goes."""
    pod = {
        "metadata": {"name": "spot-warmer"},
        "spec": {
            "nodeSelector": {POOL: POOL_VALUE, CAPACITY_TYPE: "spot"},
            "tolerations": [
                {**isolated(NS), "operator": "Equal"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "example.invalid/pause:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    cluster.core.create_namespaced_pod(NS, pod)

    def warmer() -> client.V1Pod | None:
        found = cluster.core.list_namespaced_pod(NS, field_selector="metadata.name=spot-warmer")
        return found.items[0] if found.items else None

    running = wait_for(
        lambda: (p := warmer()) is not None and p.status.phase == "Running" and p,
        SETTLE,
        "the spot warmer Running",
    )
    cluster.core.delete_namespaced_pod("spot-warmer", NS, grace_period_seconds=0)
    wait_for(lambda: warmer() is None, SETTLE, "the spot warmer gone")
    node: str = running.spec.node_name
    return node


def pending_until(seen: list, pod: str) -> tuple[float, float, bool]:
    """When `pod` was first seen, when first seen Running, and whether the scheduler marked it
    Unschedulable meanwhile (what Karpenter provisions for)."""
    mine = [s for s in seen if s.obj["metadata"]["name"] == pod]
    first = mine[0].at
    running = next(s.at for s in mine if (s.obj.get("status") or {}).get("phase") == "Running")
    unschedulable = any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for s in mine
        if s.at < running
        for c in (s.obj.get("status") or {}).get("conditions") or ()
    )
    return first, running, unschedulable


def test_workers_the_deadline_puts_on_on_demand_stay_pending_until_karpenter_boots_their_node(
    cluster: Cluster, karpenter: Karpenter, recipe_pools: list[str], daemon: Path
) -> None:
    """A job of one spot worker falls behind its deadline's line: the daemon raises it by
    max_on_demand (2) past idle spot capacity, once. The new workers stay Pending (Unschedulable,
    then nominated) for the on-demand node's boot; Karpenter launches them from the on-demand
    pool, since the worker template prefers on-demand; the daemon counts them as on-demand on
    their way, never asks again (the job's max would allow one more) and removes nobody."""
    spot_node = idle_spot_node(cluster)
    cluster.create(recipe_job(JOB, replicas=1))
    cluster.wait_settled(JOB, 1)
    worker0 = cluster.workers(JOB)[f"{JOB}-worker-0"]
    assert worker0.spec.node_name == spot_node  # the scheduler took the idle spot node
    assert worker0.metadata.annotations["karpenter.sh/do-not-disrupt"] == "true"
    ours = f"{NS}/{JOB}"
    with recording(
        cluster.core.list_namespaced_pod, NS, label_selector=WORKER_SELECTOR.format(JOB)
    ) as pods:
        # no progress reported until now: the rule waits (no_progress); from here it is behind
        cluster.patch_job(JOB, {"metadata": {"annotations": {PROGRESS_ANNOTATION: "0"}}})
        wait_for(lambda: cluster.settled(JOB, 3), SETTLE + 2 * BOOT, f"{JOB}: 3 workers Running")
        seen = list(pods.seen)
    new = [f"{JOB}-worker-{i}" for i in (1, 2)]
    for pod in new:
        first, running, unschedulable = pending_until(seen, pod)
        assert unschedulable, f"{pod} was never Unschedulable: Karpenter had nothing to provision"
        assert running - first > BOOT - 2.0, f"{pod} Running {running - first:.1f} s after it came"
        print(f"{pod}: Pending {running - first:.1f} s (boot {BOOT:g} s)")
        node = cluster.core.read_node(cluster.workers(JOB)[pod].spec.node_name).metadata.labels
        assert (node[CAPACITY_TYPE], node[NODEPOOL_LABEL]) == ("on-demand", ON_DEMAND_POOL)
    assert len(karpenter.node_claims(ON_DEMAND_POOL)) == 2
    assert len(karpenter.node_claims(SPOT_POOL)) == 1  # the warmer's, worker 0's now

    # the daemon's lines for the job from the progress on, after a few passes with 3 running
    lines = wait_for(
        lambda: (
            d
            if len(d := [x for x in json_lines(daemon / "out.log") if x.get("job") == ours]) > 0
            else None
        ),
        SETTLE,
        "the daemon's lines",
    )
    decisions = [d for d in lines if d.get("event") == "decision"]
    acts = [(d["action"], d["reason"], d["from_workers"], d["to_workers"]) for d in decisions]
    acts = [a for a in acts if a[0] != "noop"]
    assert acts == [("scale_out", "behind_deadline", 1, 3)], decisions
    [out] = [d for d in decisions if d["action"] == "scale_out"]
    assert "past idle spot capacity" in out["message"]
    # a line after it, while the new workers were Pending: counted, as on their way
    after = [d["message"] for d in decisions[decisions.index(out) + 1 :]]
    assert any("2 on on-demand (2 Pending: provisioning)" in m for m in after), after
