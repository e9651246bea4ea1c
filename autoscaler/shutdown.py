"""SIGTERM/SIGINT become a stop Event for long-running commands (Kubernetes sends SIGTERM)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class SignalStop(threading.Event):
    """Set by SIGTERM or SIGINT. The handler only records the signal and sets the event: it runs
    on the main thread between any two bytecodes, and a log line written from it waits forever
    on the log stream's lock when the signal lands while the main thread is writing one
    (structlog's WriteLogger holds a plain Lock per file; seen once: the node agent, which logs
    from the main thread, hung on SIGTERM). The line is written by whoever notices the stop."""

    def __init__(self, logger: Any) -> None:
        super().__init__()
        self._logger = logger
        self.received: str | None = None

    def log_received(self) -> None:
        if self.received is not None:
            self._logger.info("signal_received", signal=self.received)


def stop_on_signals(logger: Any) -> SignalStop:
    """A SignalStop for SIGTERM and SIGINT, logged on `logger`. Call from the main thread."""
    stop = SignalStop(logger)

    def handle(signum: int, _: FrameType | None) -> None:
        stop.received = signal.Signals(signum).name
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def wait_until_stopped(stop: threading.Event) -> None:
    """Block the main thread until `stop` is set, waking twice a second. The kernel delivers
    SIGTERM to any thread that does not block it, and Python runs the handler only when the main
    thread next runs: a plain `stop.wait()` can sleep through the signal for good (seen: 1 in 6
    stops of the daemon, whose watch threads sit in socket reads)."""
    while not stop.wait(0.5):
        pass
    if isinstance(stop, SignalStop):
        stop.log_received()
