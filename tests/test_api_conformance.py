"""One behaviour, two servers: what the product relies on from the Kubernetes API, pinned by the
same assertions on the API emulator (tests/support/kube_api.py) and on a real kube-apiserver
(`@pytest.mark.servers("emulator", "real")`: every test here runs on both).

Everything goes through HTTP with the official client, as the product's calls do; where the two
servers answered differently the emulator was fixed (docs/testing.md, "Emulator vs the real API
server", lists each difference with the upstream source). Only how a test *makes* a situation may
differ (removing a CRD: the emulator's `unserve`, the real server's CRD delete), never what it
asserts.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from kube_fixtures import CRDS, ET_API, NS, Kube, container, node, pod, training_job, worker
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from support.kube_api import KubeApiServer
from support.raw_api import send
from support.waiting import wait_for

from autoscaler.adapters.discovery.watch import ObjectWatch
from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.eviction_guard import desired_guard
from autoscaler.adapters.kube.kinds.et_operator import TRAINING_JOBS
from autoscaler.adapters.kube.lease import LeaseLock
from autoscaler.adapters.kube.pods import NOT_TERMINATED_SELECTOR
from autoscaler.adapters.kube.resources import MANAGER, Resource
from autoscaler.adapters.kube.served import is_served

pytestmark = pytest.mark.servers("emulator", "real")

Obj = dict[str, Any]
ET = "/apis/kai.alibabacloud.com/v1alpha1"
JOBS = f"{ET}/namespaces/{NS}/trainingjobs"
SCALE_INS = f"{ET}/namespaces/{NS}/scaleins"
SCALE_OUTS = f"{ET}/namespaces/{NS}/scaleouts"
PODS = f"/api/v1/namespaces/{NS}/pods"
EVENTS = f"/api/v1/namespaces/{NS}/events"
CONFIG_MAPS = f"/api/v1/namespaces/{NS}/configmaps"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
PDBS = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WORKERS = {"training-job-name": "bert", "training-job-role": "worker"}


# --- plain HTTP through the official client ---------------------------------------------------
class Api:
    """Requests as the product sends them; answers as (status code, decoded body)."""

    def __init__(self, kube: Kube) -> None:
        self.client: ApiClient = kube.server.api_client()
        kube.clients.append(self.client)  # closed with the fixture

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        patch: bool = False,
        query: dict[str, Any] | None = None,
    ) -> tuple[int, Any]:
        try:
            response = send(
                self.client, method, path, body, merge=patch, query=(query or {}).items()
            )
            return response.status, json.loads(response.data)
        except ApiException as exc:
            try:
                return exc.status, json.loads(exc.body)
            except ValueError:  # Go's http.NotFound: text/plain
                return exc.status, exc.body.decode() if isinstance(exc.body, bytes) else exc.body

    def ok(self, method: str, path: str, body: Any = None, patch: bool = False, **kw: Any) -> Obj:
        status, answer = self.call(method, path, body, patch=patch, **kw)
        assert status in (200, 201), f"{method} {path}: {status} {answer}"
        return answer  # type: ignore[no-any-return]

    def get(self, path: str) -> Obj | None:
        status, answer = self.call("GET", path)
        assert status in (200, 404), f"GET {path}: {status} {answer}"
        return answer if status == 200 else None

    def version(self, path: str) -> str:
        """A list's resourceVersion: where a watch of it starts."""
        return str(self.ok("GET", path)["metadata"]["resourceVersion"])

    def watch(
        self, path: str, since: str, seconds: int = 5, count: int | None = None, **query: Any
    ) -> tuple[list[tuple[float, Obj]], float]:
        """A watch from `since` ending after `count` events or when the server ends it (its
        timeoutSeconds): the events with the second each arrived at, and when the stream ended."""
        params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": seconds, **query}
        response = send(self.client, "GET", path, query=params.items(), timeout=seconds + 10)
        started, events = time.monotonic(), []
        try:
            for line in iter_resp_lines(response):
                events.append((time.monotonic() - started, json.loads(line)))
                if count is not None and len(events) >= count:
                    break
        finally:
            response.close()
        return events, time.monotonic() - started


@pytest.fixture
def api(kube: Kube) -> Api:
    return Api(kube)


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def rv(obj: Obj) -> int:
    return int(meta(obj)["resourceVersion"])


def job_body(name: str = "bert", **kw: Any) -> Obj:
    """A TrainingJob as a client creates it (status is the operator's, written later)."""
    job = training_job(name, **kw)
    del job["status"]
    return job


def pod_body(name: str, node_name: str, labels: dict[str, str] | None = None) -> Obj:
    made = pod(name, node_name, labels=labels, containers=[container()])
    del made["status"]
    return made


def running(api: Api, name: str, ready: bool = True) -> Obj:
    """What a kubelet reports: Running, Ready or not (through pods/status, as the kubelet does;
    the test nodes have no kubelet, so nothing else writes it)."""
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    status = {"status": {"phase": "Running", "conditions": conditions}}
    return api.ok("PATCH", f"{PODS}/{name}/status", status, patch=True)


# --- list + watch ------------------------------------------------------------------------------
def test_a_watch_from_a_lists_version_replays_added_modified_deleted_in_order(
    kube: Kube, api: Api
) -> None:
    since = api.version(JOBS)
    made = api.ok("POST", JOBS, job_body(labels={"team": "ml"}))
    changed = api.ok("PATCH", f"{JOBS}/bert", {"spec": {"slotsPerWorker": 2}}, patch=True)
    done = api.ok("DELETE", f"{JOBS}/bert")  # a custom resource's: a Status, not the object
    assert (done["kind"], done["status"]) == ("Status", "Success")
    assert done["details"] == {
        "name": "bert",
        "group": "kai.alibabacloud.com",
        "kind": "trainingjobs",
        "uid": meta(made)["uid"],
    }
    events, _ = api.watch(JOBS, since, count=3)
    assert [e["type"] for _, e in events] == ["ADDED", "MODIFIED", "DELETED"]
    added, modified, deleted = (e["object"] for _, e in events)
    assert rv(added) == rv(made) < rv(modified) == rv(changed) < rv(deleted)
    # DELETED carries the object as it was last, at the deletion's own resourceVersion
    assert meta(deleted)["uid"] == meta(made)["uid"]
    assert meta(deleted)["labels"] == {"team": "ml"} and deleted["spec"]["slotsPerWorker"] == 2
    assert (deleted["kind"], deleted["apiVersion"]) == ("TrainingJob", ET_API)
    # and the watch resumes from any of them without replaying what came before
    after, _ = api.watch(JOBS, meta(modified)["resourceVersion"], count=1)
    assert [e["type"] for _, e in after] == ["DELETED"]


def test_a_label_selector_watch_sees_objects_enter_and_leave_its_selection(
    kube: Kube, api: Api
) -> None:
    since = api.version(JOBS)
    api.ok("POST", JOBS, job_body("in", labels={"team": "ml"}))
    api.ok("POST", JOBS, job_body("out"))
    api.ok("PATCH", f"{JOBS}/out", {"metadata": {"labels": {"team": "ml"}}}, patch=True)
    left = api.ok("PATCH", f"{JOBS}/in", {"metadata": {"labels": {"team": None}}}, patch=True)
    api.ok("PATCH", f"{JOBS}/out", {"spec": {"slotsPerWorker": 3}}, patch=True)
    events, _ = api.watch(JOBS, since, count=4, labelSelector="team=ml")
    seen = [(e["type"], meta(e["object"])["name"]) for _, e in events]
    assert seen == [("ADDED", "in"), ("ADDED", "out"), ("DELETED", "in"), ("MODIFIED", "out")]
    # leaving the selection: the object as it was (still labelled), at the change's version
    gone = events[2][1]["object"]
    assert meta(gone)["labels"] == {"team": "ml"} and rv(gone) == rv(left)


def test_the_not_terminated_pod_watch_drops_a_pod_that_finished(kube: Kube, api: Api) -> None:
    kube.server.seed(node("n1"))
    api.ok("POST", PODS, pod_body("done", "n1"))
    api.ok("POST", PODS, pod_body("busy", "n1"))
    running(api, "done")
    running(api, "busy")
    since = api.version(PODS)
    listed = api.ok("GET", PODS, query={"fieldSelector": NOT_TERMINATED_SELECTOR})
    assert sorted(meta(p)["name"] for p in listed["items"]) == ["busy", "done"]
    finished = api.ok(
        "PATCH", f"{PODS}/done/status", {"status": {"phase": "Succeeded"}}, patch=True
    )
    events, _ = api.watch(PODS, since, count=1, fieldSelector=NOT_TERMINATED_SELECTOR)
    [(_, event)] = events
    assert (event["type"], meta(event["object"])["name"]) == ("DELETED", "done")
    assert event["object"]["status"]["phase"] == "Running"  # as last selected
    assert rv(event["object"]) == rv(finished)
    listed = api.ok("GET", PODS, query={"fieldSelector": NOT_TERMINATED_SELECTOR})
    assert [meta(p)["name"] for p in listed["items"]] == ["busy"]


def test_a_watch_of_one_name_follows_that_object_only(kube: Kube, api: Api) -> None:
    """The discovery sidecar follows its job by fieldSelector metadata.name (discovery/watch.py,
    ObjectWatch): its view goes missing, there, changed, gone, and never shows a neighbour."""
    seen: list[Obj | None] = []
    stop = threading.Event()
    follow = ObjectWatch(
        TRAINING_JOBS.lister(api.client, NS),
        "bert",
        lambda obj: seen.append(obj),
        timedelta(seconds=5),
        timedelta(seconds=1),
        stop,
        structlog.get_logger(),
    )
    thread = threading.Thread(target=follow.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: seen == [None], 10, "the first (empty) list")
        api.ok("POST", JOBS, job_body("bert-other"))
        api.ok("POST", JOBS, job_body())
        api.ok("PATCH", f"{JOBS}/bert", {"spec": {"slotsPerWorker": 4}}, patch=True)
        api.ok("DELETE", f"{JOBS}/bert")
        wait_for(lambda: len(seen) >= 4, 10, "the object's three changes")
        assert seen[-1] is None
        versions = [(meta(o)["name"], o["spec"].get("slotsPerWorker")) for o in seen[1:3] if o]
        assert versions == [("bert", None), ("bert", 4)]
    finally:
        stop.set()
        follow._reflector.stop_watch()
        thread.join(5)


def test_a_watch_from_a_version_the_server_no_longer_keeps_is_410_gone(
    kube: Kube, api: Api, tmp_path: Path
) -> None:
    """A kind's watch window starts where its watch cache was filled: a CRD installed now has
    nothing older (as after an apiserver restart, or etcd compaction behind a re-listing
    cache). Too old: a 200 stream with one ERROR event, 410 Expired; a new list resumes it."""
    before = api.version(CONFIG_MAPS)
    with own_crd(kube, api, tmp_path) as crd:
        events, _ = api.watch(crd.path, before, count=1)
        [(_, event)] = events
        assert event["type"] == "ERROR"
        status = event["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        assert status["message"].startswith(f"too old resource version: {before} (")
        since = api.version(crd.path)
        api.ok("POST", crd.path, crd.scale_in("late"))
        events, _ = api.watch(crd.path, since, count=1)
        assert [(e["type"], meta(e["object"])["name"]) for _, e in events] == [("ADDED", "late")]


def test_a_short_watch_with_bookmarks_gets_one_before_its_timeout(kube: Kube, api: Api) -> None:
    """No bookmark every minute in a test: the one a bookmarking watch gets 2 s before its
    timeoutSeconds, if its kind moved past what the watch had when it started (a resourceVersion
    newer than that: here a job made while it runs)."""
    since = api.version(JOBS)
    later = threading.Timer(0.5, lambda: api.ok("POST", JOBS, job_body()))
    later.start()
    try:
        events, ended = api.watch(JOBS, since, seconds=4, allowWatchBookmarks="true")
    finally:
        later.join()
    # one bookmark before the timeout; a real server may add a periodic one (its watchers'
    # bookmark timer): the product needs them to move the resourceVersion, not a count
    types = [e["type"] for _, e in events]
    assert types[0] == "ADDED" and set(types[1:]) == {"BOOKMARK"}, types
    (_, added), (at, bookmark) = events[0], events[-1]
    assert bookmark["object"] == {
        "kind": "TrainingJob",
        "apiVersion": ET_API,
        "metadata": {"resourceVersion": bookmark["object"]["metadata"]["resourceVersion"]},
    }
    assert rv(bookmark["object"]) >= rv(added["object"])
    assert 3.5 < ended < 6 and ended - at > 0.5  # before the server ended the stream


# --- writes: merge patches, optimistic concurrency, errors ------------------------------------
def test_a_null_in_a_merge_patch_removes_the_key_and_empty_maps_are_left_out(
    kube: Kube, api: Api
) -> None:
    api.ok("POST", JOBS, job_body(labels={"team": "ml"}, annotations={"a": "1", "b": "2"}))
    patched = api.ok("PATCH", f"{JOBS}/bert", {"metadata": {"annotations": {"a": None}}}, True)
    assert meta(patched)["annotations"] == {"b": "2"}
    gone = {"metadata": {"annotations": {"b": None}, "labels": {"team": None}}}
    patched = api.ok("PATCH", f"{JOBS}/bert", gone, patch=True)
    assert "annotations" not in meta(patched) and "labels" not in meta(patched)
    assert "annotations" not in meta(api.ok("GET", f"{JOBS}/bert"))
    # a node's notice annotation (the product's notice_patch), on a built-in kind
    kube.server.seed(node("n1"))
    api.ok("PATCH", "/api/v1/nodes/n1", {"metadata": {"annotations": {"x": "1"}}}, patch=True)
    patched = api.ok("PATCH", "/api/v1/nodes/n1", {"metadata": {"annotations": {"x": None}}}, True)
    assert "x" not in (meta(patched).get("annotations") or {})


def test_a_patch_carrying_a_stale_resource_version_is_409_and_changes_nothing(
    kube: Kube, api: Api
) -> None:
    """The product's drained-hosts update (annotations.py update_drained) relies on it."""
    made = api.ok("POST", JOBS, job_body())
    api.ok("PATCH", f"{JOBS}/bert", {"metadata": {"annotations": {"by": "other"}}}, patch=True)
    stale = {"metadata": {"resourceVersion": meta(made)["resourceVersion"], "annotations": {}}}
    stale["metadata"]["annotations"]["by"] = "us"
    status, answer = api.call("PATCH", f"{JOBS}/bert", stale, patch=True)
    assert (status, answer["reason"], answer["code"]) == (409, "Conflict", 409)
    assert answer["message"] == (
        'Operation cannot be fulfilled on trainingjobs.kai.alibabacloud.com "bert": the object '
        "has been modified; please apply your changes to the latest version and try again"
    )
    assert answer["details"] == {
        "name": "bert",
        "group": "kai.alibabacloud.com",
        "kind": "trainingjobs",
    }
    current = api.ok("GET", f"{JOBS}/bert")
    assert meta(current)["annotations"] == {"by": "other"}
    stale["metadata"]["resourceVersion"] = meta(current)["resourceVersion"]
    assert meta(api.ok("PATCH", f"{JOBS}/bert", stale, patch=True))["annotations"] == {"by": "us"}


def test_creating_an_existing_name_is_409_already_exists(kube: Kube, api: Api) -> None:
    """A scaler made twice (a pass whose cache had not seen the first) counts as made."""
    out = {
        "apiVersion": ET_API,
        "kind": "ScaleOut",
        "metadata": {"name": "bert-out-1"},
        "spec": {"selector": {"name": "bert"}, "toAdd": {"count": 1}},
    }
    api.ok("POST", SCALE_OUTS, out)
    status, answer = api.call("POST", SCALE_OUTS, out)
    assert (status, answer["reason"]) == (409, "AlreadyExists")
    assert answer["message"] == 'scaleouts.kai.alibabacloud.com "bert-out-1" already exists'
    assert answer["details"] == {
        "name": "bert-out-1",
        "group": "kai.alibabacloud.com",
        "kind": "scaleouts",
    }
    status, answer = api.call("POST", EVENTS, event_body("twice"))
    assert status == 201
    status, answer = api.call("POST", EVENTS, event_body("twice"))
    assert (status, answer["reason"], answer["details"]) == (
        409,
        "AlreadyExists",
        {"name": "twice", "kind": "events"},  # the core group: no group at all
    )


def test_a_delete_whose_precondition_no_longer_holds_is_409(kube: Kube, api: Api) -> None:
    """The product deletes a scaler or a budget only as the version it decided on."""
    scale_in = {
        "apiVersion": ET_API,
        "kind": "ScaleIn",
        "metadata": {"name": "bert-in-1"},
        "spec": {"selector": {"name": "bert"}, "toDelete": {"podNames": ["bert-worker-1"]}},
    }
    made = api.ok("POST", SCALE_INS, scale_in)
    changed = api.ok("PATCH", f"{SCALE_INS}/bert-in-1", {"metadata": {"labels": {"x": "y"}}}, True)
    old, new = meta(made)["resourceVersion"], meta(changed)["resourceVersion"]
    status, answer = api.call(
        "DELETE", f"{SCALE_INS}/bert-in-1", {"preconditions": {"resourceVersion": old}}
    )
    assert (status, answer["reason"]) == (409, "Conflict")
    assert answer["message"] == (
        'Operation cannot be fulfilled on ScaleIn.kai.alibabacloud.com "bert-in-1": the '
        f"ResourceVersion in the precondition ({old}) does not match the ResourceVersion in "
        f"record ({new}). The object might have been modified"
    )
    assert answer["details"] == {
        "name": "bert-in-1",
        "group": "kai.alibabacloud.com",
        "kind": "ScaleIn",
    }
    uid = meta(made)["uid"]
    status, answer = api.call("DELETE", f"{SCALE_INS}/bert-in-1", {"preconditions": {"uid": "x"}})
    assert (status, answer["message"]) == (
        409,
        'Operation cannot be fulfilled on ScaleIn.kai.alibabacloud.com "bert-in-1": the UID in '
        f"the precondition (x) does not match the UID in record ({uid}). The object might have "
        "been deleted and then recreated",
    )
    # the budget the guard removes: a built-in kind names its Kind and group the same way
    job = api.ok("POST", JOBS, job_body())
    budget = api.ok("POST", PDBS, desired_guard(job, WORKERS))
    api.ok("PATCH", f"{PDBS}/bert-spot-guard", {"metadata": {"labels": {"x": "y"}}}, patch=True)
    stale = {"preconditions": {"resourceVersion": meta(budget)["resourceVersion"]}}
    status, answer = api.call("DELETE", f"{PDBS}/bert-spot-guard", stale)
    assert (status, answer["details"]) == (
        409,
        {"name": "bert-spot-guard", "group": "policy", "kind": "PodDisruptionBudget"},
    )
    current = {"preconditions": {"resourceVersion": new}}
    assert api.ok("DELETE", f"{SCALE_INS}/bert-in-1", current)
    assert api.get(f"{SCALE_INS}/bert-in-1") is None


def test_reading_what_is_not_there_is_404(kube: Kube, api: Api) -> None:
    status, answer = api.call("GET", f"{JOBS}/nope")
    assert (status, answer["reason"], answer["message"]) == (
        404,
        "NotFound",
        'trainingjobs.kai.alibabacloud.com "nope" not found',
    )
    assert answer["details"] == {
        "name": "nope",
        "group": "kai.alibabacloud.com",
        "kind": "trainingjobs",
    }
    for path, kind in ((f"{PODS}/nope", "pods"), ("/api/v1/nodes/nope", "nodes")):
        status, answer = api.call("GET", path)
        assert (status, answer["reason"], answer["details"]) == (
            404,
            "NotFound",
            {"name": "nope", "kind": kind},
        )
    status, answer = api.call("PATCH", f"{JOBS}/nope", {"metadata": {"labels": {}}}, patch=True)
    assert (status, answer["reason"]) == (404, "NotFound")
    status, answer = api.call("DELETE", f"{JOBS}/nope")
    assert (status, answer["reason"]) == (404, "NotFound")
    # a kind nobody serves (its CRD not installed): Go's text/plain 404, not a Status
    for path in ("/apis/nope.example.com/v1", "/apis/nope.example.com/v1/namespaces/ml/things"):
        assert api.call("GET", path) == (404, "404 page not found\n")
    # a resource a built-in group-version does not have: a Status, with empty details
    status, answer = api.call("GET", f"/api/v1/namespaces/{NS}/nopes")
    assert (status, answer["reason"], answer["details"]) == (404, "NotFound", {})


def test_a_list_in_pages_keeps_the_first_pages_version(kube: Kube, api: Api) -> None:
    """The reflector lists in pages (limit, continue) and watches from the last page's
    resourceVersion: every page carries the snapshot's, the first page's, not a later one."""
    for name in ("a", "b", "c"):
        api.ok("POST", JOBS, job_body(name))
    first = api.ok("GET", JOBS, query={"limit": 2})
    assert [meta(j)["name"] for j in first["items"]] == ["a", "b"]
    assert first["metadata"]["continue"]
    api.ok("PATCH", f"{JOBS}/a", {"spec": {"slotsPerWorker": 2}}, patch=True)  # meanwhile
    token = first["metadata"]["continue"]
    last = api.ok("GET", JOBS, query={"limit": 2, "continue": token})
    assert [meta(j)["name"] for j in last["items"]] == ["c"]
    assert not last["metadata"].get("continue")
    assert last["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_a_pods_overhead_comes_from_its_runtime_class(kube: Kube, api: Api) -> None:
    """The product counts spec.overhead in a node's requested GPUs (pods.py): on a real cluster
    only the RuntimeClass admission plugin puts it there."""
    runtime_classes = "/apis/node.k8s.io/v1/runtimeclasses"
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "gpu-overhead"},
        "handler": "runc",
        "overhead": {"podFixed": {"nvidia.com/gpu": "1"}},
    }
    api.ok("POST", runtime_classes, body)
    try:
        kube.server.seed(node("n1"))
        plain = pod_body("plain", "n1")
        plain["spec"]["runtimeClassName"] = "gpu-overhead"
        assert api.ok("POST", PODS, plain)["spec"]["overhead"] == {"nvidia.com/gpu": "1"}
        refused = {
            "own": ({}, "Pod Overhead set without corresponding RuntimeClass defined Overhead"),
            "more": (
                {"runtimeClassName": "gpu-overhead"},
                "Pod's Overhead doesn't match RuntimeClass's defined Overhead",
            ),
            "unknown": ({"runtimeClassName": "nope"}, 'RuntimeClass "nope" not found'),
        }
        for name, (spec, why) in refused.items():
            body = pod_body(name, "n1")
            body["spec"].update(spec)
            if name != "unknown":
                body["spec"]["overhead"] = {"nvidia.com/gpu": "2"}
            status, answer = api.call("POST", PODS, body)
            assert (status, answer["reason"], answer["details"]) == (
                403,
                "Forbidden",
                {"name": name, "kind": "pods"},
            )
            assert answer["message"] == f'pods "{name}" is forbidden: pod rejected: {why}'
        # and a container without an image is no pod at all
        imageless = pod_body("imageless", "n1")
        del imageless["spec"]["containers"][0]["image"]
        status, answer = api.call("POST", PODS, imageless)
        assert (status, answer["message"]) == (
            422,
            'Pod "imageless" is invalid: spec.containers[0].image: Required value',
        )
    finally:
        api.call("DELETE", f"{runtime_classes}/gpu-overhead")


# --- custom resources: status subresource and structural schema -------------------------------
def test_the_status_subresource_splits_what_each_write_may_change(kube: Kube, api: Api) -> None:
    made = api.ok("POST", JOBS, training_job("bert"))  # status sent along: dropped
    assert "status" not in made and meta(made)["generation"] == 1
    both = {"spec": {"slotsPerWorker": 2}, "status": {"phase": "Scaling"}}
    patched = api.ok("PATCH", f"{JOBS}/bert", both, patch=True)
    assert "status" not in patched and patched["spec"]["slotsPerWorker"] == 2
    assert meta(patched)["generation"] == 2  # the spec moved
    status = {"phase": "Running", "conditions": [], "replicaStatuses": {}, "restartCount": 0}
    everything = {
        "metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}},
        "spec": {"slotsPerWorker": 7},
        "status": status,
    }
    patched = api.ok("PATCH", f"{JOBS}/bert/status", everything, patch=True)
    assert patched["status"] == status and patched["spec"]["slotsPerWorker"] == 2
    assert "labels" not in meta(patched) and "annotations" not in meta(patched)
    assert meta(patched)["generation"] == 2  # status only: the generation stays
    labelled = api.ok("PATCH", f"{JOBS}/bert", {"metadata": {"labels": {"x": "y"}}}, patch=True)
    assert meta(labelled)["generation"] == 2 and labelled["status"] == status
    # the product's status reads: et-operator's CRD requires these three in a status
    status, answer = api.call("PATCH", f"{JOBS}/bert/status", {"status": None}, patch=True)
    assert status == 200 and "status" not in answer
    status, answer = api.call(
        "PUT", f"{JOBS}/bert/status", {**answer, "status": {"phase": "Running"}}
    )
    assert (status, answer["reason"]) == (422, "Invalid")
    assert {c["field"] for c in answer["details"]["causes"]} == {
        "status.conditions",
        "status.replicaStatuses",
        "status.restartCount",
    }


def test_only_kinds_that_track_it_have_a_generation(kube: Kube, api: Api) -> None:
    job = api.ok("POST", JOBS, job_body())
    kube.server.seed(node("n1"))
    tracked = {
        "TrainingJob": job,
        "Pod": api.ok("POST", PODS, pod_body("p", "n1")),
        "PodDisruptionBudget": api.ok("POST", PDBS, desired_guard(job, WORKERS)),
    }
    untracked = {
        "Node": api.ok("GET", "/api/v1/nodes/n1"),
        "Lease": api.ok("POST", LEASES, lease_body("lock")),
        "Event": api.ok("POST", EVENTS, event_body("e")),
        "ConfigMap": api.ok("POST", CONFIG_MAPS, {"metadata": {"name": "c"}, "data": {}}),
    }
    assert {k: meta(o).get("generation") for k, o in tracked.items()} == dict.fromkeys(tracked, 1)
    assert {k: meta(o).get("generation") for k, o in untracked.items()} == dict.fromkeys(untracked)
    renewed = api.ok("PATCH", f"{LEASES}/lock", {"spec": {"holderIdentity": "b"}}, patch=True)
    assert "generation" not in meta(renewed)


def test_custom_resources_are_pruned_and_defaulted_by_their_schema(kube: Kube, api: Api) -> None:
    job = job_body()
    job["extra"] = 1
    job["spec"]["bogus"] = {"deep": True}
    job["spec"]["etReplicaSpecs"]["worker"]["junk"] = "x"
    job["metadata"]["unknownMeta"] = "m"
    made = api.ok("POST", JOBS, job)
    assert "extra" not in made and "bogus" not in made["spec"]
    assert "junk" not in made["spec"]["etReplicaSpecs"]["worker"]
    assert "unknownMeta" not in meta(made)
    assert (
        made["spec"]["etReplicaSpecs"]["worker"]["template"]
        == job["spec"]["etReplicaSpecs"]["worker"]["template"]
    )  # under x-kubernetes-preserve-unknown-fields: kept as sent
    # et-operator's defaults: backoffLimit 6, restartPolicy Never, on create and on patch
    assert (made["spec"]["backoffLimit"], made["spec"]["restartPolicy"]) == (6, "Never")
    unset = {"spec": {"backoffLimit": None, "bogus": 1, "slotsPerWorker": 2.0}}
    patched = api.ok("PATCH", f"{JOBS}/bert", unset, patch=True)
    assert patched["spec"]["backoffLimit"] == 6 and "bogus" not in patched["spec"]
    # an integral number is an integer, and comes back as one
    assert patched["spec"]["slotsPerWorker"] == 2
    assert isinstance(patched["spec"]["slotsPerWorker"], int)


def test_a_schema_violation_is_422_invalid_naming_each_field(kube: Kube, api: Api) -> None:
    api.ok("POST", JOBS, job_body())
    bad = {"spec": {"slotsPerWorker": "many", "etReplicaSpecs": {"worker": {"maxReplicas": True}}}}
    status, answer = api.call("PATCH", f"{JOBS}/bert", bad, patch=True)
    assert (status, answer["reason"], answer["code"]) == (422, "Invalid", 422)
    details = answer["details"]
    assert (details["name"], details["group"], details["kind"]) == (
        "bert",
        "kai.alibabacloud.com",
        "TrainingJob",
    )
    worker_max = "spec.etReplicaSpecs.worker.maxReplicas"
    # a boolean where the schema says integer, format int32: named by its format, not its type
    # (kube-openapi validate/type.go typeValidator.Validate)
    assert sorted(details["causes"], key=lambda c: c["field"]) == [
        {
            "reason": "FieldValueTypeInvalid",
            "message": f'Invalid value: "": {worker_max} in body must be of type int32: ""',
            "field": worker_max,
        },
        {
            "reason": "FieldValueTypeInvalid",
            "message": (
                'Invalid value: "string": spec.slotsPerWorker in body must be of type '
                'integer: "string"'
            ),
            "field": "spec.slotsPerWorker",
        },
    ]
    assert answer["message"].startswith('TrainingJob.kai.alibabacloud.com "bert" is invalid: [')
    below = {"spec": {"etReplicaSpecs": {"worker": {"minReplicas": 0}}}}
    status, answer = api.call("PATCH", f"{JOBS}/bert", below, patch=True)
    assert status == 422
    assert answer["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": (
                "Invalid value: 0: spec.etReplicaSpecs.worker.minReplicas in body should be "
                "greater than or equal to 1"
            ),
            "field": "spec.etReplicaSpecs.worker.minReplicas",
        }
    ]


# --- the Lease and Events ----------------------------------------------------------------------
def lease_body(name: str) -> Obj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }


def test_a_lease_written_from_a_stale_read_is_409_and_never_unconditional(
    kube: Kube, api: Api
) -> None:
    """Leader election (lease.py): every write is a replace carrying the version read."""
    a = LeaseLock(api.client, NS, "leader", "a", timedelta(seconds=15))
    b = LeaseLock(api.client, NS, "leader", "b", timedelta(seconds=15))
    assert a.try_acquire_or_renew() and a.holder == "a"
    assert not b.try_acquire_or_renew() and b.holder == "a"  # held and not expired
    read = api.ok("GET", f"{LEASES}/leader")
    assert a.try_acquire_or_renew()  # a renews after b read
    read["spec"]["holderIdentity"] = "b"
    status, answer = api.call("PUT", f"{LEASES}/leader", read)
    assert (status, answer["reason"], answer["details"]) == (
        409,
        "Conflict",
        {"name": "leader", "group": "coordination.k8s.io", "kind": "leases"},
    )
    assert api.ok("GET", f"{LEASES}/leader")["spec"]["holderIdentity"] == "a"
    # a replace without a resourceVersion is refused outright, not applied blindly
    del read["metadata"]["resourceVersion"]
    status, answer = api.call("PUT", f"{LEASES}/leader", read)
    assert (status, answer["reason"]) == (422, "Invalid")
    assert answer["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: must be specified for an update",
            "field": "metadata.resourceVersion",
        }
    ]
    # the same for a custom resource; a ConfigMap (AllowUnconditionalUpdate) takes it
    job = api.ok("POST", JOBS, job_body())
    del job["metadata"]["resourceVersion"]
    assert api.call("PUT", f"{JOBS}/bert", job)[0] == 422
    api.ok("POST", CONFIG_MAPS, {"metadata": {"name": "c"}, "data": {"k": "1"}})
    assert api.ok("PUT", f"{CONFIG_MAPS}/c", {"metadata": {"name": "c"}, "data": {"k": "2"}})
    # two creates racing: the second is 409 AlreadyExists, which the loser reads as lost
    c = LeaseLock(api.client, NS, "other", "c", timedelta(seconds=15))
    d = LeaseLock(api.client, NS, "other", "d", timedelta(seconds=15))
    assert c._create() and not d._create()


def event_body(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NS},
        "involvedObject": {"kind": "TrainingJob", "name": "bert", "namespace": NS},
        "reason": "Test",
        "message": "m",
        "type": "Normal",
        "source": {"component": MANAGER},
    }


def test_the_products_events_are_created_and_found_by_their_object(kube: Kube, api: Api) -> None:
    job = api.ok("POST", JOBS, job_body())
    kube.server.seed(node("n1"))
    recorder = EventRecorder(api.client, host="replica-1")
    now = datetime.now(UTC)
    recorder.record(job, "ScaleOutCreated", "add 2 worker(s)", now)
    recorder.record(api.ok("GET", "/api/v1/nodes/n1"), "HostsDrained", "n1 drained", now)
    assert recorder.flush(10)
    found = api.ok(
        "GET", EVENTS, query={"fieldSelector": "involvedObject.name=bert,reason=ScaleOutCreated"}
    )
    [event] = found["items"]
    about = event["involvedObject"]
    assert (about["kind"], about["name"], about["namespace"], about["uid"]) == (
        "TrainingJob",
        "bert",
        NS,
        meta(job)["uid"],
    )
    assert (event["reportingComponent"], event["reportingInstance"]) == (MANAGER, "replica-1")
    assert (event["type"], event["message"], event["count"]) == ("Normal", "add 2 worker(s)", 1)
    # a cluster-scoped object's Events live in "default", their object in no namespace
    on_node = api.ok(
        "GET", "/api/v1/namespaces/default/events", query={"fieldSelector": "reason=HostsDrained"}
    )
    assert [e["involvedObject"]["name"] for e in on_node["items"]] == ["n1"]
    for e in on_node["items"]:
        api.ok("DELETE", f"/api/v1/namespaces/default/events/{meta(e)['name']}")
    # an Event whose object lives in another namespace is refused
    elsewhere = event_body("elsewhere")
    elsewhere["involvedObject"]["namespace"] = "other"
    status, answer = api.call("POST", EVENTS, elsewhere)
    assert (status, answer["reason"]) == (422, "Invalid")
    assert answer["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "other": does not match event.namespace',
            "field": "involvedObject.namespace",
        }
    ]


# --- API discovery: CRDs come and go -----------------------------------------------------------
class OwnCrd:
    """A copy of et-operator's ScaleIn CRD in a group of its own, new for every test."""

    def __init__(self, tmp_path: Path) -> None:
        self.group = f"g{uuid.uuid4().hex[:10]}.conformance.test"
        crd = yaml.safe_load((CRDS / "kai.alibabacloud.com_scaleins.yaml").read_text())
        crd["spec"]["group"] = self.group
        self.name = crd["metadata"]["name"] = f"scaleins.{self.group}"
        self.file = tmp_path / f"{self.group}.yaml"
        self.file.write_text(yaml.safe_dump(crd))
        self.api_version = f"{self.group}/v1alpha1"
        self.path = f"/apis/{self.api_version}/namespaces/{NS}/scaleins"
        self.resource = Resource("ScaleIn", self.group, "v1alpha1", "scaleins", True)

    def scale_in(self, name: str) -> Obj:
        return {
            "apiVersion": self.api_version,
            "kind": "ScaleIn",
            "metadata": {"name": name},
            "spec": {"selector": {"name": "bert"}, "toDelete": {"podNames": []}},
        }


def install(kube: Kube, crd: OwnCrd) -> None:
    kube.server.install_crd(str(crd.file))  # the real server's waits until Established


def remove(kube: Kube, api: Api, crd: OwnCrd) -> None:
    """Delete the CRD (the emulator: stop serving its kind, which is what deleting it does)."""
    if isinstance(kube.server, KubeApiServer):
        kube.server.unserve(f"scaleins.{crd.group}")
        return
    status, answer = api.call("DELETE", f"{CRD_API}/{crd.name}")
    assert status in (200, 404), answer
    wait_for(lambda: api.get(f"{CRD_API}/{crd.name}") is None, 30, f"CRD {crd.name} gone")


class own_crd:  # noqa: N801 - a context manager used like a function
    """Installed on entry, deleted on exit (the real server keeps CRDs across tests)."""

    def __init__(self, kube: Kube, api: Api, tmp_path: Path) -> None:
        self.kube, self.api, self.crd = kube, api, OwnCrd(tmp_path)

    def __enter__(self) -> OwnCrd:
        install(self.kube, self.crd)
        return self.crd

    def __exit__(self, *exc: object) -> None:
        remove(self.kube, self.api, self.crd)


def discovered(api: Api, group: str) -> Obj | None:
    return next((g for g in api.ok("GET", "/apis")["groups"] if g["name"] == group), None)


def test_discovery_lists_an_installed_crds_kind_and_its_subresources(kube: Kube, api: Api) -> None:
    group = discovered(api, "kai.alibabacloud.com")
    assert group is not None
    assert group["versions"] == [
        {"groupVersion": "kai.alibabacloud.com/v1alpha1", "version": "v1alpha1"}
    ]
    assert group["preferredVersion"] == group["versions"][0]
    listed = api.ok("GET", ET)
    assert (listed["kind"], listed["groupVersion"]) == ("APIResourceList", ET_API)
    by_name = {r["name"]: r for r in listed["resources"]}
    assert {"trainingjobs", "trainingjobs/status", "scaleins", "scaleouts"} <= set(by_name)
    jobs = by_name["trainingjobs"]
    assert (jobs["kind"], jobs["namespaced"], jobs["singularName"]) == (
        "TrainingJob",
        True,
        "trainingjob",
    )
    assert set(jobs["verbs"]) == {
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"
    }  # fmt: skip
    assert set(by_name["trainingjobs/status"]["verbs"]) == {"get", "patch", "update"}
    # what the product asks (served.py): served, and an uninstalled group simply is not
    assert is_served(api.client, TRAINING_JOBS)
    gone = Resource("ScaleIn", "nope.example.com", "v1", "scaleins", True)
    assert not is_served(api.client, gone)
    core = api.ok("GET", "/api/v1")
    eviction = next(r for r in core["resources"] if r["name"] == "pods/eviction")
    assert (eviction["group"], eviction["version"], eviction["kind"]) == (
        "policy",
        "v1",
        "Eviction",
    )


def test_a_crd_installed_later_appears_and_a_deleted_one_leaves_discovery_and_404s(
    kube: Kube, api: Api, tmp_path: Path
) -> None:
    crd = OwnCrd(tmp_path)
    assert not is_served(api.client, crd.resource)
    assert api.call("GET", crd.path) == (404, "404 page not found\n")
    install(kube, crd)
    try:
        wait_for(lambda: is_served(api.client, crd.resource), 10, "the kind in discovery")
        assert discovered(api, crd.group) is not None
        assert api.ok("GET", crd.path)["items"] == []
        api.ok("POST", crd.path, crd.scale_in("s"))
    finally:
        remove(kube, api, crd)
    wait_for(lambda: not is_served(api.client, crd.resource), 10, "the kind gone from discovery")
    wait_for(lambda: discovered(api, crd.group) is None, 10, "the group gone from /apis")
    assert api.call("GET", f"/apis/{crd.api_version}") == (404, "404 page not found\n")
    assert api.call("GET", crd.path) == (404, "404 page not found\n")
    assert api.call("GET", f"{crd.path}/s") == (404, "404 page not found\n")


# --- PodDisruptionBudgets: the disruption controller and the eviction subresource -------------
def guarded_workers(kube: Kube, api: Api) -> Obj:
    """bert's two workers on a node without a kubelet (their status is what we write): worker 0
    Ready, worker 1 not; and the product's guard over them. Returns the budget as created."""
    kube.server.seed(node("n1"))
    job = api.ok("POST", JOBS, job_body())
    for i, ready in ((0, True), (1, False)):
        body = worker("bert", i, "n1")
        del body["status"]
        body["spec"]["containers"] = [container()]
        body["metadata"]["ownerReferences"][0]["uid"] = meta(job)["uid"]
        api.ok("POST", PODS, body)
        running(api, f"bert-worker-{i}", ready)
    return api.ok("POST", PDBS, desired_guard(job, WORKERS))


def test_the_guard_over_a_jobs_workers_gets_the_fail_safe_status(kube: Kube, api: Api) -> None:
    """TrainingJob has no scale subresource: the disruption controller cannot work out how many
    pods to expect (maxUnavailable needs it), emits CalculateExpectedPodCountFailed and writes
    failSafe's status (kubernetes pkg/controller/disruption/disruption.go trySync, failSafe):
    no disruption allowed, nothing observed."""
    made = guarded_workers(kube, api)
    zero = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
    assert made["status"] == zero  # as created, before the controller
    status = wait_for(
        lambda: (
            (api.ok("GET", f"{PDBS}/bert-spot-guard").get("status") or {}).get("conditions")
            and api.ok("GET", f"{PDBS}/bert-spot-guard")["status"]
        ),
        15,
        "the disruption controller's status",
    )
    [condition] = status.pop("conditions")
    assert status == zero  # no observedGeneration: the budget counts as never processed
    assert {k: v for k, v in condition.items() if k not in ("lastTransitionTime", "message")} == {
        "type": "DisruptionAllowed",
        "status": "False",
        "reason": "SyncFailed",
    }
    # A controller-manager whose discovery has not seen the CRD yet fails the same way with
    # another message: its REST mapper is reset only every 30 s (cmd/kube-controller-manager/app/
    # controllermanager.go, CreateControllerContext), and the failed sync retries with backoff.
    assert condition["message"] in (
        "trainingjobs.kai.alibabacloud.com does not implement the scale subresource",
        'no matches for kind "TrainingJob" in version "kai.alibabacloud.com/v1alpha1"',
    )


def test_a_budget_over_unowned_pods_counts_them_and_expects_what_it_can(
    kube: Kube, api: Api
) -> None:
    kube.server.seed(node("n1"))
    for name in ("a", "b"):
        api.ok("POST", PODS, pod_body(name, "n1", labels={"app": "lone"}))
        running(api, name, ready=name == "a")
    selector = {"matchLabels": {"app": "lone"}}
    for name, rule in (("max", "maxUnavailable"), ("min", "minAvailable")):
        api.ok("POST", PDBS, {"metadata": {"name": name}, "spec": {"selector": selector, rule: 0}})

    def synced(name: str) -> Obj | None:
        status = api.ok("GET", f"{PDBS}/{name}").get("status") or {}
        return status if status.get("observedGeneration") == 1 else None

    by_max = wait_for(lambda: synced("max"), 15, "the maxUnavailable budget's status")
    by_min = wait_for(lambda: synced("min"), 15, "the minAvailable budget's status")
    # maxUnavailable scales with the pods' controllers: none, so nothing is expected
    assert {k: by_max[k] for k in ("currentHealthy", "desiredHealthy", "expectedPods")} == {
        "currentHealthy": 1,
        "desiredHealthy": 0,
        "expectedPods": 0,
    }
    assert by_max["disruptionsAllowed"] == 0
    # an integer minAvailable expects the pods there are
    assert {k: by_min[k] for k in ("currentHealthy", "desiredHealthy", "expectedPods")} == {
        "currentHealthy": 1,
        "desiredHealthy": 0,
        "expectedPods": 2,
    }
    assert by_min["disruptionsAllowed"] == 1
    [max_cond], [min_cond] = by_max["conditions"], by_min["conditions"]
    assert (max_cond["status"], max_cond["reason"], max_cond["observedGeneration"]) == (
        "False",
        "InsufficientPods",
        1,
    )
    assert (min_cond["status"], min_cond["reason"], min_cond["message"]) == (
        "True",
        "SufficientPods",
        "",
    )


def eviction(name: str) -> Obj:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}


def test_eviction_under_the_guard_is_429_for_a_ready_worker_and_lets_an_unready_one_go(
    kube: Kube, api: Api
) -> None:
    guarded_workers(kube, api)
    wait_for(
        lambda: (api.ok("GET", f"{PDBS}/bert-spot-guard").get("status") or {}).get("conditions"),
        15,
        "the disruption controller's status",
    )
    status, answer = api.call("POST", f"{PODS}/bert-worker-0/eviction", eviction("bert-worker-0"))
    assert (status, answer["reason"], answer["code"]) == (429, "TooManyRequests", 429)
    assert answer["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert answer["details"] == {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget bert-spot-guard is still being processed by "
                "the server.",
            }
        ],
        "retryAfterSeconds": 10,
    }
    assert meta(api.ok("GET", f"{PODS}/bert-worker-0")).get("deletionTimestamp") is None
    # unhealthyPodEvictionPolicy AlwaysAllow: a worker that is not Ready may go
    status, answer = api.call("POST", f"{PODS}/bert-worker-1/eviction", eviction("bert-worker-1"))
    assert (status, answer["status"]) == (201, "Success")
    evicted = api.get(f"{PODS}/bert-worker-1")  # Terminating (no kubelet here), or gone
    if evicted is not None:
        assert meta(evicted)["deletionTimestamp"]
        [target] = [c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert (target["status"], target["reason"]) == ("True", "EvictionByEvictionAPI")
    # a pod two budgets select cannot be evicted at all
    other = {"selector": {"matchLabels": {"replica-index": "0"}}, "maxUnavailable": 1}
    api.ok("POST", PDBS, {"metadata": {"name": "second"}, "spec": other})
    status, answer = api.call("POST", f"{PODS}/bert-worker-0/eviction", eviction("bert-worker-0"))
    assert (status, answer["message"]) == (
        500,
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
        "not support.",
    )
