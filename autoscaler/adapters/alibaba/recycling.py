"""Poll DescribeInstances for spot instances locked as Recycling (reclaimed, released in ~5 min)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from aliyunsdkcore.client import AcsClient
from aliyunsdkecs.request.v20140526.DescribeInstancesRequest import DescribeInstancesRequest

from autoscaler.adapters.alibaba.client import call, shared_client
from autoscaler.adapters.alibaba.interruptions import InterruptionReporter
from autoscaler.adapters.alibaba.nodes import EcsNodes
from autoscaler.adapters.cloud_sources import Clock, utcnow
from autoscaler.adapters.polling import run_every
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config
from autoscaler.notices_and_prices import NoticeBoard, Wake

_PAGE = 100  # DescribeInstances' MaxResults ceiling
_MAX_PAGES = 1000  # a token that never ends is a server bug, not a reason to loop forever


def is_recycling(instance: dict[str, Any]) -> bool:
    locks = (instance.get("OperationLocks") or {}).get("LockReason") or []
    return any(
        isinstance(lock, dict) and str(lock.get("LockReason", "")).lower() == "recycling"
        for lock in locks
    )


class RecyclingPoller:
    """`poll_once()` lists the region's spot instances and reports the Recycling ones."""

    def __init__(
        self,
        client: AcsClient,
        board: NoticeBoard,
        wake: Wake,
        nodes: EcsNodes,
        *,
        interval: timedelta = timedelta(seconds=15),
        clock: Clock = utcnow,
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._interval = interval
        self._clock = clock
        self._reporter = InterruptionReporter(board, wake, nodes, via="ecs")
        self.counts = self._reporter.counts

    def poll_once(self) -> int:
        """One full listing; returns how many spot instances are Recycling. API errors propagate."""
        now = self._clock()
        spot = [i for i in self._instances() if i.get("SpotStrategy", "NoSpot") != "NoSpot"]
        self._nodes.remember(spot)
        recycling = [i for i in spot if is_recycling(i)]
        for instance in recycling:
            self._reporter.report(instance["InstanceId"], now, now)
        self.counts["polls"] += 1
        return len(recycling)

    def run(self, stop: threading.Event) -> None:
        run_every(self.poll_once, stop, self._interval.total_seconds(), "alibaba-ecs")

    def _instances(self) -> Iterator[dict[str, Any]]:
        token: str | None = None
        for _ in range(_MAX_PAGES):
            request = DescribeInstancesRequest()
            request.set_MaxResults(_PAGE)
            if token:
                request.set_NextToken(token)
            reply = call(self._client, request)
            for instance in (reply.get("Instances") or {}).get("Instance") or []:
                if isinstance(instance, dict) and isinstance(instance.get("InstanceId"), str):
                    yield instance
                else:
                    self.counts["unparsable"] += 1
                    self._reporter.log.warning("instance_unparsable", entry=str(instance)[:200])
            next_token = reply.get("NextToken")
            if not next_token or next_token == token:
                return
            token = next_token


def build(config: Config, ctx: SourceContext) -> RecyclingPoller:
    """The `alibaba-ecs` source (adapters/sources.py)."""
    client, nodes = shared_client(config, ctx)
    return RecyclingPoller(
        client, ctx.board, ctx.wake, nodes, interval=config.alibaba.poll_interval
    )
