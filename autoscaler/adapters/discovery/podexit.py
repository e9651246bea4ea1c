"""`--exit-with-container NAME`: end the sidecar once the launcher's NAME container terminated.

Where the sidecar cannot be a native sidecar (et-operator drops the field, or Kubernetes < 1.29),
it runs as a regular container, and a pod completes only when every container has: without this
the launcher pod would stay Running after horovodrun ended and et-operator would never mark the
job Succeeded or Failed. The sidecar watches its own pod (downward API: POD_NAME, POD_NAMESPACE)
and stops when `status.containerStatuses[NAME].state.terminated` is set.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import structlog
from kubernetes import client

from autoscaler.adapters.discovery.watch import ObjectWatch
from autoscaler.adapters.kube.resources import Obj

log = structlog.get_logger("autoscaler.discovery.podexit")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


def terminated(pod: Obj | None, container: str) -> bool:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return any(
        s.get("name") == container and (s.get("state") or {}).get("terminated") for s in statuses
    )


class ContainerExit:
    def __init__(
        self,
        api: client.ApiClient,
        ref: ContainerRef,
        watch_timeout: timedelta,
        backoff_max: timedelta,
        stop: threading.Event,
    ) -> None:
        self.ref = ref
        self._stop = stop
        self.log = log.bind(pod=f"{ref.namespace}/{ref.pod}", container=ref.container)
        lister = partial(client.CoreV1Api(api).list_namespaced_pod, ref.namespace)
        self._watch = ObjectWatch(
            lister, ref.pod, self._seen, watch_timeout, backoff_max, stop, self.log
        )

    def run(self) -> None:
        self._watch.run()

    def _seen(self, pod: Obj | None) -> None:
        if terminated(pod, self.ref.container):
            self.log.info("container_terminated")
            self._stop.set()
