"""Follow one named object: list it, then watch it from the list's resourceVersion.

Level-triggered: every (re)list hands the object as it is (None when missing) to the callback,
then every watch event does. A dropped stream resumes from the last resourceVersion, 410 Gone
re-lists, API errors back off exponentially (0.5 s doubling up to `backoff_max`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from structlog.typing import FilteringBoundLogger

from autoscaler.backoff import Backoff

_FIRST_RETRY = 0.5  # seconds; doubles per failure up to backoff_max

Obj = dict[str, Any]
# The client's list call for one namespace (e.g. CoreV1Api.list_namespaced_pod with the namespace
# bound); called with a field selector and list/watch keyword arguments.
Lister = Callable[..., Any]


class ObjectWatch:
    def __init__(
        self,
        lister: Lister,
        name: str,
        on_object: Callable[[Obj | None], None],
        watch_timeout: timedelta,
        backoff_max: timedelta,
        stop: threading.Event,
        log: FilteringBoundLogger,
    ) -> None:
        self._lister = lister
        self._selector = f"metadata.name={name}"
        self._on_object = on_object
        self._watch_timeout = max(1, int(watch_timeout.total_seconds()))
        self._backoff_max = backoff_max.total_seconds()
        self._stop = stop
        self.log = log

    def run(self) -> None:
        """Until `stop` is set; it is seen at the next event or watch timeout."""
        backoff = Backoff(_FIRST_RETRY, self._backoff_max)
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
                delay = backoff.next_delay()
                self.log.warning("api_error", status=exc.status, reason=exc.reason, retry_in=delay)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                # a dropped stream or an unreachable server: resume from `version` after a pause
                delay = backoff.next_delay()
                self.log.warning(
                    "watch_broken", error=f"{type(exc).__name__}: {exc}", retry_in=delay
                )
            except Exception as exc:  # an odd object must not end the sidecar: log, re-list
                delay = backoff.next_delay()
                self.log.error("watch_failed", error=f"{type(exc).__name__}: {exc}", retry_in=delay)
                version = None
            else:  # the watch timed out as asked: resume at once
                backoff.reset()
                continue
            self._stop.wait(delay)

    def _relist(self) -> str:
        response = self._lister(field_selector=self._selector, _preload_content=False)
        try:
            listing = json.loads(response.data)
        finally:
            response.release_conn()
        version = str(listing["metadata"]["resourceVersion"])  # a malformed list applies nothing
        items = listing.get("items") or []
        if not items:
            self.log.warning("object_not_found")
        self._on_object(items[0] if items else None)
        return version

    def _watch(self, version: str) -> str:
        response = self._lister(
            field_selector=self._selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
            _request_timeout=(10, self._watch_timeout + 30),
        )
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj["metadata"]["resourceVersion"])
                if kind != "BOOKMARK":
                    self._on_object(None if kind == "DELETED" else obj)
                if self._stop.is_set():
                    break
        finally:
            response.close()
            response.release_conn()
        return version
