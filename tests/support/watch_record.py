"""The record `support.invariants.check` replays, read from a real kube-apiserver's own watches.

The emulator keeps every event it emits (`RecordingServer`); a real server keeps no such record,
so this watches the kinds the invariants read (Nodes of the run's pool, and in its namespace
Pods, TrainingJobs, ScaleIns, ScaleOuts and the daemon's Lease) directly, as the admin, not
through the fault proxy, and keeps every event with the monotonic time it arrived. Every kind is
stored in one etcd, so resourceVersions are its revisions: one commit order across kinds. The
record is replayed in that order, each event's time the latest arrival so far (a watch that
delivered later does not move an event before one committed earlier).

Writes: the fault proxy keeps every write it forwarded with the revision the server committed it
at (`FaultProxy.writes`); the Lease holder at a write is the holder of the latest Lease event
committed before it (or, for a write that committed nothing, the last one that had arrived when
it left the proxy). `reclaimed`: the pods the harness killed as the spot reclaim, by uid.

A watch of the recorder that ends is resumed from its last revision; one that cannot be (410)
leaves a gap, which `record()` refuses to replay. `caught_up()` says whether every object a
consistent list returns now is in the record as the list has it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from . import raw_api
from .faults import FaultProxy
from .invariants import AGENT, Event, Write

Obj = dict[str, Any]
ET = "/apis/kai.alibabacloud.com/v1alpha1/namespaces/{ns}"


@dataclass(frozen=True)
class _Kind:
    kind: str
    path: str
    selector: str = ""


class WatchRecorder:
    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        node_selector: str,
        lease: tuple[str, str],
        proxy: FaultProxy | None = None,
    ) -> None:
        self.api, self.namespace, self.lease, self.proxy = api, namespace, lease, proxy
        ns = namespace
        self.kinds = (
            _Kind("Node", "/api/v1/nodes", node_selector),
            _Kind("Pod", f"/api/v1/namespaces/{ns}/pods"),
            _Kind("TrainingJob", ET.format(ns=ns) + "/trainingjobs"),
            _Kind("ScaleIn", ET.format(ns=ns) + "/scaleins"),
            _Kind("ScaleOut", ET.format(ns=ns) + "/scaleouts"),
            _Kind(
                "Lease",
                f"/apis/coordination.k8s.io/v1/namespaces/{lease[1]}/leases",
                "",
            ),
        )
        self.reclaimed: set[str] = set()  # uids of pods the spot reclaim killed
        self.gaps: list[str] = []  # watches that could not resume: the record is incomplete
        self._events: list[tuple[int, float, float, str, str, Obj]] = []  # rv, t, wall, ...
        self._leases: list[tuple[int, float, str | None]] = []  # rv, arrival, holder
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._responses: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    # --- running ----------------------------------------------------------------------------
    def start(self) -> WatchRecorder:
        """List each kind (what exists is recorded as ADDED), then watch it from there."""
        for k in self.kinds:
            rv = self._list(k)
            thread = threading.Thread(target=self._watch, args=(k, rv), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            responses = list(self._responses.values())
        for response in responses:
            with contextlib.suppress(Exception):  # a stream that may be gone already
                response.shutdown()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> WatchRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _list(self, k: _Kind) -> str:
        query = [("labelSelector", k.selector)] if k.selector else []
        listed = json.loads(raw_api.send(self.api, "GET", k.path, query=query).data)
        for item in listed.get("items") or ():
            item.setdefault("kind", k.kind)
            self._keep(k.kind, "ADDED", item)
        return str(listed["metadata"]["resourceVersion"])

    def _watch(self, k: _Kind, rv: str) -> None:
        while not self._stop.is_set():
            query: list[tuple[str, Any]] = [
                ("watch", "true"),
                ("resourceVersion", rv),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", 240),
            ]
            if k.selector:
                query.append(("labelSelector", k.selector))
            try:
                response = raw_api.send(self.api, "GET", k.path, query=query, timeout=300)
            except ApiException as exc:
                if self._stop.is_set():
                    return
                self._gap(k, f"watch from {rv}: {exc.status} {exc.reason}")
                return
            except Exception:  # noqa: BLE001 - a refused connection at the end: resume
                if self._stop.wait(0.1):
                    return
                continue
            with self._lock:
                self._responses[k.kind] = response
            try:
                rv = self._read(k, response, rv)
            except Exception:  # noqa: BLE001 - a broken stream: resume from where it was
                pass
            finally:
                with self._lock:
                    self._responses.pop(k.kind, None)
                response.release_conn()
            if rv == "":
                return

    def _read(self, k: _Kind, response: Any, rv: str) -> str:
        """Events until the stream ends; the revision to resume from ('' after a gap)."""
        buffer = b""
        for chunk in response.stream(65536, decode_content=True):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    self._gap(k, f"watch from {rv}: {obj.get('message')}")
                    return ""
                rv = str(obj["metadata"]["resourceVersion"])
                if event["type"] != "BOOKMARK":
                    obj.setdefault("kind", k.kind)
                    self._keep(k.kind, event["type"], obj)
        return rv

    def _keep(self, kind: str, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        t, wall = time.monotonic(), time.time()
        with self._lock:
            if kind == "Lease":
                if obj["metadata"]["name"] == self.lease[0]:
                    holder = (obj.get("spec") or {}).get("holderIdentity")
                    self._leases.append((rv, t, None if type_ == "DELETED" else holder))
                return
            self._events.append((rv, t, wall, type_, kind, obj))

    def _gap(self, k: _Kind, why: str) -> None:
        with self._lock:
            self.gaps.append(f"{k.kind}: {why}")

    # --- reading ----------------------------------------------------------------------------
    def holder(self) -> str | None:
        """The Lease's holder as the last Lease event committed says."""
        with self._lock:
            latest = max(self._leases, default=None)
        return latest[2] if latest else None

    def record(self) -> tuple[list[Event], set[str], list[Write]]:
        """What `check` replays: the events in commit order, the reclaimed pods, the writes."""
        with self._lock:
            assert not self.gaps, f"the record has gaps: {self.gaps}"
            raw = sorted(self._events, key=lambda e: e[0])
            leases = sorted(self._leases)
            reclaimed = set(self.reclaimed)
        events, latest = [], float("-inf")
        for _, t, wall, type_, kind, obj in raw:
            latest = max(latest, t)
            events.append(Event(latest, wall, type_, kind, obj))
        writes = []
        for w in list(self.proxy.writes) if self.proxy else ():
            if not w.agent.startswith(AGENT) or "/leases" in w.path:
                continue
            if 400 <= w.status < 500:  # refused (the leader fence's 403 among them): not written
                continue
            if w.rv is not None:  # the holder of the last Lease event committed before it
                before = [h for rv, _, h in leases if rv < w.rv]
            else:  # nothing committed: the holder when it left the proxy, as far as known
                before = [h for _, at, h in sorted(leases, key=lambda x: x[1]) if at <= w.t]
            holder = before[-1] if before else None
            writes.append(Write(w.t, w.agent[len(AGENT) :], w.method, w.path, holder))
        return events, reclaimed, writes

    def caught_up(self) -> bool:
        """Every object of every kind is in the record as a consistent list has it now, and
        none the record holds is missing from the list."""
        for k in self.kinds:
            if k.kind == "Lease":
                continue
            query = [("labelSelector", k.selector)] if k.selector else []
            listed = json.loads(raw_api.send(self.api, "GET", k.path, query=query).data)
            want = {
                o["metadata"]["uid"]: o["metadata"]["resourceVersion"]
                for o in listed.get("items") or ()
            }
            if self._held(k.kind) != want:
                return False
        return True

    def _held(self, kind: str) -> dict[str, str]:
        held: dict[str, str] = {}
        with self._lock:
            for _, _, _, type_, k, obj in sorted(self._events, key=lambda e: e[0]):
                if k != kind:
                    continue
                uid = obj["metadata"]["uid"]
                if type_ == "DELETED":
                    held.pop(uid, None)
                else:
                    held[uid] = str(obj["metadata"]["resourceVersion"])
        return held

    def wait_caught_up(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.caught_up():
            if time.monotonic() > deadline:
                raise AssertionError(f"the watch record did not catch up within {timeout} s")
            time.sleep(0.1)
