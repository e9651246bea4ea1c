"""Where notice sources and price feeds meet the observer: thread-safe, no client libraries.

Cloud sources (SQS, ECS polling, webhooks) `post` notices to the board and wake the daemon; the
observer folds `active()` into each snapshot. Because a notice read from a queue is deleted there,
the daemon also persists it on the Node as the `NOTICE_ANNOTATION` (the node agent writes the same
annotation), so a restarted daemon rebuilds it from the cluster: level-triggered.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from autoscaler.core.model import Notice, NoticeKind

NOTICE_ANNOTATION = "spot-autoscaler.io/notice"
# On a TrainingJob/AITrainingJob: the hosts hidden from its Horovod discovery (a JSON list). The
# daemon writes it; the launcher's sidecar turns it into the drain file the discovery script reads.
DRAINED_ANNOTATION = "spot-autoscaler.io/drained-hosts"
# On the same job: the hosts the launcher runs Horovod worker processes on, i.e. the hosts in
# Horovod's current rank assignment (a JSON list). The discovery sidecar writes it; the daemon
# drops a kept host only once a replacement is in it.
ASSIGNED_ANNOTATION = "spot-autoscaler.io/assigned-hosts"

Wake = Callable[[str], None]  # ask the daemon for a reconcile pass now; the argument says why


def encode_notice(notice: Notice) -> str:
    return json.dumps(
        {
            "kind": notice.kind.value,
            "source": notice.source,
            "id": notice.id,
            "deadline": notice.deadline.isoformat() if notice.deadline else None,
            "received_at": notice.received_at.isoformat() if notice.received_at else None,
        },
        sort_keys=True,
    )


def decode_notice(node: str, value: str) -> Notice | None:
    """The notice an annotation holds, or None if it is not one of ours (never raises)."""
    try:
        data = json.loads(value)
        return Notice(
            node=node,
            kind=NoticeKind(data["kind"]),
            source=str(data.get("source", "annotation")),
            id=str(data.get("id", "")),
            deadline=datetime.fromisoformat(data["deadline"]) if data.get("deadline") else None,
            received_at=datetime.fromisoformat(data["received_at"])
            if data.get("received_at")
            else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


# A Node holds one persisted notice: a harder one replaces a softer one, never the reverse.
_HARDNESS = {
    NoticeKind.REBALANCE: 0,
    NoticeKind.MAINTENANCE: 1,
    NoticeKind.INTERRUPTION: 2,
    NoticeKind.STATE_CHANGE: 2,
}


def hardest(notices: list[Notice]) -> Notice | None:
    return max(notices, key=lambda n: _HARDNESS[n.kind], default=None)


def supersedes(new: Notice, held: Notice | None) -> bool:
    """Whether `new` should replace the notice a Node holds: not the same one, not softer."""
    if held is None:
        return True
    return (held.source, held.id) != (new.source, new.id) and _HARDNESS[new.kind] >= _HARDNESS[
        held.kind
    ]


def encode_drained(hosts: frozenset[str] | set[str]) -> str:
    return json.dumps(sorted(hosts))


def _host_list(value: str | None) -> frozenset[str] | None:
    """A JSON list of host names; None when absent or malformed (never raises)."""
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    return frozenset(h for h in data if isinstance(h, str)) if isinstance(data, list) else None


def decode_drained(value: str | None) -> frozenset[str]:
    """Drained hosts from the annotation; a malformed value counts as none."""
    return _host_list(value) or frozenset()


encode_assigned = encode_drained


def decode_assigned(value: str | None) -> frozenset[str] | None:
    """Assigned hosts from the annotation; None = not reported (no sidecar, or malformed)."""
    return _host_list(value)


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
