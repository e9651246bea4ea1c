"""Kubernetes Events on the objects we act on, so `kubectl describe` tells the story.

Best effort and off the write path: `record` only queues; one sender thread posts the Events
(client-go's broadcaster does the same), so an Event that meets a slow or failing API server
never delays the next drain. A full queue drops the Event with a log line; an Event that cannot
be written is logged and dropped, never failing the action. Fenced like every write, at send
time: a replica whose lease is not valid then sends no Event.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from datetime import UTC, datetime

import structlog
from kubernetes import client

from autoscaler.adapters.kube.client import own_namespace
from autoscaler.adapters.kube.resources import MANAGER, Obj
from autoscaler.fencing import Fence, NotLeader

log = structlog.get_logger()

_QUEUE = 1000  # Events waiting to be sent; past this they are dropped (logged)
_SEND_TIMEOUT = 10.0  # seconds for one Event's request


def _failed(name: str, reason: str, exc: Exception) -> None:
    error = f"{type(exc).__name__}: {getattr(exc, 'status', exc)}"
    log.warning("event_failed", object=name, reason=reason, error=error)


class _Sender:
    """One thread posting queued Events in order; started with the first."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self._core = core
        self._queue: queue.Queue[tuple[str, Obj, Fence]] = queue.Queue(_QUEUE)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, namespace: str, body: Obj, fence: Fence) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="events", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((namespace, body, fence))
        except queue.Full:
            log.warning(
                "event_dropped",
                reason=body["reason"],
                why="queue full",
                object=body["involvedObject"]["name"],
            )

    def flush(self, timeout: float) -> bool:
        """Wait until every queued Event was sent or given up; False on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def drop_waiting(self) -> int:
        """Take every Event not yet begun off the queue unsent; how many."""
        dropped = 0
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return dropped
            self._queue.task_done()
            dropped += 1

    def _run(self) -> None:
        while True:
            namespace, body, fence = self._queue.get()
            try:
                self._send(namespace, body, fence)
            finally:
                self._queue.task_done()

    def _send(self, namespace: str, body: Obj, fence: Fence) -> None:
        name, reason = body["involvedObject"]["name"], body["reason"]
        try:
            with fence.sending(f"event {reason} on {name}"):
                self._core.create_namespaced_event(
                    namespace, body, _request_timeout=fence.timeout(_SEND_TIMEOUT)
                )
        except NotLeader as exc:
            log.info("event_not_sent", object=name, reason=reason, why=str(exc))
        except Exception as exc:
            _failed(name, reason, exc)


class EventRecorder:
    def __init__(
        self,
        api_client: client.ApiClient,
        component: str = MANAGER,
        host: str = "",
        fence: Fence | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._sender = _Sender(self._core)
        self._component = component
        self._host = host  # e.g. the pod name of the leader
        self.fence = fence or Fence.open()

    def unfenced(self) -> EventRecorder:
        """The same recorder without the fence (a standby's notice Events, see persist_notice)."""
        twin = EventRecorder.__new__(EventRecorder)
        twin._core, twin._sender = self._core, self._sender
        twin._component, twin._host = self._component, self._host
        twin.fence = Fence.open()
        return twin

    def about_self(self, reason: str, message: str, now: datetime) -> None:
        """A Warning on this replica's own Pod ($POD_NAME, $POD_NAMESPACE from the downward API),
        for what concerns the daemon rather than a job (a rejected config file). Unfenced: every
        replica reads its own config. The Pod is read for its uid, which `kubectl describe`
        matches Events on. Outside a pod (no $POD_NAME) there is nothing to attach it to."""
        name = os.environ.get("POD_NAME")
        if not name:
            log.debug("event_not_sent", reason=reason, why="POD_NAME not set")
            return
        try:
            pod = self._core.read_namespaced_pod(
                name, own_namespace(), _preload_content=False, _request_timeout=_SEND_TIMEOUT
            )
            obj = json.loads(pod.data)
        except Exception as exc:
            _failed(name, reason, exc)
            return
        self.unfenced().record(obj, reason, message, now, warning=True)

    def flush(self, timeout: float = 5.0) -> bool:
        """Send what is queued (`--once`, tests); False if time ran out."""
        return self._sender.flush(timeout)

    def close(self, timeout: float) -> None:
        """At shutdown, before the Lease goes: what is queued gets `timeout` s to be sent, the
        rest is dropped and one line says how many (sent after the release, each would be
        refused NotLeader with a line of its own: 278-661 lines at the end of each 2,000-node
        benchmark run, whose Events queue behind a slow server)."""
        if self.flush(timeout):
            return
        if dropped := self._sender.drop_waiting():
            log.info("events_dropped", events=dropped, why="the daemon is stopping")

    def record(
        self, obj: Obj, reason: str, message: str, now: datetime, warning: bool = False
    ) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        # Events of cluster-scoped objects (Nodes) live in "default", as kubectl expects.
        namespace = meta.get("namespace") or "default"
        stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", ""),
                "name": name,
                "namespace": meta.get("namespace", ""),
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._sender.put(namespace, body, self.fence)
