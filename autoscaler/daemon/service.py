"""The daemon: a mode's parts (observer, actuator, caches, sources, lock) around one reconcile loop.

apscheduler drives the clockwork (periodic ticks, config reload, lease renewal); the reconcile
worker does the work. `start`/`stop` run it as a service; `run_once` is `--once`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from autoscaler.adapters.cloud_sources import NamedSource
from autoscaler.config import Config
from autoscaler.daemon.endpoints import Endpoints
from autoscaler.daemon.instrument import GuardedActuator, MeasuredObserver, NoticeTracker
from autoscaler.daemon.leader import AlwaysLeader, LeaderElector, LeaderLock, Leadership
from autoscaler.daemon.loop import ReconcileLoop, WakeSignal
from autoscaler.daemon.metrics import Metrics
from autoscaler.daemon.reload import ConfigReloader
from autoscaler.daemon.renewer import RenewerProcess
from autoscaler.daemon.supervise import Supervisor
from autoscaler.fencing import Fence
from autoscaler.notices_and_prices import NoticeWake
from autoscaler.reconcile import Observer, Reconciler
from autoscaler.shutdown import wait_until_stopped
from autoscaler.writes import Actuator

_STOP_TIMEOUT = 10.0  # seconds a part gets to finish on shutdown (a pass's actions)
# seconds the sources get, counted from the start of the shutdown: an SQS long poll under way
# lasts up to 20 s (aws.sqs.wait_time's bound) and must end here, not be left to SQS
# (adapters/aws/queue.py `run`); within deploy/'s terminationGracePeriodSeconds (30)
_SOURCES_STOP_TIMEOUT = 22.0


@dataclass
class Parts:
    """What a mode (kubernetes, standalone) plugs into the daemon; built by `wiring`."""

    observer: Observer
    actuator: Actuator  # already the dry-run one under --dry-run
    synced: Callable[[], bool] = lambda: True  # caches hold the whole world
    # operator backends and whether the API server serves what each needs ({} = not applicable)
    backends: Callable[[], Mapping[str, bool]] = dict
    # objects skipped as malformed so far, by (kind, reason)
    rejected: Callable[[], Mapping[tuple[str, str], int]] = dict
    start: Callable[[], None] = lambda: None  # begin watches
    stop: Callable[[], None] = lambda: None
    # a Warning about this replica itself (reason, message): an Event on its own Pod
    announce: Callable[[str, str], None] = lambda reason, message: None
    # drains applied at once (one per job); 1 = one after another
    write_workers: int = 1
    # finish what a pass left queued (Events) while the Lease is still ours; before `stop`
    settle: Callable[[], object] = lambda: None
    sources: list[NamedSource] = field(default_factory=list)  # notice and price feeds
    # makes the leader lock where the renewals run (pickled into the renewer's process unless
    # leader_election.renew_in is "thread"); None: this mode runs alone (no leader election)
    lock: Callable[[], LeaderLock] | None = None
    # asked by the mode's writers before each write; the daemon binds it to the leadership
    fence: Fence | None = None
    watch_errors: Callable[[], int] = lambda: 0  # failed lists/watches, retried by the caches
    signal_failures: Callable[[], int] = lambda: 0  # pods the checkpoint signal did not reach
    # what a mode takes live from a reloaded config besides the policies (e.g. prices)
    reconfigure: Callable[[Config], None] = lambda _: None
    # why the outside system cannot be reached after trying for so many seconds; None: it can
    reachable: Callable[[float], str | None] = lambda within: None


class Daemon:
    def __init__(
        self,
        config: Config,
        parts: Parts,
        wake: WakeSignal,
        logger: Any,
        decision_logger: Any,
        config_path: Path | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.settings = config.daemon
        self.parts = parts
        self.wake = wake
        self.metrics = metrics or Metrics()
        self._logger = logger
        self.leadership = self._leadership(parts.lock)
        if parts.fence is not None:  # from now on, a write goes out only while we lead
            parts.fence.bind(self.leadership.is_leader)
        self.metrics.track_leader(self.leadership.is_leader)
        self.metrics.count_errors_from("watch", parts.watch_errors)
        self.metrics.count_errors_from("checkpoint_signal", parts.signal_failures)
        self.metrics.track_backends(parts.backends)
        self.metrics.count_rejected(parts.rejected)
        tracker = NoticeTracker(self.metrics)
        self.reconciler = Reconciler(
            MeasuredObserver(parts.observer, self.metrics, tracker),
            GuardedActuator(parts.actuator, self.leadership.is_leader, self.metrics, tracker),
            config.policy_set,
            decision_logger,
            write_workers=parts.write_workers,
            on_written=lambda: wake("a ScaleIn written behind its drains"),
            # a departure that could not land while its check held, after its own back-off
            # (writes.Writes._retry_later): the responder answers it again
            on_expired=lambda: wake(NoticeWake("a departure's server check expired")),
            on_step=lambda step, seconds: self.metrics.fast_path.labels(step).observe(seconds),
        )
        self.metrics.count_errors_from("memo", lambda: self.reconciler.memo_mismatches)
        backoff_max = self.settings.error_backoff_max.total_seconds()
        self.loop = ReconcileLoop(
            self.reconciler,
            wake,
            self.leadership,
            parts.synced,
            self.metrics,
            logger,
            coalesce=self.settings.wake_coalesce.total_seconds(),
            backoff_max=backoff_max,
        )
        self.reloader = (
            ConfigReloader(
                config_path,
                config,
                self._apply_config,
                logger,
                self._config_rejected,
            )
            if config_path is not None
            else None
        )
        if self.reloader is not None:
            self.metrics.track_config(lambda: self.reloader is None or self.reloader.healthy)
        self.supervisor = Supervisor(parts.sources, logger, self.metrics.error, backoff_max)
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.endpoints: Endpoints | None = None
        self._stopped = False

    def _leadership(self, make_lock: Callable[[], LeaderLock] | None) -> Leadership:
        election = self.settings.leader_election
        if make_lock is None or not election.enabled or self.parts.actuator.dry_run:
            return AlwaysLeader()  # a dry run writes nothing, not even the Lease

        def changed(leader: bool) -> None:
            if leader:
                self.wake("leader elected")

        def failed() -> None:
            self.metrics.error("lease")

        if election.renew_in == "thread":
            return LeaderElector(make_lock(), election, self._logger, changed, failed)
        log = (self.settings.log_format, self.settings.log_level)
        return RenewerProcess(make_lock, election, log, self._logger, changed, failed)

    # --- health ------------------------------------------------------------------------------
    def liveness(self) -> str | None:
        stale = time.monotonic() - self.loop.heartbeat
        limit = self.settings.effective_liveness_timeout.total_seconds()
        return (
            None
            if stale < limit
            else f"reconcile loop silent for {stale:.0f}s (limit {limit:.0f}s)"
        )

    def readiness(self) -> str | None:
        # the config is loaded before the daemon exists; a bad reload keeps the old one
        return None if self.parts.synced() else "caches not synced"

    def backends_detail(self) -> str:
        """The /readyz body's second line: which operator backends are live."""
        backends = self.parts.backends()
        if not backends:
            return ""
        words = [f"{b}={'live' if on else 'not-served'}" for b, on in sorted(backends.items())]
        return "backends: " + " ".join(words)

    # --- service -----------------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        self.endpoints = Endpoints(
            s.metrics_bind_address,
            s.metrics_port,
            self.metrics,
            self.liveness,
            self.readiness,
            detail=self.backends_detail,
        )
        self.endpoints.start()
        self.parts.start()
        self.supervisor.start()
        self.loop.start()
        now = datetime.now(UTC)
        self._every("tick", s.tick_interval, lambda: self.wake("tick"), now)
        if self.reloader is not None and s.config_reload_interval > timedelta(0):
            self._every(
                "reload",
                s.config_reload_interval,
                self.reloader.check,
                now + s.config_reload_interval,
            )
        if not isinstance(self.leadership, AlwaysLeader):  # renews, or minds the renewer
            self._every("lease", s.leader_election.retry_period, self.leadership.step, now)
        self.scheduler.start()
        self._logger.info(
            "daemon_started",
            mode=s.mode,
            dry_run=self.parts.actuator.dry_run,
            port=self.endpoints.port,
            leader_election=isinstance(self.leadership, LeaderElector),
            tick_s=s.tick_interval.total_seconds(),
        )

    def _every(
        self, name: str, interval: timedelta, job: Callable[[], object], first: datetime
    ) -> None:
        def guarded() -> None:
            try:
                job()
            except Exception as exc:  # a scheduled job never takes the daemon down
                self.metrics.error(name)
                self._logger.error(
                    "job_failed", job=name, error=f"{type(exc).__name__}: {exc}", exc_info=exc
                )

        self.scheduler.add_job(
            guarded,
            "interval",
            seconds=interval.total_seconds(),
            id=name,
            next_run_time=first,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )

    def _config_rejected(self, problems: list[str]) -> None:
        self.metrics.error("config")
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        self.parts.announce(
            "ConfigRejected",
            f"{self.reloader.path if self.reloader else 'config'}: {problems[0]}{more}; "
            "the previous config stays in force",
        )

    def _apply_config(self, config: Config) -> None:
        self.parts.reconfigure(config)
        self.loop.set_policies(config.policy_set)

    def stop(self) -> None:
        """Stop acting first, then give up the Lease, then stop watching and serving.
        Safe to call twice, and after a start that failed half way."""
        if self._stopped:
            return
        self._stopped = True
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        began = time.monotonic()
        self.supervisor.stopping()
        self.loop.stop(_STOP_TIMEOUT)
        self.parts.settle()
        self.leadership.release()
        self.supervisor.stop(max(0.0, _SOURCES_STOP_TIMEOUT - (time.monotonic() - began)))
        self.parts.stop()
        if self.endpoints is not None:
            self.endpoints.stop()
        self._logger.info("daemon_stopped")

    def run_until(self, stop: threading.Event) -> None:
        try:
            self.start()
            wait_until_stopped(stop)
        finally:
            self.stop()

    # --- --once ------------------------------------------------------------------------------
    def run_once(self) -> bool:
        """Sync caches, lead (unless dry run), one pass, let go. False on any failure."""
        deadline = time.monotonic() + self.settings.sync_timeout.total_seconds()
        self.parts.start()
        try:
            if not _wait_for(self.parts.synced, deadline):
                self._logger.error(
                    "caches_not_synced", timeout_s=self.settings.sync_timeout.total_seconds()
                )
                return False
            if not _wait_for(
                self._try_lead, deadline, self.settings.leader_election.retry_period.total_seconds()
            ):
                self._logger.error("not_leader", why="another replica holds the lease")
                return False
            decided = self.loop.run_pass({"once"})
            return self.loop.finish_writes(_STOP_TIMEOUT) and decided
        finally:
            self.parts.settle()
            self.leadership.release()
            self.parts.stop()

    def _try_lead(self) -> bool:
        self.leadership.step()
        return self.leadership.is_leader()


def _wait_for(condition: Callable[[], bool], deadline: float, poll: float = 0.05) -> bool:
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True
