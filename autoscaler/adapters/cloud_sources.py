"""What every cloud notice source and price feed shares: the node index seam, posting a notice
and waking the daemon, and keeping a PriceBook fresh. No SDK imports (Alibaba uses this too).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import structlog

from autoscaler.adapters.polling import run_every
from autoscaler.core.model import Notice
from autoscaler.notices_and_prices import NoticeBoard, PriceBook, Wake, notice_wake

Clock = Callable[[], datetime]
# (instance type, zone) -> spot price per hour, for the given instance types at `now`
FetchPrices = Callable[[Sequence[str], datetime], dict[tuple[str, str], float]]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Source(Protocol):
    """A notice source or price feed: runs until `stop` is set (the daemon's supervisor restarts
    it with a back-off if it raises)."""

    def run(self, stop: threading.Event) -> None: ...


NamedSource = tuple[str, Source]  # the name is the errors_total component label, e.g. "aws-sqs"


class NodeIndex(Protocol):
    """Which Kubernetes node runs a cloud instance (the observer reads it from spec.providerID)."""

    def node_for_instance(self, instance_id: str) -> str | None: ...


def post_notice(
    board: NoticeBoard, wake: Wake, notice: Notice, counts: Counter[str], log: Any
) -> bool:
    """Post to the board; wake the daemon only for a new notice (a duplicate is acted on once)."""
    fields = {
        "node": notice.node,
        "kind": notice.kind.value,
        "notice_id": notice.id,
        "deadline": notice.deadline.isoformat() if notice.deadline else None,
    }
    if not board.post(notice):
        counts["duplicate"] += 1
        log.debug("notice_duplicate", **fields)  # polls see the same notice every pass
        return False
    counts["posted"] += 1
    log.info("notice_posted", **fields)
    wake(notice_wake(notice))
    return True


class SpotPriceFeed:
    """Refreshes a PriceBook from a cloud's spot price API for the instance types in the cluster."""

    def __init__(
        self,
        name: str,
        fetch: FetchPrices,
        book: PriceBook,
        instance_types: Callable[[], Iterable[str]],
        every: timedelta,
        clock: Clock = utcnow,
    ) -> None:
        self.name = name
        self._fetch = fetch
        self._book = book
        self._instance_types = instance_types
        self._every = every
        self._clock = clock
        self._due: datetime | None = None
        self.counts: Counter[str] = Counter()
        self._log = structlog.get_logger().bind(source=name)

    def refresh(self, now: datetime) -> bool:
        """Fetch and store prices if due; True if the book changed. API errors propagate."""
        if self._due is not None and now < self._due:
            return False
        types = sorted({t for t in self._instance_types() if t})
        if not types:
            return False  # nothing to price yet: try again on the next call
        prices = self._fetch(types, now)
        self._book.update(prices, now)
        self._due = now + self._every
        self.counts["refreshes"] += 1
        self._log.info("spot_prices_refreshed", instance_types=types, prices=len(prices))
        return True

    def run(self, stop: threading.Event) -> None:
        # Check often (cheap) so types that appear later are priced soon; fetch only when due.
        check = min(self._every, timedelta(seconds=30)).total_seconds()
        run_every(lambda: self.refresh(self._clock()), stop, check, self.name)
