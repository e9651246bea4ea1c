"""The Kubernetes API emulator, exercised only through the official ``kubernetes`` client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, dynamic, watch
from kubernetes.client.rest import ApiException
from support.kube_api import KubeApiServer

KAI = ("kai.alibabacloud.com", "v1alpha1")
NS = "default"


def pod(
    name: str, labels: dict[str, str] | None = None, node: str | None = None, ns: str = NS
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": spec,
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
    }


def scaleout(name: str, count: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": "ScaleOut",
        "metadata": {"name": name, **meta},
        "spec": {"selector": {"name": "job"}, "toAdd": {"count": count}},
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def collect(fn: Callable[..., Any], *args: Any, n: int, **kwargs: Any) -> list[dict[str, Any]]:
    """The first ``n`` events of a watch (a read timeout fails the test instead of hanging)."""
    w, events = watch.Watch(), []
    for event in w.stream(fn, *args, _request_timeout=5, **kwargs):
        events.append(event)
        if len(events) >= n:
            w.stop()
    return events


class BackgroundWatch(threading.Thread):
    """Runs a watch in a thread, keeping its events and the exception that ended it."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.watch = watch.Watch()
        self.start()

    def run(self) -> None:
        try:
            for event in self.watch.stream(self.fn, *self.args, _request_timeout=5, **self.kwargs):
                self.events.append(event)
        except BaseException as e:  # the test inspects it
            self.error = e


@pytest.fixture
def v1(kube_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube_client)


@pytest.fixture
def crd(kube_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_client)


# ---------------------------------------------------------------- discovery
def test_discovery_serves_the_clients(kube_client: client.ApiClient) -> None:
    assert client.VersionApi(kube_client).get_code().major == "1"
    assert client.CoreApi(kube_client).get_api_versions().versions == ["v1"]
    groups = {g.name for g in client.ApisApi(kube_client).get_api_versions().groups}
    assert {"kai.alibabacloud.com", "kongming.cce.baiudbce.com", "coordination.k8s.io"} <= groups
    resources = client.CoreV1Api(kube_client).get_api_resources().resources
    assert {"pods", "pods/status", "nodes", "configmaps"} <= {r.name for r in resources}
    # The dynamic client builds itself entirely from discovery.
    dyn = dynamic.DynamicClient(kube_client)
    scaleouts = dyn.resources.get(api_version="kai.alibabacloud.com/v1alpha1", kind="ScaleOut")
    assert scaleouts.create(body=scaleout("via-dynamic"), namespace=NS).metadata.uid


# ---------------------------------------------------------------- create / get
def test_create_assigns_server_metadata(v1: client.CoreV1Api) -> None:
    a = v1.create_namespaced_pod(NS, pod("a"))
    b = v1.create_namespaced_pod(NS, pod("b"))
    assert a.metadata.uid and a.metadata.uid != b.metadata.uid
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    assert a.metadata.generation == 1 and a.metadata.creation_timestamp.microsecond == 0
    assert a.status.phase == "Pending"  # the pod strategy resets status on create
    assert v1.read_namespaced_pod("a", NS).metadata.resource_version == a.metadata.resource_version
    generated = v1.create_namespaced_pod(
        NS, {"metadata": {"generateName": "w-"}, "spec": pod("x")["spec"]}
    )
    assert generated.metadata.name.startswith("w-") and len(generated.metadata.name) == 7


def test_creation_timestamp_follows_the_injected_clock(
    kube_api: KubeApiServer, crd: client.CustomObjectsApi
) -> None:
    kube_api.now = lambda: datetime(2025, 1, 2, 3, 4, 5, 999999, tzinfo=UTC)
    made = crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s1"))
    assert made["metadata"]["creationTimestamp"] == "2025-01-02T03:04:05Z"  # 1-second resolution


def test_errors_are_status_objects(v1: client.CoreV1Api, crd: client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_pod("nope", NS)
    assert missing.value.status == 404
    assert status_of(missing.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "nope" not found',
        "reason": "NotFound",
        "code": 404,
        "details": {"name": "nope", "kind": "pods"},  # group is omitempty: none for core
    }
    crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("dup"))
    with pytest.raises(ApiException) as dup:
        crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("dup"))
    assert (dup.value.status, status_of(dup.value)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as invalid:
        crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("Bad_Name"))
    assert (invalid.value.status, status_of(invalid.value)["reason"]) == (422, "Invalid")
    with pytest.raises(ApiException) as no_kind:
        crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", {"metadata": {"name": "x"}})
    assert no_kind.value.status == 400
    with pytest.raises(ApiException) as unknown:
        crd.list_namespaced_custom_object(*KAI, NS, "nosuchthings")
    assert unknown.value.status == 404


# ---------------------------------------------------------------- list & selectors
@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["w1", "w2"]),
        ("app==web,tier=gpu", ["w2"]),
        ("app!=web", ["db", "plain"]),  # != also matches pods without the label
        ("tier in (gpu, cpu)", ["db", "w2"]),
        ("tier notin (gpu)", ["db", "plain", "w1"]),
        ("tier", ["db", "w2"]),
        ("!tier", ["plain", "w1"]),
        ("app in (web,db),!tier", ["w1"]),
    ],
)
def test_label_selectors(
    kube_api: KubeApiServer, v1: client.CoreV1Api, selector: str, expected: list[str]
) -> None:
    kube_api.seed(
        pod("w1", {"app": "web"}),
        pod("w2", {"app": "web", "tier": "gpu"}),
        pod("db", {"app": "db", "tier": "cpu"}),
        pod("plain"),
    )
    names = [p.metadata.name for p in v1.list_namespaced_pod(NS, label_selector=selector).items]
    assert names == expected


def test_invalid_label_selector_is_400(v1: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_pod(NS, label_selector="a in b")
    assert exc.value.status == 400


def test_field_selectors_and_list_resource_version(
    kube_api: KubeApiServer, v1: client.CoreV1Api, crd: client.CustomObjectsApi
) -> None:
    kube_api.seed(
        pod("bound", node="n1"),
        pod("free"),
        pod("done", node="n1"),
        pod("other", node="n1", ns="team"),
    )
    kube_api.patch("pods", "done", {"status": {"phase": "Succeeded"}})

    def names(pods: Any) -> list[str]:
        return sorted(p.metadata.name for p in pods.items)

    not_done = "spec.nodeName=n1,status.phase!=Succeeded"
    on_n1 = v1.list_pod_for_all_namespaces(field_selector=not_done)
    assert names(on_n1) == ["bound", "other"]
    assert on_n1.metadata.resource_version == str(kube_api.resource_version)
    assert names(v1.list_namespaced_pod(NS, field_selector="spec.nodeName=")) == ["free"]
    assert names(v1.list_namespaced_pod("team")) == ["other"]
    assert names(v1.list_pod_for_all_namespaces(field_selector="metadata.name=free")) == ["free"]
    with pytest.raises(ApiException) as exc:  # custom resources only support metadata.* fields
        crd.list_namespaced_custom_object(*KAI, NS, "scaleouts", field_selector="spec.x=job")
    assert exc.value.status == 400


def test_list_items_are_shaped_like_the_real_server(
    kube_api: KubeApiServer, v1: client.CoreV1Api, crd: client.CustomObjectsApi
) -> None:
    kube_api.seed(pod("p"), scaleout("s"))
    body = json.loads(v1.list_namespaced_pod(NS, _preload_content=False).data)
    assert body["kind"] == "PodList" and "kind" not in body["items"][0]  # typed items: no kind
    assert crd.list_cluster_custom_object(*KAI, "scaleouts")["items"][0]["kind"] == "ScaleOut"


def test_list_pagination(kube_api: KubeApiServer, v1: client.CoreV1Api) -> None:
    kube_api.seed(*(pod(f"p{i}") for i in range(5)))
    first = v1.list_namespaced_pod(NS, limit=2)
    rest = v1.list_namespaced_pod(NS, limit=10, _continue=first.metadata._continue)
    assert [p.metadata.name for p in first.items + rest.items] == [f"p{i}" for i in range(5)]
    assert rest.metadata._continue is None


# ---------------------------------------------------------------- patch / put / delete
def test_merge_and_json_patches(v1: client.CoreV1Api, crd: client.CustomObjectsApi) -> None:
    crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s", count=1))
    merged = crd.patch_namespaced_custom_object(
        *KAI,
        NS,
        "scaleouts",
        "s",
        {"spec": {"toAdd": {"count": 3}, "timeout": 90, "selector": None}},
    )
    assert merged["spec"] == {"toAdd": {"count": 3}, "timeout": 90}  # null removes a key
    assert merged["metadata"]["generation"] == 2
    v1.create_namespaced_pod(NS, pod("p", {"a": "1"}))
    patched = v1.patch_namespaced_pod(
        "p",
        NS,
        [
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "9"},
            {"op": "add", "path": "/metadata/annotations", "value": {"x/y": "z"}},
            {"op": "remove", "path": "/metadata/annotations/x~1y"},
        ],
    )
    assert patched.metadata.labels == {"a": "9", "b": "2"}
    assert patched.metadata.annotations is None  # omitempty: the last one gone, the map too
    with pytest.raises(ApiException) as failed_test:
        v1.patch_namespaced_pod(
            "p", NS, [{"op": "test", "path": "/metadata/labels/a", "value": "1"}]
        )
    assert failed_test.value.status == 422
    with pytest.raises(ApiException) as strategic_on_cr:
        crd.patch_namespaced_custom_object(
            *KAI,
            NS,
            "scaleouts",
            "s",
            {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert strategic_on_cr.value.status == 415


def test_strategic_merge_patch_merges_conditions_by_type(
    kube_api: KubeApiServer, v1: client.CoreV1Api
) -> None:
    kube_api.seed(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "MemoryPressure", "status": "False"},
                ]
            },
        }
    )
    node = v1.patch_node_status(
        "n1",
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletDown"},
                    {"type": "InstanceExpired", "status": "True"},
                ]
            }
        },
    )
    assert [(c.type, c.status) for c in node.status.conditions] == [
        ("Ready", "False"),
        ("MemoryPressure", "False"),
        ("InstanceExpired", "True"),
    ]


def test_put_uses_optimistic_concurrency(kube_client: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(kube_client)
    lease = leases.create_namespaced_lease(
        NS, {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}
    )
    lease.spec.holder_identity = "b"
    updated = leases.replace_namespaced_lease("leader", NS, lease)  # sends the rv it read
    assert updated.spec.holder_identity == "b"
    lease.spec.holder_identity = "c"  # its resourceVersion is stale now
    with pytest.raises(ApiException) as exc:
        leases.replace_namespaced_lease("leader", NS, lease)
    assert (exc.value.status, status_of(exc.value)["reason"]) == (409, "Conflict")
    same = leases.replace_namespaced_lease("leader", NS, updated)  # a no-op write changes nothing
    assert same.metadata.resource_version == updated.metadata.resource_version
    with pytest.raises(ApiException) as missing:
        leases.replace_namespaced_lease("ghost", NS, {"metadata": {"name": "ghost"}})
    assert missing.value.status == 404


def test_patch_with_stale_resource_version_conflicts(crd: client.CustomObjectsApi) -> None:
    made = crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s"))
    crd.patch_namespaced_custom_object(*KAI, NS, "scaleouts", "s", {"spec": {"timeout": 5}})
    stale = {
        "metadata": {"resourceVersion": made["metadata"]["resourceVersion"]},
        "spec": {"timeout": 6},
    }
    with pytest.raises(ApiException) as exc:
        crd.patch_namespaced_custom_object(*KAI, NS, "scaleouts", "s", stale)
    assert exc.value.status == 409


def test_status_subresource(crd: client.CustomObjectsApi, v1: client.CoreV1Api) -> None:
    forged = dict(scaleout("s"), status={"phase": "forged"})
    assert "status" not in crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", forged)
    main = crd.patch_namespaced_custom_object(
        *KAI, NS, "scaleouts", "s", {"status": {"phase": "x"}}
    )
    assert "status" not in main  # the main resource ignores status
    # et-operator's CRD requires these status fields (tests/support/crds)
    full = {"phase": "Scaling", "conditions": [], "replicaStatuses": {}, "restartCount": 0}
    st = crd.patch_namespaced_custom_object_status(
        *KAI, NS, "scaleouts", "s", {"status": full, "spec": {"timeout": 1}}
    )
    assert st["status"] == full
    assert "timeout" not in st["spec"]  # /status ignores everything but status
    assert st["metadata"]["generation"] == 1  # status changes do not bump generation
    st["status"]["phase"] = "ScaleSucceeded"
    replaced = crd.replace_namespaced_custom_object_status(*KAI, NS, "scaleouts", "s", st)
    assert replaced["status"]["phase"] == "ScaleSucceeded"
    v1.create_namespaced_pod(NS, pod("p"))
    running = v1.patch_namespaced_pod_status("p", NS, {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"


def test_delete(
    kube_api: KubeApiServer, v1: client.CoreV1Api, crd: client.CustomObjectsApi
) -> None:
    v1.create_namespaced_pod(NS, pod("p"))
    assert v1.delete_namespaced_pod("p", NS).metadata.name == "p"  # pods return the object
    crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s"))
    assert crd.delete_namespaced_custom_object(*KAI, NS, "scaleouts", "s")["status"] == "Success"
    with pytest.raises(ApiException) as exc:
        crd.get_namespaced_custom_object(*KAI, NS, "scaleouts", "s")
    assert exc.value.status == 404
    held = scaleout("held", finalizers=["kai/finalizer"])
    crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", held)
    pending = crd.delete_namespaced_custom_object(*KAI, NS, "scaleouts", "held")
    assert pending["metadata"]["deletionTimestamp"]  # finalizers keep it until removed
    crd.patch_namespaced_custom_object(
        *KAI, NS, "scaleouts", "held", {"metadata": {"finalizers": None}}
    )
    assert kube_api.get("scaleouts", "held") is None
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "cm"}, "data": {"k": "v"}})
    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1"))
    with pytest.raises(ApiException) as precondition:
        v1.delete_namespaced_config_map("cm", NS, body=stale)
    assert precondition.value.status == 409


def test_events_leases_and_collections(
    kube_api: KubeApiServer, kube_client: client.ApiClient, v1: client.CoreV1Api
) -> None:
    v1.create_namespaced_event(
        NS,
        {
            "metadata": {"name": "e1"},
            "reason": "Preempted",
            "involvedObject": {"kind": "Pod", "name": "p"},
        },
    )
    preempted = v1.list_namespaced_event(NS, field_selector="reason=Preempted").items
    assert [e.metadata.name for e in preempted] == ["e1"]
    new_events = client.EventsV1Api(kube_client)
    new_events.create_namespaced_event(
        NS,
        {
            "metadata": {"name": "e2"},
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "reason": "ScaleOut",
            "action": "Create",
            "reportingController": "spot-autoscaler",
            "reportingInstance": "x",
        },
    )
    assert [e.reason for e in new_events.list_namespaced_event(NS).items] == ["ScaleOut"]
    kube_api.seed(pod("a", {"x": "1"}), pod("b", {"x": "1"}), pod("c"))
    v1.delete_collection_namespaced_pod(NS, label_selector="x=1")
    assert [p["metadata"]["name"] for p in kube_api.objects("pods")] == ["c"]


# ---------------------------------------------------------------- watch
def test_watch_resumes_from_a_resource_version(
    kube_api: KubeApiServer, v1: client.CoreV1Api
) -> None:
    kube_api.seed(pod("old"))
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("a"))
    v1.patch_namespaced_pod("a", NS, {"metadata": {"labels": {"k": "v"}}})
    v1.delete_namespaced_pod("a", NS)
    events = collect(v1.list_namespaced_pod, NS, resource_version=rv, n=3)
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    rvs = [int(e["object"].metadata.resource_version) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    # Without a resourceVersion a watch starts with synthetic ADDED events for current state.
    assert [e["object"].metadata.name for e in collect(v1.list_namespaced_pod, NS, n=1)] == ["old"]


def test_watch_with_selector_sees_objects_enter_and_leave(
    kube_api: KubeApiServer, v1: client.CoreV1Api
) -> None:
    rv = str(kube_api.resource_version)
    v1.create_namespaced_pod(NS, pod("p"))
    v1.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"role": "worker"}}})
    v1.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"role": None}}})
    events = collect(
        v1.list_namespaced_pod, NS, resource_version=rv, label_selector="role=worker", n=2
    )
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


def test_watch_custom_objects(kube_api: KubeApiServer, crd: client.CustomObjectsApi) -> None:
    rv = crd.list_namespaced_custom_object(*KAI, NS, "scaleouts")["metadata"]["resourceVersion"]
    crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s"))
    done = [{"type": "ScaleSucceeded", "status": "True"}]
    kube_api.patch("scaleouts", "s", {"status": {"conditions": done}})
    events = collect(
        crd.list_namespaced_custom_object, *KAI, NS, "scaleouts", resource_version=rv, n=2
    )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    assert events[1]["object"]["status"]["conditions"] == done


def test_too_old_resource_version_gets_410(kube_api: KubeApiServer, v1: client.CoreV1Api) -> None:
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("a"))
    kube_api.compact()
    with pytest.raises(ApiException) as exc:  # given timeout_seconds, the client never retries
        list(
            watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=5)
        )
    assert exc.value.status == 410
    with pytest.raises(ApiException) as retried:  # else it retries once from the same rv
        list(
            watch.Watch().stream(
                v1.list_namespaced_pod, NS, resource_version=rv, _request_timeout=5
            )
        )
    assert retried.value.status == 410
    assert kube_api.count("GET", "/pods", watch=True) == 3
    # On the wire: HTTP 200, then an ERROR event holding a 410 Expired Status (the watch cache).
    resp = v1.list_namespaced_pod(NS, watch=True, resource_version=rv, _preload_content=False)
    assert resp.status == 200
    assert [json.loads(line) for line in resp.data.decode().splitlines()] == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "reason": "Expired",
                "code": 410,
                "message": f"too old resource version: {rv} ({kube_api.resource_version})",
            },
        }
    ]


def test_bounded_history_expires_old_versions(
    kube_api: KubeApiServer, v1: client.CoreV1Api
) -> None:
    kube_api.history_limit = 3
    rv = kube_api.resource_version
    for i in range(4):
        v1.create_namespaced_pod(NS, pod(f"p{i}"))
    with pytest.raises(ApiException) as exc:
        collect(v1.list_namespaced_pod, NS, resource_version=str(rv), timeout_seconds=5, n=1)
    assert exc.value.status == 410
    assert len(collect(v1.list_namespaced_pod, NS, resource_version=str(rv + 1), n=3)) == 3


def test_bookmarks_and_server_timeout(kube_api: KubeApiServer, v1: client.CoreV1Api) -> None:
    """Bookmarks come every bookmark_interval until 2 s before timeoutSeconds, and only with a
    resourceVersion past both the watch's start and what it replayed (the watch cache's rules:
    a bookmark at the resourceVersion a watch already has is not sent)."""
    kube_api.bookmark_interval = 0.1
    rv = str(kube_api.resource_version)
    v1.create_namespaced_pod(NS, pod("a"))

    def stream(since: str) -> list[dict[str, Any]]:
        return list(
            watch.Watch().stream(
                v1.list_namespaced_pod,
                NS,
                resource_version=since,
                timeout_seconds=3,
                allow_watch_bookmarks=True,
                _request_timeout=8,
            )
        )

    started = time.monotonic()
    replayed = stream(rv)  # pod a, then nothing newer: no bookmark
    assert 2.9 < time.monotonic() - started < 5  # the server ends the stream at timeoutSeconds
    assert [e["type"] for e in replayed] == ["ADDED"]
    later = threading.Timer(0.3, lambda: v1.create_namespaced_pod(NS, pod("b")))
    later.start()
    events = stream(str(kube_api.resource_version))
    later.join()
    assert events[0]["type"] == "ADDED" and events[0]["object"].metadata.name == "b"
    assert events[1:] and {e["type"] for e in events[1:]} == {"BOOKMARK"}
    b = events[0]["object"].metadata.resource_version
    assert all(e["object"]["metadata"]["resourceVersion"] == b for e in events[1:])


# ---------------------------------------------------------------- faults & controls
def test_fault_injection(
    kube_api: KubeApiServer, v1: client.CoreV1Api, crd: client.CustomObjectsApi
) -> None:
    kube_api.fail_next(2, status=500, path_contains="/pods")
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            v1.list_namespaced_pod(NS)
        assert (exc.value.status, status_of(exc.value)["reason"]) == (500, "InternalError")
    assert v1.list_namespaced_pod(NS).items == []
    kube_api.fail_next(1, status=429, method="POST")
    crd.list_namespaced_custom_object(*KAI, NS, "scaleouts")  # a GET is unaffected
    with pytest.raises(ApiException) as throttled:
        crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s"))
    assert throttled.value.status == 429
    kube_api.fail_next(1, status=503, path_contains="watch=")
    with pytest.raises(ApiException) as watch_failed:
        collect(v1.list_namespaced_pod, NS, n=1)
    assert watch_failed.value.status == 503


def test_drop_watches_abruptly_breaks_the_stream(
    kube_api: KubeApiServer, v1: client.CoreV1Api
) -> None:
    watcher = BackgroundWatch(v1.list_namespaced_pod, NS)
    kube_api.wait_until(lambda: kube_api.watch_count == 1)
    v1.create_namespaced_pod(NS, pod("a"))
    kube_api.wait_until(lambda: len(watcher.events) == 1)
    kube_api.drop_watches()
    watcher.join(5)
    assert isinstance(watcher.error, urllib3.exceptions.ProtocolError)
    kube_api.wait_until(lambda: kube_api.watch_count == 0)


def test_clean_watch_end_lets_the_client_resume(
    kube_api: KubeApiServer, v1: client.CoreV1Api
) -> None:
    watcher = BackgroundWatch(v1.list_namespaced_pod, NS, resource_version="1")
    v1.create_namespaced_pod(NS, pod("a"))
    kube_api.wait_until(lambda: len(watcher.events) == 1)
    kube_api.drop_watches(abrupt=False)  # like a server timeout: the client re-watches
    kube_api.wait_until(lambda: kube_api.count(watch=True) == 2 and kube_api.watch_count == 1)
    v1.create_namespaced_pod(NS, pod("b"))
    kube_api.wait_until(lambda: len(watcher.events) == 2)
    assert [e["object"].metadata.name for e in watcher.events] == ["a", "b"]  # no replays
    resumed_from = kube_api.requests(watch=True)[1].query["resourceVersion"]
    assert resumed_from == watcher.events[0]["object"].metadata.resource_version
    watcher.watch.stop()


def test_request_log_latency_and_kubeconfig(kube_api: KubeApiServer, tmp_path: Path) -> None:
    path = kube_api.kubeconfig(str(tmp_path / "kubeconfig"))
    api = config.new_client_from_config(config_file=path)
    core = client.CoreV1Api(api)
    kube_api.clear_requests()
    core.list_node()
    core.list_node(label_selector="spot=true")
    assert kube_api.count("GET", "/api/v1/nodes") == 2
    last = kube_api.requests()[-1]
    assert (last.query, last.status) == ({"labelSelector": "spot=true"}, 200)
    kube_api.latency = 0.2
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started >= 0.2
    api.close()


def test_seed_and_direct_access(kube_api: KubeApiServer, v1: client.CoreV1Api) -> None:
    (seeded,) = kube_api.seed(
        {
            "apiVersion": "kai.alibabacloud.com/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {
                "name": "job",
                "namespace": "team",
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {"etReplicaSpecs": {"worker": {"replicas": 2}}},
            "status": {"phase": "Running"},
        }
    )
    assert seeded["status"] == {"phase": "Running"}  # seeding keeps status (as if the operator)
    assert seeded["metadata"]["creationTimestamp"] == "2024-01-01T00:00:00Z"
    stored = kube_api.get("TrainingJob", "job", "team")
    assert stored is not None and stored["metadata"]["uid"] == seeded["metadata"]["uid"]
    kube_api.seed(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"spot": "true"}}}
    )
    assert [n.metadata.name for n in v1.list_node(label_selector="spot=true").items] == ["n1"]
    kube_api.delete("nodes", "n1")
    assert v1.list_node().items == []


def test_custom_resources_are_pruned_and_validated_by_their_crd_schema(
    crd: client.CustomObjectsApi,
) -> None:
    body = {
        **scaleout("s"),
        "spec": {"selector": {"name": "job"}, "toAdd": {"count": 1}, "unknownField": 1},
    }
    created = crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", body)
    assert "unknownField" not in created["spec"]  # pruned, silently, as the real server does
    bad = {**scaleout("t"), "spec": {"selector": {"name": "job"}, "toAdd": {"count": "two"}}}
    with pytest.raises(ApiException) as exc:
        crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", bad)
    assert exc.value.status == 422
    assert "spec.toAdd.count in body must be of type integer" in status_of(exc.value)["message"]


# ---------------------------------------------------------------- CRD schemas
def trainingjob(name: str, **spec: Any) -> dict[str, Any]:
    worker = {"replicas": 2, "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}}}
    return {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"etReplicaSpecs": {"launcher": {"replicas": 1}, "worker": worker}, **spec},
    }


def causes(exc: ApiException) -> list[tuple[str, str]]:
    return [(c["reason"], c["field"]) for c in status_of(exc)["details"]["causes"]]


def test_pruning_keeps_what_the_schema_declares_and_preserves_only_where_it_says(
    crd: client.CustomObjectsApi,
) -> None:
    body = trainingjob("j", unknownTop=1)
    body["metadata"]["bogus"] = "x"  # ObjectMeta has no such field
    worker = body["spec"]["etReplicaSpecs"]["worker"]
    worker["madeUp"] = True  # worker is a declared object without preserve: pruned
    worker["template"]["metadata"] = {"labels": {"a": "b"}, "anything": 1}  # preserved subtree
    body["spec"]["etReplicaSpecs"]["ps"] = {"replicas": 1}  # etReplicaSpecs preserves unknown
    body["spec"]["etReplicaSpecs"]["launcher"]["junk"] = 1  # ...but prunes inside known ones
    made = crd.create_namespaced_custom_object(*KAI, NS, "trainingjobs", body)
    specs = made["spec"]["etReplicaSpecs"]
    assert "unknownTop" not in made["spec"] and "bogus" not in made["metadata"]
    assert "madeUp" not in specs["worker"] and "junk" not in specs["launcher"]
    assert specs["ps"] == {"replicas": 1}
    assert specs["worker"]["template"]["metadata"] == {"labels": {"a": "b"}, "anything": 1}
    # the schema's defaults are applied (backoffLimit 6, restartPolicy Never, port protocol)
    assert (made["spec"]["backoffLimit"], made["spec"]["restartPolicy"]) == (6, "Never")


def test_unknown_fields_warn_by_default_and_fail_under_strict_field_validation(
    kube_client: client.ApiClient,
    crd: client.CustomObjectsApi,
) -> None:
    body = {**scaleout("s"), "spec": {"selector": {"name": "job"}, "extra": 1}}
    resp = crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", body, _preload_content=False)
    assert resp.headers.get("Warning") == '299 - "unknown field \\"spec.extra\\""'
    with pytest.raises(ApiException) as strict:
        crd.create_namespaced_custom_object(
            *KAI, NS, "scaleouts", {**body, "metadata": {"name": "t"}}, field_validation="Strict"
        )
    assert strict.value.status == 400
    assert status_of(strict.value)["message"] == (
        'ScaleOut in version "v1alpha1" cannot be handled as a ScaleOut: strict decoding '
        'error: unknown field "spec.extra"'
    )


def test_validation_errors_are_422_invalid_with_one_cause_per_field(
    crd: client.CustomObjectsApi,
) -> None:
    bad = trainingjob("j", restartPolicy="Always", slotsPerWorker="two")
    bad["spec"]["etReplicaSpecs"]["worker"]["replicas"] = 0
    del bad["spec"]["etReplicaSpecs"]["launcher"]
    with pytest.raises(ApiException) as exc:
        crd.create_namespaced_custom_object(*KAI, NS, "trainingjobs", bad)
    body = status_of(exc.value)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    assert body["details"]["kind"] == "TrainingJob" and body["details"]["name"] == "j"
    assert sorted(causes(exc.value)) == [
        ("FieldValueInvalid", "spec.etReplicaSpecs.worker.replicas"),
        ("FieldValueNotSupported", "spec.restartPolicy"),
        ("FieldValueRequired", "spec.etReplicaSpecs.launcher"),
        ("FieldValueTypeInvalid", "spec.slotsPerWorker"),
    ]
    assert body["message"].startswith('TrainingJob.kai.alibabacloud.com "j" is invalid: [')
    assert (
        'spec.restartPolicy: Unsupported value: "Always": supported values: "Never", "OnFailure"'
    ) in body["message"]
    assert (
        "spec.etReplicaSpecs.worker.replicas: Invalid value: 0: spec.etReplicaSpecs.worker."
        "replicas in body should be greater than or equal to 1"
    ) in body["message"]
    assert (
        'spec.slotsPerWorker: Invalid value: "string": spec.slotsPerWorker in body must be '
        'of type integer: "string"'
    ) in body["message"]


def test_status_writes_must_carry_what_the_operators_status_requires(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
) -> None:
    crd.create_namespaced_custom_object(
        *KAI,
        NS,
        "scaleins",
        {
            "apiVersion": "kai.alibabacloud.com/v1alpha1",
            "kind": "ScaleIn",
            "metadata": {"name": "s"},
            "spec": {"toDelete": {"podNames": ["p"]}},
        },
    )
    with pytest.raises(ApiException) as exc:  # JobStatus: conditions, replicaStatuses,
        crd.patch_namespaced_custom_object_status(  # restartCount are required
            *KAI, NS, "scaleins", "s", {"status": {"phase": "Scaling"}}
        )
    assert sorted(causes(exc.value)) == [
        ("FieldValueRequired", f"status.{f}")
        for f in ("conditions", "replicaStatuses", "restartCount")
    ]
    with pytest.raises(ApiException) as when:
        crd.patch_namespaced_custom_object_status(
            *KAI,
            NS,
            "scaleins",
            "s",
            {
                "status": {
                    "conditions": [
                        {"type": "Created", "status": "True", "lastTransitionTime": "now"}
                    ],
                    "replicaStatuses": {},
                    "restartCount": 0,
                }
            },
        )
    assert causes(when.value) == [("FieldValueInvalid", "status.conditions[0].lastTransitionTime")]


def test_validation_ratcheting_lets_an_object_stored_invalid_change_elsewhere(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
) -> None:
    stored = trainingjob("j", slotsPerWorker="two")  # seeded: stored without validation
    kube_api.seed({**stored, "status": {"phase": "Running"}})  # status lacks required fields
    patched = crd.patch_namespaced_custom_object(
        *KAI,
        NS,
        "trainingjobs",
        "j",
        {"metadata": {"annotations": {"spot-autoscaler.io/drained-hosts": "[]"}}},
    )
    assert patched["metadata"]["annotations"]  # unchanged invalid parts are not held against it
    with pytest.raises(ApiException) as exc:  # a changed invalid part is
        crd.patch_namespaced_custom_object(
            *KAI, NS, "trainingjobs", "j", {"spec": {"slotsPerWorker": "three"}}
        )
    assert causes(exc.value) == [("FieldValueTypeInvalid", "spec.slotsPerWorker")]
    kube_api.validation_ratcheting = False  # before 1.30 (or with the gate off)
    with pytest.raises(ApiException) as strict:
        crd.patch_namespaced_custom_object(
            *KAI, NS, "trainingjobs", "j", {"metadata": {"labels": {"a": "b"}}}
        )
    assert ("FieldValueRequired", "status.conditions") in causes(strict.value)


def test_the_reconstructed_cce_schema_types_the_scaling_fields(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
) -> None:
    cce = ("kongming.cce.baiudbce.com", "v1")
    job = {
        "apiVersion": "kongming.cce.baiudbce.com/v1",
        "kind": "AITrainingJob",
        "metadata": {"name": "ernie"},
        "junk": 1,
        "spec": {
            "faultTolerant": True,
            "priority": "high",  # unknown spec fields: kept
            "replicaSpecs": {"trainer": {"replicas": 2, "scaleInpods": ["a"]}},
        },
    }
    made = crd.create_namespaced_custom_object(*cce, NS, "aitrainingjobs", job)
    assert "junk" not in made and made["spec"]["priority"] == "high"
    with pytest.raises(ApiException) as exc:
        crd.patch_namespaced_custom_object(
            *cce,
            NS,
            "aitrainingjobs",
            "ernie",
            {"spec": {"replicaSpecs": {"trainer": {"replicas": "3"}}}},
        )
    assert causes(exc.value) == [("FieldValueTypeInvalid", "spec.replicaSpecs[trainer].replicas")]


# ---------------------------------------------------------------- kinds not served
def test_an_unserved_kind_leaves_discovery_and_answers_the_plain_404(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
    crd: client.CustomObjectsApi,
) -> None:
    cce = ("kongming.cce.baiudbce.com", "v1")
    kube_api.seed(
        {
            "apiVersion": "kongming.cce.baiudbce.com/v1",
            "kind": "AITrainingJob",
            "metadata": {"name": "ernie"},
            "spec": {},
        }
    )
    kube_api.unserve("aitrainingjobs.kongming.cce.baiudbce.com")
    apis = client.ApisApi(kube_client)
    assert cce[0] not in {g.name for g in apis.get_api_versions().groups}
    for call in (
        lambda: kube_client.call_api(
            f"/apis/{cce[0]}", "GET", auth_settings=[], _preload_content=False
        ),
        lambda: crd.get_api_resources(*cce),
        lambda: crd.list_namespaced_custom_object(*cce, NS, "aitrainingjobs"),
        lambda: crd.get_namespaced_custom_object(*cce, NS, "aitrainingjobs", "ernie"),
        lambda: crd.create_namespaced_custom_object(
            *cce,
            NS,
            "aitrainingjobs",
            {
                "apiVersion": "kongming.cce.baiudbce.com/v1",
                "kind": "AITrainingJob",
                "metadata": {"name": "x"},
            },
        ),
    ):
        with pytest.raises(ApiException) as exc:
            call()
        # Go's http.NotFound, not a Status: what the client sees for a CRD not installed
        body = exc.value.body
        text = body.decode() if isinstance(body, bytes) else body
        assert (exc.value.status, text) == (404, "404 page not found\n")
        assert exc.value.headers["Content-Type"] == "text/plain; charset=utf-8"
    # an unknown resource of a built-in group-version is go-restful's Status instead
    with pytest.raises(ApiException) as core:
        kube_client.call_api(
            "/api/v1/namespaces/default/nosuchthings",
            "GET",
            auth_settings=[],
            _preload_content=False,
        )
    assert status_of(core.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server could not find the requested resource",
        "reason": "NotFound",
        "details": {},
        "code": 404,
    }
    kube_api.serve("AITrainingJob")  # the CRD installed later: empty (a deleted CRD's objects go)
    assert crd.list_namespaced_custom_object(*cce, NS, "aitrainingjobs")["items"] == []
    assert cce[0] in {g.name for g in apis.get_api_versions().groups}


def test_a_group_stays_while_one_of_its_kinds_is_served(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
    crd: client.CustomObjectsApi,
) -> None:
    kube_api.unserve("ScaleIn", keep_objects=True)  # a version set to served: false
    kube_api.seed(
        {
            "apiVersion": "kai.alibabacloud.com/v1alpha1",
            "kind": "ScaleIn",
            "metadata": {"name": "kept"},
            "spec": {},
        }
    )
    names = {r.name for r in crd.get_api_resources(*KAI).resources}
    assert "scaleins" not in names and {"scaleouts", "trainingjobs"} <= names
    group = json.loads(
        kube_client.call_api(
            f"/apis/{KAI[0]}",
            "GET",
            auth_settings=[],
            _preload_content=False,
            _return_http_data_only=True,
        ).data
    )
    assert (group["kind"], group["preferredVersion"]["version"]) == ("APIGroup", "v1alpha1")
    with pytest.raises(ApiException) as exc:
        crd.list_cluster_custom_object(*KAI, "scaleins")
    assert exc.value.status == 404
    kube_api.serve("ScaleIn")
    assert [
        s["metadata"]["name"]
        for s in crd.list_namespaced_custom_object(*KAI, NS, "scaleins")["items"]
    ] == ["kept"]


def test_watches_on_a_kind_that_goes_end_and_the_client_then_gets_404(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    v1: client.CoreV1Api,
) -> None:
    rv = crd.list_namespaced_custom_object(*KAI, NS, "scaleouts")["metadata"]["resourceVersion"]
    outs = BackgroundWatch(
        crd.list_namespaced_custom_object, *KAI, NS, "scaleouts", resource_version=rv
    )
    pods = BackgroundWatch(v1.list_namespaced_pod, NS, resource_version=rv)
    kube_api.wait_until(lambda: kube_api.watch_count == 2)
    crd.create_namespaced_custom_object(*KAI, NS, "scaleouts", scaleout("s"))
    kube_api.wait_until(lambda: len(outs.events) == 1)
    kube_api.unserve("ScaleOut")
    outs.join(5)  # the stream ended cleanly; the client's re-watch got the plain 404
    assert isinstance(outs.error, ApiException) and outs.error.status == 404
    assert [e["type"] for e in outs.events] == ["ADDED"]  # no DELETED for the objects that went
    assert pods.is_alive() and kube_api.watch_count == 1  # other kinds' watches go on
    kube_api.serve("ScaleOut")
    with pytest.raises(ApiException) as gone:  # a new watch cache: older versions are gone
        collect(
            crd.list_namespaced_custom_object,
            *KAI,
            NS,
            "scaleouts",
            resource_version=rv,
            timeout_seconds=5,
            n=1,
        )
    assert gone.value.status == 410
    pods.watch.stop()


def test_a_v1beta1_crd_keeps_unknown_fields_unless_it_opts_into_pruning(
    kube_api: KubeApiServer,
    kube_client: client.ApiClient,
    crd: client.CustomObjectsApi,
    tmp_path: Path,
) -> None:
    def install(plural: str, kind: str, **spec: Any) -> None:
        path = tmp_path / f"{plural}.yaml"
        path.write_text(
            json.dumps(
                {  # JSON is YAML
                    "apiVersion": "apiextensions.k8s.io/v1beta1",
                    "kind": "CustomResourceDefinition",
                    "metadata": {"name": f"{plural}.example.com"},
                    "spec": {
                        "group": "example.com",
                        "version": "v1",
                        "scope": "Namespaced",
                        "names": {"plural": plural, "kind": kind},
                        "validation": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {"size": {"type": "integer"}},
                                    }
                                },
                            }
                        },
                        **spec,
                    },
                }
            )
        )
        kube_api.install_crd(str(path))

    install("olds", "Old")  # v1beta1 defaulted preserveUnknownFields to true
    install("strict", "Strict", preserveUnknownFields=False)
    assert "example.com" in {g.name for g in client.ApisApi(kube_client).get_api_versions().groups}

    def create(plural: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
        made: dict[str, Any] = crd.create_namespaced_custom_object(
            "example.com",
            "v1",
            NS,
            plural,
            {"apiVersion": "example.com/v1", "kind": kind, "metadata": {"name": "x"}, "spec": spec},
        )
        return made

    assert create("olds", "Old", {"size": 1, "extra": 2})["spec"] == {"size": 1, "extra": 2}
    assert create("strict", "Strict", {"size": 1, "extra": 2})["spec"] == {"size": 1}
    with pytest.raises(ApiException) as exc:  # validation applies either way
        crd.create_namespaced_custom_object(
            "example.com",
            "v1",
            NS,
            "olds",
            {
                "apiVersion": "example.com/v1",
                "kind": "Old",
                "metadata": {"name": "y"},
                "spec": {"size": "big"},
            },
        )
    assert exc.value.status == 422
