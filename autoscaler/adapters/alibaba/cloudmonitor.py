"""CloudMonitor `Instance:PreemptibleInstanceInterruption` events: parsing both shapes, and polling
DescribeSystemEventAttribute (the webhook in `webhook.py` receives the same events pushed).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aliyunsdkcore.client import AcsClient
from aliyunsdkcore.request import CommonRequest

from autoscaler.adapters.alibaba.client import call, shared_client
from autoscaler.adapters.alibaba.interruptions import InterruptionReporter
from autoscaler.adapters.cloud_sources import Clock, NodeIndex, utcnow
from autoscaler.adapters.polling import run_every
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config
from autoscaler.notices_and_prices import NoticeBoard, Wake

EVENT_NAME = "Instance:PreemptibleInstanceInterruption"
_PAGE = 100
_MAX_PAGES = 100


class BadEvent(ValueError):
    """Not a readable CloudMonitor event: count it, log it, go on."""


@dataclass(frozen=True, slots=True)
class Interruption:
    instance_id: str
    time: datetime | None  # when CloudMonitor raised it, if the event says


def parse_event(event: Any) -> Interruption | None:
    """An interruption from a CloudMonitor event, or None for another event.

    Two shapes: DescribeSystemEventAttribute's (`Name`, `Content` a JSON string, `Time` epoch ms)
    and the URL callback body (`name`, `content` an object, `resourceId`, `eventTime`/`time`).
    """
    if not isinstance(event, dict):
        raise BadEvent("not a JSON object")
    fields = {k[:1].lower() + k[1:]: v for k, v in event.items() if isinstance(k, str)}
    if fields.get("name") != EVENT_NAME:
        return None
    content = fields.get("content") or {}
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            raise BadEvent("content is not JSON") from None
    if not isinstance(content, dict):
        raise BadEvent("content is not an object")
    instance_id = content.get("instanceId")
    if not instance_id:  # resourceId: acs:ecs:<region>:<uid>:instance/<id>
        resource = fields.get("resourceId")
        instance_id = resource.rpartition("instance/")[2] if isinstance(resource, str) else None
    if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
        raise BadEvent("no instance id")
    return Interruption(instance_id, _event_time(fields.get("time", fields.get("eventTime"))))


def _event_time(value: Any) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000, UTC)  # epoch milliseconds
    if isinstance(value, str):
        for parse in (
            datetime.fromisoformat,
            # the callback's compact form: 20190409T121826.922+0800
            lambda v: datetime.strptime(v, "%Y%m%dT%H%M%S.%f%z"),
        ):
            try:
                parsed = parse(value)
            except ValueError:
                continue
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        if value.isdigit():
            return _event_time(int(value))
    return None


class CloudMonitorPoller:
    """`poll_once()` reads the last `lookback` of interruption events; the board drops repeats."""

    def __init__(
        self,
        client: AcsClient,
        board: NoticeBoard,
        wake: Wake,
        nodes: NodeIndex,
        *,
        interval: timedelta = timedelta(seconds=15),
        lookback: timedelta = timedelta(minutes=10),
        clock: Clock = utcnow,
    ) -> None:
        self._client = client
        self._interval = interval
        self._lookback = lookback
        self._clock = clock
        self._reporter = InterruptionReporter(board, wake, nodes, via="cloudmonitor")
        self.counts = self._reporter.counts

    def poll_once(self) -> int:
        """Returns how many interruption events the window holds. API errors propagate."""
        now = self._clock()
        found = 0
        for raw in self._events(now - self._lookback, now):
            try:
                event = parse_event(raw)
            except BadEvent as exc:
                self.counts["unparsable"] += 1
                self._reporter.log.warning("event_unparsable", error=str(exc), entry=str(raw)[:200])
                continue
            if event is None:
                continue
            found += 1
            self._reporter.report(event.instance_id, event.time or now, now)
        self.counts["polls"] += 1
        return found

    def run(self, stop: threading.Event) -> None:
        run_every(self.poll_once, stop, self._interval.total_seconds(), "alibaba-cloudmonitor")

    def _events(self, start: datetime, end: datetime) -> Iterator[Any]:
        for page in range(1, _MAX_PAGES + 1):
            # aliyunsdkcore ships no CloudMonitor package; a CommonRequest signs the same way.
            request = CommonRequest(
                version="2019-01-01", action_name="DescribeSystemEventAttribute", product="Cms"
            )
            request.set_method("POST")
            for key, value in (
                ("Product", "ECS"),
                ("EventType", "StatusNotification"),
                ("Name", EVENT_NAME),
                ("StartTime", str(int(start.timestamp() * 1000))),
                ("EndTime", str(int(end.timestamp() * 1000))),
                ("PageNumber", str(page)),
                ("PageSize", str(_PAGE)),
            ):
                request.add_query_param(key, value)
            reply = call(self._client, request)
            if str(reply.get("Success", "true")).lower() != "true":
                raise RuntimeError(
                    f"DescribeSystemEventAttribute: {reply.get('Code')} {reply.get('Message')}"
                )
            events = (reply.get("SystemEvents") or {}).get("SystemEvent") or []
            yield from events
            if len(events) < _PAGE:
                return


def build(config: Config, ctx: SourceContext) -> CloudMonitorPoller:
    """The `alibaba-cloudmonitor` source (adapters/sources.py)."""
    client, nodes = shared_client(config, ctx)
    monitor = config.alibaba.cloudmonitor
    return CloudMonitorPoller(
        client,
        ctx.board,
        ctx.wake,
        nodes,
        interval=monitor.poll_interval,
        lookback=monitor.lookback,
    )
