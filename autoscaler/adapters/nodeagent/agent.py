"""The per-node agent: poll the metadata service, report the hardest notice on the Node."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from autoscaler.adapters.cloud_sources import Clock, utcnow
from autoscaler.adapters.nodeagent.annotator import NodeAnnotator
from autoscaler.adapters.nodeagent.metadata import Acknowledging, Metadata, MetadataError
from autoscaler.adapters.polling import run_every
from autoscaler.backoff import Backoff
from autoscaler.core.model import Notice
from autoscaler.core.notices import hardest

# GCP and Azure give 30 s of notice: a metadata service that was down for a minute must be
# asked again within seconds of coming back. It is on the host; retrying that often costs nothing.
_BACKOFF_CAP_S = 5.0


def _never_drained() -> bool:
    return False


class NodeAgent:
    def __init__(
        self,
        metadata: Metadata,
        annotator: NodeAnnotator,
        *,
        interval: timedelta | None = None,  # default: the metadata service's own
        drained: Callable[[], bool] = _never_drained,  # the node's work is gone (pods.NodePods)
        clock: Clock = utcnow,
    ) -> None:
        self._metadata = metadata
        self._annotator = annotator
        self._interval = interval or metadata.interval
        self._drained = drained
        self._clock = clock
        self._first_seen: dict[tuple[str, str], Notice] = {}
        self.counts: Counter[str] = Counter()

    def poll_once(self) -> Notice | None:
        """One look at the metadata service; the notice now in force on this node, if any."""
        now = self._clock()
        self.counts["polls"] += 1
        try:
            found = self._metadata.notices(self._annotator.node, now)
        except MetadataError:
            self.counts["metadata_errors"] += 1  # logged and retried by run()
            raise
        # keep the first sighting, so received_at says when the node first heard of it
        notice = hardest([self._first_seen.setdefault((n.source, n.id), n) for n in found])
        if notice is not None and self._annotator.report(notice):
            self.counts["reported"] += 1
        if isinstance(self._metadata, Acknowledging):  # after the report: the daemon hears first
            self._metadata.acknowledge(now, self._drained)
        return notice

    def run(self, stop: threading.Event) -> None:
        """Start a poll every interval. A poll that itself waits (GCE's long poll) is followed by
        the next at once; an error is retried after a back-off, but never sooner than that."""
        period = self._interval.total_seconds()
        next_start = time.monotonic()

        def paced_poll() -> None:
            nonlocal next_start
            if stop.wait(max(0.0, next_start - time.monotonic())):
                return
            next_start = time.monotonic() + period
            self.poll_once()

        backoff = Backoff(cap=_BACKOFF_CAP_S, jitter=True)
        run_every(paced_poll, stop, 0.0, "node-agent", backoff)
