"""Who may act: leadership from a lock, kept only while renewals keep succeeding.

`is_leader()` is computed from the time of the last successful renewal, not from a flag a thread
sets: if the renewing call hangs, leadership still lapses after `renew_deadline`, which is shorter
than the lease duration others wait, so two replicas never act at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from autoscaler.config.daemon import LeaderElectionSettings


def lease_valid(renewed_at: float | None, renew_deadline: float, now: float) -> bool:
    """Whether a holder may act: its last renewal (when that attempt began, on its own
    monotonic clock) is less than the renew deadline old. The fence's rule (fencing.py)."""
    return renewed_at is not None and now - renewed_at < renew_deadline


class LeaderLock(Protocol):
    identity: str
    holder: str | None

    def try_acquire_or_renew(self) -> bool: ...

    def release(self) -> bool: ...


class Leadership(Protocol):
    def is_leader(self) -> bool: ...

    def step(self) -> None: ...

    def release(self) -> None: ...


class AlwaysLeader:
    """Leader election off (standalone mode, dry run, or disabled): this process acts alone."""

    def is_leader(self) -> bool:
        return True

    def step(self) -> None:
        pass

    def release(self) -> None:
        pass


class LeaderElector:
    def __init__(
        self,
        lock: LeaderLock,
        settings: LeaderElectionSettings,
        logger: Any,
        on_change: Callable[[bool], None],
        on_error: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = lock
        self._renew_deadline = settings.renew_deadline.total_seconds()
        self._retry_period = settings.retry_period.total_seconds()
        self._logger = logger
        self._on_change = on_change  # called with the new state whenever it flips
        self._on_error = on_error
        self._clock = clock
        self._renewed_at: float | None = None
        self._was_leader = False
        self._guard = threading.Lock()  # step() and release() never interleave
        self._released = False  # after release, a late step must not take the Lease again

    @property
    def renewed_at(self) -> float | None:
        """When the last renewal that landed began (our clock); None: not leading."""
        return self._renewed_at

    def is_leader(self) -> bool:
        return lease_valid(self._renewed_at, self._renew_deadline, self._clock())

    def step(self) -> None:
        """One acquire-or-renew attempt; call every retry period."""
        with self._guard:
            if self._released:
                return
            started, outcome = self._clock(), "renewed"
            try:
                if self._lock.try_acquire_or_renew():
                    self._renewed(started)
                elif self._lock.holder and self._lock.holder != self._lock.identity:
                    # someone else holds it now (we were paused, or partitioned): stop acting at
                    # once, not when our own deadline runs out
                    self._renewed_at, outcome = None, "held by another"
                else:
                    outcome = "not taken"  # a 409: a write of ours or another's came between
            except Exception as exc:  # API down: leadership lapses by the deadline, we retry
                self._on_error()
                self._logger.warning("lease_error", error=f"{type(exc).__name__}: {exc}")
                outcome = "error"
            self._slow_step(started, outcome)
            self._publish()

    def _slow_step(self, started: float, outcome: str) -> None:
        """A step longer than the retry period says so: the leader's renewals are what keeps its
        fence open, and at 2,000 nodes they lapsed (20 s) with no error to show why."""
        took = self._clock() - started
        if took > self._retry_period:
            self._logger.warning(
                "lease_step_slow", took_s=round(took, 3), outcome=outcome, holder=self._lock.holder
            )

    def _renewed(self, started: float) -> None:
        """A renewal landed. Its attempt's start, not its end, is when the lease was valid from.
        One that comes after the fence had closed (no renewal within the renew deadline: a slow
        API server, or a stalled process) was a lapse that no step saw: it is logged, with how
        long writes were refused and how long this renewal took."""
        before, self._renewed_at = self._renewed_at, started
        if before is None:
            return
        closed = started - (before + self._renew_deadline)
        if closed > 0:
            self._logger.warning(
                "lease_lapsed",
                identity=self._lock.identity,
                writes_refused_s=round(closed + (self._clock() - started), 3),
                renewal_took_s=round(self._clock() - started, 3),
                since_last_renewal_s=round(started - before, 3),
            )

    def release(self) -> None:
        """Step down and free the Lease so a standby takes over at once."""
        with self._guard:
            was = self._renewed_at is not None
            self._renewed_at, self._released = None, True
            if was:
                try:
                    if self._lock.release():
                        self._logger.info("lease_released", identity=self._lock.identity)
                except Exception as exc:  # it will expire on its own
                    self._on_error()
                    self._logger.warning(
                        "lease_release_failed", error=f"{type(exc).__name__}: {exc}"
                    )
            self._publish(quiet=True)

    def _publish(self, quiet: bool = False) -> None:
        leader = self.is_leader()
        if leader == self._was_leader:
            return
        self._was_leader = leader
        if leader:
            self._logger.info("leader_elected", identity=self._lock.identity)
        elif not quiet:  # lost, not given up
            self._logger.warning(
                "leader_lost", identity=self._lock.identity, holder=self._lock.holder
            )
        self._on_change(leader)
