"""Poll loops that never crash and never hammer a failing API: back-off with jitter.

Shared by every notice source and price feed (AWS, Alibaba, the node agent). It lives here only
because the cloud-signals work may not write `autoscaler/adapters/` itself; it imports no SDK.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from autoscaler.backoff import Backoff


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
    backoff = backoff or Backoff(jitter=True)
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
