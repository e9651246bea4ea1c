"""GCE's metadata server: preemption and host maintenance, the first long-polled.

- `instance/preempted`: `TRUE` once the VM is being preempted, else `FALSE`; a Spot or preemptible
  VM is powered off 30 s later. Read with a hanging GET (`wait_for_change=true&last_etag=<ETag we
  hold>&timeout_sec=N`): the server answers at once when the value differs from that ETag, else
  when it changes, else after N seconds with the same value.
- `instance/maintenance-event`: `NONE`, `MIGRATE_ON_HOST_MAINTENANCE` (live migration: the VM
  stays, so no notice) or `TERMINATE_ON_HOST_MAINTENANCE` (VMs that cannot migrate, e.g. with
  GPUs: stopped 60 s later). Read with a plain GET right after each hanging one.

Every request carries `Metadata-Flavor: Google`, without which the server refuses it. GCE gives no
time with either value: the deadline counts from when the agent first saw it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from urllib.parse import urlencode

from autoscaler.adapters.nodeagent.metadata import (
    TIMEOUT_S,
    MetadataError,
    Reply,
    answers,
    notice,
    request,
)
from autoscaler.core.model import Notice, NoticeKind

GCE_METADATA_URL = "http://169.254.169.254"  # as Google's clients: no DNS needed
_V1 = "/computeMetadata/v1"
_FLAVOR = {"Metadata-Flavor": "Google"}
PREEMPTION_LEAD = timedelta(seconds=30)
MAINTENANCE_LEAD = timedelta(seconds=60)
DEFAULT_WAIT = timedelta(seconds=1)  # the hanging GET's timeout, and so the poll interval
# SHUTDOWN_ON_HOST_MAINTENANCE: the name in Google's own maintenance sample (python-docs-samples
# compute/metadata/main.py); any other value is not documented and is reported as an error.
_TERMINATING = frozenset({"TERMINATE_ON_HOST_MAINTENANCE", "SHUTDOWN_ON_HOST_MAINTENANCE"})
_STAYING = frozenset({"NONE", "MIGRATE_ON_HOST_MAINTENANCE"})


class GceMetadata:
    SOURCE = "gce-metadata"

    def __init__(self, base_url: str = GCE_METADATA_URL, wait: timedelta = DEFAULT_WAIT) -> None:
        self._base = base_url.rstrip("/") + _V1
        # each poll hangs up to `wait`, so the agent starts the next one at once: a preemption is
        # seen the moment it happens, maintenance within `wait`
        self.interval = wait
        self._wait_s = max(1, math.ceil(wait.total_seconds()))  # timeout_sec is whole seconds
        self._etag: str | None = None  # of `preempted`, as last read
        self._first_seen: dict[str, datetime] = {}

    def available(self) -> bool:
        reply = answers(self._base + "/instance/id", _FLAVOR)
        return (
            reply is not None
            and reply.status == 200
            and reply.headers.get("Metadata-Flavor") == "Google"
        )

    def notices(self, node: str, now: datetime) -> list[Notice]:
        preempted, etag = self._preempted()
        event = self._maintenance_event()
        found: list[tuple[str, NoticeKind, timedelta]] = []
        if preempted:
            found.append(("preempted", NoticeKind.INTERRUPTION, PREEMPTION_LEAD))
        if event in _TERMINATING:
            found.append((event, NoticeKind.MAINTENANCE, MAINTENANCE_LEAD))
        # only now, with both read: a failed poll leaves the next one to ask again at once
        self._etag = etag
        # a value that went back (FALSE, NONE) forgets its sighting: a later one is a new notice
        self._first_seen = {what: self._first_seen.get(what, now) for what, _, _ in found}
        out: list[Notice] = []
        for what, kind, lead in found:
            seen = self._first_seen[what]
            out.append(notice(node, kind, self.SOURCE, what, seen, now, seen + lead))
        return out

    def _preempted(self) -> tuple[bool, str | None]:
        """The value and its ETag: at once on the first read, else when it differs from ours."""
        url = self._base + "/instance/preempted"
        timeout = TIMEOUT_S
        if self._etag is not None:
            query = {
                "wait_for_change": "true",
                "last_etag": self._etag,
                "timeout_sec": self._wait_s,
            }
            url += "?" + urlencode(query)
            timeout += self._wait_s
        reply = request(url, headers=_FLAVOR, timeout=timeout)
        value = _text("preempted", reply)
        if value not in ("TRUE", "FALSE"):
            raise MetadataError(f"preempted: {value[:40]!r} is neither TRUE nor FALSE")
        return value == "TRUE", reply.headers.get("ETag")

    def _maintenance_event(self) -> str:
        reply = request(self._base + "/instance/maintenance-event", headers=_FLAVOR)
        if reply.status == 404:  # not defined on this server (metadata.go's NotDefinedError)
            return "NONE"
        value = _text("maintenance-event", reply)
        if value not in _TERMINATING | _STAYING:
            raise MetadataError(f"maintenance-event: unknown value {value[:60]!r}")
        return value


def _text(what: str, reply: Reply) -> str:
    if reply.status != 200:
        raise MetadataError(f"{what}: HTTP {reply.status}")
    return reply.body.strip()
