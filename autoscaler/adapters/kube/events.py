"""Kubernetes Events on the objects we act on, so `kubectl describe` tells the story.

Best effort: an Event that cannot be written is logged and dropped, never failing the action.
Fenced like every write: a replica whose lease is not valid now sends no Event.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import structlog
from kubernetes import client

from autoscaler.adapters.kube.resources import MANAGER, Obj
from autoscaler.fencing import Fence, NotLeader

log = structlog.get_logger()


class EventRecorder:
    def __init__(
        self,
        api_client: client.ApiClient,
        component: str = MANAGER,
        host: str = "",
        fence: Fence | None = None,
    ) -> None:
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._component = component
        self._host = host  # e.g. the pod name of the leader
        self.fence = fence or Fence.open()

    def unfenced(self) -> EventRecorder:
        """The same recorder without the fence (a standby's notice Events, see persist_notice)."""
        return EventRecorder(self._api_client, self._component, self._host)

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
        try:
            self.fence.check(f"event {reason} on {name}")
            self._core.create_namespaced_event(
                namespace, body, _request_timeout=self.fence.timeout(10.0)
            )
        except NotLeader as exc:
            log.info("event_not_sent", object=name, reason=reason, why=str(exc))
        except Exception as exc:
            log.warning("event_failed", object=name, reason=reason,
                        error=f"{type(exc).__name__}: {getattr(exc, 'status', exc)}")
