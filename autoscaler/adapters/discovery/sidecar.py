"""The launcher-pod sidecar: the drain file in, the assigned hosts out, and an end with the pod.

- The central daemon records a job's drained hosts as `DRAINED_ANNOTATION` on its TrainingJob;
  a watch of the job turns each change into the drain file `discover_hosts.sh` reads, within a
  watch event's latency. Every (re)list rewrites the file from the object as it is
  (level-triggered); a missing job or annotation means nothing is drained.
- `discover_hosts.sh` writes the hosts that run a Horovod worker (in its rank assignment) to the
  assigned-hosts file; polled once a second, a change becomes `ASSIGNED_ANNOTATION` on the job.
- With an `exit_with` container (`--exit-with-container`), a watch of the own pod ends the
  sidecar once that container has terminated, so the pod can complete.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import structlog
from kubernetes import client

from autoscaler.adapters.discovery.assigned import AssignedPublisher
from autoscaler.adapters.discovery.drainfile import write_drain_file
from autoscaler.adapters.discovery.podexit import ContainerExit, ContainerRef
from autoscaler.adapters.discovery.watch import ObjectWatch
from autoscaler.adapters.kube.kinds.jobref import JobRef
from autoscaler.adapters.kube.resources import Obj
from autoscaler.annotations import DRAINED_ANNOTATION, decode_drained

__all__ = ["ContainerRef", "DrainSidecar", "JobRef", "run_sidecar"]

POLL_SECONDS = 1.0  # the assigned-hosts file changes at most once per discovery call (~1 s)

log = structlog.get_logger("autoscaler.discovery.sidecar")


class DrainSidecar:
    """Keeps the drain file equal to the job's drained-hosts annotation."""

    def __init__(
        self,
        api: client.ApiClient,
        job: JobRef,
        drain_path: Path,
        watch_timeout: timedelta,
        backoff_max: timedelta,
        stop: threading.Event | None = None,
    ) -> None:
        self.job = job
        self.drain_path = drain_path
        self._stop = stop or threading.Event()
        self.log = log.bind(job=str(job), drain_file=str(drain_path))
        lister = partial(client.CustomObjectsApi(api).list_namespaced_custom_object, *job.path)
        self._watch = ObjectWatch(
            lister, job.name, self._apply, watch_timeout, backoff_max, self._stop, self.log
        )

    def stop(self) -> None:
        """Ask `run` to return; it does at the next event or watch timeout."""
        self._stop.set()

    def run(self) -> None:
        self._watch.run()

    def _apply(self, job: Obj | None) -> None:
        annotations = (job or {}).get("metadata", {}).get("annotations") or {}
        drained = decode_drained(annotations.get(DRAINED_ANNOTATION))
        if write_drain_file(self.drain_path, drained):
            self.log.info("drain_file_written", hosts=sorted(drained))


def run_sidecar(
    api: client.ApiClient,
    job: JobRef,
    drain_path: Path,
    assigned_path: Path | None,
    exit_with: ContainerRef | None,
    watch_timeout: timedelta,
    backoff_max: timedelta,
    stop: threading.Event | None = None,
    poll: float = POLL_SECONDS,
) -> None:
    """Run every part; return once `exit_with` terminated (or `stop` is set), else never."""
    stop = stop or threading.Event()
    parts: list[Callable[[], None]] = [
        DrainSidecar(api, job, drain_path, watch_timeout, backoff_max, stop).run
    ]
    if exit_with is not None:
        parts.append(ContainerExit(api, exit_with, watch_timeout, backoff_max, stop).run)
    for part in parts:  # daemon threads: returning from here ends the process at once
        threading.Thread(target=part, daemon=True).start()
    publisher = AssignedPublisher(api, job, assigned_path) if assigned_path else None
    while not stop.is_set():
        if publisher is not None:
            publisher.poll()
        stop.wait(poll)
