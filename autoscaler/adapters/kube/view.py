"""What the job kinds and pod helpers read and note in the watch cache, as a protocol.

The cache (cache.py) is built from the registry of kinds, so the kinds must not import the cache
back, not even for a type: they name this protocol instead, which `KubeCache` satisfies.
"""

from __future__ import annotations

from typing import Protocol

from autoscaler.adapters.kube.resources import Obj, Resource


class CacheView(Protocol):
    def items(self, resource: Resource) -> list[Obj]: ...

    def get(self, resource: Resource, key: str) -> Obj | None: ...

    def assume(self, resource: Resource, obj: Obj) -> None: ...

    def forget(self, resource: Resource, obj: Obj) -> None: ...
