"""Fenced writes: no write leaves this replica unless it holds a valid lease at that very moment.

The daemon's leader election decides *whether* we lead; the adapters that write to the cluster
ask a `Fence` immediately before every write attempt (each retry included). Adapters must not
know the daemon, so the fence is a plain object handed to them by the wiring, and bound to the
elector by the daemon once the elector exists.

The bound (docs/kubernetes.md, "Leader election and fencing"): the fence opens only while
`now - renewed_at < renew_deadline` on our own monotonic clock, and every fenced write carries a
total timeout of at most `lease_duration - renew_deadline`, so a write sent at `t` completes (or
is abandoned) by `renewed_at + lease_duration`, before any other replica may take over.
"""

from __future__ import annotations

from collections.abc import Callable


class NotLeader(RuntimeError):
    """This replica does not hold a valid lease now: the write was not sent."""


def _closed() -> bool:
    return False


def _open() -> bool:
    return True


class Fence:
    """Asked before each write. Closed until bound: a write before the daemon decided who leads
    is refused, never sent."""

    def __init__(self, write_timeout: float | None = None) -> None:
        # seconds a fenced write may take in all (connect + send + answer); None: caller's default
        self.write_timeout = write_timeout
        self._may_write: Callable[[], bool] = _closed

    @classmethod
    def open(cls) -> Fence:
        """Always lets writes through: no leader election (standalone, disabled), or a test."""
        fence = cls()
        fence.bind(_open)
        return fence

    def bind(self, may_write: Callable[[], bool]) -> None:
        self._may_write = may_write

    def allows(self) -> bool:
        return self._may_write()

    def check(self, what: str) -> None:
        """Raise NotLeader (and so send nothing) unless the lease is valid right now."""
        if not self._may_write():
            raise NotLeader(f"not the leader (lease not valid now): {what} not sent")

    def timeout(self, default: float) -> float:
        """The total timeout for one write: ours if we have one, never longer than `default`."""
        return default if self.write_timeout is None else min(default, self.write_timeout)
