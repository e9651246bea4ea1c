"""Poll loops that never crash and never hammer a failing API: backoff with jitter.

Shared by every notice source and price feed (AWS, Alibaba, the node agent). It lives here only
because the cloud-signals work may not write `autoscaler/adapters/` itself; it imports no SDK.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import structlog


class Backoff:
    """Exponential backoff with equal jitter: a delay in [d/2, d], d = base * 2^failures <= cap.

    Jitter spreads the retries of many daemons hitting the same throttled API; the floor of d/2
    keeps a failing source from spinning.
    """

    def __init__(
        self, base: float = 1.0, cap: float = 60.0, rng: random.Random | None = None
    ) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


def describe_error(exc: BaseException) -> str:
    """A short, log-safe description (SDK messages can be long; they carry no secrets)."""
    return f"{type(exc).__name__}: {exc}"[:300]


def run_every(
    step: Callable[[], object],
    stop: threading.Event,
    interval: float,
    name: str,
    backoff: Backoff | None = None,
) -> None:
    """Call `step` every `interval` seconds until `stop` is set.

    An exception from `step` is logged and retried after a backoff delay instead of ending the
    thread: one source's outage must never stop the others or the daemon.
    """
    log = structlog.get_logger().bind(source=name)
    backoff = backoff or Backoff()
    log.info("source_started", interval_s=interval)
    while not stop.is_set():
        try:
            step()
        except Exception as exc:  # see the docstring: log, back off, go on
            delay = backoff.next_delay()
            log.warning(
                "source_error",
                error=describe_error(exc),
                failures=backoff.failures,
                retry_in_s=round(delay, 2),
            )
        else:
            backoff.reset()
            delay = interval
        stop.wait(delay)
    log.info("source_stopped")
