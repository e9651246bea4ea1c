"""A NoticeBoard that also writes each new notice onto its Node.

A notice read from a cloud queue is gone from the queue once handled: kept only in memory, a
restart (or the other replica taking over) would forget it. Written on the Node as an annotation,
it comes back through the watch cache, which is how a standby's notice reaches the leader too.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from autoscaler.core import Notice
from autoscaler.notices_and_prices import NoticeBoard

Persist = Callable[[str, Notice], bool]  # (node, notice) -> written


class PersistingBoard(NoticeBoard):
    """Writes happen on one background thread: the source's wake (and so the drain) never waits
    for the API call, and notices are written in the order they arrived."""

    def __init__(self, persist: Persist, logger: Any, on_error: Callable[[], None]) -> None:
        super().__init__()
        self._persist = persist
        self._logger = logger
        self._on_error = on_error
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notice-persist")

    def post(self, notice: Notice) -> bool:
        new = super().post(notice)
        if new:
            self._writer.submit(self._write, notice)
        return new

    def close(self) -> None:
        """Finish the writes already queued (the daemon calls this when it stops)."""
        self._writer.shutdown(wait=True)

    def _write(self, notice: Notice) -> None:
        try:
            self._persist(notice.node, notice)
        except Exception as exc:  # the notice still acts from memory; the source goes on
            self._on_error()
            self._logger.warning(
                "notice_not_persisted",
                node=notice.node,
                notice=notice.id,
                error=f"{type(exc).__name__}: {exc}",
            )
