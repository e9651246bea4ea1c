"""What the job kinds and pod helpers read and note in the watch cache, as a protocol.

The cache (cache.py) is built from the registry of kinds, so the kinds must not import the cache
back, not even for a type: they name this protocol instead, which `KubeCache` satisfies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from autoscaler.adapters.kube.resources import Obj, Resource


@dataclass(frozen=True)
class WatchedJobs:
    """One kind's job resource, as the cache needs to know it."""

    resource: Resource
    keep: Callable[[Obj], bool]  # which of its objects are elastic jobs at all
    phase: Callable[[Obj], str]  # a change of phase is worth a wake


@dataclass(frozen=True)
class Watchlist:
    """What the cache watches besides nodes, pods and our budgets: given by the wiring (the
    registry's `kinds.WATCHLIST`), so the cache knows no kind."""

    jobs: tuple[WatchedJobs, ...]
    helpers: tuple[Resource, ...]  # the kinds' other resources (scaler objects)
    backends: Mapping[str, tuple[Resource, ...]]  # backend -> what it needs served


class CacheView(Protocol):
    def items(self, resource: Resource) -> list[Obj]: ...

    def get(self, resource: Resource, key: str) -> Obj | None: ...

    def assume(self, resource: Resource, obj: Obj) -> None: ...

    def forget(self, resource: Resource, obj: Obj) -> None: ...
