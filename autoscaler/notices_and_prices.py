"""Where notice sources and price feeds meet the observer: thread-safe, no client libraries.

Cloud sources (SQS, ECS polling, webhooks) `post` notices to the board and `wake` the daemon; the
observer folds `active()` into each snapshot. Because a notice read from a queue is deleted there,
the daemon also persists it on its Node (autoscaler.annotations.NOTICE_ANNOTATION).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from autoscaler.core.model import Notice


@dataclass(frozen=True)
class NoticeWake:
    """A wake that may carry a notice: a source's notice, or a Node's change in the watch cache
    (taints, cordons, the node agent's annotation). The loop takes the fast path for these
    first; any other wake is plain text."""

    what: str

    def __str__(self) -> str:
        return self.what


WakeReason = str | NoticeWake  # says why, for the log; a NoticeWake also says "maybe a notice"
Wake = Callable[[WakeReason], None]  # ask the daemon for a reconcile pass now


def notice_wake(notice: Notice) -> NoticeWake:
    return NoticeWake(f"{notice.source}: {notice.kind.value} on {notice.node}")


def may_be_notice(reason: WakeReason) -> bool:
    return isinstance(reason, NoticeWake)


class NoticeBoard:
    """Active notices, deduplicated by (source, id): a redelivered message is not a new notice."""

    def __init__(self, ttl: timedelta = timedelta(minutes=15)) -> None:
        self._lock = threading.Lock()
        self._notices: dict[tuple[str, str], Notice] = {}
        self._ttl = ttl  # how long a notice without a deadline stays active

    def post(self, notice: Notice) -> bool:
        """Record a notice; True if it is new (act on it), False for a duplicate."""
        key = (notice.source, notice.id)
        with self._lock:
            if key in self._notices:
                return False
            self._notices[key] = notice
            return True

    def withdraw(self, source: str, notice_id: str) -> bool:
        with self._lock:
            return self._notices.pop((source, notice_id), None) is not None

    def active(self, now: datetime) -> tuple[Notice, ...]:
        """Notices still in force; expired ones are dropped (node gone, or the risk passed)."""
        with self._lock:
            for key, n in list(self._notices.items()):
                end = n.deadline + self._ttl if n.deadline else (n.received_at or now) + self._ttl
                if end < now:
                    del self._notices[key]
            return tuple(self._notices.values())


class PriceBook:
    """Live spot prices per hour by (instance type, zone); zone '' is the type's cheapest known."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prices: dict[tuple[str, str], float] = {}
        self.updated_at: datetime | None = None

    def update(self, prices: dict[tuple[str, str], float], now: datetime) -> None:
        with self._lock:
            self._prices.update(prices)
            for (itype, _), price in prices.items():
                best = self._prices.get((itype, ""))
                self._prices[(itype, "")] = price if best is None else min(best, price)
            self.updated_at = now

    def spot_price(self, instance_type: str, zone: str = "") -> float | None:
        with self._lock:
            return self._prices.get((instance_type, zone), self._prices.get((instance_type, "")))
