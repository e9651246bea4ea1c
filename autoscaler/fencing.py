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

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_SENDING = threading.local()  # the fenced write this thread is sending: (fence, what)


def sending_now() -> bool:
    """Whether this thread is sending a fenced write (inside `Fence.sending`)."""
    return getattr(_SENDING, "value", None) is not None


def check_sending() -> None:
    """The fence of the write this thread is sending (Fence.sending), asked again: called by the
    HTTP connection immediately before a request's bytes leave. No-op outside a fenced write."""
    current = getattr(_SENDING, "value", None)
    if current is not None:
        current[0].check(current[1])


class NotLeader(RuntimeError):
    """This replica does not hold a valid lease now: the write was not sent."""


class Stale(RuntimeError):
    """What the write was decided on was confirmed too long ago: it was not sent (decide again)."""


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
        self._until = threading.local()  # this thread's (monotonic deadline, what it rests on)

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

    @contextmanager
    def until(self, deadline: float, rests_on: str) -> Iterator[None]:
        """Writes of this thread inside the block (retries too) go out only before `deadline`
        (time.monotonic()) and must be answered by then: a fact checked on the server (a notice
        still there) holds that long, not through a slow series of retries."""
        self._until.value = (deadline, rests_on)
        try:
            yield
        finally:
            self._until.value = None

    @contextmanager
    def sending(self, what: str) -> Iterator[None]:
        """A write of this thread: checked now, and again as its bytes leave (`check_sending`,
        which the HTTP connection calls): a thread stopped between a check and its send (SIGSTOP,
        a long pause) would otherwise send, when it resumes, on a lease another replica holds by
        then; a request's timeout does not start until it is sent."""
        self.check(what)
        _SENDING.value = (self, what)
        try:
            yield
        finally:
            _SENDING.value = None

    def check(self, what: str) -> None:
        """Raise NotLeader (and so send nothing) unless the lease is valid right now; Stale when
        past this thread's `until`."""
        if not self._may_write():
            raise NotLeader(f"not the leader (lease not valid now): {what} not sent")
        until = getattr(self._until, "value", None)
        if until is not None and time.monotonic() >= until[0]:
            raise Stale(f"{what} not sent: {until[1]} was checked too long ago")

    def timeout(self, default: float) -> float:
        """The total timeout for one write: ours if we have one, never longer than `default`,
        nor past this thread's `until`."""
        out = default if self.write_timeout is None else min(default, self.write_timeout)
        until = getattr(self._until, "value", None)
        return out if until is None else max(0.001, min(out, until[0] - time.monotonic()))
