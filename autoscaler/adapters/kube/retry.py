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

log = structlog.get_logger()


def _transient(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status == 429 or (exc.status or 0) >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError)


def _delay(exc: Exception, attempt: int) -> float:
    retry_after = ""
    if isinstance(exc, ApiException) and exc.headers:
        retry_after = str(exc.headers.get("Retry-After") or "")
    if retry_after.isdigit():
        return min(float(retry_after), _MAX_DELAY)
    return min(_BASE_DELAY * 2**attempt, _MAX_DELAY)


def with_retries(call: Callable[[], T], what: str, retries: int) -> T:
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if attempt >= retries or not _transient(exc):
                raise
            delay = _delay(exc, attempt)
            log.warning("api_retry", call=what, attempt=attempt + 1, retry_in=delay,
                        error=f"{type(exc).__name__}: {getattr(exc, 'status', '')}")
            time.sleep(delay)
            attempt += 1

