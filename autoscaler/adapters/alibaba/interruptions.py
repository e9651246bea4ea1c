"""One spot reclaim, three ways to hear of it (the Recycling lock, CloudMonitor polled, CloudMonitor
calling us): all post the same notice id, so the board acts on whichever arrives first, once.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import structlog

from autoscaler.adapters.cloud_sources import NodeIndex, post_notice
from autoscaler.core.model import Notice, NoticeKind
from autoscaler.notices_and_prices import NoticeBoard, Wake

SOURCE = "alibaba"
RECLAIM_LEAD_TIME = timedelta(minutes=5)  # a reclaimed spot instance is released ~5 min later


class InterruptionReporter:
    """Maps an interrupted instance to its node and posts the notice; counts what happened."""

    def __init__(self, board: NoticeBoard, wake: Wake, nodes: NodeIndex, via: str) -> None:
        self._board = board
        self._wake = wake
        self._nodes = nodes
        self.counts: Counter[str] = Counter()
        self.log = structlog.get_logger().bind(source=f"{SOURCE}-{via}")

    def report(self, instance_id: str, noticed_at: datetime, now: datetime) -> bool:
        """True if this was news (a new notice was posted)."""
        node = self._nodes.node_for_instance(instance_id)
        if node is None:
            self.counts["unknown_instance"] += 1
            self.log.info("instance_unknown", instance=instance_id)
            return False
        notice = Notice(
            node=node,
            kind=NoticeKind.INTERRUPTION,
            source=SOURCE,
            id=f"interruption/{instance_id}",
            deadline=noticed_at + RECLAIM_LEAD_TIME,
            received_at=now,
        )
        return post_notice(self._board, self._wake, notice, self.counts, self.log)
