"""The launcher-pod sidecar: keep the drain file equal to the job's drained-hosts annotation.

The central daemon records a job's drained hosts as `DRAINED_ANNOTATION` on its TrainingJob; this
watch turns each change into the drain file `discover_hosts.sh` reads, within a watch event's
latency. List, then watch from the list's resourceVersion; resume after a dropped stream, re-list
after 410 Gone, back off exponentially after API errors. Every (re)list rewrites the file from the
object as it is (level-triggered); a missing job or annotation means nothing is drained.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from autoscaler.adapters.discovery.drainfile import write_drain_file
from autoscaler.signals import DRAINED_ANNOTATION, decode_drained

GROUP, VERSION, PLURAL = "kai.alibabacloud.com", "v1alpha1", "trainingjobs"  # et-operator
_FIRST_RETRY = 0.5  # seconds; doubles per failure up to backoff_max

log = structlog.get_logger("autoscaler.discovery.sidecar")


@dataclass(frozen=True, slots=True)
class JobRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> JobRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace, name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """In-cluster credentials (the launcher's service account) unless a kubeconfig is given."""
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


class DrainSidecar:
    def __init__(
        self,
        api: client.ApiClient,
        job: JobRef,
        drain_path: Path,
        watch_timeout: timedelta,
        backoff_max: timedelta,
    ) -> None:
        self._objects = client.CustomObjectsApi(api)
        self.job = job
        self.drain_path = drain_path
        self._watch_timeout = max(1, int(watch_timeout.total_seconds()))
        self._backoff_max = backoff_max.total_seconds()
        self._stop = threading.Event()
        self.log = log.bind(job=str(job), drain_file=str(drain_path))

    def stop(self) -> None:
        """Ask `run` to return; it does at the next event or watch timeout."""
        self._stop.set()

    def run(self) -> None:
        delay = _FIRST_RETRY
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                version = self._watch(version)
            except ApiException as exc:
                if exc.status == 410:  # our resourceVersion was compacted away: start over
                    self.log.info("watch_expired", resource_version=version)
                    version = None
                    continue
                self.log.warning("api_error", status=exc.status, reason=exc.reason, retry_in=delay)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                # a dropped stream or an unreachable server: resume from `version` after a pause
                self.log.warning(
                    "watch_broken", error=f"{type(exc).__name__}: {exc}", retry_in=delay
                )
            else:  # the watch timed out as asked: resume at once
                delay = _FIRST_RETRY
                continue
            self._stop.wait(delay)
            delay = min(delay * 2, self._backoff_max)

    def _relist(self) -> str:
        listing = self._list()
        items = listing.get("items") or []
        if not items:
            self.log.warning("job_not_found")
        self._apply(items[0] if items else None)
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        response = self._list(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False, _request_timeout=(10, self._watch_timeout + 30),
        )
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj["metadata"]["resourceVersion"])
                if kind != "BOOKMARK":
                    self._apply(None if kind == "DELETED" else obj)
                if self._stop.is_set():
                    break
        finally:
            response.close()
            response.release_conn()
        return version

    def _list(self, **kwargs: Any) -> Any:
        return self._objects.list_namespaced_custom_object(
            GROUP, VERSION, self.job.namespace, PLURAL,
            field_selector=f"metadata.name={self.job.name}", **kwargs,
        )

    def _apply(self, job: dict[str, Any] | None) -> None:
        annotations = (job or {}).get("metadata", {}).get("annotations") or {}
        drained = decode_drained(annotations.get(DRAINED_ANNOTATION))
        if write_drain_file(self.drain_path, drained):
            self.log.info("drain_file_written", hosts=sorted(drained))
