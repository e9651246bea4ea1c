"""The nodes as the core sees them, kept current from the cache's changes.

At 20,000 nodes, reading every node on every pass cost a third of the pass while a few change
between passes. So a node is read again only when its object changed, when the GPUs its pods
hold changed (the pod index says which), or when a price moved; an unchanged node keeps its
GpuNode object, and an unchanged cluster its very tuple, which lets the core's memo (core/memo.py)
see at a glance that nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.nodes import NodeFacts, node_facts
from autoscaler.adapters.kube.rejects import Rejections
from autoscaler.adapters.kube.resources import NODES
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import CapacityType, GpuNode, Notice

PriceKey = tuple[CapacityType, str, str, float]  # capacity type, instance type, zone, GPUs
Held = Callable[[str], tuple[float, float]]  # node -> (GPUs, GPU memory) its pods request


@dataclass(frozen=True, slots=True)
class NodeView:
    gpu_nodes: tuple[GpuNode, ...]  # the same tuple while no GPU node changed
    notices: list[Notice]  # what the nodes' taints, conditions and annotations say
    alive: frozenset[str]  # Ready nodes
    memory_per_gpu: float | None  # the smallest GiB per GPU of the nodes that share GPUs


class NodeTable:
    def __init__(self, cache: KubeCache, settings: KubernetesSettings, rejects: Rejections) -> None:
        self._cache = cache
        self._settings = settings
        self._rejects = rejects
        self._changes = cache.track(NODES)  # every node the cache holds, to start with
        self._facts: dict[str, NodeFacts] = {}  # readable nodes by name
        self._gpu: dict[str, GpuNode] = {}  # nodes with whole GPUs
        self._priced: dict[str, PriceKey] = {}  # ... and what their price depends on
        self._prices: dict[PriceKey, float | None] = {}
        self._notices: dict[str, tuple[Notice, ...]] = {}  # only nodes that carry some
        self._memory: dict[str, float] = {}  # GiB per GPU of GPU nodes that tell it
        self._alive: frozenset[str] = frozenset()
        self._view: NodeView | None = None

    def read(
        self,
        held: Held,
        held_changed: Iterable[str | None],
        price: Callable[[CapacityType, str, str, float], float | None],
    ) -> NodeView:
        """The nodes now. `held_changed`: nodes whose pods' requests changed since the last read."""
        changed = self._take_changes()
        dirty = changed | {n for n in held_changed if n is not None and n in self._facts}
        prices = self._look_up_prices(changed, price)
        if any(k in self._prices and self._prices[k] != v for k, v in prices.items()):
            dirty |= self._gpu.keys()  # a spot price moved, or a config reload: every GPU node
        self._prices = prices
        replaced = sum(self._refresh(name, held, prices) for name in sorted(dirty)) > 0
        last = self._view
        if last is not None and not changed and not replaced:
            return last
        self._view = NodeView(
            gpu_nodes=last.gpu_nodes if last and not replaced else tuple(self._gpu.values()),
            notices=[n for ns in self._notices.values() for n in ns],
            alive=self._alive,
            memory_per_gpu=min(self._memory.values(), default=None),
        )
        return self._view

    def _look_up_prices(
        self, changed: set[str], price: Callable[[CapacityType, str, str, float], float | None]
    ) -> dict[PriceKey, float | None]:
        """The price of every priced GPU node's key and of the changed nodes' keys."""
        keys = set(self._priced.values())
        for name in changed:  # GPU nodes only: a CPU node has no price to look up
            if (facts := self._facts.get(name)) is not None and facts.gpus.whole > 0:
                keys.add(_price_key(facts))
        return {key: price(*key) for key in keys}

    def _take_changes(self) -> set[str]:
        """Read the nodes whose objects changed: facts, notices, readiness."""
        changed = set(self._changes.take())
        alive = set(self._alive)
        for name in changed:
            obj = self._cache.get(NODES, name)
            facts = self._rejects.read("Node", obj, self._read) if obj is not None else None
            self._notices.pop(name, None)
            alive.discard(name)
            if facts is None:  # deleted, or malformed (rejected)
                self._facts.pop(name, None)
                continue
            self._facts[name] = facts
            if facts.notices:
                self._notices[name] = facts.notices
            if facts.ready:
                alive.add(name)
            if facts.bad_notice_annotation and obj is not None:
                self._rejects.reject(
                    "Node",
                    obj,
                    "bad_notice_annotation",
                    "the spot-autoscaler.io/notice annotation is unreadable",
                )
        if changed:
            self._alive = frozenset(alive)
        return changed

    def _read(self, obj: dict) -> NodeFacts:
        return node_facts(obj, self._settings)

    def _refresh(self, name: str, held: Held, prices: dict[PriceKey, float | None]) -> bool:
        """Build `name`'s GpuNode again; True if it is a different one now (or gone)."""
        facts = self._facts.get(name)
        old = self._gpu.get(name)
        if facts is None or facts.gpus.whole <= 0:
            self._gpu.pop(name, None)
            self._priced.pop(name, None)
            self._memory.pop(name, None)
            return old is not None
        requested, memory = held(name)
        if facts.gpus.memory_per_gpu:
            self._memory[name] = facts.gpus.memory_per_gpu
            requested += memory / facts.gpus.memory_per_gpu
        else:
            self._memory.pop(name, None)
        key = self._priced[name] = _price_key(facts)
        new = GpuNode(
            name=name,
            gpus_allocatable=facts.gpus.whole,
            gpus_requested=requested,
            capacity_type=facts.capacity_type,
            price_per_hour=prices[key],
            schedulable=facts.schedulable,
            zone=facts.zone,
            instance_type=facts.instance_type,
            labels=facts.labels,
            shared_gpu=facts.shared_gpu,
        )
        if old is not None and old == new:
            return False  # a status update that changed nothing we read: keep the object
        self._gpu[name] = new
        return True


def _price_key(facts: NodeFacts) -> PriceKey:
    return (facts.capacity_type, facts.instance_type, facts.zone, facts.gpus.whole)
