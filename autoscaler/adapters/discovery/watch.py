"""Follow one named object: a Reflector (adapters/kube/reflector.py) of just that object.

Level-triggered: after every (re)list, and every change a watch event makes, the object as it now
is (None when missing) goes to the callback. Resuming a dropped stream, re-listing on 410 Gone
or an odd object, and backing off after API errors (0.5 s doubling up to `backoff_max`) are the
Reflector's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from structlog.typing import FilteringBoundLogger

from autoscaler.adapters.kube.reflector import Changes, Lister, Reflector
from autoscaler.adapters.kube.resources import Obj

_FIRST_RETRY = 0.5  # seconds; doubles per failure up to backoff_max


class ObjectWatch:
    def __init__(
        self,
        lister: Lister,
        name: str,
        on_object: Callable[[Obj | None], None],
        watch_timeout: timedelta,
        backoff_max: timedelta,
        stop: threading.Event,
        log: FilteringBoundLogger,
    ) -> None:
        self._on_object = on_object
        self._log = log
        self._reflector = Reflector(
            lister,
            # the field selector again, client-side: servers (and emulators) may ignore it
            lambda obj: (obj.get("metadata") or {}).get("name") == name,
            lambda obj: obj,  # held whole: it is one object
            self._changed,
            stop,
            log,
            field_selector=f"metadata.name={name}",
            watch_timeout=watch_timeout.total_seconds(),
            backoff=(_FIRST_RETRY, backoff_max.total_seconds()),
        )

    def run(self) -> None:
        """Until `stop` is set; it is seen at the next event or watch timeout."""
        self._reflector.run()

    def _changed(self, _: Changes) -> None:
        held = self._reflector.items()  # at most the one object
        if not held:
            self._log.warning("object_not_found")
        self._on_object(held[0] if held else None)
