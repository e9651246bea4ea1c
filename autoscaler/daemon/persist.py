"""A NoticeBoard that also writes each new notice onto its Node.

A notice read from a cloud queue is gone from the queue once handled: kept only in memory, a
restart (or the other replica taking over) would forget it. Written on the Node as an annotation,
it comes back through the watch cache, which is how a standby's notice reaches the leader too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoscaler.core import Notice
from autoscaler.signals import NoticeBoard

Persist = Callable[[str, Notice], bool]  # (node, notice) -> written


class PersistingBoard(NoticeBoard):
    def __init__(self, persist: Persist, logger: Any, on_error: Callable[[], None]) -> None:
        super().__init__()
        self._persist = persist
        self._logger = logger
        self._on_error = on_error

    def post(self, notice: Notice) -> bool:
        new = super().post(notice)
        if new:
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
        return new
