"""A small but faithful Kubernetes API server emulator for tests (stdlib only).

It speaks real HTTP on 127.0.0.1, so the official ``kubernetes`` client runs unmodified.
It reproduces the API semantics our controller depends on: a global resourceVersion,
uid/creationTimestamp (1 s resolution), label/field selectors, optimistic concurrency (409),
``/status`` subresources, merge/strategic/JSON patches, list+watch resumed from a bounded
event history, and 410 Gone (a watch ERROR event) once a resourceVersion is older than that
history. Test controls inject faults, drop watches, compact history, add latency and count
requests.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import random
import re
import select
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from . import structural

if TYPE_CHECKING:
    from kubernetes.client import ApiClient  # type: ignore[import-untyped]

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource key, namespace or "", name)
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
            504: "Timeout"}
_BUILTIN_GROUPS = {"", "coordination.k8s.io", "events.k8s.io", "policy"}
# Strategic merge patch: these lists merge by key instead of being replaced.
_SMP_MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name",
                   "volumes": "name", "env": "name", "ownerReferences": "uid", "addresses": "type"}
_POD_FIELDS = ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
               "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
               "status.nominatedNodeName")
_EVENT_FIELDS = tuple(f"involvedObject.{f}" for f in (
    "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath",
)) + ("reason", "reportingComponent", "source", "type")
_NOT_FOUND = "the server could not find the requested resource"


def _truthy(value: str | None) -> bool:
    """Boolean query parameters as Go's strconv.ParseBool reads them (the client sends True)."""
    return (value or "").lower() in ("1", "t", "true")


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = True
    # Status an API create starts from (real strategies reset it); None keeps the sent status.
    initial_status: Obj | None = None
    returns_deleted_object: bool = False  # ReturnDeletedObject in the real registry (pods)
    field_labels: tuple[str, ...] = ()  # beyond metadata.name / metadata.namespace

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:  # the "group resource" used in messages and as a store key
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def builtin(self) -> bool:
        return self.group in _BUILTIN_GROUPS


class ApiError(Exception):
    def __init__(self, code: int, message: str, reason: str | None = None,
                 details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details
        self.reason = reason or _REASONS.get(code, "Unknown")

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def _details(res: Resource, name: str) -> Obj:
    return {"name": name, "group": res.group, "kind": res.plural}


def _not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, f'{res.key} "{name}" not found', details=_details(res, name))


def _conflict(res: Resource, name: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {res.key} "{name}": the object has '
                         "been modified; please apply your changes to the latest version and "
                         "try again", details=_details(res, name))


@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    status: int = 0

    @property
    def watch(self) -> bool:
        return _truthy(self.query.get("watch"))


@dataclass
class _Fault:
    remaining: int
    status: int
    path_contains: str | None
    method: str | None


@dataclass
class _Event:
    rv: int
    key: str
    type: str
    obj: Obj
    old: Obj | None = None


# ---------------------------------------------------------------- selectors
def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses (set-based values contain commas)."""
    terms: list[str] = []
    depth, cur = 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms, cur = [*terms, cur], ""
        else:
            cur += ch
    return [t.strip() for t in [*terms, cur] if t.strip()]


LabelTest = Callable[[dict[str, str]], bool]


def _exists(k: str, neg: bool) -> LabelTest:
    return lambda ls: (k in ls) != neg


def _equals(k: str, v: str, neg: bool) -> LabelTest:
    return lambda ls: (ls.get(k) == v) != neg  # so != also matches objects without the label


def _member(k: str, values: set[str], neg: bool) -> LabelTest:
    return lambda ls: (k in ls and ls[k] in values) != neg


def parse_label_selector(selector: str) -> LabelTest:
    reqs: list[LabelTest] = []
    key = r"([A-Za-z0-9][-A-Za-z0-9_./]*)"
    for term in _split_terms(selector):
        if m := re.fullmatch(rf"(!?)\s*{key}", term):
            reqs.append(_exists(m.group(2), m.group(1) == "!"))
        elif m := re.fullmatch(rf"{key}\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)", term):
            reqs.append(_equals(m.group(1), m.group(3), m.group(2) == "!="))
        elif m := re.fullmatch(rf"{key}\s+(in|notin)\s*\(([^()]*)\)", term):
            values = {v.strip() for v in m.group(3).split(",")}
            reqs.append(_member(m.group(1), values, m.group(2) == "notin"))
        else:
            raise ApiError(400, f"unable to parse requirement: invalid selector {selector!r}")
    return lambda labels: all(r(labels) for r in reqs)


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return "" if cur is None else str(cur)


def parse_field_selector(selector: str, res: Resource) -> Callable[[Obj], bool]:
    allowed = ("metadata.name", "metadata.namespace", *res.field_labels)
    reqs: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        m = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise ApiError(400, f"invalid field selector: {term!r}")
        if m.group(1) not in allowed:  # the real server rejects unsupported fields; so do we
            raise ApiError(400, f"field label not supported: {m.group(1)}")
        reqs.append((m.group(1), m.group(2) == "!=", m.group(3)))
    return lambda obj: all((_field_value(obj, f) == v) != ne for f, ne, v in reqs)


# ---------------------------------------------------------------- patches
def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; with ``strategic`` the well-known lists merge by key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        elif strategic and k in _SMP_MERGE_KEYS and isinstance(v, list) \
                and isinstance(result.get(k), list):
            mk, merged = _SMP_MERGE_KEYS[k], list(result[k])
            for item in v:
                idx = next((i for i, o in enumerate(merged)
                            if isinstance(o, dict) and o.get(mk) == item.get(mk)), None)
                if idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = merge_patch(merged[idx], item, strategic)
            result[k] = merged
        else:
            result[k] = merge_patch(result.get(k), v, strategic)
    return result


def json_patch(doc: Any, ops: list[Obj]) -> Any:
    """RFC 6902 (add/remove/replace/move/copy/test); failures are 422 like the real server."""
    def tokens(path: str) -> list[str]:
        if path and not path.startswith("/"):
            raise ApiError(422, f"invalid JSON pointer {path!r}")
        return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]

    def walk(d: Any, toks: list[str]) -> Any:
        for t in toks:
            try:
                d = d[int(t)] if isinstance(d, list) else d[t]
            except (KeyError, IndexError, ValueError, TypeError):
                raise ApiError(422, f"json patch: path not found: /{'/'.join(toks)}") from None
        return d

    def remove(d: Any, toks: list[str]) -> Any:
        parent, last = walk(d, toks[:-1]), toks[-1]
        walk(parent, [last])
        return parent.pop(int(last) if isinstance(parent, list) else last)

    def add(d: Any, toks: list[str], value: Any) -> Any:
        if not toks:
            return value
        parent, last = walk(d, toks[:-1]), toks[-1]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if not 0 <= idx <= len(parent):
                raise ApiError(422, f"json patch: index out of range: {last}")
            parent.insert(idx, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise ApiError(422, "json patch: parent is not a container")
        return d

    doc = copy.deepcopy(doc)
    for op in ops:
        kind, toks, value = op.get("op"), tokens(op.get("path", "")), op.get("value")
        if kind in ("remove", "replace") and toks:
            remove(doc, toks)
        if kind in ("add", "replace"):
            doc = add(doc, toks, copy.deepcopy(value))
        elif kind in ("move", "copy"):
            src = tokens(op.get("from", ""))
            moved = remove(doc, src) if kind == "move" else copy.deepcopy(walk(doc, src))
            doc = add(doc, toks, moved)
        elif kind == "test" and walk(doc, toks) != value:
            raise ApiError(422, f"json patch: test operation failed at {op.get('path')}")
        elif kind not in ("remove", "test"):
            raise ApiError(422, f"json patch: unsupported operation {kind!r}")
    return doc


# ---------------------------------------------------------------- server
def _default_resources() -> list[Resource]:
    # Custom resources have a status subresource, so the real server drops status on create.
    cr: Obj = {"namespaced": True, "initial_status": {}}
    no_status: Obj = {"namespaced": True, "status_subresource": False}
    return [
        Resource("", "v1", "nodes", "Node", False, field_labels=("spec.unschedulable",)),
        Resource("", "v1", "pods", "Pod", True, initial_status={"phase": "Pending"},
                 returns_deleted_object=True, field_labels=_POD_FIELDS),
        Resource("", "v1", "namespaces", "Namespace", False, initial_status={"phase": "Active"},
                 field_labels=("status.phase",)),
        Resource("", "v1", "events", "Event", field_labels=_EVENT_FIELDS, **no_status),
        Resource("", "v1", "configmaps", "ConfigMap", **no_status),
        Resource("coordination.k8s.io", "v1", "leases", "Lease", **no_status),
        Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
        Resource("events.k8s.io", "v1", "events", "Event", **no_status),
        Resource("kai.alibabacloud.com", "v1alpha1", "trainingjobs", "TrainingJob", **cr),
        Resource("kai.alibabacloud.com", "v1alpha1", "scaleins", "ScaleIn", **cr),
        Resource("kai.alibabacloud.com", "v1alpha1", "scaleouts", "ScaleOut", **cr),
        Resource("kongming.cce.baiudbce.com", "v1", "aitrainingjobs", "AITrainingJob", **cr),
    ]


class KubeApiServer:
    """In-memory Kubernetes API server on 127.0.0.1:<ephemeral>; use as a context manager."""

    def __init__(self, history_limit: int = 1000, bookmark_interval: float = 60.0) -> None:
        self._lock = threading.Condition()  # RLock inside; guards all state, notified on changes
        self._resources: dict[tuple[str, str, str], Resource] = {}
        self._objects: dict[Key, Obj] = {}
        self._rv = 0
        self._history: deque[_Event] = deque()
        self._compacted_rv = 0  # watches from a resourceVersion below this get 410 Gone
        self._faults: list[_Fault] = []
        self._watch_epoch, self._abrupt_drop, self._closing = 0, True, False
        self._httpd: ThreadingHTTPServer | None = None
        self.history_limit = history_limit
        self.bookmark_interval = bookmark_interval
        self.latency = 0.0  # seconds added before every request is served
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)  # override to pin time
        self.watch_count = 0  # open watch streams
        self.request_log: list[RequestRecord] = []
        self._withdrawn: dict[tuple[str, str, str], Resource] = {}  # kinds not served now
        # Seconds the simulated kubelet takes to finish a Terminating pod; None = never by
        # itself (finish_terminating() does it). Pods on no node go at once, as on the real one.
        self.kubelet_delay: float | None = 0.0
        for res in _default_resources():
            self.register(res)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                       "status": {"phase": "Active"}})

    # ------------------------------------------------------------ lifecycle
    def start(self) -> KubeApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
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
        from kubernetes import client  # type: ignore[import-untyped]  # lazy: stdlib-only module

        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig (JSON is valid YAML) pointing at this server, without auth."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "emulator",
               "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
               "users": [{"name": "emulator", "user": {}}],
               "contexts": [{"name": "emulator",
                             "context": {"cluster": "emulator", "user": "emulator"}}]}
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    # ------------------------------------------------------------ test controls
    def register(self, res: Resource) -> None:
        with self._lock:
            self._resources[(res.group, res.version, res.plural)] = res

    def unserve(self, ref: str) -> None:
        """Stop serving a kind, as when its CRD is not installed (or deleted, which deletes its
        objects): gone from discovery, 404 on every path; watches on it end."""
        with self._lock:
            res = self.resource(ref)
            del self._resources[(res.group, res.version, res.plural)]
            self._withdrawn[(res.group, res.version, res.plural)] = res
            for key in [k for k in self._objects if k[0] == res.key]:
                del self._objects[key]
        self.drop_watches(abrupt=False)

    def serve(self, ref: str) -> None:
        """Serve a withdrawn kind again (its CRD installed later), with no objects."""
        with self._lock:
            found = [k for k, r in self._withdrawn.items() if ref in (r.plural, r.kind, r.key)]
            self._resources[found[0]] = self._withdrawn.pop(found[0])
            self._lock.notify_all()

    def finish_terminating(self, name: str | None = None, namespace: str | None = None) -> None:
        """The kubelet is done with Terminating pods (all, or the one named): they go."""
        with self._lock:
            res = self.resource("pods")
            for key, obj in list(self._objects.items()):
                meta = obj["metadata"]
                if key[0] == res.key and meta.get("deletionTimestamp") and \
                        name in (None, meta["name"]) and namespace in (None, meta["namespace"]):
                    self._remove(res, key, obj)

    def set_container_states(self, name: str, namespace: str, states: dict[str, Any]) -> Obj:
        """Set a pod's container states, the way the kubelet reports them: each value is
        "running", "waiting" or an exit code (terminated). The phase follows like the kubelet's
        (pkg/kubelet/kubelet_pods.go getPhase): Succeeded/Failed only once every regular
        container has terminated (for restartPolicy Never); native sidecars (init containers
        with restartPolicy Always) never keep a pod Running; a running regular container does."""
        with self._lock:
            key, old = self._existing(self.resource("pods"), namespace, name)
            pod = copy.deepcopy(old)
            spec = pod.get("spec") or {}
            sidecars = {c["name"] for c in spec.get("initContainers") or ()
                        if c.get("restartPolicy") == "Always"}

            def status(cname: str) -> Obj:
                value = states[cname]
                if value == "running":
                    state: Obj = {"running": {"startedAt": self._timestamp()}}
                elif value == "waiting":
                    state = {"waiting": {"reason": "ContainerCreating"}}
                else:
                    state = {"terminated": {"exitCode": int(value), "reason":
                             "Completed" if int(value) == 0 else "Error"}}
                return {"name": cname, "state": state, "ready": value == "running"}

            regular = [c["name"] for c in spec.get("containers") or ()]
            st = pod.setdefault("status", {})
            st["containerStatuses"] = [status(c) for c in regular if c in states]
            st["initContainerStatuses"] = [status(c) for c in sorted(sidecars) if c in states]
            codes = [states.get(c) for c in regular]
            if all(isinstance(v, int) for v in codes):
                st["phase"] = "Succeeded" if all(v == 0 for v in codes) else "Failed"
            elif any(v == "running" for v in codes):
                st["phase"] = "Running"
            return self._commit(self.resource("pods"), key, old, pod)

    def fail_next(self, n: int = 1, status: int = 500, path_contains: str | None = None,
                  method: str | None = None) -> None:
        """Answer the next ``n`` matching requests with ``status``; ``path_contains`` is a
        substring of the request target, query included (e.g. ``"watch="``)."""
        with self._lock:
            self._faults.append(_Fault(n, status, path_contains, method))

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
            self._compacted_rv = self._rv
            self._lock.notify_all()

    @property
    def resource_version(self) -> int:
        return self._rv

    def requests(self, method: str | None = None, path_contains: str | None = None,
                 watch: bool | None = None) -> list[RequestRecord]:
        with self._lock:
            return [r for r in self.request_log if method in (None, r.method)
                    and (path_contains is None or path_contains in r.path)
                    and watch in (None, r.watch)]

    def count(self, method: str | None = None, path_contains: str | None = None,
              watch: bool | None = None) -> int:
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

    # Direct object access, as another controller would write: no validation, no status rules.
    def resource(self, ref: str, api_version: str | None = None) -> Resource:
        """Find a resource by plural, Kind or plural.group (core wins ties, e.g. events)."""
        for res in self._resources.values():
            if ref in (res.plural, res.kind, res.key) and api_version in (None, res.api_version):
                return res
        raise KeyError(ref)

    def seed(self, *objs: Obj) -> list[Obj]:
        """Create or replace objects as given (status, uid and creationTimestamp kept),
        emitting ADDED/MODIFIED. Namespaced objects default to namespace "default"."""
        out = []
        with self._lock:
            for obj in map(copy.deepcopy, objs):
                res = self.resource(obj["kind"], obj.get("apiVersion"))
                meta = obj.setdefault("metadata", {})
                key = self._backdoor_key(res, meta["name"], meta.pop("namespace", None))
                if res.namespaced:
                    meta["namespace"] = key[1]
                old = self._objects.get(key)
                out.append(self._commit(res, key, old, obj) if old else
                           self._insert(res, key, obj, keep=("uid", "creationTimestamp")))
        return out

    def get(self, ref: str, name: str, namespace: str | None = None) -> Obj | None:
        res = self.resource(ref)
        with self._lock:
            return copy.deepcopy(self._objects.get(self._backdoor_key(res, name, namespace)))

    def objects(self, ref: str, namespace: str | None = None) -> list[Obj]:
        """All stored objects of a kind, in every namespace unless one is given."""
        res = self.resource(ref)
        with self._lock:
            return [copy.deepcopy(o) for (k, ns, _), o in sorted(self._objects.items())
                    if k == res.key and namespace in (None, ns)]

    def patch(self, ref: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """Merge-patch any part, status included; emits MODIFIED."""
        res = self.resource(ref)
        with self._lock:
            key = self._backdoor_key(res, name, namespace)
            old = self._objects[key]
            return self._commit(res, key, old, merge_patch(old, patch))

    def delete(self, ref: str, name: str, namespace: str | None = None) -> None:
        """Remove at once, finalizers ignored; emits DELETED."""
        res = self.resource(ref)
        with self._lock:
            key = self._backdoor_key(res, name, namespace)
            self._remove(res, key, self._objects[key])

    def _backdoor_key(self, res: Resource, name: str, namespace: str | None) -> Key:
        return (res.key, (namespace or "default") if res.namespaced else "", name)

    # ------------------------------------------------------------ store internals (lock held)
    def _timestamp(self) -> str:
        return self.now().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _emit(self, res: Resource, type_: str, obj: Obj, old: Obj | None = None) -> None:
        self._history.append(_Event(self._rv, res.key, type_, copy.deepcopy(obj), old))
        while len(self._history) > self.history_limit:
            self._compacted_rv = self._history.popleft().rv
        self._lock.notify_all()

    def _insert(self, res: Resource, key: Key, obj: Obj, keep: tuple[str, ...] = ()) -> Obj:
        """Store a new object; the server owns uid/creationTimestamp unless seeding keeps them."""
        meta = obj["metadata"]
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        self._rv += 1
        given = {k: meta[k] for k in keep if meta.get(k)}
        meta.update({"uid": str(uuid.uuid4()), "creationTimestamp": self._timestamp(),
                     "resourceVersion": str(self._rv), "generation": 1, **given})
        for server_owned in ("deletionTimestamp", "selfLink", "managedFields"):
            meta.pop(server_owned, None)
        self._objects[key] = obj
        self._emit(res, "ADDED", obj)
        return copy.deepcopy(obj)

    def _commit(self, res: Resource, key: Key, old: Obj, new: Obj) -> Obj:
        """Store an update. Server-owned metadata comes from ``old``; an unchanged object is
        not written at all (same resourceVersion, no event), as on the real server."""
        new = copy.deepcopy(new)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        for k in ("uid", "creationTimestamp", "name", "namespace", "generation",
                  "deletionTimestamp", "resourceVersion"):
            if k in old_meta:
                meta[k] = old_meta[k]
        if new == old:
            return copy.deepcopy(old)
        spec_of = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        if spec_of(new) != spec_of(old):
            meta["generation"] = old_meta.get("generation", 1) + 1
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[key] = new
        self._emit(res, "MODIFIED", new, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(res, key, new)  # the last finalizer is gone: deletion completes
        return copy.deepcopy(new)

    def _remove(self, res: Resource, key: Key, old: Obj) -> Obj:
        del self._objects[key]
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
        try:
            self._take_fault(h.command, h.path)
            code, payload = self._route(h, url.path, query, json.loads(raw) if raw else None)
        except json.JSONDecodeError as e:
            code, payload = 400, ApiError(400, f"invalid JSON body: {e}").status()
        except ApiError as e:
            code, payload = e.code, e.status()
        except Exception as e:  # an emulator bug: answer 500 and show it, not a dead socket
            traceback.print_exc()
            code, payload = 500, ApiError(500, f"emulator error: {e!r}").status()
        record.status = code
        if payload is not None:  # None: a watch stream has already answered
            with contextlib.suppress(OSError):  # the client may have gone away
                h.send_json(code, payload)

    def _take_fault(self, method: str, target: str) -> None:
        with self._lock:
            for f in self._faults:
                if f.remaining > 0 and f.method in (None, method) \
                        and (f.path_contains or "") in target:
                    f.remaining -= 1
                    raise ApiError(f.status, f"injected failure ({f.status})")

    def _route(self, h: _Handler, path: str, query: dict[str, str],
               body: Any) -> tuple[int, Obj | None]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["version"]:
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-emulator",
                         "gitCommit": "", "gitTreeState": "clean", "buildDate": "",
                         "goVersion": "", "compiler": "gc", "platform": "linux/amd64"}
        if parts == ["api"]:
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs":
                         [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.url[7:]}]}
        if parts == ["apis"]:
            return 200, self._group_list()
        if parts[:1] == ["api"]:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, _NOT_FOUND)
        if not rest:
            return 200, self._resource_list(group, version)
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] != "status":
            namespace, rest = rest[1], rest[2:]
        res = self._resources.get((group, version, rest[0]))
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if res is not None and res.plural == "pods" and sub == "eviction" and name is not None \
                and h.command == "POST" and namespace is not None:
            return 201, self._evict(namespace, name, body or {})
        if (res is None or len(rest) > 3
                or (sub is not None and (sub != "status" or not res.status_subresource))
                or (namespace is not None and not res.namespaced)
                or (res.namespaced and namespace is None and name is not None)):
            raise ApiError(404, _NOT_FOUND)
        method = h.command
        if method == "GET" and name is None and _truthy(query.get("watch")):
            self._watch(h, res, namespace, query)
            return 200, None
        if method == "GET":
            if name is None:
                return 200, self._list(res, namespace, query)
            return 200, self._get(res, namespace, name)
        if method == "POST" and name is None and (namespace is not None or not res.namespaced):
            return 201, self._create(res, namespace, body)
        if method == "PUT" and name is not None:
            return 200, self._update(res, namespace, name, body, sub)
        if method == "PATCH" and name is not None:
            ctype = h.headers.get("Content-Type", "")
            return 200, self._patch(res, namespace, name, body, ctype, sub)
        if method == "DELETE" and name is not None and sub is None:
            options = dict(body or {})  # the client sends gracePeriodSeconds as a query param
            if query.get("gracePeriodSeconds", "").isdigit():
                options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            return 200, self._delete(res, namespace, name, options)
        if method == "DELETE" and name is None:
            return 200, self._delete_collection(res, namespace, query)
        raise ApiError(405, f"{method} is not supported on this path")

    def _group_list(self) -> Obj:
        groups: dict[str, list[str]] = {}
        for g, v, _ in self._resources:
            if g and v not in groups.setdefault(g, []):
                groups[g].append(v)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
            for g, vs in groups.items()]}

    def _resource_list(self, group: str, version: str) -> Obj:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        resources = []
        for res in self._resources.values():
            if (res.group, res.version) != (group, version):
                continue
            base = {"namespaced": res.namespaced, "kind": res.kind}
            resources.append({"name": res.plural, "singularName": res.kind.lower(),
                              "verbs": verbs, **base})
            if res.status_subresource:
                resources.append({"name": f"{res.plural}/status", "singularName": "",
                                  "verbs": ["get", "patch", "update"], **base})
        if not resources:
            raise ApiError(404, _NOT_FOUND)
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    # ------------------------------------------------------------ verbs
    def _existing(self, res: Resource, namespace: str | None, name: str) -> tuple[Key, Obj]:
        key = (res.key, namespace or "", name)
        if key not in self._objects:
            raise _not_found(res, name)
        return key, self._objects[key]

    def _matcher(self, res: Resource, namespace: str | None,
                 query: dict[str, str]) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), res)
        return lambda o: (namespace in (None, o["metadata"].get("namespace"))
                          and labels(o["metadata"].get("labels") or {}) and fields(o))

    def _check_body(self, res: Resource, namespace: str | None, body: Any,
                    name: str | None = None) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if not res.builtin and not (body.get("kind") and body.get("apiVersion")):
            raise ApiError(400, f"Object 'Kind' or 'apiVersion' is missing in {json.dumps(body)}")
        if (body.get("kind", res.kind), body.get("apiVersion", res.api_version)) \
                != (res.kind, res.api_version):
            raise ApiError(400, f"the body is not {res.api_version}, Kind={res.kind}")
        meta = body.setdefault("metadata", {})
        if namespace is not None and meta.get("namespace") not in (None, "", namespace):
            raise ApiError(400, "the namespace of the provided object does not match the "
                                "namespace sent on the request")
        if name is not None and meta.get("name") != name:
            raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match "
                                f"the name on the URL ({name})")
        for k, v in (meta.get("labels") or {}).items():
            prefix, _, short = k.rpartition("/")
            if (len(short) > 63 or not _LABEL_RE.match(short)
                    or (prefix and not _NAME_RE.match(prefix)) or not isinstance(v, str)
                    or len(v) > 63 or (v and not _LABEL_RE.match(v))):
                raise ApiError(422, f'{res.kind} "{meta.get("name", "")}" is invalid: '
                                    f"metadata.labels: Invalid value: {k!r}: {v!r}")
        return body

    @staticmethod
    def _conform(res: Resource, obj: Obj, old: Obj | None = None) -> Obj:
        """Prune and validate a custom resource against its CRD's structural schema; an update
        is judged on what it changes (validation ratcheting)."""
        schema = structural.schemas().get((res.group, res.version, res.plural))
        if schema is None:
            return obj
        pruned, problems = (structural.conform(schema, obj) if old is None
                            else structural.conform(schema, obj, old=old))
        if problems:
            name = (obj.get("metadata") or {}).get("name", "")
            raise ApiError(422, f'{res.kind}.{res.group} "{name}" is invalid: '
                                + ", ".join(problems), "Invalid",
                           {"name": name, "group": res.group, "kind": res.kind,
                            "causes": [{"reason": "FieldValueInvalid", "message": p}
                                       for p in problems]})
        return pruned

    def _get(self, res: Resource, namespace: str | None, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self._existing(res, namespace, name)[1])

    def _list(self, res: Resource, namespace: str | None, query: dict[str, str]) -> Obj:
        match = self._matcher(res, namespace, query)
        token = query.get("continue")
        start = json.loads(base64.b64decode(token))["start"] if token else None
        limit = int(query.get("limit") or 0)
        with self._lock:
            items = [o for (k, ns, n), o in sorted(self._objects.items())
                     if k == res.key and match(o) and (not start or [ns, n] > start)]
            meta: Obj = {"resourceVersion": str(self._rv)}
        if limit and len(items) > limit:
            items, last = items[:limit], items[limit - 1]["metadata"]
            start = [last.get("namespace", ""), last["name"]]
            meta["continue"] = base64.b64encode(json.dumps({"start": start}).encode()).decode()
        # Built-in (typed) lists omit kind/apiVersion on items; custom-resource lists keep them.
        strip = ("kind", "apiVersion") if res.builtin else ()
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta,
                "items": [{k: copy.deepcopy(v) for k, v in o.items() if k not in strip}
                          for o in items]}

    def _create(self, res: Resource, namespace: str | None, body: Any) -> Obj:
        obj = copy.deepcopy(self._check_body(res, namespace, body))
        if res.initial_status is not None and res.status_subresource:
            obj.pop("status", None)
            if res.initial_status:
                obj["status"] = copy.deepcopy(res.initial_status)
        obj = self._conform(res, obj)
        meta = obj["metadata"]
        if res.namespaced:
            meta["namespace"] = namespace
        with self._lock:
            if not meta.get("name") and meta.get("generateName"):
                suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
                meta["name"] = meta["generateName"] + suffix
            name = meta.get("name") or ""
            pattern = _DNS_LABEL_RE if res.plural == "namespaces" else _NAME_RE
            if not name or len(name) > 253 or not pattern.match(name):
                raise ApiError(422, f'{res.kind} "{name}" is invalid: metadata.name: Invalid '
                                    "value: a lowercase RFC 1123 name is required")
            key = (res.key, namespace or "", name)
            if key in self._objects:
                raise ApiError(409, f'{res.key} "{name}" already exists', "AlreadyExists",
                               _details(res, name))
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

    def _update(self, res: Resource, namespace: str | None, name: str, body: Any,
                sub: str | None) -> Obj:
        body = self._check_body(res, namespace, body, name)
        with self._lock:
            key, old = self._existing(res, namespace, name)
            rv = body["metadata"].get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name)
            new = self._conform(res, self._with_subresource(res, old, body, sub), old)
            return self._commit(res, key, old, new)

    def _patch(self, res: Resource, namespace: str | None, name: str, body: Any, ctype: str,
               sub: str | None) -> Obj:
        ctype = ctype.split(";")[0].strip()
        with self._lock:
            key, old = self._existing(res, namespace, name)
            if ctype == "application/json-patch+json" and isinstance(body, list):
                patched = json_patch(old, body)
            elif ctype == "application/merge-patch+json" and isinstance(body, dict):
                patched = merge_patch(old, body)
            elif ctype == "application/strategic-merge-patch+json" and isinstance(body, dict) \
                    and res.builtin:  # the real server refuses strategic patches on CRs
                patched = merge_patch(old, body, strategic=True)
            else:
                raise ApiError(415, "the body of the request was in an unknown format - "
                                    "accepted media types include: application/json-patch+json, "
                                    "application/merge-patch+json")
            if not isinstance(patched, dict):
                raise ApiError(422, "the patch result is not an object")
            # A resourceVersion inside the patch is a precondition, exactly as for PUT.
            rv = (patched.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name)
            self._check_body(res, namespace, patched, name)
            new = self._conform(res, self._with_subresource(res, old, patched, sub), old)
            return self._commit(res, key, old, new)

    def _delete(self, res: Resource, namespace: str | None, name: str, options: Obj) -> Obj:
        with self._lock:
            key, old = self._existing(res, namespace, name)
            for k, want in (options.get("preconditions") or {}).items():  # resourceVersion, uid
                if want and want != old["metadata"].get(k):
                    raise ApiError(409, f"Precondition failed: {k} in precondition: {want}, "
                                        f"{k} in object meta: {old['metadata'].get(k)}")
            grace = self._grace(res, old, options)
            if grace:  # a bound pod: Terminating for its grace period, until the kubelet is done
                return self._terminate(res, key, old, grace)
            if old["metadata"].get("finalizers"):  # deletion waits for them; returns the object
                if old["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(old)
                marked = copy.deepcopy(old)
                marked["metadata"]["deletionTimestamp"] = self._timestamp()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                self._rv += 1
                marked["metadata"]["resourceVersion"] = str(self._rv)
                self._objects[key] = marked
                self._emit(res, "MODIFIED", marked, old)
                return copy.deepcopy(marked)
            gone = self._remove(res, key, old)
        if res.returns_deleted_object:
            return gone
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {**_details(res, name), "uid": old["metadata"]["uid"]}}

    def _grace(self, res: Resource, pod: Obj, options: Obj) -> int:
        """The grace period a delete gives a pod (0 for other kinds and unbound pods, which
        the real server deletes at once): the request's, else the pod's own, else 30 s."""
        if res.plural != "pods" or not (pod.get("spec") or {}).get("nodeName"):
            return 0
        given = options.get("gracePeriodSeconds")
        if given is None:
            given = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        held = pod["metadata"].get("deletionGracePeriodSeconds")
        return int(min(given, held) if held is not None else given)

    def _terminate(self, res: Resource, key: Key, old: Obj, grace: int) -> Obj:
        """Mark a pod Terminating (deletionTimestamp = now + grace, as the real registry sets
        it); its phase stays until the kubelet stops the containers and removes it."""
        marked = copy.deepcopy(old)
        meta = marked["metadata"]
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") == grace:
            return copy.deepcopy(old)  # deleting again changes nothing
        meta["deletionGracePeriodSeconds"] = grace
        meta["deletionTimestamp"] = (self.now() + timedelta(seconds=grace)).astimezone(
            UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[key] = marked
        self._emit(res, "MODIFIED", marked, old)
        if self.kubelet_delay == 0:
            self._remove(res, key, marked)
        elif self.kubelet_delay is not None:
            ns, name = key[1], key[2]
            timer = threading.Timer(self.kubelet_delay, self.finish_terminating, (name, ns))
            timer.daemon = True
            timer.start()
        return copy.deepcopy(marked)

    def _evict(self, namespace: str, name: str, body: Obj) -> Obj:
        """POST pods/<name>/eviction (policy/v1 Eviction), honouring PodDisruptionBudgets like
        the real registry (pkg/registry/core/pod/storage/eviction.go): a healthy pod may go
        only if every budget selecting it still allows a disruption; otherwise 429. An
        evicted pod gets the DisruptionTarget condition and is deleted gracefully."""
        pods = self.resource("pods")
        with self._lock:
            key, pod = self._existing(pods, namespace, name)
            if not pod["metadata"].get("deletionTimestamp"):
                for pdb in self._budgets_for(pod):
                    if not self._healthy(pod) and \
                            pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
                        continue
                    healthy, desired = self._budget(pdb)
                    if healthy - desired <= 0 and self._healthy(pod):
                        pdb_name = pdb["metadata"]["name"]
                        raise ApiError(
                            429, "Cannot evict pod as it would violate the pod's disruption "
                                 "budget.", "TooManyRequests",
                            {"causes": [{"reason": "DisruptionBudget", "message":
                                         f"The disruption budget {pdb_name} needs {desired} "
                                         f"healthy pods and has {healthy} currently"}]})
                target = copy.deepcopy(pod)
                conditions = target.setdefault("status", {}).setdefault("conditions", [])
                conditions.append({"type": "DisruptionTarget", "status": "True",
                                   "reason": "EvictionByEvictionAPI",
                                   "message": "Eviction API: evicting",
                                   "lastTransitionTime": self._timestamp()})
                pod = self._commit(pods, key, pod, target)
            options = (body.get("deleteOptions") or {})
        self._delete(pods, namespace, name, options)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    def _budgets_for(self, pod: Obj) -> list[Obj]:
        ns, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels") or {}
        out = []
        for (k, pns, _), pdb in self._objects.items():
            if k != "poddisruptionbudgets.policy" or pns != ns:
                continue
            match = ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if all(labels.get(a) == b for a, b in match.items()):
                out.append(pdb)
        return out

    @staticmethod
    def _healthy(pod: Obj) -> bool:
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or ())
        return status.get("phase") == "Running" and ready and \
            not pod["metadata"].get("deletionTimestamp")

    def _budget(self, pdb: Obj) -> tuple[int, int]:
        """(currently healthy, desired healthy) over the pods the budget selects."""
        spec, ns = pdb.get("spec") or {}, pdb["metadata"]["namespace"]
        match = (spec.get("selector") or {}).get("matchLabels") or {}
        pods = [o for (k, pns, _), o in self._objects.items() if k == "pods" and pns == ns
                and all((o["metadata"].get("labels") or {}).get(a) == b
                        for a, b in match.items())]
        expected, healthy = len(pods), sum(map(self._healthy, pods))

        def amount(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-expected * int(value[:-1]) // 100)  # rounded up, like the real one
            return int(value)

        if "minAvailable" in spec:
            return healthy, amount(spec["minAvailable"])
        return healthy, expected - amount(spec.get("maxUnavailable", 0))

    def _delete_collection(self, res: Resource, namespace: str | None,
                           query: dict[str, str]) -> Obj:
        match = self._matcher(res, namespace, query)
        with self._lock:
            victims = [(k, o) for k, o in sorted(self._objects.items())
                       if k[0] == res.key and match(o)]
            for (_, ns, name), _obj in victims:
                self._delete(res, ns or None, name, {})
            meta = {"resourceVersion": str(self._rv)}
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta,
                "items": [o for _, o in victims]}

    # ------------------------------------------------------------ watch
    def _watch(self, h: _Handler, res: Resource, namespace: str | None,
               query: dict[str, str]) -> None:
        match = self._matcher(res, namespace, query)
        timeout = float(query.get("timeoutSeconds") or 0)
        deadline = time.monotonic() + timeout if timeout else float("inf")
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        rv_param = query.get("resourceVersion", "")
        with self._lock:
            if rv_param in ("", "0"):  # "start at most recent": synthetic ADDED for the state
                cursor = self._rv
                out = [{"type": "ADDED", "object": copy.deepcopy(o)}
                       for (k, _, _), o in sorted(self._objects.items())
                       if k == res.key and match(o)]
            elif rv_param.isdigit():
                cursor, out = int(rv_param), []
            else:
                raise ApiError(400, f"invalid resourceVersion {rv_param!r}")
            epoch = self._watch_epoch
            self.watch_count += 1
            self._lock.notify_all()
        h.close_connection = True
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        abrupt = finished = False
        next_bookmark = time.monotonic() + self.bookmark_interval if bookmarks else float("inf")
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
                        if cursor < self._compacted_rv:  # events owed are gone: 410, like
                            out = [{"type": "ERROR", "object": ApiError(  # the watch cache
                                410, f"too old resource version: {cursor} "
                                     f"({self._compacted_rv})").status()}]
                            break
                        out = [e for ev in self._history if ev.rv > cursor and ev.key == res.key
                               for e in self._translate(ev, match)]
                        cursor = max(cursor, self._rv)
                        now = time.monotonic()
                        if out:
                            break
                        if now >= deadline or now >= next_bookmark:
                            finished, bookmark_due = now >= deadline, bookmarks
                            break
                        if h.client_gone():  # notice hang-ups while idle: watch_count stays true
                            raise ConnectionResetError
                        self._lock.wait(min(deadline, next_bookmark, now + 0.2) - now)
                if bookmark_due:  # lets the client resume from here (periodically, at timeout)
                    h.write_chunk(json.dumps({"type": "BOOKMARK", "object": {
                        "kind": res.kind, "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(cursor)}}}).encode() + b"\n")
                    next_bookmark = time.monotonic() + self.bookmark_interval
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive like the real server; watches are chunked
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK
    api: KubeApiServer

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.api._serve(self)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def send_json(self, code: int, payload: Obj) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
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
