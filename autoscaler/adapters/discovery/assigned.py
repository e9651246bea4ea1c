"""Publish the hosts Horovod runs workers on, for the daemon: the discovery script's assigned-hosts
file (one host per line) becomes the job's `ASSIGNED_ANNOTATION`, a merge patch per change.

The file is polled (stat, then read on change): it is tiny and written about once a second at
most, by `discover_hosts.sh` (atomically). A missing file publishes nothing: no worker was seen
yet, and the annotation's absence tells the daemon exactly that.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.discovery.hostlines import valid_host
from autoscaler.adapters.kube.kinds.jobref import JobRef
from autoscaler.annotations import ASSIGNED_ANNOTATION, encode_assigned

MERGE_PATCH = "application/merge-patch+json"

log = structlog.get_logger("autoscaler.discovery.assigned")


class AssignedPublisher:
    def __init__(self, api: client.ApiClient, job: JobRef, path: Path) -> None:
        self._objects = client.CustomObjectsApi(api)
        self.job = job
        self.path = path
        self._seen: tuple[int, int, int] | None = None  # the file's (inode, mtime, size) read last
        self._hosts: frozenset[str] | None = None  # what the file says
        self._published: frozenset[str] | None = None
        self._failing = False
        self.log = log.bind(job=str(job), assigned_file=str(path))

    def poll(self) -> bool:
        """Publish the file's hosts if they changed; True when a patch was made."""
        self._read()
        if self._hosts is None or self._hosts == self._published:
            return False
        patch = {"metadata": {"annotations": {ASSIGNED_ANNOTATION: encode_assigned(self._hosts)}}}
        try:
            self._objects.patch_namespaced_custom_object(
                *self.job.path, self.job.name, patch, _content_type=MERGE_PATCH
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            if not self._failing:  # once per outage: the next poll retries
                error = f"{type(exc).__name__}: {exc}"
                self.log.warning("assigned_hosts_not_published", error=error)
            self._failing = True
            return False
        self._failing = False
        self._published = self._hosts
        self.log.info("assigned_hosts_published", hosts=sorted(self._hosts))
        return True

    def _read(self) -> None:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._seen:
                return
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            return
        self._seen = seen
        lines = (line.strip() for line in text.splitlines())
        # as the daemon names hosts: the pod, i.e. the first DNS label (mpi-operator's discovery
        # prints `<pod>.<job>.<namespace>.svc`; et-operator's, the pod name itself)
        self._hosts = frozenset(h.split(".", 1)[0] for h in lines if valid_host(h))
