"""Azure's Scheduled Events (IMDS): Preempt and Terminate events for this VM, acknowledged once the
node is drained.

`GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true` lists the events of
every VM in this VM's availability set or scale-set placement group, so only those whose
`Resources` name this VM (`/metadata/instance/compute/name`) count. `Preempt` (a Spot VM evicted:
at least 30 s, best effort) and `Terminate` (the VM deleted: 5-15 min, as the scale set says) are
interruptions due at `NotBefore`; Freeze, Reboot and Redeploy leave the VM in place. An event
goes `Scheduled` -> `Started` (NotBefore then blank) and vanishes when done or cancelled.

Acknowledging (`POST {"StartRequests": [{"EventId": ...}]}`) lets an event start before NotBefore,
for every VM it names. So it is sent only when that can cut nothing short: NotBefore has passed,
or the event names this VM alone and the node has been drained (pods.NodePods). Unacknowledged,
the event starts at NotBefore anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import structlog

from autoscaler.adapters.nodeagent.metadata import (
    TIMEOUT_S,
    MetadataError,
    answers,
    parse_json,
    request,
)
from autoscaler.core.model import Notice, NoticeKind

AZURE_METADATA_URL = "http://169.254.169.254"
_EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
_VM_NAME = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
_HEADERS = {"Metadata": "true"}  # without it: 400
# "expect a delayed response in your first call of up to two minutes": the service starts then
_FIRST_CALL_TIMEOUT_S = 130.0
_LEAVING = frozenset({"Preempt", "Terminate"})


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    status: str  # Scheduled | Started
    resources: tuple[str, ...]
    not_before: datetime | None  # None once Started


class AzureScheduledEvents:
    SOURCE = "azure-scheduled-events"
    # Microsoft advises at least once a second (a Preempt may give only 30 s); twice a second
    # keeps notice -> drain within 1 s (there is no long poll), well inside IMDS's limit of 5
    # requests a second per VM (instance-metadata-service.md, "Rate limiting")
    interval = timedelta(seconds=0.5)

    def __init__(self, base_url: str = AZURE_METADATA_URL) -> None:
        self._base = base_url.rstrip("/")
        self._vm: str | None = None
        self._started = False  # the first call, which switches the service on, has answered
        self._ours: list[Event] = []  # this VM's leaving events, as last read
        self._acknowledged: set[str] = set()
        self._log = structlog.get_logger().bind(source="node-agent")

    def available(self) -> bool:
        reply = answers(self._base + _VM_NAME, _HEADERS)
        if reply is None or reply.status != 200 or not reply.body.strip():
            return False
        self._vm = reply.body.strip()
        return True

    def notices(self, node: str, now: datetime) -> list[Notice]:
        vm = self._vm or self._vm_name()
        timeout = TIMEOUT_S if self._started else _FIRST_CALL_TIMEOUT_S
        reply = request(self._base + _EVENTS, headers=_HEADERS, timeout=timeout)
        if reply.status != 200:
            raise MetadataError(f"scheduledevents: HTTP {reply.status}")
        self._started = True
        events = parse_events(reply.body)
        self._ours = [e for e in events if e.type in _LEAVING and vm in e.resources]
        self._acknowledged &= {e.id for e in self._ours}  # the others are done or cancelled
        return [
            Notice(
                node=node,
                kind=NoticeKind.INTERRUPTION,
                source=self.SOURCE,
                id=f"{e.type}:{e.id}",  # stable as it goes Started (the agent keeps the first)
                deadline=now if e.status == "Started" else e.not_before,
                received_at=now,
            )
            for e in self._ours
        ]

    def acknowledge(self, now: datetime, drained: Callable[[], bool]) -> None:
        """Start this VM's scheduled events that can no longer cut anything short."""
        drained_now: bool | None = None  # asked at most once per poll
        for event in self._ours:
            if event.status != "Scheduled" or event.id in self._acknowledged:
                continue
            if event.not_before is not None and now >= event.not_before:
                self._start(event, "deadline_passed")
            elif event.resources == (self._vm,):
                if drained_now is None:
                    drained_now = drained()
                if drained_now:
                    self._start(event, "node_drained")

    def _start(self, event: Event, why: str) -> None:
        body = json.dumps({"StartRequests": [{"EventId": event.id}]}).encode()
        headers = _HEADERS | {"Content-Type": "application/json"}
        reply = request(self._base + _EVENTS, method="POST", headers=headers, data=body)
        if reply.status != 200:
            raise MetadataError(f"scheduledevents acknowledgement: HTTP {reply.status}")
        self._acknowledged.add(event.id)
        self._log.info("event_acknowledged", event_id=event.id, event_type=event.type, why=why)

    def _vm_name(self) -> str:
        reply = request(self._base + _VM_NAME, headers=_HEADERS)
        if reply.status != 200 or not reply.body.strip():
            raise MetadataError(f"compute/name: HTTP {reply.status}")
        self._vm = reply.body.strip()
        return self._vm


def parse_events(body: str) -> list[Event]:
    """Every event in a scheduledevents document; MetadataError if it is not one."""
    events = parse_json("scheduledevents", body).get("Events")
    if not isinstance(events, list):
        raise MetadataError("scheduledevents: no Events list")
    return [_event(raw) for raw in events]


def _event(raw: object) -> Event:
    if not isinstance(raw, dict):
        raise MetadataError("scheduledevents: an event is not an object")
    fields = [raw.get(k) for k in ("EventId", "EventType", "EventStatus", "NotBefore")]
    resources = raw.get("Resources")
    if not isinstance(resources, list) or not all(isinstance(f, str) for f in fields + resources):
        raise MetadataError(f"scheduledevents: malformed event {str(raw)[:200]}")
    ident, kind, status, not_before = fields
    return Event(
        id=str(ident),
        type=str(kind),
        status=str(status),
        resources=tuple(resources),
        not_before=_rfc1123(str(not_before)),
    )


def _rfc1123(value: str) -> datetime | None:
    """`Mon, 19 Sep 2016 18:29:47 GMT`; blank (the event has started) is None."""
    if not value.strip():
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        raise MetadataError(f"scheduledevents: NotBefore {value[:40]!r} is not a time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
