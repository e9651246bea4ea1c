"""The per-node agent: poll the metadata service, report the hardest notice on the Node."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

from autoscaler.adapters.cloud_sources import Clock, utcnow
from autoscaler.adapters.nodeagent.annotator import NodeAnnotator
from autoscaler.adapters.nodeagent.metadata import Metadata
from autoscaler.adapters.polling import run_every
from autoscaler.core.model import Notice
from autoscaler.core.notices import hardest


class NodeAgent:
    def __init__(
        self,
        metadata: Metadata,
        annotator: NodeAnnotator,
        *,
        interval: timedelta = timedelta(seconds=5),  # AWS's advice for instance-action
        clock: Clock = utcnow,
    ) -> None:
        self._metadata = metadata
        self._annotator = annotator
        self._interval = interval
        self._clock = clock
        self._first_seen: dict[tuple[str, str], Notice] = {}
        self.counts: Counter[str] = Counter()

    def poll_once(self) -> Notice | None:
        """One look at the metadata service; the notice now in force on this node, if any."""
        now = self._clock()
        self.counts["polls"] += 1
        # keep the first sighting, so received_at says when the node first heard of it
        notices = [
            self._first_seen.setdefault((n.source, n.id), n)
            for n in self._metadata.notices(self._annotator.node, now)
        ]
        notice = hardest(notices)
        if notice is not None and self._annotator.report(notice):
            self.counts["reported"] += 1
        return notice

    def run(self, stop: threading.Event) -> None:
        run_every(self.poll_once, stop, self._interval.total_seconds(), "node-agent")
