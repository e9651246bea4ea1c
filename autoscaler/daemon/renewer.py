"""Lease renewals in a process of their own, so the daemon's work cannot starve them.

At 2,000 nodes the leader's fence closed for 20 s and more with no renewal attempt ending, though
each request had a 5 s timeout (docs/benchmarks.md). A socket timeout counts only time blocked on
the socket, not time a thread waits for the interpreter lock among the daemon's busy threads (the
pass, the server checks, the signal pool, the watches) on a machine whose cores the API server
also wants. client-go renews in a goroutine of its own on a runtime with no such lock; here a
spawned interpreter runs the same `LeaderElector`, and shares with the daemon only:

- `renewed`: when the last renewal that landed began (`time.monotonic()`, 0: not leading), in
  shared memory. The fence reads it before every write with no thread of the daemon in between
  (CLOCK_MONOTONIC is one clock for every process of a host, so the bound in fencing.py holds).
- `beat`: the daemon's heartbeat, four a retry period. The child renews only while the last is
  younger than a retry period, so a daemon that is stopped or frozen (SIGSTOP, a frozen cgroup)
  loses the Lease about as soon as with in-process renewals (a retry period later); a hung
  reconcile loop is /healthz's to catch, as before.
- a pipe: leadership changes and errors up (the wake, the metric), "release" down. Its far end
  closing tells the child the daemon is gone: it exits without releasing, and the Lease runs out,
  by when any write the daemon had in flight was answered or abandoned (fencing.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import structlog

from autoscaler.config.daemon import LeaderElectionSettings
from autoscaler.daemon.leader import LeaderElector, LeaderLock, lease_valid
from autoscaler.logs import JSON_LINES, configure

_CONTEXT = multiprocessing.get_context("spawn")  # fork would copy a process with threads running
_RELEASE_WAIT = 5.0  # seconds the daemon waits for the child to give the Lease up and exit


class RenewerProcess:
    """`Leadership` whose renewals run in a child process (module doc). `step()`, called every
    retry period by the daemon, starts the child the first time and restarts it if it died."""

    def __init__(
        self,
        make_lock: Callable[[], LeaderLock],  # pickled: made in the child
        settings: LeaderElectionSettings,
        log: tuple[str, str],  # the daemon's log format and level, for the child's lines
        logger: Any,
        on_change: Callable[[bool], None],
        on_error: Callable[[], None],
    ) -> None:
        self._make_lock, self._settings, self._log = make_lock, settings, log
        self._logger = logger
        self._on_change, self._on_error = on_change, on_error
        self._deadline = settings.renew_deadline.total_seconds()
        self._renewed = _CONTEXT.RawValue("d", 0.0)
        self._beat = _CONTEXT.RawValue("d", 0.0)
        self._child: Any = None  # multiprocessing's Process (SpawnProcess)
        self._pipe: Connection | None = None
        self._stopping = threading.Event()
        self._guard = threading.Lock()  # step() and release() never interleave

    def is_leader(self) -> bool:
        renewed = self._renewed.value or None  # 0: not leading
        return not self._stopping.is_set() and lease_valid(
            renewed, self._deadline, time.monotonic()
        )

    def step(self) -> None:
        with self._guard:
            if self._stopping.is_set():
                return
            if self._child is None:
                self._beat.value = time.monotonic()
                threading.Thread(target=self._heartbeat, name="lease-beat", daemon=True).start()
            elif self._child.is_alive():
                return
            else:
                self._on_error()
                self._logger.error("lease_renewer_died", exitcode=self._child.exitcode)
            self._spawn()

    def _spawn(self) -> None:
        ours, theirs = _CONTEXT.Pipe()
        self._child = _CONTEXT.Process(
            target=_serve,
            args=(self._make_lock, self._settings, self._log, self._renewed, self._beat, theirs),
            name="lease-renewer",
            daemon=True,  # never outlives a daemon that exits normally
        )
        self._child.start()
        theirs.close()  # ours alone: the child sees EOF once the daemon is gone
        self._pipe = ours
        threading.Thread(target=self._listen, args=(ours,), name="lease-news", daemon=True).start()

    def _heartbeat(self) -> None:
        period = self._settings.retry_period.total_seconds() / 4
        while not self._stopping.wait(period):
            self._beat.value = time.monotonic()

    def _listen(self, pipe: Connection) -> None:
        """The child's news: leadership changes and errors. Ends with the child."""
        while True:
            try:
                what, value = pipe.recv()
            except (EOFError, OSError):
                return
            if what == "leader":
                self._on_change(value)
            elif what == "error":
                self._on_error()

    def release(self) -> None:
        """Stop acting at once; the child gives the Lease up so a standby takes over now."""
        with self._guard:
            if self._stopping.is_set():
                return
            self._stopping.set()  # is_leader() is False from here on
            child, pipe = self._child, self._pipe
            if child is None or pipe is None:
                return
            if child.is_alive():  # else its Lease runs out on its own
                with contextlib.suppress(OSError):
                    pipe.send(("release", None))
                child.join(_RELEASE_WAIT)  # it exits once the Lease is given up
            if child.is_alive():
                child.kill()
                child.join()
            pipe.close()


def _serve(
    make_lock: Callable[[], LeaderLock],
    settings: LeaderElectionSettings,
    log: tuple[str, str],
    renewed: Any,
    beat: Any,
    pipe: Connection,
) -> None:
    """The child: a LeaderElector stepped every retry period while the daemon's heartbeat is
    fresh, its renewal time published to `renewed`."""
    # A terminal's Ctrl-C or a signal to the whole group is the daemon's to handle: it tells the
    # child to release, or goes, which the child sees on the pipe. Not a traceback, not a lapse.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure(JSON_LINES[log[0]], log[1])
    logger = structlog.get_logger("spot-autoscaler").bind(process="lease-renewer")

    def tell(what: str, value: object = None) -> None:
        with contextlib.suppress(OSError):  # the daemon is gone; the loop below sees it and ends
            pipe.send((what, value))

    elector = LeaderElector(
        make_lock(), settings, logger, lambda leader: tell("leader", leader), lambda: tell("error")
    )
    period = settings.retry_period.total_seconds()
    due, withheld = time.monotonic(), False
    while True:
        try:
            if pipe.poll(max(0.0, due - time.monotonic())):
                pipe.recv()  # the one message down: release
                elector.release()
                renewed.value = 0.0
                return
        except (EOFError, OSError):
            renewed.value = 0.0
            logger.warning("lease_renewer_orphaned", why="the daemon is gone; the Lease runs out")
            return
        due = max(due + period, time.monotonic())
        silent = time.monotonic() - beat.value
        if silent >= period:  # the daemon is stopped or frozen: let the Lease go as it would
            if not withheld:
                logger.warning("lease_renewal_withheld", daemon_silent_s=round(silent, 3))
            withheld = True
            continue
        if withheld:
            logger.info("lease_renewal_resumed")
            withheld = False
        elector.step()
        renewed.value = elector.renewed_at or 0.0
