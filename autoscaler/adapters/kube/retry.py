"""Retry one API call through short server trouble (429, 5xx, a dropped connection).

Anything else, or trouble that lasts, goes to the caller: the reconciler logs it and the next
pass tries again from a fresh view.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import structlog
import urllib3
from kubernetes.client.exceptions import ApiException

from autoscaler.backoff import Backoff

T = TypeVar("T")

_BASE_DELAY = 0.2
_MAX_DELAY = 2.0
# drains race a node's death (a 2-minute notice): retried sooner and more often
URGENT = (0.02, 0.2, 6)  # first delay, most delay, retries

log = structlog.get_logger()


def _transient(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status == 429 or (exc.status or 0) >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError)


def _retry_after(exc: Exception) -> float | None:
    """The server's Retry-After (seconds), if it sent one."""
    headers = exc.headers if isinstance(exc, ApiException) else None
    value = str((headers or {}).get("Retry-After") or "")
    return float(value) if value.isdigit() else None


def with_retries(
    call: Callable[[], T],
    what: str,
    retries: int,
    base: float = _BASE_DELAY,
    most: float = _MAX_DELAY,
) -> T:
    backoff = Backoff(base, most)
    while True:
        try:
            return call()
        except Exception as exc:
            if backoff.failures >= retries or not _transient(exc):
                raise
            delay = backoff.next_delay(_retry_after(exc))
            log.warning(
                "api_retry",
                call=what,
                attempt=backoff.failures,
                retry_in=delay,
                error=f"{type(exc).__name__}: {getattr(exc, 'status', '')}",
            )
            time.sleep(delay)
