"""EventBridge events (as delivered to SQS) -> per-instance notice events. Pure parsing, no I/O.

Shapes follow the EC2 and AWS Health EventBridge schemas (see shared/reference/spot-signals.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from autoscaler.core.model import NoticeKind
from autoscaler.times import parse_utc

INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
HEALTH = "AWS Health Event"
ITN_LEAD_TIME = timedelta(minutes=2)  # AWS reclaims a spot instance two minutes after the warning
LEAVING_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


class Unparsable(ValueError):
    """The message is not an EventBridge event we can read: count it, log it, delete it."""


@dataclass(frozen=True, slots=True)
class InstanceEvent:
    event_id: str  # the EventBridge id: a redelivered message repeats it
    instance_id: str
    kind: NoticeKind
    time: datetime  # when the event happened
    deadline: datetime | None
    detail_type: str

    @property
    def notice_id(self) -> str:
        # One Health event can name several instances; each needs its own board entry.
        return f"{self.event_id}/{self.instance_id}"


def parse_message(body: str) -> list[InstanceEvent]:
    """The instance events in one SQS message body; [] for a valid event we do not act on."""
    try:
        event = json.loads(body)
    except ValueError as exc:
        raise Unparsable(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise Unparsable("not a JSON object")
    detail_type = _str(event, "detail-type")
    event_id = _str(event, "id")
    time = _iso_time(_str(event, "time"))
    detail = event.get("detail")
    if not isinstance(detail, dict):
        raise Unparsable("no detail object")

    if detail_type == INTERRUPTION:
        return [
            InstanceEvent(
                event_id,
                _instance(detail),
                NoticeKind.INTERRUPTION,
                time,
                time + ITN_LEAD_TIME,
                detail_type,
            )
        ]
    if detail_type == REBALANCE:
        return [
            InstanceEvent(
                event_id, _instance(detail), NoticeKind.REBALANCE, time, None, detail_type
            )
        ]
    if detail_type == STATE_CHANGE:
        if detail.get("state") not in LEAVING_STATES:
            return []  # pending/running: nothing is going away
        return [
            InstanceEvent(
                event_id, _instance(detail), NoticeKind.STATE_CHANGE, time, time, detail_type
            )
        ]
    if detail_type == HEALTH:
        return _health(event, detail, event_id, time)
    return []


def _health(
    event: dict[str, Any], detail: dict[str, Any], event_id: str, time: datetime
) -> list[InstanceEvent]:
    """EC2 scheduled changes (retirement, maintenance) name instances in affectedEntities."""
    if detail.get("service") != "EC2" or detail.get("eventTypeCategory") != "scheduledChange":
        return []
    start = detail.get("startTime")
    deadline = _health_time(start) if isinstance(start, str) else None
    return [
        InstanceEvent(event_id, i, NoticeKind.MAINTENANCE, time, deadline, HEALTH)
        for i in _affected_instances(event, detail)
    ]


def _affected_instances(event: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    """The instance ids a Health event names, sorted, each once."""
    entities = detail.get("affectedEntities") or []
    if not isinstance(entities, list):
        raise Unparsable("affectedEntities is not a list")
    ids = [e.get("entityValue") for e in entities if isinstance(e, dict)]
    if not ids:  # older payloads list the instances only in `resources`
        ids = [r.rsplit("/", 1)[-1] for r in event.get("resources") or [] if isinstance(r, str)]
    return sorted({i for i in ids if isinstance(i, str) and i.startswith("i-")})


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise Unparsable(f"missing {key!r}")
    return value


def _instance(detail: dict[str, Any]) -> str:
    value = detail.get("instance-id")
    if not isinstance(value, str) or not value.startswith("i-"):
        raise Unparsable("detail has no instance-id")
    return value


def _iso_time(value: str) -> datetime:
    parsed = parse_utc(value)
    if parsed is None:
        raise Unparsable(f"bad time {value!r}")
    return parsed


def _health_time(value: str) -> datetime:
    """Health writes RFC 1123 times ("Sat, 05 Jun 2021 15:10:09 GMT"); accept ISO as well."""
    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return _iso_time(value)
