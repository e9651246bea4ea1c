"""The reconcile worker: one thread runs every pass, so two passes never overlap.

Periodic ticks, watch events, notices, leadership and config changes all just `wake` it. Wake-ups
that arrive while it waits `coalesce` seconds, or while a pass runs, become one (more) pass:
a burst of 50 pod events costs one or two passes, and nothing that happened is missed. A wake
that may carry a notice also goes at once to the notice responder (daemon/responder.py), which
answers it beside the pass; the pass gives way to it.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from autoscaler.backoff import Backoff
from autoscaler.core import PolicySet
from autoscaler.daemon.leader import Leadership
from autoscaler.daemon.metrics import Metrics
from autoscaler.daemon.responder import NoticeResponder
from autoscaler.notices_and_prices import WakeReason, may_be_notice
from autoscaler.reconcile import Reconciler

_SYNC_POLL = 0.2  # seconds between looks at the caches until they have synced
# A full pass gives way to waiting notices for at most this long (seconds, from the first time it
# gave way), then decides and acts, a batch of growth at least per pass: a stream of notices (or
# of Node events, which may be one) must not starve growth, which waits for idle capacity for a
# minute anyway (scale_out.min_idle), nor hold a notice for more than one batch of it.
GIVE_WAY_FOR = 2.0
SETTLE_FOR = 2.0  # seconds the fast path's writes get before the full pass runs anyway
# After a full pass that took d seconds of its thread's CPU the next waits REST_PER_PASS * d: the
# passes' CPU is at most a third of the time. With churn they ran back to back (2,000 nodes:
# ~0.3 s each, 90-130 of the daemon's CPU-s in 300 s) on the cores the API server wanted for the
# notices' writes. CPU, not wall time: a pass waiting for the server (its undrains under API
# faults) takes no core, and resting after it only held the next pass. Nothing a pass decides is
# due within a second (growth waits for a minute of idle GPUs); notices go to the responder,
# which never waits for this.
REST_PER_PASS = 2.0


class WakeSignal:
    """The `Wake` callable handed to caches and sources; thread-safe, never blocks."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reasons: set[WakeReason] = set()
        self._on_notice: Callable[[], None] = lambda: None

    def __call__(self, reason: WakeReason) -> None:
        with self._lock:
            self._reasons.add(reason)
        self._event.set()
        if may_be_notice(reason):
            self._on_notice()

    def route_notices(self, to: Callable[[], None]) -> None:
        """Also tell `to` of every wake that may carry a notice (the responder)."""
        self._on_notice = to

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def pending(self) -> bool:
        """A wake came since the last take."""
        return self._event.is_set()

    def take(self) -> set[WakeReason]:
        """The reasons gathered since the last take; the next wake starts a new batch."""
        with self._lock:
            self._event.clear()
            reasons, self._reasons = self._reasons, set()
        return reasons


class ReconcileLoop:
    def __init__(
        self,
        reconciler: Reconciler,
        wake: WakeSignal,
        leadership: Leadership,
        synced: Callable[[], bool],
        metrics: Metrics,
        logger: Any,
        coalesce: float,
        backoff_max: float,
    ) -> None:
        self.reconciler = reconciler
        self._wake = wake
        self._leadership = leadership
        self._synced = synced
        self._metrics = metrics
        self._logger = logger
        self._coalesce = coalesce
        self._backoff = Backoff(1.0, backoff_max)
        self._stop = threading.Event()
        self._frozen = False
        self._thread: threading.Thread | None = None
        self._pending: PolicySet | None = None
        self.heartbeat = time.monotonic()  # when the loop last came round: /healthz
        self._giving_way_since: float | None = None  # first pass of a streak that gave way
        self._rest_until = 0.0  # time.monotonic() before which no full pass begins
        self.passes = 0  # completed passes (tests and --once read it)
        self._errors_seen = 0  # the reconciler's write failures when the last full pass ended
        self._responder = NoticeResponder(self._react, self._may_react)
        wake.route_notices(self._responder.notify)

    def set_policies(self, policies: PolicySet) -> None:
        """Swap the policies between passes (config reload), then reconcile under them."""
        self._pending = policies
        self._wake("config")

    def start(self) -> None:
        self._responder.start()
        self._thread = threading.Thread(target=self._run, name="reconcile", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Let a running pass finish (actions are not cut in half), then end the thread."""
        self._stop.set()
        self._wake("shutdown")
        started = time.monotonic()
        if self._thread is not None:
            self._thread.join(timeout)
        self._responder.stop(max(0.0, timeout - (time.monotonic() - started)))
        self.reconciler.finish(max(0.0, timeout - (time.monotonic() - started)))

    def run_pass(self, reasons: set[WakeReason]) -> bool:
        """One observe-decide-act pass; False if it failed (logged and counted, never raised)."""
        if (pending := self._pending) is not None:
            self._pending = None
            self.reconciler.policies = pending
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            decisions = self.reconciler.tick(datetime.now(UTC), self._give_way, self._notice_waits)
        except Exception as exc:  # the observer could not see the world: retry after a back-off
            self._metrics.error("reconcile")
            self._logger.error(
                "reconcile_failed",
                wake=_logged(reasons),
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            return False
        finally:
            if not self.reconciler.gave_way:  # a pass cut short is not a pass's duration
                self._metrics.reconcile.observe(time.perf_counter() - started)
        if self.reconciler.gave_way:  # a notice came meanwhile: answer it, then pass again
            if self._giving_way_since is None:
                self._giving_way_since = time.monotonic()
            self._wake("pass gave way to a notice")
            return True
        self._giving_way_since = None
        self._rest_until = time.monotonic() + REST_PER_PASS * (time.thread_time() - cpu)
        self.passes += 1
        # standing objects left over (thousands of budgets at start-up): a few writes at a
        # time while nothing else is waiting, so a notice's pass never queues behind them all
        while not (self.reconciler.kept or self._wake.pending() or self._stop.is_set()):
            self.reconciler.keep_more(datetime.now(UTC))
        self._metrics.decided(decisions)
        self._logger.debug(
            "pass_done",
            wake=_logged(reasons),
            decisions=len(decisions),
            seconds=round(time.perf_counter() - started, 3),
        )
        # failures since the last full pass, the writes behind it and the fast path's included
        errors_before, self._errors_seen = self._errors_seen, self.reconciler.errors
        return self._errors_seen == errors_before

    def finish_writes(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) for the writes still going out behind the passes
        (`--once` lets go of the lease after them); False if one failed."""
        self.reconciler.finish(timeout)
        errors_before, self._errors_seen = self._errors_seen, self.reconciler.errors
        return self._errors_seen == errors_before

    def _give_way(self) -> bool:
        """While the responder answers a notice (it runs only beside the loop's thread;
        `--once` never), for at most GIVE_WAY_FOR from the first time of a streak."""
        if not self._notice_waits():
            return False
        since = self._giving_way_since
        return since is None or time.monotonic() - since < GIVE_WAY_FOR

    def _notice_waits(self) -> bool:
        """The responder has a notice to answer (it runs only while the loop's thread does)."""
        return self._responder.busy()

    def _may_react(self) -> bool:
        return self._synced() and self._leadership.is_leader()

    def _react(self) -> None:
        """The notice fast path (the responder's thread): the noticed jobs' drains and
        ScaleIns. A failure is logged and left to the next pass, which decides the same
        departures again."""
        try:
            decisions = self.reconciler.react(datetime.now(UTC))
        except Exception as exc:
            self._metrics.error("reconcile")
            self._logger.error("react_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self._metrics.acted(decisions)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            # gather a burst of events into one pass, and rest after the last (REST_PER_PASS);
            # after a pass gave way its notice has waited enough. (Not skipped for every notice:
            # a Node event may be one, and passes without the wait cost more than the wait on a
            # busy control plane: measured.)
            if self._stop.wait(self._pause()):
                return
            reasons = self._wake.take()
            self.heartbeat = time.monotonic()
            # deciding on a half-listed cluster would be wrong: look again soon
            if not self._synced():
                self._logger.debug("pass_skipped", why="caches not synced", wake=_logged(reasons))
                if not self._stop.wait(_SYNC_POLL):
                    self._wake("sync")
                continue
            if not self._frozen:
                # The synced cache is long-lived: keep it out of the collector's full passes
                # (a 0.2 s pause per full collection at 5,000 nodes, measured).
                gc.freeze()
                self._frozen = True
            if not self._leadership.is_leader():
                self._logger.debug(
                    "pass_skipped", why="standby: not the leader", wake=_logged(reasons)
                )
                continue
            self._yield_to_notices()
            if self.run_pass(reasons):
                self._backoff.reset()
            else:
                self._back_off()

    def _pause(self) -> float:
        """Seconds before the pass a wake asks for."""
        if self._giving_way_since is not None:
            return 0.0
        return max(self._coalesce, self._rest_until - time.monotonic())

    def _yield_to_notices(self) -> None:
        """Before a pass: while the responder answers notices, and then while their ScaleIns go
        out behind their drains. A full pass beside them would slow them (one interpreter: a
        pass is CPU-bound, they wait for it; measured), but notices hold the pass back for at
        most GIVE_WAY_FOR from the first time of a streak: growth must not starve."""
        while self._give_way():
            if self._giving_way_since is None:
                self._giving_way_since = time.monotonic()
            self._responder.wait_idle(GIVE_WAY_FOR - (time.monotonic() - self._giving_way_since))
        self.reconciler.settle(self._stop.is_set, SETTLE_FOR)

    def _back_off(self) -> None:
        """After a failed pass: the next one after the back-off's delay (notices meanwhile are
        the responder's). Wakes wait: a write behind the pass that failed wakes the loop as it
        ends, and would otherwise retry it in a hot loop."""
        delay = self._backoff.next_delay()
        self._logger.info("backing_off", seconds=delay, failures=self._backoff.failures)
        if not self._stop.wait(delay):
            self._wake("retry after failure")


def _logged(reasons: set[WakeReason]) -> list[str]:
    return sorted(map(str, reasons))
