"""Wait on a condition with a timeout: tests never sleep "a bit"."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll until `condition()` is truthy and return its value; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
    return value


def seconds_until(
    condition: Callable[[], Any], timeout: float = 5.0, what: str = "condition"
) -> float:
    """How long `condition()` took to become truthy (a measured latency)."""
    started = time.monotonic()
    wait_for(condition, timeout, what)
    return time.monotonic() - started
