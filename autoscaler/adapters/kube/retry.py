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


def _delay(exc: Exception, attempt: int, base: float, most: float) -> float:
    retry_after = ""
    if isinstance(exc, ApiException) and exc.headers:
        retry_after = str(exc.headers.get("Retry-After") or "")
    if retry_after.isdigit():
        return min(float(retry_after), most)
    return min(base * 2**attempt, most)


def with_retries(
    call: Callable[[], T],
    what: str,
    retries: int,
    base: float = _BASE_DELAY,
    most: float = _MAX_DELAY,
) -> T:
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if attempt >= retries or not _transient(exc):
                raise
            delay = _delay(exc, attempt, base, most)
            log.warning(
                "api_retry",
                call=what,
                attempt=attempt + 1,
                retry_in=delay,
                error=f"{type(exc).__name__}: {getattr(exc, 'status', '')}",
            )
            time.sleep(delay)
            attempt += 1
