"""Run each notice/price source on its own thread; one that fails is restarted after a back-off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from autoscaler.adapters.cloud_sources import NamedSource, Source
from autoscaler.backoff import Backoff


class Supervisor:
    def __init__(
        self,
        sources: list[NamedSource],
        logger: Any,
        on_error: Callable[[str], None],
        backoff_max: float,
    ) -> None:
        self._sources = sources
        self._logger = logger
        self._on_error = on_error
        self._backoff_max = backoff_max
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for name, source in self._sources:
            thread = threading.Thread(
                target=self._keep_running, args=(name, source), name=name, daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stopping(self) -> None:
        """Tell the sources now (their polls under way end while the daemon stops acting);
        `stop` waits for them."""
        self._stop.set()

    def stop(self, timeout: float) -> None:
        """At most `timeout` seconds from now for all the sources' threads together."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _keep_running(self, name: str, source: Source) -> None:
        backoff = Backoff(1.0, self._backoff_max)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                source.run(self._stop)
                if self._stop.is_set():
                    return
                self._logger.warning("source_returned", source=name)
            except Exception as exc:
                self._logger.error(
                    "source_failed", source=name, error=f"{type(exc).__name__}: {exc}", exc_info=exc
                )
            self._on_error(name)
            # a source that ran a good while before failing starts its back-off afresh
            if time.monotonic() - started > self._backoff_max:
                backoff.reset()
            self._stop.wait(backoff.next_delay())
