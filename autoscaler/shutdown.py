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
