"""The cache keeps only what the adapter reads (kept_fields.py): whatever is read from a trimmed
object equals what the whole object, as the API returns it, says."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kube_fixtures import (
    CCE_API,
    ET_API,
    NS,
    Kube,
    ai_training_job,
    scaler,
    training_job,
)
from kubernetes import client
from support.kube_pods import DEFAULT_TOLERATIONS
from support.waiting import wait_for

from autoscaler.adapters.kube import KubeCache, KubeObserver
from autoscaler.adapters.kube import cache as cache_module
from autoscaler.adapters.kube.kept_fields import NODE_SHAPE, _Interner, project, trimmer
from autoscaler.adapters.kube.kinds import WATCHLIST
from autoscaler.adapters.kube.kinds.cce import AI_TRAINING_JOBS
from autoscaler.adapters.kube.kinds.et_operator import SCALE_INS, SCALE_OUTS, TRAINING_JOBS
from autoscaler.adapters.kube.nodes import instance_id, node_facts
from autoscaler.adapters.kube.podindex import _recognise
from autoscaler.adapters.kube.pods import pod_facts
from autoscaler.adapters.kube.resources import (
    NODES,
    PODS,
    Obj,
    Resource,
    key_of,
)
from autoscaler.adapters.kube.wake_signatures import signature
from autoscaler.annotations import NOTICE_ANNOTATION, encode_notice
from autoscaler.config import Prices
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core import Notice, NoticeKind, Snapshot
from autoscaler.notices_and_prices import NoticeBoard, PriceBook

SETTINGS = KubernetesSettings()
NOW = datetime(2026, 3, 2, 12, tzinfo=UTC)
NTH = "aws-node-termination-handler/spot-itn"


# --- objects as the API server returns them --------------------------------------------------
def managed_fields(manager: str) -> list[Obj]:
    return [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-03-02T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {}, "f:status": {}},
        }
    ]


def full_container(name: str, resources: Obj, **extra: Any) -> Obj:
    return {
        "name": name,
        "image": "registry.example.com/train:1",
        "command": ["/bin/sh", "-c"],
        "args": ["python train.py"],
        "env": [{"name": "A", "value": "1"}],
        "ports": [{"containerPort": 12345, "protocol": "TCP"}],
        "resources": resources,
        "volumeMounts": [
            {
                "name": "kube-api-access",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
        **extra,
    }


def full_pod(
    name: str,
    node: str | None,
    *,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    owner: Obj | None = None,
    containers: list[Obj] | None = None,
    init_containers: list[Obj] | None = None,
    overhead: dict[str, str] | None = None,
    ready: str | None = "True",
    running_since: str | None = "2026-03-02T10:00:04Z",
    deleting: bool = False,
) -> Obj:
    gpu = {"limits": {"nvidia.com/gpu": "1", "cpu": "7"}, "requests": {"cpu": "7"}}
    spec: Obj = {
        "containers": containers or [full_container("main", gpu)],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "tolerations": copy.deepcopy(DEFAULT_TOLERATIONS),
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                    ]
                },
            }
        ],
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if node:
        spec["nodeName"] = node
    if init_containers:
        spec["initContainers"] = init_containers
    if overhead:
        spec["overhead"] = overhead
    conditions = [
        {
            "type": t,
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": "2026-03-02T10:00:01Z",
        }
        for t in ("PodReadyToStartContainers", "Initialized", "PodScheduled")
    ]
    if ready is not None:
        conditions.insert(
            2,
            {
                "type": "Ready",
                "status": ready,
                "lastProbeTime": None,
                "lastTransitionTime": "2026-03-02T10:00:05Z",
                **({"reason": "ContainersNotReady"} if ready != "True" else {}),
            },
        )
    state: Obj = (
        {"running": {"startedAt": running_since}}
        if running_since
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    meta: Obj = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "resourceVersion": "4711",
        "creationTimestamp": "2026-03-02T10:00:00Z",
        "generateName": "x-",
        "labels": labels or {"app": "x"},
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
        "managedFields": managed_fields("kubelet"),
    }
    if owner:
        meta["ownerReferences"] = [owner]
    if deleting:
        meta["deletionTimestamp"] = "2026-03-02T11:00:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "conditions": conditions,
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.1",
            "podIPs": [{"ip": "10.1.0.1"}],
            "qosClass": "Burstable",
            "startTime": "2026-03-02T10:00:00Z",
            "containerStatuses": [
                {
                    "name": "main",
                    "state": state,
                    "lastState": {},
                    "ready": ready == "True",
                    "restartCount": 0,
                    "image": "registry.example.com/train:1",
                    "imageID": "sha256:00",
                    "containerID": "containerd://11",
                    "started": bool(running_since),
                }
            ],
        },
    }


def et_owner(job: str) -> Obj:
    return {
        "apiVersion": ET_API,
        "kind": "TrainingJob",
        "name": job,
        "uid": f"uid-{job}",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def full_pods() -> list[Obj]:
    """Every way a pod's facts come about."""
    et_labels = {
        "group-name": "kai.alibabacloud.com",
        "training-job-name": "bert",
        "training-job-role": "worker",
        "replica-index": "0",
    }
    cce_owner = {
        "apiVersion": CCE_API,
        "kind": "AITrainingJob",
        "name": "ernie",
        "uid": "u",
        "controller": True,
    }
    sidecar = full_container("s", {"limits": {"nvidia.com/gpu": "1"}}, restartPolicy="Always")
    init = full_container("i", {"limits": {"nvidia.com/gpu": "3"}})
    memory = {"limits": {"aliyun.com/gpu-mem": "24"}}
    return [
        full_pod("bert-worker-0", "gpu-a", labels=et_labels, owner=et_owner("bert")),
        # a worker by its controller and name alone; Ready False: started from its container
        full_pod("bert-worker-7", "gpu-a", owner=et_owner("bert"), ready="False"),
        # no Ready condition yet, container not running: no ready_since
        full_pod(
            "bert-worker-8",
            "gpu-b",
            phase="Pending",
            owner=et_owner("bert"),
            ready=None,
            running_since=None,
        ),
        full_pod(
            "bert-worker-9",
            None,
            phase="Pending",
            owner=et_owner("bert"),
            ready=None,
            running_since=None,
        ),
        full_pod(
            "ernie-trainer-0",
            "gpu-b",
            owner=cce_owner,
            init_containers=[sidecar, init],
            overhead={"nvidia.com/gpu": "1", "cpu": "250m"},
        ),
        full_pod("small", "share", containers=[full_container("m", memory)]),
        full_pod("going", "gpu-b", deleting=True),
        full_pod("cpu", "gpu-a", containers=[full_container("c", {"requests": {"cpu": "1"}})]),
    ]


def full_node(
    name: str,
    *,
    taints: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    conditions: list[Obj] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> Obj:
    base = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHas{t}",
            "message": "ok",
            "lastHeartbeatTime": "2026-03-02T11:59:30Z",
            "lastTransitionTime": "2026-03-02T10:00:00Z",
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    base.append(
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "ok",
            "lastHeartbeatTime": "2026-03-02T11:59:30Z",
            "lastTransitionTime": "2026-03-02T10:00:00Z",
        }
    )
    spec: Obj = {
        "providerID": f"aws:///us-east-1a/i-{name}",
        "taints": taints or [],
        "podCIDR": "10.1.0.0/24",
    }
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "99",
            "creationTimestamp": "2026-03-02T09:00:00Z",
            "labels": {
                "karpenter.sh/capacity-type": "spot",
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p3.16xlarge",
                "topology.kubernetes.io/zone": "us-east-1a",
                **(labels or {}),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "csi.volume.kubernetes.io/nodeid": "{}",
                **(annotations or {}),
            },
            "managedFields": managed_fields("kubelet"),
        },
        "spec": spec,
        "status": {
            "allocatable": {
                "cpu": "63",
                "memory": "480Gi",
                "nvidia.com/gpu": "8",
                "pods": "110",
                **(allocatable or {}),
            },
            "capacity": {"cpu": "64", "memory": "488Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": base + (conditions or []),
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.30.0"},
            "images": [{"names": ["a"]}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }


def full_nodes() -> list[Obj]:
    persisted = Notice("noticed", NoticeKind.REBALANCE, "aws-sqs", "m-7", received_at=NOW)
    expired = {
        "type": "InstanceExpired",
        "status": "True",
        "reason": "x",
        "message": "y",
        "lastHeartbeatTime": "2026-03-02T11:59:30Z",
        "lastTransitionTime": "2026-03-02T11:00:00Z",
    }
    nth = {
        "key": NTH,
        "value": "evt-1",
        "effect": "NoSchedule",
        "timeAdded": "2026-03-02T11:59:00Z",
    }
    return [
        full_node("gpu-a"),
        full_node("gpu-b", taints=[nth]),
        full_node(
            "noticed",
            annotations={NOTICE_ANNOTATION: encode_notice(persisted)},
            labels={"eks.amazonaws.com/capacityType": "ON_DEMAND"},
        ),
        full_node("expired", conditions=[expired], unschedulable=True),
        full_node(
            "share",
            labels={"ack.node.gpu.schedule": "share"},
            allocatable={
                "nvidia.com/gpu": "0",
                "aliyun.com/gpu-mem": "64",
                "aliyun.com/gpu-count": "4",
            },
        ),
    ]


def custom_objects() -> list[tuple[Resource, Obj]]:
    t0 = datetime(2026, 3, 2, 11, tzinfo=UTC)
    job = training_job("bert", max_workers=8)
    job["metadata"]["managedFields"] = managed_fields("et-operator")
    return [
        (TRAINING_JOBS, job),
        (AI_TRAINING_JOBS, ai_training_job("ernie")),
        (SCALE_OUTS, scaler("ScaleOut", "bert-out-1", "bert", outcome="ScaleSucceeded", at=t0)),
        (SCALE_INS, scaler("ScaleIn", "bert-in-1", "bert", at=t0, pods=["bert-worker-7"])),
    ]


# --- every reader sees the same ----------------------------------------------------------------
@pytest.mark.parametrize("pod", full_pods(), ids=lambda p: p["metadata"]["name"])
def test_a_trimmed_pod_says_what_the_whole_pod_says(pod: Obj) -> None:
    lean = trimmer(PODS)(pod)
    assert pod_facts(lean, SETTINGS, _recognise) == pod_facts(pod, SETTINGS, _recognise)
    assert signature(PODS, lean, SETTINGS) == signature(PODS, pod, SETTINGS)
    assert key_of(lean) == key_of(pod)
    assert lean["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]


@pytest.mark.parametrize("node", full_nodes(), ids=lambda n: n["metadata"]["name"])
def test_a_trimmed_node_says_what_the_whole_node_says(node: Obj) -> None:
    lean = trimmer(NODES)(node)
    assert node_facts(lean, SETTINGS) == node_facts(node, SETTINGS)
    assert signature(NODES, lean, SETTINGS) == signature(NODES, node, SETTINGS)
    assert instance_id(lean["spec"]["providerID"]) == instance_id(node["spec"]["providerID"])


def filled_cache(monkeypatch: pytest.MonkeyPatch | None = None) -> KubeCache:
    """A cache that is never started, filled through the write-through path; with
    `monkeypatch`, one that keeps objects whole (what the cache did before trimming)."""
    if monkeypatch is not None:
        monkeypatch.setattr(cache_module, "trimmer", lambda resource: copy.deepcopy)
    cache = KubeCache(client.ApiClient(), SETTINGS, WATCHLIST)
    objects = [
        *((NODES, n) for n in full_nodes()),
        *((PODS, p) for p in full_pods()),
        *custom_objects(),
    ]
    for resource, obj in objects:
        cache.assume(resource, obj)
    return cache


def snapshot_of(cache: KubeCache) -> Snapshot:
    prices = Prices(spot={"p3.16xlarge": 7.34}, on_demand={"p3.16xlarge": 24.48})
    return KubeObserver(cache, SETTINGS, prices, NoticeBoard(), PriceBook()).snapshot(NOW)


def test_a_snapshot_from_the_trimmed_cache_equals_one_from_whole_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lean = snapshot_of(filled_cache())
    whole = snapshot_of(filled_cache(monkeypatch))
    assert lean == whole
    # not vacuous: every kind of fact is in there
    assert {j.name for j in lean.jobs} == {"bert", "ernie"}
    assert len(lean.jobs[0].workers) == 4 and lean.jobs[0].last_scale_out_at is not None
    sources = {n.source for n in lean.notices}
    assert sources == {"k8s-taint", "k8s-condition", "k8s-cordon", "aws-sqs"}
    assert {n.name for n in lean.nodes} == {"gpu-a", "gpu-b", "noticed", "expired", "share"}


def test_the_cache_holds_trimmed_copies_and_leaves_the_callers_object_alone() -> None:
    cache = KubeCache(client.ApiClient(), SETTINGS, WATCHLIST)
    pod, job = full_pods()[0], custom_objects()[0][1]
    sent = copy.deepcopy([pod, job])
    cache.assume(PODS, pod)
    cache.assume(TRAINING_JOBS, job)
    assert [pod, job] == sent  # the actuator goes on using what the API returned
    held = cache.get(PODS, key_of(pod))
    assert held == trimmer(PODS)(pod)
    assert "managedFields" not in held["metadata"] and "env" not in held["spec"]["containers"][0]
    held_job = cache.get(TRAINING_JOBS, key_of(job))
    assert "managedFields" not in held_job["metadata"]
    assert held_job == {
        **job,
        "metadata": {k: v for k, v in job["metadata"].items() if k != "managedFields"},
    }


def test_workers_of_one_template_share_their_containers_and_owner() -> None:
    """Shared parts are one object for all pods holding them equal (kept_fields.Shared); container
    statuses go when a Ready condition says since when the pod runs, and stay when not."""
    trim = trimmer(PODS)
    a, b = (trim(full_pod(f"bert-worker-{i}", "gpu-a", owner=et_owner("bert"))) for i in (1, 2))
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["metadata"]["ownerReferences"] is b["metadata"]["ownerReferences"]
    assert a["metadata"] is not b["metadata"]
    assert "containerStatuses" not in a["status"]
    other = trim(full_pod("gpt-worker-1", "gpu-a", owner=et_owner("gpt")))
    assert other["metadata"]["ownerReferences"] != a["metadata"]["ownerReferences"]
    starting = trim(full_pod("bert-worker-3", "gpu-a", owner=et_owner("bert"), ready="False"))
    assert starting["status"]["containerStatuses"]


def test_shared_values_nobody_holds_are_dropped_when_the_table_has_doubled() -> None:
    interner = _Interner()
    held = [interner.one({"n": i}) for i in range(600)]
    for i in range(600):
        interner.one({"gone": i})  # held by nobody once returned
    assert len(interner._table) < 1024  # the 1,024th value pruned the table
    assert all(interner.one({"n": i}) is held[i] for i in range(600))
    kept = interner.one({"v": 1})
    assert type(interner.one({"v": 1.0})["v"]) is float and kept == {"v": 1}  # equal, not same


def test_projection_keeps_absent_keys_absent_and_odd_types_whole() -> None:
    node = full_node("n")
    # wake_signatures.py reads `.get("conditions", [])`: None stays
    node["status"]["conditions"] = None
    del node["spec"]["taints"]
    lean = project(node, NODE_SHAPE)
    assert lean["status"]["conditions"] is None and "taints" not in lean["spec"]
    assert "unschedulable" not in lean["spec"] and "capacity" not in lean["status"]
    assert lean["metadata"]["annotations"] == {}  # only ours is read


def test_lists_and_watches_store_trimmed_objects(kube: Kube) -> None:
    kube.server.seed(full_node("gpu-a"), full_pods()[0])
    cache = kube.cache()
    listed = cache.get(PODS, f"{NS}/bert-worker-0")
    assert listed is not None and "managedFields" not in listed["metadata"]
    kube.server.seed(full_pods()[1])
    watched = wait_for(lambda: cache.get(PODS, f"{NS}/bert-worker-7"), what="the watched pod")
    assert "volumes" not in watched["spec"] and "managedFields" not in watched["metadata"]
    node = cache.get(NODES, "gpu-a")
    assert node is not None and set(node["status"]) == {"allocatable", "conditions"}
