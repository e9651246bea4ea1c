"""The emulator's unkind parts, as the real API server does them, through the official client:
kinds that are not served, Terminating pods, evictions that honour PodDisruptionBudgets, and a
pod phase that follows its containers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.eviction import evict
from support.kube_api import KubeApiServer

NS = "default"
KAI = ("kai.alibabacloud.com", "v1alpha1")


def bound_pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}], **spec},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


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
    assert (
        custom.list_cluster_custom_object("kongming.cce.baiudbce.com", "v1", "aitrainingjobs")[
            "items"
        ]
        == []
    )


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
    policy.create_namespaced_pod_disruption_budget(
        NS,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guard"},
            "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": 0},
        },
    )
    with pytest.raises(ApiException) as err:
        evict(core, "w0", NS)
    assert err.value.status == 429
    body = json.loads(err.value.body)
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    evict(core, "other", NS)
    evicted = core.read_namespaced_pod("other", NS)
    assert evicted.metadata.deletion_timestamp is not None
    assert [c.type for c in evicted.status.conditions][-1] == "DisruptionTarget"
    core.delete_namespaced_pod("w0", NS, grace_period_seconds=0)  # a DELETE is never blocked
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["other", "w1"]


def test_a_pod_completes_only_when_every_regular_container_has_exited(
    kube_api: KubeApiServer,
) -> None:
    # restartPolicy Never, as et-operator sets on its pods; the default (Always) restarts them
    launcher = bound_pod(
        "launcher", containers=[{"name": "main"}, {"name": "sidecar"}], restartPolicy="Never"
    )
    native = bound_pod(
        "native",
        containers=[{"name": "main"}],
        restartPolicy="Never",
        initContainers=[{"name": "sidecar", "restartPolicy": "Always"}],
    )
    kube_api.seed(launcher, native)
    done = kube_api.set_container_states("launcher", NS, {"main": 0, "sidecar": "running"})
    assert done["status"]["phase"] == "Running"  # a regular sidecar keeps the pod Running
    done = kube_api.set_container_states("native", NS, {"main": 0, "sidecar": "running"})
    assert done["status"]["phase"] == "Succeeded"  # a native sidecar does not
    failed = kube_api.set_container_states("launcher", NS, {"main": 1, "sidecar": 0})
    assert failed["status"]["phase"] == "Failed"


# ---------------------------------------------------------------- pods: defaults, deletion
def collect_events(core: client.CoreV1Api, rv: str, n: int) -> list[tuple[str, Any]]:
    from kubernetes import watch

    w, out = watch.Watch(), []
    for event in w.stream(core.list_namespaced_pod, NS, resource_version=rv, _request_timeout=5):
        out.append((event["type"], event["object"]))
        if len(out) >= n:
            w.stop()
    return out


def test_a_pod_created_through_the_api_is_defaulted(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    made = core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "image": "trainer:1.0"}]},
        },
    )
    assert (made.spec.restart_policy, made.spec.termination_grace_period_seconds) == ("Always", 30)
    assert made.spec.containers[0].image_pull_policy == "IfNotPresent"
    assert {(t.key, t.toleration_seconds) for t in made.spec.tolerations} == {
        ("node.kubernetes.io/not-ready", 300),
        ("node.kubernetes.io/unreachable", 300),
    }
    assert made.status.phase == "Pending"


def test_graceful_deletion_marks_then_the_kubelet_ends_the_pod(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core = client.CoreV1Api(kube_client)
    kube_api.now = lambda: datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    kube_api.kubelet_delay = None  # the node's kubelet is gone: Terminating until told
    kube_api.seed(bound_pod("w", terminationGracePeriodSeconds=45))
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    marked = core.delete_namespaced_pod("w", NS)  # no grace given: the pod's own
    assert marked.metadata.deletion_timestamp == datetime(2025, 1, 1, 12, 0, 45, tzinfo=UTC)
    assert marked.metadata.deletion_grace_period_seconds == 45
    assert marked.status.phase == "Running"  # until the containers stop
    assert (
        core.delete_namespaced_pod(
            "w", NS, grace_period_seconds=60
        ).metadata.deletion_grace_period_seconds
        == 45
    )  # a longer grace changes nothing
    shorter = core.delete_namespaced_pod("w", NS, grace_period_seconds=10)
    assert shorter.metadata.deletion_timestamp == datetime(2025, 1, 1, 12, 0, 10, tzinfo=UTC)
    assert kube_api.finish_terminating("w", NS) == ["w"]
    events = collect_events(core, rv, 4)
    assert [t for t, _ in events] == ["MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
    terminal = events[2][1]
    assert terminal.status.phase == "Failed"  # killed by SIGTERM: exit 143
    assert terminal.status.container_statuses[0].state.terminated.exit_code == 143
    assert core.list_namespaced_pod(NS).items == []


def test_the_kubelet_finishes_after_its_delay_and_kills_at_the_grace_period(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core = client.CoreV1Api(kube_client)
    kube_api.seed(bound_pod("slow"), bound_pod("stuck"))
    kube_api.kubelet_delay = 1.5  # the containers take 1.5 s to stop on SIGTERM
    core.delete_namespaced_pod("slow", NS, grace_period_seconds=30)
    core.delete_namespaced_pod("stuck", NS, grace_period_seconds=1)  # shorter than that
    assert {p.metadata.name for p in core.list_namespaced_pod(NS).items} == {"slow", "stuck"}
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    kube_api.wait_until(lambda: kube_api.get("Pod", "slow", NS) is None, timeout=5)
    ended = {
        o.metadata.name: o.status.container_statuses[0].state.terminated.exit_code
        for t, o in collect_events(core, rv, 4)
        if t == "MODIFIED"
    }
    assert ended == {"stuck": 137, "slow": 143}  # killed at its 1 s deadline; stopped at 1.5 s


def test_deletion_is_immediate_with_grace_zero_unbound_or_terminal(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core = client.CoreV1Api(kube_client)
    kube_api.kubelet_delay = None
    done = bound_pod("done")
    done["status"]["phase"] = "Succeeded"
    unbound = bound_pod("unbound")
    del unbound["spec"]["nodeName"]
    kube_api.seed(bound_pod("zero"), done, unbound, bound_pod("terminating"))
    core.delete_namespaced_pod("zero", NS, grace_period_seconds=0)
    core.delete_namespaced_pod("done", NS)
    core.delete_namespaced_pod("unbound", NS)
    core.delete_namespaced_pod("terminating", NS)  # 30 s, then forced
    core.delete_namespaced_pod("terminating", NS, grace_period_seconds=0)
    assert core.list_namespaced_pod(NS).items == []


def test_a_terminating_pod_with_a_finalizer_stays_until_it_is_removed(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core = client.CoreV1Api(kube_client)
    held = bound_pod("held")
    held["metadata"]["finalizers"] = ["example.com/keep"]
    kube_api.seed(held)
    core.delete_namespaced_pod("held", NS)  # the kubelet finishes at once (kubelet_delay 0)
    pod = core.read_namespaced_pod("held", NS)
    assert pod.status.phase == "Failed" and pod.metadata.deletion_grace_period_seconds == 0
    core.patch_namespaced_pod("held", NS, {"metadata": {"finalizers": None}})
    assert core.list_namespaced_pod(NS).items == []


# ---------------------------------------------------------------- the kubelet's phase
@pytest.mark.parametrize(
    ("policy", "states", "phase"),
    [
        ("Never", {"main": "running"}, "Running"),
        ("Never", {"main": "waiting"}, "Pending"),
        ("Never", {"main": 0}, "Succeeded"),
        ("Never", {"main": 2}, "Failed"),
        ("OnFailure", {"main": 2}, "Running"),  # the kubelet restarts it
        ("OnFailure", {"main": 0}, "Succeeded"),
        ("Always", {"main": 0}, "Running"),  # restarted too: Always never completes
    ],
)
def test_the_phase_follows_the_containers_like_the_kubelets_get_phase(
    kube_api: KubeApiServer,
    policy: str,
    states: dict[str, Any],
    phase: str,
) -> None:
    kube_api.seed(bound_pod("p", restartPolicy=policy))
    pod = kube_api.set_container_states("p", NS, states)
    assert pod["status"]["phase"] == phase
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == ("True" if states == {"main": "running"} else "False")


def test_init_containers_and_readiness(kube_api: KubeApiServer) -> None:
    init = bound_pod("init", restartPolicy="Never", initContainers=[{"name": "setup"}])
    kube_api.seed(init)
    assert (
        kube_api.set_container_states("init", NS, {"setup": "running"})["status"]["phase"]
        == "Pending"
    )
    assert (
        kube_api.set_container_states("init", NS, {"setup": 1})["status"]["phase"] == "Failed"
    )  # a failed init container fails a Never pod
    kube_api.seed(bound_pod("slow", restartPolicy="Never"))
    pod = kube_api.set_container_states("slow", NS, {"main": ("running", False)})
    assert pod["status"]["phase"] == "Running"
    assert [c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready"] == ["False"]
    running = kube_api.run_pod("slow", NS)
    assert {c["type"]: c["status"] for c in running["status"]["conditions"]} == {
        "Ready": "True",
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
    }


# ---------------------------------------------------------------- disruption budgets
def owned(name: str, owner: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    pod = bound_pod(name, labels)
    pod["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
    return pod


def budget(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": labels}, **spec},
    }


def test_budget_status_is_kept_by_the_disruption_controllers_rules(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    policy = client.PolicyV1Api(kube_client)
    web = {"app": "web"}
    [rs] = kube_api.seed(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web"},
            "spec": {"replicas": 4},
        }
    )
    ref = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "web",
        "uid": rs["metadata"]["uid"],
    }
    kube_api.seed(*(owned(f"web-{i}", ref, web) for i in range(3)))
    with pytest.raises(ApiException) as both:
        policy.create_namespaced_pod_disruption_budget(
            NS, budget("both", web, minAvailable=1, maxUnavailable=1)
        )
    assert json.loads(both.value.body)["message"] == (
        'PodDisruptionBudget.policy "both" is invalid: spec: Invalid value: "object": '
        "minAvailable and maxUnavailable cannot be both set"
    )
    policy.create_namespaced_pod_disruption_budget(NS, budget("half", web, minAvailable="50%"))
    status = policy.read_namespaced_pod_disruption_budget("half", NS).status
    # expected pods = the ReplicaSet's scale (4), not the 3 pods; 50% of 4 rounded up = 2
    assert (
        status.expected_pods,
        status.desired_healthy,
        status.current_healthy,
        status.disruptions_allowed,
    ) == (4, 2, 3, 1)
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [
        ("DisruptionAllowed", "True", "SufficientPods")
    ]
    kube_api.patch(
        "Pod", "web-0", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, NS
    )  # one goes unready: none may go now
    status = policy.read_namespaced_pod_disruption_budget("half", NS).status
    assert (status.current_healthy, status.disruptions_allowed) == (2, 0)


def test_a_budget_over_et_operator_workers_by_max_unavailable_fails_safe(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    # TrainingJob has no scale subresource: the controller cannot size maxUnavailable, so it
    # sets disruptionsAllowed 0 (failSafe) and never marks the budget observed
    policy, core = client.PolicyV1Api(kube_client), client.CoreV1Api(kube_client)
    job = {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": "TrainingJob",
        "name": "bert",
        "uid": "u1",
    }
    labels = {"training-job-name": "bert"}
    kube_api.seed(owned("bert-worker-0", job, labels), owned("bert-worker-1", job, labels))
    policy.create_namespaced_pod_disruption_budget(NS, budget("guard", labels, maxUnavailable=1))
    status = policy.read_namespaced_pod_disruption_budget("guard", NS).status
    assert status.disruptions_allowed == 0 and not status.observed_generation
    [cond] = status.conditions
    assert (cond.status, cond.reason, cond.message) == (
        "False",
        "SyncFailed",
        "trainingjobs.kai.alibabacloud.com does not implement the scale subresource",
    )
    with pytest.raises(ApiException) as err:
        evict(core, "bert-worker-0", NS)
    assert (err.value.status, err.value.headers["Retry-After"]) == (429, "10")
    assert json.loads(err.value.body)["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget guard is still being processed by the server.",
        }
    ]


def test_an_allowed_eviction_decrements_the_budget_and_deletes_gracefully(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core, policy = client.CoreV1Api(kube_client), client.PolicyV1Api(kube_client)
    kube_api.kubelet_delay = None
    labels = {"app": "w"}
    kube_api.seed(*(bound_pod(f"w{i}", labels) for i in range(3)))
    policy.create_namespaced_pod_disruption_budget(NS, budget("two", labels, minAvailable=2))

    evict(core, "w0", NS)
    pod = core.read_namespaced_pod("w0", NS)
    assert pod.metadata.deletion_timestamp and pod.status.phase == "Running"  # Terminating
    [target] = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert (target.status, target.reason, target.message) == (
        "True",
        "EvictionByEvictionAPI",
        "Eviction API: evicting",
    )
    status = policy.read_namespaced_pod_disruption_budget("two", NS).status
    assert (status.current_healthy, status.disruptions_allowed) == (2, 0)
    with pytest.raises(ApiException) as err:
        evict(core, "w1", NS)
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"], body["details"]["causes"]) == (
        429,
        "TooManyRequests",
        [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget two needs 2 healthy pods and has 2 currently",
            }
        ],
    )
    evict(core, "w0", NS)  # already Terminating: the budget is not asked again
    kube_api.finish_terminating("w0", NS)
    kube_api.seed(bound_pod("w3", labels))  # a replacement: one may go again
    evict(core, "w1", NS)


def test_evictions_the_budget_does_not_stop(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core, policy = client.CoreV1Api(kube_client), client.PolicyV1Api(kube_client)
    labels = {"app": "w"}
    pending = bound_pod("pending", labels)
    pending["status"] = {"phase": "Pending"}
    unready = bound_pod("unready", labels)
    unready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    kube_api.seed(bound_pod("ready", labels), pending, unready)
    policy.create_namespaced_pod_disruption_budget(NS, budget("one", labels, minAvailable=1))

    evict(core, "pending", NS)  # canIgnorePDB: Pending (and Succeeded/Failed) pods go regardless
    # not healthy while the budget is met (currentHealthy >= desiredHealthy)
    evict(core, "unready", NS)
    with pytest.raises(ApiException) as err:
        evict(core, "ready", NS)
    assert err.value.status == 429
    policy.create_namespaced_pod_disruption_budget(NS, budget("also", labels, minAvailable=0))
    with pytest.raises(ApiException) as two:
        evict(core, "ready", NS)
    assert (two.value.status, json.loads(two.value.body)["message"]) == (
        500,
        "This pod has more than one PodDisruptionBudget, which the eviction subresource "
        "does not support.",
    )
    with pytest.raises(ApiException) as missing:
        evict(core, "nope", NS)
    assert missing.value.status == 404
    with pytest.raises(ApiException) as mismatch:
        core.create_namespaced_pod_eviction(
            "ready",
            NS,
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}},
        )
    assert mismatch.value.status == 400


def test_without_the_controller_a_new_budget_is_still_being_processed(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
) -> None:
    core, policy = client.CoreV1Api(kube_client), client.PolicyV1Api(kube_client)
    kube_api.pdb_controller = False  # the real controller lags: nothing observed yet
    labels = {"app": "w"}
    kube_api.seed(bound_pod("w0", labels), bound_pod("w1", labels))
    policy.create_namespaced_pod_disruption_budget(NS, budget("b", labels, minAvailable=1))
    with pytest.raises(ApiException) as err:
        evict(core, "w0", NS)
    assert "still being processed" in json.loads(err.value.body)["details"]["causes"][0]["message"]
    kube_api.sync_pdbs()
    evict(core, "w0", NS)
