"""The emulator's unkind parts, as the real API server does them, through the official client:
kinds that are not served, Terminating pods, evictions that honour PodDisruptionBudgets, and a
pod phase that follows its containers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kube_api import KubeApiServer

pytest_plugins = ["support.fixtures"]  # kube_api, kube_client

NS = "default"
KAI = ("kai.alibabacloud.com", "v1alpha1")


def bound_pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}], **spec},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_kind_not_served_is_absent_from_discovery_and_404_everywhere(
    kube_api: KubeApiServer, kube_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube_client)
    kube_api.unserve("AITrainingJob")
    groups = {g.name for g in client.ApisApi(kube_client).get_api_versions().groups}
    assert "kongming.cce.baiudbce.com" not in groups and KAI[0] in groups
    with pytest.raises(ApiException) as err:
        custom.get_api_resources("kongming.cce.baiudbce.com", "v1")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        custom.list_cluster_custom_object("kongming.cce.baiudbce.com", "v1", "aitrainingjobs")
    assert err.value.status == 404
    kube_api.unserve("ScaleIn")  # a group with other kinds stays; the kind goes
    names = {r.name for r in custom.get_api_resources(*KAI).resources}
    assert "scaleins" not in names and "trainingjobs" in names
    kube_api.serve("AITrainingJob")  # the CRD installed later
    assert custom.list_cluster_custom_object(
        "kongming.cce.baiudbce.com", "v1", "aitrainingjobs")["items"] == []


def test_a_bound_pod_stays_terminating_until_the_kubelet_is_done(
    kube_api: KubeApiServer, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    kube_api.kubelet_delay = None
    kube_api.seed(bound_pod("w"), {**bound_pod("unbound"), "spec": {"containers": []}})
    core.delete_namespaced_pod("w", NS, grace_period_seconds=30)
    pod = core.read_namespaced_pod("w", NS)
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 30 and pod.status.phase == "Running"
    core.delete_namespaced_pod("unbound", NS)  # on no node: gone at once
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["w"]
    core.delete_namespaced_pod("w", NS, grace_period_seconds=5)  # a shorter grace wins
    assert core.read_namespaced_pod("w", NS).metadata.deletion_grace_period_seconds == 5
    kube_api.finish_terminating("w", NS)
    assert core.list_namespaced_pod(NS).items == []


def test_evictions_honour_pod_disruption_budgets(
    kube_api: KubeApiServer, kube_client: client.ApiClient
) -> None:
    core, policy = client.CoreV1Api(kube_client), client.PolicyV1Api(kube_client)
    kube_api.kubelet_delay = None
    labels = {"training-job-name": "bert"}
    kube_api.seed(bound_pod("w0", labels), bound_pod("w1", labels), bound_pod("other"))
    policy.create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": 0}})
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "w0"}}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction("w0", NS, eviction)
    assert err.value.status == 429
    body = json.loads(err.value.body)
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    core.create_namespaced_pod_eviction("other", NS, {**eviction, "metadata": {"name": "other"}})
    evicted = core.read_namespaced_pod("other", NS)
    assert evicted.metadata.deletion_timestamp is not None
    assert [c.type for c in evicted.status.conditions][-1] == "DisruptionTarget"
    core.delete_namespaced_pod("w0", NS, grace_period_seconds=0)  # a DELETE is never blocked
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["other", "w1"]


def test_a_pod_completes_only_when_every_regular_container_has_exited(
    kube_api: KubeApiServer,
) -> None:
    # restartPolicy Never, as et-operator sets on its pods; the default (Always) restarts them
    launcher = bound_pod("launcher", containers=[{"name": "main"}, {"name": "sidecar"}],
                         restartPolicy="Never")
    native = bound_pod("native", containers=[{"name": "main"}], restartPolicy="Never",
                       initContainers=[{"name": "sidecar", "restartPolicy": "Always"}])
    kube_api.seed(launcher, native)
    done = kube_api.set_container_states("launcher", NS, {"main": 0, "sidecar": "running"})
    assert done["status"]["phase"] == "Running"  # a regular sidecar keeps the pod Running
    done = kube_api.set_container_states("native", NS, {"main": 0, "sidecar": "running"})
    assert done["status"]["phase"] == "Succeeded"  # a native sidecar does not
    failed = kube_api.set_container_states("launcher", NS, {"main": 1, "sidecar": 0})
    assert failed["status"]["phase"] == "Failed"
