"""SIGTERM/SIGINT become a stop Event for long-running commands (Kubernetes sends SIGTERM)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


def stop_on_signals(logger: Any) -> threading.Event:
    """An Event set by SIGTERM or SIGINT; the signal is logged. Call from the main thread."""
    stop = threading.Event()

    def handle(signum: int, _: FrameType | None) -> None:
        logger.info("signal_received", signal=signal.Signals(signum).name)
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
