"""The emulator's test-side surface (seed, get, objects, patch, delete, install_crd, ...) on a
real kube-apiserver, so one test body runs against both (`kube_fixtures.kube` "real").

Only what a real server allows: objects are created through the API, then their status is
written through the status subresource (a create drops a Pod's or a custom resource's status:
the registry strategies' PrepareForCreate); an ownerReference to an object of the test gets that
object's real uid (a made-up uid would make the garbage collector delete the dependent). Request
counting, fault injection, compaction and a pinned clock stay the emulator's: tests that need
them run on the emulator only.

`reset()` clears what a test made (its namespace's objects and the nodes it seeded) so the
session's one control plane serves every test.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from . import raw_api
from .control_plane import KWOK_ANNOTATION, ControlPlane

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    namespaced: bool = True
    status: bool = False  # has a status subresource

    def path(self, namespace: str | None, name: str = "", sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return base + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


_ET = "kai.alibabacloud.com"
KINDS: dict[str, Kind] = {
    "Namespace": Kind("", "v1", "namespaces", namespaced=False, status=True),
    "Node": Kind("", "v1", "nodes", namespaced=False, status=True),
    "Pod": Kind("", "v1", "pods", status=True),
    "Event": Kind("", "v1", "events"),
    "ConfigMap": Kind("", "v1", "configmaps"),
    "Service": Kind("", "v1", "services"),
    "ServiceAccount": Kind("", "v1", "serviceaccounts"),
    "Lease": Kind("coordination.k8s.io", "v1", "leases"),
    "PodDisruptionBudget": Kind("policy", "v1", "poddisruptionbudgets", status=True),
    "Job": Kind("batch", "v1", "jobs", status=True),
    "TrainingJob": Kind(_ET, "v1alpha1", "trainingjobs", status=True),
    "ScaleIn": Kind(_ET, "v1alpha1", "scaleins", status=True),
    "ScaleOut": Kind(_ET, "v1alpha1", "scaleouts", status=True),
    "AITrainingJob": Kind("kongming.cce.baiudbce.com", "v1", "aitrainingjobs", status=True),
    "MPIJob": Kind("kubeflow.org", "v2beta1", "mpijobs", status=True),
}
_PLURALS = {k.plural: name for name, k in KINDS.items()}
# what reset() clears in the test namespace, dependents first
_RESET = ("ScaleIn", "ScaleOut", "TrainingJob", "AITrainingJob", "MPIJob", "Job", "Pod",
          "PodDisruptionBudget", "Lease", "Event", "ConfigMap", "Service")  # fmt: skip
SEEDED_LABEL = "spot-autoscaler.test/seeded"  # nodes a test seeded (not kwok's)
_SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "mpi-operator"})


def kind_of(ref: str) -> str:
    """'TrainingJob', 'trainingjobs', 'events' or 'leases' -> the kind's name."""
    return ref if ref in KINDS else _PLURALS[ref.split(".")[0]]


class RealApi:
    def __init__(self, plane: ControlPlane, namespace: str = "ml") -> None:
        self.plane = plane
        self.namespace = namespace
        self._api = plane.api_client()
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)
        self._ensure_namespace(namespace)

    # --- clients --------------------------------------------------------------------------------
    def api_client(self) -> ApiClient:
        return self.plane.api_client()

    def kubeconfig(self, path: str) -> str:
        shutil.copyfile(self.plane.kubeconfig_path, path)
        return path

    # --- the emulator's backdoor, through the API -------------------------------------------
    def seed(self, *objs: Obj) -> list[Obj]:
        return [self._seed(json.loads(json.dumps(obj))) for obj in objs]

    def get(self, ref: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self._call("GET", KINDS[kind_of(ref)].path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def objects(self, ref: str, namespace: str | None = None) -> list[Obj]:
        kind = kind_of(ref)
        items: list[Obj] = self._call("GET", KINDS[kind].path(namespace)).get("items") or []
        for item in items:  # lists leave the kind out of their items
            item.setdefault("kind", kind)
        return items

    def patch(self, ref: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """A merge patch; its status part goes through the status subresource."""
        kind = KINDS[kind_of(ref)]
        patch = dict(patch)
        status = patch.pop("status", None)
        out = self._call("PATCH", kind.path(namespace, name), patch, merge=True) if patch else {}
        if status is not None:
            sub = "status" if kind.status else ""
            out = self._call("PATCH", kind.path(namespace, name, sub), {"status": status}, True)
        return out

    def delete(self, ref: str, name: str, namespace: str | None = None) -> None:
        path = KINDS[kind_of(ref)].path(namespace, name)
        try:
            self._call("DELETE", path, {"gracePeriodSeconds": 0})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def install_crd(self, path: str | Path) -> None:
        self.plane.apply_crd(self._api, Path(path))

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s")
            time.sleep(0.02)

    @property
    def resource_version(self) -> int:
        """The store's current revision (a list's resourceVersion: a consistent read)."""
        listed = self._call("GET", KINDS["Namespace"].path(None), query=[("limit", 1)])
        return int(listed["metadata"]["resourceVersion"])

    def wait_for_change(self, since: int, timeout: float) -> int:
        """Polls (no server-side hook here): the revision once it passed `since`, or now's."""
        deadline = time.monotonic() + timeout
        while (rv := self.resource_version) <= since and time.monotonic() < deadline:
            time.sleep(0.02)
        return rv

    def reset(self) -> None:
        """An empty cluster again, as a test on the emulator starts with: no node, and in every
        namespace but the system ones none of the kinds tests make (other modules of the session
        leave theirs; a kube test's cache watches every namespace)."""
        for kind in _RESET:
            if kind in ("Event", "Lease", "ConfigMap", "Service"):  # in the test namespace only
                self._delete_all(kind, [self.namespace])
                continue
            try:
                items = self.objects(kind)
            except ApiException as exc:
                if exc.status == 404:  # a CRD not installed
                    continue
                raise
            spaces = {o["metadata"]["namespace"] for o in items} - _SYSTEM_NAMESPACES
            self._delete_all(kind, sorted(spaces))
        for node in self.objects("Node"):
            self.delete("Node", node["metadata"]["name"])
        self.wait_until(
            lambda: (
                not [
                    p
                    for p in self.objects("Pod")
                    if p["metadata"]["namespace"] not in _SYSTEM_NAMESPACES
                ]
                and not self.objects("Node")
            ),
            30,
        )

    def _delete_all(self, kind: str, namespaces: list[str]) -> None:
        for namespace in namespaces:
            try:
                self._call("DELETE", KINDS[kind].path(namespace), {"gracePeriodSeconds": 0})
            except ApiException as exc:
                if exc.status not in (404, 405):
                    raise

    def close(self) -> None:
        self._api.close()

    # --- internals ------------------------------------------------------------------------------
    def _seed(self, obj: Obj) -> Obj:
        kind_name = obj["kind"]
        kind = KINDS[kind_name]
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace") if kind.namespaced else None
        if kind.namespaced and not namespace:
            namespace = meta["namespace"] = "default"
        if namespace:
            self._ensure_namespace(namespace)
        if kind_name == "Node" and KWOK_ANNOTATION not in (meta.get("annotations") or {}):
            meta.setdefault("labels", {})[SEEDED_LABEL] = "true"
        for server_owned in ("uid", "resourceVersion", "creationTimestamp"):
            meta.pop(server_owned, None)
        self._own(meta, namespace)
        status = obj.pop("status", None)
        made = self._call("POST", kind.path(namespace), obj)
        if status and kind.status:
            name = made["metadata"]["name"]
            made = self._call(
                "PATCH", kind.path(namespace, name, "status"), {"status": status}, True
            )
        return made

    def _own(self, meta: Obj, namespace: str | None) -> None:
        """Owner references get their owner's real uid; one to an object that is not there is
        left out (the garbage collector would delete its dependent)."""
        owners = []
        for ref in meta.get("ownerReferences") or ():
            kind = kind_of(ref["kind"]) if ref["kind"] in KINDS else None
            owner = self.get(kind, ref["name"], namespace) if kind else None
            if owner is not None:
                owners.append({**ref, "uid": owner["metadata"]["uid"]})
        if owners:
            meta["ownerReferences"] = owners
        else:
            meta.pop("ownerReferences", None)

    def _ensure_namespace(self, name: str) -> None:
        try:
            self._call("POST", KINDS["Namespace"].path(None), {"metadata": {"name": name}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        merge: bool = False,
        query: list[tuple[str, Any]] | None = None,
    ) -> Obj:
        response = raw_api.send(self._api, method, path, body, merge=merge, query=query or ())
        data: Obj = json.loads(response.data)
        return data
