"""Objects the adapter cannot read are skipped, never the whole pass.

One malformed TrainingJob (say `etReplicaSpecs` given as a list) used to fail every snapshot, so no
other job was drained either. Now the object is left out of the snapshot, logged once per
resourceVersion, counted (`objects_rejected_total{kind,reason}`), and told once as a Warning Event
on the object by the leader (Events are writes).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import structlog

from autoscaler.adapters.kube.resources import Obj, key_of

log = structlog.get_logger()
T = TypeVar("T")

# what reading a malformed object raises (wrong types, missing keys, bad numbers)
_MOST_UNTOLD = 1000
MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError)


def _version(obj: Obj) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str((meta or {}).get("resourceVersion") or "") if isinstance(meta, dict) else ""


class Rejections:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str, str]] = set()  # (kind, key, resourceVersion)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._untold: list[tuple[Obj, str]] = []  # (object, message) for a Warning Event

    def read(self, kind: str, obj: Obj, derive: Callable[[Obj], T]) -> T | None:
        """`derive(obj)`, or None (and the object rejected) if the object is malformed."""
        try:
            return derive(obj)
        except MALFORMED as exc:
            self.reject(kind, obj, type(exc).__name__, str(exc))
            return None

    def reject(self, kind: str, obj: Obj, reason: str, detail: str) -> None:
        try:
            key = key_of(obj)
        except MALFORMED:
            key = "?"
        seen = (kind, key, _version(obj))
        with self._lock:
            if seen in self._seen:
                return
            self._seen.add(seen)
            self._counts[(kind, reason)] += 1
            message = f"{kind} {key} skipped: {reason}: {detail}"[:500]
            if len(self._untold) < _MOST_UNTOLD:  # no leader to tell (dry run): stay bounded
                self._untold.append((obj, message))
        log.warning(
            "object_rejected",
            kind=kind,
            object=key,
            reason=reason,
            detail=detail[:300],
            resource_version=seen[2],
        )

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def untold(self) -> list[tuple[Obj, str]]:
        """Rejections not yet told as Events; each is returned once."""
        with self._lock:
            out, self._untold = self._untold, []
        return out
