"""A Kubernetes API server emulator for tests that behaves like the real one, unkind parts
included (stdlib + PyYAML).

It speaks real HTTP on 127.0.0.1, so the official ``kubernetes`` client runs unmodified. Like
the real server (1.30) it has a global resourceVersion, uid/creationTimestamp (1 s resolution),
label/field selectors, optimistic concurrency (409), ``/status`` subresources, merge/strategic/
JSON patches, list+watch resumed from a bounded event history and 410 Gone once a
resourceVersion is older than that history. And, where tests used to be kinder than clusters:

- custom resources are pruned, defaulted and validated against their CRDs' structural schemas
  (``tests/support/crds``; 422 Invalid with causes; validation ratcheting on update), see
  ``kube_schema``;
- kinds can be unserved (CRD not installed) and served again: gone from discovery, every path
  under them a text/plain ``404 page not found``, their watches end (``unserve``/``serve``);
- pods are defaulted on create, deleted gracefully (Terminating for the grace period until the
  simulated kubelet is done: ``kubelet_delay``, ``finish_terminating``), their phase follows
  their container states (``set_container_states``, ``run_pod``), PodDisruptionBudgets get the
  disruption controller's status and the eviction subresource honours them, see ``kube_pods``.

Test controls inject faults, drop watches, compact history, add latency and count requests;
``seed``/``get``/``objects``/``patch``/``delete`` read and write the store directly, as another
controller would, without validation.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import random
import select
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from .http import serve
from .kube_core import (
    DNS_LABEL_RE,
    EVENT_FIELDS,
    LABEL_RE,
    NAME_RE,
    NOT_FOUND,
    POD_FIELDS,
    ApiError,
    Key,
    Obj,
    PlainNotFound,
    Resource,
    conflict,
    details_of,
    invalid,
    json_patch,
    merge_patch,
    not_found,
    parse_field_selector,
    parse_label_selector,
    truthy,
)
from .kube_pods import PodWorkloads, default_pod, validate_pdb, validate_pod
from .kube_schema import FieldError, load_crd

if TYPE_CHECKING:
    from kubernetes.client import ApiClient  # type: ignore[import-untyped]

__all__ = [
    "ApiError",
    "KubeApiServer",
    "RequestRecord",
    "Resource",
    "json_patch",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector",
]
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    status: int = 0

    @property
    def watch(self) -> bool:
        return truthy(self.query.get("watch"))


@dataclass
class _Fault:
    remaining: int
    status: int  # 0: served as usual, `delay` seconds late
    path_contains: str | None
    method: str | None
    delay: float = 0.0


@dataclass
class _Event:
    rv: int
    key: str
    type: str
    obj: Obj
    old: Obj | None = None


def custom_resource(crd: str) -> Resource:
    """The resource a CRD file defines (tests/support/crds/<file> or an absolute path).
    With a status subresource the real server drops status on create."""
    v = load_crd(crd)
    return Resource(
        v.group,
        v.version,
        v.plural,
        v.kind,
        v.namespaced,
        status_subresource=v.status_subresource,
        initial_status={} if v.status_subresource else None,
        crd=crd,
        generation=True,  # customresource strategy: spec changes move it (status, metadata not)
        unconditional_update=False,
    )


def _default_resources() -> list[Resource]:
    no_status: Obj = {"namespaced": True, "status_subresource": False}
    workload: Obj = {"namespaced": True, "initial_status": {}, "scale": True, "generation": True}
    # PodDisruptionBudgetStatus's counts are not omitempty: a new budget shows them as 0
    # (pkg/registry/policy/poddisruptionbudget/strategy.go PrepareForCreate resets status)
    unprocessed = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0}
    unprocessed["expectedPods"] = 0
    return [
        Resource("", "v1", "nodes", "Node", False, field_labels=("spec.unschedulable",)),
        Resource(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            initial_status={"phase": "Pending"},
            returns_deleted_object=True,
            field_labels=POD_FIELDS,
            generation=True,  # PodObservedGenerationTracking (pod/strategy.go PrepareForCreate)
        ),
        Resource(
            "",
            "v1",
            "namespaces",
            "Namespace",
            False,
            initial_status={"phase": "Active"},
            field_labels=("status.phase",),
        ),
        Resource("", "v1", "events", "Event", field_labels=EVENT_FIELDS, **no_status),
        Resource("", "v1", "configmaps", "ConfigMap", **no_status),
        Resource("", "v1", "services", "Service", True, initial_status={"loadBalancer": {}}),
        Resource("apps", "v1", "deployments", "Deployment", **workload),
        Resource("apps", "v1", "replicasets", "ReplicaSet", **workload),
        Resource("apps", "v1", "statefulsets", "StatefulSet", **workload),
        Resource(
            "coordination.k8s.io", "v1", "leases", "Lease", unconditional_update=False, **no_status
        ),
        Resource(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            True,
            initial_status=unprocessed,
            generation=True,
            unconditional_update=False,
        ),
        Resource("events.k8s.io", "v1", "events", "Event", **no_status),
        # pods name one for their overhead (the RuntimeClass admission plugin)
        Resource("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, False),
        custom_resource("kai.alibabacloud.com_trainingjobs.yaml"),
        custom_resource("kai.alibabacloud.com_scaleins.yaml"),
        custom_resource("kai.alibabacloud.com_scaleouts.yaml"),
        # reconstructed: no upstream schema is public
        custom_resource("kongming.cce.baiudbce.com_aitrainingjobs.yaml"),
    ]


class KubeApiServer(PodWorkloads):
    """In-memory Kubernetes API server on 127.0.0.1:<ephemeral>; use as a context manager.

    Knobs (attributes): ``latency``, ``now`` (pin the clock), ``history_limit``,
    ``bookmark_interval``, ``validation_ratcheting`` (1.30 default: on), ``kubelet_delay``,
    ``kubelet_exit_code``, ``pdb_controller`` (see kube_pods.PodWorkloads)."""

    def __init__(self, history_limit: int = 1000, bookmark_interval: float = 60.0) -> None:
        self._lock = threading.Condition()  # RLock inside; guards all state, notified on changes
        self._resources: dict[tuple[str, str, str], Resource] = {}
        self._objects: dict[Key, Obj] = {}
        self._index: dict[str, set[Key]] = {}  # resource key -> keys of its stored objects
        self._unserved: set[str] = set()  # resource keys not served (CRD not installed)
        self._served_epoch: dict[str, int] = {}  # bumped on unserve: its watches end
        self._watch_floor: dict[str, int] = {}  # serve(): older watch resourceVersions get 410
        self._rv = 0
        self._history: deque[_Event] = deque()
        # the same events by resource key: a watch reads only its kind's events newer than its
        # cursor (from the right), so a write costs O(watchers), not O(history x watchers)
        self._history_of: dict[str, deque[_Event]] = {}
        self._compacted_rv = 0  # watches from a resourceVersion below this get 410 Gone
        self._faults: list[_Fault] = []
        self._watch_epoch, self._abrupt_drop, self._closing = 0, True, False
        self._httpd: ThreadingHTTPServer | None = None
        self._tls = threading.local()  # per request: warnings to send as Warning headers
        self.history_limit = history_limit
        self.bookmark_interval = bookmark_interval
        self.latency = 0.0  # seconds added before every request is served
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)  # override to pin time
        self.validation_ratcheting = True  # CRDValidationRatcheting, beta and on in 1.30
        self.watch_count = 0  # open watch streams
        self.request_log: list[RequestRecord] = []
        self._init_pods()
        for res in _default_resources():
            self.register(res)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.seed(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns},
                    "status": {"phase": "Active"},
                }
            )

    # ------------------------------------------------------------ lifecycle
    def start(self) -> KubeApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = serve(_HTTPServer(("127.0.0.1", 0), handler))
        self._kubelet.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def api_client(self) -> ApiClient:
        from kubernetes import client  # type: ignore[import-untyped]  # lazy: the server needs no client

        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig pointing at this server, without auth."""
        return write_kubeconfig(path, self.url, "emulator")

    # ------------------------------------------------------------ test controls
    def register(self, res: Resource) -> None:
        with self._lock:
            self._resources[(res.group, res.version, res.plural)] = res
            self._index.setdefault(res.key, set())

    def unserve(self, ref: str, keep_objects: bool = False) -> None:
        """Stop serving a kind, as when its CRD is not installed, or deleted: it leaves
        discovery (its group too when no kind of it is left), every path under it answers
        text/plain ``404 page not found`` and its watches end (cleanly: the client re-watches
        and gets the 404). Its objects go silently, without DELETED events, unless
        ``keep_objects`` (a CRD version set to ``served: false``: they are back on serve())."""
        with self._lock:
            res = self.resource(ref)
            self._unserved.add(res.key)
            self._served_epoch[res.key] = self._served_epoch.get(res.key, 0) + 1
            if not keep_objects:
                for key in self._keys(res):
                    del self._objects[key]
                self._index[res.key].clear()
            self._lock.notify_all()

    def serve(self, ref: str) -> None:
        """Serve a kind again (its CRD installed later). Watches must start afresh: a
        resourceVersion from before gets 410 Gone, as from a new watch cache."""
        with self._lock:
            res = self.resource(ref)
            self._unserved.discard(res.key)
            self._watch_floor[res.key] = self._rv
            self._lock.notify_all()

    def install_crd(self, path: str) -> Resource:
        """Register and serve the kind a CRD file defines (a CRD applied later). The CRD is an
        object too: writing it (and its Established status) moves the store's resourceVersion,
        so the new kind's watch window starts after every version handed out before."""
        res = custom_resource(path)
        with self._lock:
            self._rv += 1
            self.register(res)
            self.serve(res.key)
        return res

    def served(self, ref: str) -> bool:
        return self.resource(ref).key not in self._unserved

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        path_contains: str | None = None,
        method: str | None = None,
    ) -> None:
        """Answer the next ``n`` matching requests with ``status``; ``path_contains`` is a
        substring of the request target, query included (e.g. ``"watch="``)."""
        with self._lock:
            self._faults.append(_Fault(n, status, path_contains, method))

    def slow_next(
        self, n: int, delay: float, path_contains: str | None = None, method: str | None = None
    ) -> None:
        """Serve the next ``n`` matching requests ``delay`` seconds late (a busy server)."""
        with self._lock:
            self._faults.append(_Fault(n, 0, path_contains, method, delay))

    def clear_faults(self) -> None:
        """Forget the failures `fail_next` still has to give."""
        with self._lock:
            self._faults.clear()

    def drop_watches(self, abrupt: bool = True) -> None:
        """End open watches: abruptly (socket shut, no final chunk: the client raises) or
        cleanly (like a server-side timeout: the client's Watch re-watches by itself)."""
        with self._lock:
            self._watch_epoch += 1
            self._abrupt_drop = abrupt
            self._lock.notify_all()

    def compact(self) -> None:
        """Forget all event history, like etcd compaction: older resourceVersions get 410."""
        with self._lock:
            self._history.clear()
            self._history_of.clear()
            self._compacted_rv = self._rv
            self._lock.notify_all()

    @property
    def resource_version(self) -> int:
        return self._rv

    def requests(
        self, method: str | None = None, path_contains: str | None = None, watch: bool | None = None
    ) -> list[RequestRecord]:
        with self._lock:
            return [
                r
                for r in self.request_log
                if method in (None, r.method)
                and (path_contains is None or path_contains in r.path)
                and watch in (None, r.watch)
            ]

    def count(
        self, method: str | None = None, path_contains: str | None = None, watch: bool | None = None
    ) -> int:
        return len(self.requests(method, path_contains, watch))

    def clear_requests(self) -> None:
        with self._lock:
            self.request_log.clear()

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Block until ``predicate()`` holds (re-checked on every server change and every
        50 ms, since it may read client-side state), else raise TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("condition not met")
                self._lock.wait(min(remaining, 0.05))

    def wait_for_change(self, since: int, timeout: float) -> int:
        """Block until the store's resourceVersion passes ``since`` (or ``timeout``);
        returns the current resourceVersion."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._rv <= since and not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            return self._rv

    # Direct object access, as another controller would write: no validation, no status rules.
    def resource(self, ref: str, api_version: str | None = None) -> Resource:
        """Find a resource by plural, Kind or plural.group (core wins ties, e.g. events),
        served or not."""
        for res in self._resources.values():
            if ref in (res.plural, res.kind, res.key) and api_version in (None, res.api_version):
                return res
        raise KeyError(ref)

    def seed(self, *objs: Obj) -> list[Obj]:
        """Create or replace objects as given (status, uid and creationTimestamp kept),
        emitting ADDED/MODIFIED. Namespaced objects default to namespace "default". Not
        validated; custom resources get their schema's defaults, as any read of them would."""
        out = []
        with self._lock:
            for obj in map(copy.deepcopy, objs):
                res = self.resource(obj["kind"], obj.get("apiVersion"))
                meta = obj.setdefault("metadata", {})
                key = self._backdoor_key(res, meta["name"], meta.pop("namespace", None))
                if res.namespaced:
                    meta["namespace"] = key[1]
                if res.crd and load_crd(res.crd).prunes:
                    load_crd(res.crd).schema.default(obj)
                old = self._objects.get(key)
                out.append(
                    self._commit(res, key, old, obj)
                    if old
                    else self._insert(res, key, obj, keep=("uid", "creationTimestamp"))
                )
        return out

    def get(self, ref: str, name: str, namespace: str | None = None) -> Obj | None:
        res = self.resource(ref)
        with self._lock:
            return copy.deepcopy(self._objects.get(self._backdoor_key(res, name, namespace)))

    def objects(self, ref: str, namespace: str | None = None) -> list[Obj]:
        """All stored objects of a kind, in every namespace unless one is given."""
        res = self.resource(ref)
        with self._lock:
            return [copy.deepcopy(self._objects[k]) for k in self._keys(res, namespace)]

    def patch(self, ref: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """Merge-patch any part, status included; emits MODIFIED."""
        res = self.resource(ref)
        with self._lock:
            key = self._backdoor_key(res, name, namespace)
            old = self._objects[key]
            return self._commit(res, key, old, merge_patch(old, patch))

    def delete(self, ref: str, name: str, namespace: str | None = None) -> None:
        """Remove at once, finalizers and grace periods ignored; emits DELETED."""
        res = self.resource(ref)
        with self._lock:
            key = self._backdoor_key(res, name, namespace)
            self._terminating.pop(key, None)
            self._remove(res, key, self._objects[key])

    def _backdoor_key(self, res: Resource, name: str, namespace: str | None) -> Key:
        return (res.key, (namespace or "default") if res.namespaced else "", name)

    # ------------------------------------------------------------ store internals (lock held)
    def _timestamp(self) -> str:
        return self.now().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _keys(self, res: Resource, namespace: str | None = None) -> list[Key]:
        return sorted(k for k in self._index.get(res.key, ()) if namespace in (None, k[1]))

    @staticmethod
    def _omit_empty(meta: Obj) -> None:
        """ObjectMeta's maps and lists are `omitempty`: a real server never returns them empty
        (merge-patching away the last annotation drops `annotations` altogether)."""
        for key in ("labels", "annotations", "finalizers", "ownerReferences"):
            if key in meta and not meta[key]:
                del meta[key]

    def _emit(self, res: Resource, type_: str, obj: Obj, old: Obj | None = None) -> None:
        event = _Event(self._rv, res.key, type_, copy.deepcopy(obj), old)
        self._history.append(event)
        self._history_of.setdefault(res.key, deque()).append(event)
        while len(self._history) > self.history_limit:
            oldest = self._history.popleft()  # also the oldest of its own kind
            self._history_of[oldest.key].popleft()
            self._compacted_rv = oldest.rv
        self._lock.notify_all()
        if res.key in ("pods", "poddisruptionbudgets.policy"):
            self._pods_changed(res, obj, old)

    def _insert(self, res: Resource, key: Key, obj: Obj, keep: tuple[str, ...] = ()) -> Obj:
        """Store a new object; the server owns uid/creationTimestamp unless seeding keeps them."""
        meta = obj["metadata"]
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        self._rv += 1
        given = {k: meta[k] for k in keep if meta.get(k)}
        meta.update(
            {
                "uid": str(uuid.uuid4()),
                "creationTimestamp": self._timestamp(),
                "resourceVersion": str(self._rv),
                **({"generation": 1} if res.generation else {}),
                **given,
            }
        )
        for server_owned in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
        ):
            meta.pop(server_owned, None)
        self._omit_empty(meta)
        self._objects[key] = obj
        self._index.setdefault(res.key, set()).add(key)
        self._emit(res, "ADDED", obj)
        return copy.deepcopy(obj)

    def _commit(self, res: Resource, key: Key, old: Obj, new: Obj, deleting: bool = False) -> Obj:
        """Store an update. Server-owned metadata comes from ``old`` (deletion metadata too,
        unless ``deleting``); an unchanged object is not written at all (same
        resourceVersion, no event), as on the real server."""
        new = copy.deepcopy(new)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        owned = ["uid", "creationTimestamp", "name", "namespace", "generation", "resourceVersion"]
        if not deleting:
            owned += ["deletionTimestamp", "deletionGracePeriodSeconds"]
            for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(k, None)
        for k in owned:
            if k in old_meta and not (deleting and k == "generation"):
                meta[k] = old_meta[k]
        self._omit_empty(meta)
        if new == old:
            return copy.deepcopy(old)
        spec_of = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        if res.generation and spec_of(new) != spec_of(old):
            meta["generation"] = old_meta.get("generation", 1) + 1
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[key] = new
        self._emit(res, "MODIFIED", new, old)
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and meta.get("deletionGracePeriodSeconds", 0) == 0
            and key in self._objects
        ):
            self._remove(res, key, new)  # the last finalizer is gone: deletion completes
        return copy.deepcopy(new)

    def _remove(self, res: Resource, key: Key, old: Obj) -> Obj:
        del self._objects[key]
        self._index[res.key].discard(key)
        self._rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._rv)  # DELETED carries its own revision
        self._emit(res, "DELETED", gone, old)
        return gone

    # ------------------------------------------------------------ HTTP routing
    def _serve(self, h: _Handler) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        record = RequestRecord(h.command, url.path, query)
        with self._lock:
            self.request_log.append(record)
            self._lock.notify_all()
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if self.latency:
            time.sleep(self.latency)
        self._tls.warnings = []
        headers: dict[str, str] = {}
        try:
            self._take_fault(h.command, h.path)
            body = json.loads(raw, parse_float=_go_number) if raw else None
            code, payload = self._route(h, url.path, query, body)
        except json.JSONDecodeError as e:
            code, payload = 400, ApiError(400, f"invalid JSON body: {e}").status()
        except PlainNotFound:
            record.status = 404
            with contextlib.suppress(OSError):
                h.send_text(404, PlainNotFound.TEXT)
            return
        except ApiError as e:
            code, payload, headers = e.code, e.status(), e.headers
        except Exception as e:  # an emulator bug: answer 500 and show it, not a dead socket
            traceback.print_exc()
            code, payload = 500, ApiError(500, f"emulator error: {e!r}").status()
        record.status = code
        # RFC 7234 warn-text: a quoted-string, so inner quotes are escaped
        quoted = (w.replace("\\", "\\\\").replace('"', '\\"') for w in self._tls.warnings)
        warnings = [f'299 - "{w}"' for w in quoted]
        if payload is not None:  # None: a watch stream has already answered
            with contextlib.suppress(OSError):  # the client may have gone away
                h.send_json(code, payload, headers, warnings)

    def _take_fault(self, method: str, target: str) -> None:
        with self._lock:
            fault = next(
                (
                    f
                    for f in self._faults
                    if f.remaining > 0
                    and f.method in (None, method)
                    and (f.path_contains or "") in target
                ),
                None,
            )
            if fault is not None:
                fault.remaining -= 1
        if fault is not None and fault.status:
            raise ApiError(fault.status, f"injected failure ({fault.status})")
        if fault is not None:
            time.sleep(fault.delay)  # not under the lock: other requests go on meanwhile

    def _route(
        self, h: _Handler, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Obj | None]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["version"]:
            return 200, {
                "major": "1",
                "minor": "30",
                "gitVersion": "v1.30.0-emulator",
                "gitCommit": "",
                "gitTreeState": "clean",
                "buildDate": "",
                "goVersion": "",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if parts == ["api"]:
            return 200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url[7:]}
                ],
            }
        if parts == ["apis"]:
            return 200, self._group_list()
        if parts[:1] == ["apis"] and len(parts) == 2:
            return 200, self._group(parts[1])
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise PlainNotFound
        if not rest:
            return 200, self._resource_list(group, version)
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] != "status":
            namespace, rest = rest[1], rest[2:]
        res = self._served_resource(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if (
            (namespace is not None and not res.namespaced)
            or len(rest) > 3
            or (res.namespaced and namespace is None and name is not None)
        ):
            raise ApiError(404, NOT_FOUND, details={}) if res.builtin else PlainNotFound()
        method = h.command
        if res.key == "pods" and sub == "eviction" and method == "POST" and namespace:
            return 201, self._evict(namespace, str(name), body)
        if sub is not None and (sub != "status" or not res.status_subresource):
            raise (
                not_found(res, str(name))
                if not res.builtin
                else ApiError(404, NOT_FOUND, details={})
            )
        if method == "GET" and name is None and truthy(query.get("watch")):
            self._watch(h, res, namespace, query)
            return 200, None
        if method == "GET":
            if name is None:
                return 200, self._list(res, namespace, query)
            return 200, self._get(res, namespace, name)
        if method == "POST" and name is None and (namespace is not None or not res.namespaced):
            return 201, self._create(res, namespace, body, query)
        if method == "PUT" and name is not None:
            return 200, self._update(res, namespace, name, body, sub, query)
        if method == "PATCH" and name is not None:
            ctype = h.headers.get("Content-Type", "")
            return 200, self._patch(res, namespace, name, body, ctype, sub, query)
        if method == "DELETE" and name is not None and sub is None:
            return 200, self._delete(res, namespace, name, self._delete_options(body, query))
        if method == "DELETE" and name is None:
            return 200, self._delete_collection(
                res, namespace, query, self._delete_options(body, query)
            )
        raise ApiError(405, f"{method} is not supported on this path")

    def _served_resource(self, group: str, version: str, plural: str) -> Resource:
        """The resource a path names. Not found: a built-in group-version answers a JSON
        Status (go-restful's 404, details {}); a custom group, or a kind not served, goes to
        the apiextensions crdHandler, which delegates to the text/plain 404."""
        res = self._resources.get((group, version, plural))
        if res is not None and res.key not in self._unserved:
            return res
        builtin_gv = any(
            (r.group, r.version) == (group, version) and r.builtin and r.key not in self._unserved
            for r in self._resources.values()
        )
        if builtin_gv:
            raise ApiError(404, NOT_FOUND, details={})
        raise PlainNotFound

    @staticmethod
    def _delete_options(body: Any, query: dict[str, str]) -> Obj:
        """DeleteOptions from the body, overridden by query parameters (the Python client
        sends gracePeriodSeconds, propagationPolicy and dryRun as both)."""
        options = dict(body) if isinstance(body, dict) else {}
        grace = query.get("gracePeriodSeconds", "")
        if grace.lstrip("-").isdigit():
            options["gracePeriodSeconds"] = int(grace)
        if query.get("dryRun"):
            options["dryRun"] = [query["dryRun"]]
        return options

    def _served_groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for (g, v, _), res in self._resources.items():
            if g and res.key not in self._unserved and v not in groups.setdefault(g, []):
                groups[g].append(v)
        return {g: vs for g, vs in groups.items() if vs}

    @staticmethod
    def _group_obj(name: str, versions: list[str]) -> Obj:
        return {
            "name": name,
            "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{name}/{versions[0]}", "version": versions[0]},
        }

    def _group_list(self) -> Obj:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group_obj(g, vs) for g, vs in self._served_groups().items()],
        }

    def _group(self, group: str) -> Obj:
        versions = self._served_groups().get(group)
        if not versions:
            raise PlainNotFound
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_obj(group, versions)}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources = []
        for res in self._resources.values():
            if (res.group, res.version) != (group, version) or res.key in self._unserved:
                continue
            base = {"namespaced": res.namespaced, "kind": res.kind}
            resources.append(
                {"name": res.plural, "singularName": res.kind.lower(), "verbs": _VERBS, **base}
            )
            if res.status_subresource:
                resources.append(
                    {
                        "name": f"{res.plural}/status",
                        "singularName": "",
                        "verbs": ["get", "patch", "update"],
                        **base,
                    }
                )
            if res.scale:
                resources.append(
                    {
                        "name": f"{res.plural}/scale",
                        "singularName": "",
                        "group": "autoscaling",
                        "version": "v1",
                        "verbs": ["get", "patch", "update"],
                        "namespaced": res.namespaced,
                        "kind": "Scale",
                    }
                )
            if res.key == "pods":
                resources.append(
                    {
                        "name": "pods/eviction",
                        "singularName": "",
                        "group": "policy",
                        "version": "v1",
                        "verbs": ["create"],
                        "namespaced": True,
                        "kind": "Eviction",
                    }
                )
        if not resources:
            raise PlainNotFound
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ------------------------------------------------------------ verbs
    def _existing(self, res: Resource, namespace: str | None, name: str) -> tuple[Key, Obj]:
        key = (res.key, namespace or "", name)
        if key not in self._objects:
            raise not_found(res, name)
        return key, self._objects[key]

    def _matcher(
        self, res: Resource, namespace: str | None, query: dict[str, str]
    ) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), res)
        return lambda o: (
            namespace in (None, o["metadata"].get("namespace"))
            and labels(o["metadata"].get("labels") or {})
            and fields(o)
        )

    def _check_body(
        self, res: Resource, namespace: str | None, body: Any, name: str | None = None
    ) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if not res.builtin and not (body.get("kind") and body.get("apiVersion")):
            raise ApiError(400, f"Object 'Kind' or 'apiVersion' is missing in {json.dumps(body)}")
        if (body.get("kind", res.kind), body.get("apiVersion", res.api_version)) != (
            res.kind,
            res.api_version,
        ):
            raise ApiError(400, f"the body is not {res.api_version}, Kind={res.kind}")
        meta = body.setdefault("metadata", {})
        if namespace is not None and meta.get("namespace") not in (None, "", namespace):
            raise ApiError(
                400,
                "the namespace of the provided object does not match the "
                "namespace sent on the request",
            )
        if name is not None and meta.get("name") != name:
            raise ApiError(
                400,
                f"the name of the object ({meta.get('name')}) does not match "
                f"the name on the URL ({name})",
            )
        for k, v in (meta.get("labels") or {}).items():
            prefix, _, short = k.rpartition("/")
            if (
                len(short) > 63
                or not LABEL_RE.match(short)
                or (prefix and not NAME_RE.match(prefix))
                or not isinstance(v, str)
                or len(v) > 63
                or (v and not LABEL_RE.match(v))
            ):
                raise ApiError(
                    422,
                    f'{res.kind} "{meta.get("name", "")}" is invalid: '
                    f"metadata.labels: Invalid value: {k!r}: {v!r}",
                )
        return body

    def _decode(self, res: Resource, obj: Obj, query: dict[str, str]) -> Obj:
        """What decoding a request body does to a custom resource: unknown fields pruned
        (reported per fieldValidation: Warn headers by default, 400 when Strict), nulls of
        non-nullable fields dropped, schema defaults applied."""
        if not res.crd:
            return obj
        crd = load_crd(res.crd)
        if not crd.prunes:  # a v1beta1 CRD keeping unknown fields: stored as sent
            return obj
        schema = crd.schema
        unknown = schema.prune(obj)
        mode = query.get("fieldValidation", "Warn")
        if unknown and mode == "Strict":
            found = ", ".join(f'unknown field "{p}"' for p in unknown)
            raise ApiError(
                400,
                f'{res.kind} in version "{res.version}" cannot be handled as a '
                f"{res.kind}: strict decoding error: {found}",
            )
        if mode != "Ignore":
            self._tls.warnings.extend(f'unknown field "{p}"' for p in unknown)
        schema.default(obj)
        return obj

    def _validate(self, res: Resource, obj: Obj, old: Obj | None) -> None:
        """The strategy's validation: a custom resource against its schema (ratcheting on
        update), a PodDisruptionBudget's spec."""
        problems: list[FieldError] = []
        if res.crd:
            problems = load_crd(res.crd).schema.validate(obj, old, self.validation_ratcheting)
        elif res.key == "poddisruptionbudgets.policy":
            problems = validate_pdb(obj)
        elif res.key == "pods" and old is None:
            problems = validate_pod(obj)
        elif res.key == "events":
            problems = validate_event(obj)
        if problems:
            raise invalid(res, (obj.get("metadata") or {}).get("name", ""), problems)

    def _get(self, res: Resource, namespace: str | None, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self._existing(res, namespace, name)[1])

    def _list(self, res: Resource, namespace: str | None, query: dict[str, str]) -> Obj:
        match = self._matcher(res, namespace, query)
        token = query.get("continue")
        cont = json.loads(base64.b64decode(token)) if token else {}
        start = cont.get("start")
        limit = int(query.get("limit") or 0)
        with self._lock:
            items = [
                self._objects[k]
                for k in self._keys(res, namespace)
                if match(self._objects[k]) and (not start or [k[1], k[2]] > start)
            ]
            # every page of a paged list is read at the first page's resourceVersion (its
            # continue token carries it: k8s.io/apiserver pkg/storage/continue.go), so the list
            # says that one, not a later (the items here are current: no snapshot is kept)
            meta: Obj = {"resourceVersion": str(cont.get("rv") or self._rv)}
        if limit and len(items) > limit:
            items, last = items[:limit], items[limit - 1]["metadata"]
            start = [last.get("namespace", ""), last["name"]]
            token = json.dumps({"rv": int(meta["resourceVersion"]), "start": start})
            meta["continue"] = base64.b64encode(token.encode()).decode()
        # Built-in (typed) lists omit kind/apiVersion on items; custom-resource lists keep them.
        strip = ("kind", "apiVersion") if res.builtin else ()
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": [{k: copy.deepcopy(v) for k, v in o.items() if k not in strip} for o in items],
        }

    def _create(
        self, res: Resource, namespace: str | None, body: Any, query: dict[str, str]
    ) -> Obj:
        obj = copy.deepcopy(self._check_body(res, namespace, body))
        if res.initial_status is not None and res.status_subresource:
            obj.pop("status", None)
            if res.initial_status:
                obj["status"] = copy.deepcopy(res.initial_status)
        obj = self._decode(res, obj, query)
        if res.key == "pods":
            default_pod(obj)
        meta = obj["metadata"]
        if res.namespaced:
            meta["namespace"] = namespace
        with self._lock:
            if not meta.get("name") and meta.get("generateName"):
                suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
                meta["name"] = meta["generateName"] + suffix
            name = meta.get("name") or ""
            pattern = DNS_LABEL_RE if res.plural == "namespaces" else NAME_RE
            if not name or len(name) > 253 or not pattern.match(name):
                raise ApiError(
                    422,
                    f'{res.kind} "{name}" is invalid: metadata.name: Invalid '
                    "value: a lowercase RFC 1123 name is required",
                )
            if res.key == "pods":
                self._admit_pod(obj)
            self._validate(res, obj, None)
            key = (res.key, namespace or "", name)
            if key in self._objects:
                raise ApiError(
                    409,
                    f'{res.key} "{name}" already exists',
                    "AlreadyExists",
                    details_of(res, name),
                )
            return self._insert(res, key, obj)

    def _with_subresource(self, res: Resource, old: Obj, new: Obj, sub: str | None) -> Obj:
        """Main-resource writes keep the old status; /status writes change only status."""
        if not res.status_subresource:
            return new
        base, source = (copy.deepcopy(old), new) if sub == "status" else (new, old)
        base.pop("status", None)
        if "status" in source:
            base["status"] = copy.deepcopy(source["status"])
        return base

    def _update(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        sub: str | None,
        query: dict[str, str],
    ) -> Obj:
        body = self._decode(res, copy.deepcopy(self._check_body(res, namespace, body, name)), query)
        with self._lock:
            key, old = self._existing(res, namespace, name)
            rv = body["metadata"].get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise conflict(res, name)
            if not rv and not res.unconditional_update:  # generic/registry/store.go Update
                error = FieldError(
                    "Invalid", "metadata.resourceVersion", 0, "must be specified for an update"
                )
                raise invalid(res, name, [error], by_resource=True)
            new = self._with_subresource(res, old, body, sub)
            self._validate(res, new, old)
            return self._commit(res, key, old, new)

    def _patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        ctype: str,
        sub: str | None,
        query: dict[str, str],
    ) -> Obj:
        ctype = ctype.split(";")[0].strip()
        with self._lock:
            key, old = self._existing(res, namespace, name)
            if ctype == "application/json-patch+json" and isinstance(body, list):
                patched = json_patch(old, body)
            elif ctype == "application/merge-patch+json" and isinstance(body, dict):
                patched = merge_patch(copy.deepcopy(old), body)
            elif (
                ctype == "application/strategic-merge-patch+json"
                and isinstance(body, dict)
                and res.builtin
            ):  # the real server refuses strategic patches on CRs
                patched = merge_patch(copy.deepcopy(old), body, strategic=True)
            else:
                raise ApiError(
                    415,
                    "the body of the request was in an unknown format - "
                    "accepted media types include: application/json-patch+json, "
                    "application/merge-patch+json",
                )
            if not isinstance(patched, dict):
                raise ApiError(422, "the patch result is not an object")
            # A resourceVersion inside the patch is a precondition, exactly as for PUT.
            rv = (patched.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != old["metadata"]["resourceVersion"]:
                raise conflict(res, name)
            self._check_body(res, namespace, patched, name)
            new = self._with_subresource(res, old, self._decode(res, patched, query), sub)
            self._validate(res, new, old)
            return self._commit(res, key, old, new)

    def _delete(self, res: Resource, namespace: str | None, name: str, options: Obj) -> Obj:
        with self._lock:
            key, old = self._existing(res, namespace, name)
            self._check_preconditions(res, old, options)
            if res.key == "pods":  # graceful: Terminating until the kubelet is done
                return self._delete_pod(res, key, options)
            if old["metadata"].get("finalizers"):  # deletion waits for them; returns the object
                if old["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(old)
                marked = copy.deepcopy(old)
                marked["metadata"]["deletionTimestamp"] = self._timestamp()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit(res, key, old, marked, deleting=True)
            self._remove(res, key, old)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {**details_of(res, name), "uid": old["metadata"]["uid"]},
        }

    @staticmethod
    def _check_preconditions(res: Resource, old: Obj, options: Obj) -> None:
        """registry/rest/delete.go BeforeDelete: the uid, then the resourceVersion; a Conflict
        on the object's Kind (``ScaleIn.kai.alibabacloud.com``, ``Pod``)."""
        preconditions, meta = options.get("preconditions") or {}, old["metadata"]
        for key, name, why in (
            ("uid", "UID", "deleted and then recreated"),
            ("resourceVersion", "ResourceVersion", "modified"),
        ):
            want = preconditions.get(key)
            if want is not None and want != meta.get(key):
                on = f"{res.kind}.{res.group}" if res.group else res.kind
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {on} "{meta["name"]}": the {name} in the '
                    f"precondition ({want}) does not match the {name} in record "
                    f"({meta.get(key)}). The object might have been {why}",
                    "Conflict",
                    details_of(res, meta["name"], res.kind),
                )

    def _delete_collection(
        self, res: Resource, namespace: str | None, query: dict[str, str], options: Obj
    ) -> Obj:
        match = self._matcher(res, namespace, query)
        with self._lock:
            victims = [
                (k, self._objects[k]) for k in self._keys(res, namespace) if match(self._objects[k])
            ]
            for (_, ns, name), _obj in victims:
                self._delete(res, ns or None, name, options)
            meta = {"resourceVersion": str(self._rv)}
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": [o for _, o in victims],
        }

    # ------------------------------------------------------------ watch
    def _watch(
        self, h: _Handler, res: Resource, namespace: str | None, query: dict[str, str]
    ) -> None:
        match = self._matcher(res, namespace, query)
        timeout = float(query.get("timeoutSeconds") or 0)
        deadline = time.monotonic() + timeout if timeout else float("inf")
        bookmarks = truthy(query.get("allowWatchBookmarks"))
        rv_param = query.get("resourceVersion", "")
        with self._lock:
            if rv_param in ("", "0"):  # "start at most recent": synthetic ADDED for the state
                cursor = self._rv
                out = [
                    {"type": "ADDED", "object": copy.deepcopy(self._objects[k])}
                    for k in self._keys(res)
                    if match(self._objects[k])
                ]
            elif rv_param.isdigit():
                cursor, out = int(rv_param), []
            else:
                raise ApiError(400, f"invalid resourceVersion {rv_param!r}")
            epoch, served = self._watch_epoch, self._served_epoch.get(res.key, 0)
            floor = max(self._compacted_rv, self._watch_floor.get(res.key, 0))
            self.watch_count += 1
            self._lock.notify_all()
        h.close_connection = True
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        abrupt = finished = False
        start_rv = cursor

        def bookmark_time(now: float) -> float:
            """cacher/cache_watcher.go nextBookmarkTime: every bookmark_interval (a minute)
            and 2 s before the watch's deadline, none after that."""
            at = min(now + self.bookmark_interval, deadline - 2.0)
            return at if bookmarks and at >= now else float("inf")

        next_bookmark = bookmark_time(time.monotonic())
        replaying = True  # the first read of the history: the events owed since `start_rv`
        try:
            while True:
                for event in out:
                    h.write_chunk(json.dumps(event).encode() + b"\n")
                if out and out[-1]["type"] == "ERROR":
                    break
                out, bookmark_due = [], False
                with self._lock:
                    while True:
                        if self._closing or epoch != self._watch_epoch:
                            abrupt, finished = self._abrupt_drop and not self._closing, True
                            break
                        if served != self._served_epoch.get(res.key, 0):  # unserved: its
                            finished = True  # storage is torn down, the stream ends cleanly
                            break
                        floor = max(floor, self._compacted_rv)
                        if cursor < floor:  # events owed are gone: 410, like the watch cache
                            out = [
                                {
                                    "type": "ERROR",
                                    "object": ApiError(
                                        410, f"too old resource version: {cursor} ({floor})"
                                    ).status(),
                                }
                            ]
                            break
                        newer = _newer(self._history_of.get(res.key, ()), cursor)
                        out = [e for ev in newer for e in self._translate(ev, match)]
                        if replaying and newer:  # cache_watcher.go processInterval: bookmarks
                            start_rv = newer[-1].rv  # must pass the last event replayed
                        replaying = False
                        cursor = max(cursor, self._rv)
                        now = time.monotonic()
                        if out:
                            break
                        if now >= deadline or now >= next_bookmark:
                            finished, bookmark_due = now >= deadline, now < deadline
                            break
                        if h.client_gone():  # notice hang-ups while idle: watch_count stays true
                            raise ConnectionResetError
                        self._lock.wait(min(deadline, next_bookmark, now + 0.2) - now)
                # lets the client resume from here; only past where the watch started or its
                # replay ended (cache_watcher.go processInterval, process: nothing at or below
                # that resourceVersion is sent), so a watch that saw nothing new gets none
                if bookmark_due and cursor > start_rv:
                    h.write_chunk(
                        json.dumps(
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": res.kind,
                                    "apiVersion": res.api_version,
                                    "metadata": {"resourceVersion": str(cursor)},
                                },
                            }
                        ).encode()
                        + b"\n"
                    )
                if bookmark_due:
                    next_bookmark = bookmark_time(time.monotonic())
                if finished:
                    break
            if abrupt:  # no terminating chunk: the client sees a broken stream
                h.connection.shutdown(socket.SHUT_RDWR)
            else:
                h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away
        finally:
            with self._lock:
                self.watch_count -= 1
                self._lock.notify_all()

    @staticmethod
    def _translate(ev: _Event, match: Callable[[Obj], bool]) -> list[Obj]:
        """Map a stored event onto a filtered watch like the watch cache does: objects that
        enter the selection appear ADDED, objects that leave it appear DELETED."""
        new_ok = ev.type != "DELETED" and match(ev.obj)
        old_ok = ev.old is not None and match(ev.old)
        if ev.type == "DELETED":
            return [{"type": "DELETED", "object": copy.deepcopy(ev.obj)}] if old_ok else []
        if new_ok:
            return [{"type": "MODIFIED" if old_ok else "ADDED", "object": copy.deepcopy(ev.obj)}]
        if old_ok:
            assert ev.old is not None
            gone = copy.deepcopy(ev.old)
            gone["metadata"]["resourceVersion"] = str(ev.rv)
            return [{"type": "DELETED", "object": gone}]
        return []


def write_kubeconfig(path: str, server: str, name: str) -> str:
    """A kubeconfig (JSON is valid YAML) for `server` without auth, its entries called `name`."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def _go_number(text: str) -> float | int:
    """A JSON number with a fraction or exponent as the server holds it: Go decodes it to a
    float64 and encodes an integral one back without them (2.0 is returned as 2)."""
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 1e21 else value


def validate_event(event: Obj) -> list[FieldError]:
    """What pkg/apis/core/validation/events.go legacyValidateEvent checks of a core/v1 Event
    that matters here: its object's namespace agrees with its own (an object in no namespace,
    e.g. a Node: the Event in "default"; with eventTime set also "kube-system")."""
    namespace = (event.get("metadata") or {}).get("namespace") or ""
    about = str((event.get("involvedObject") or {}).get("namespace") or "")
    if about:
        ok = namespace == about
    else:
        ok = namespace in ("", "default", *(("kube-system",) if event.get("eventTime") else ()))
    if ok:
        return []
    return [
        FieldError("Invalid", "involvedObject.namespace", about, "does not match event.namespace")
    ]


def _newer(events: Sequence[_Event] | deque[_Event], cursor: int) -> list[_Event]:
    """The events after `cursor`, oldest first, read from the right of a deque in rv order."""
    out: list[_Event] = []
    for ev in reversed(events):
        if ev.rv <= cursor:
            break
        out.append(ev)
    out.reverse()
    return out


class _HTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is normal (watches, timeouts): no traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive like the real server; watches are chunked
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK
    api: KubeApiServer

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.api._serve(self)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def send_json(
        self,
        code: int,
        payload: Obj,
        headers: dict[str, str] | None = None,
        warnings: list[str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        for w in warnings or ():
            self.send_header("Warning", w)
        self.end_headers()
        self.wfile.write(data)

    def send_text(self, code: int, text: str) -> None:
        """Go's http.Error/http.NotFound: text/plain, nosniff."""
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def client_gone(self) -> bool:
        """True once the peer closed: readable with nothing to read (watchers send nothing)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        try:
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass
