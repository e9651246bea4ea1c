"""Share idle GPUs between jobs as whole workers: priority first, then fairness (water-filling).

A worker's GPUs must sit on one node, so capacity is reserved node by node, cheapest GPU-hour first
and best fit next. Growth moves in quantum steps (e.g. 2 -> 4 -> 8) reserved all or nothing, which
is also how et-operator treats a ScaleOut: all new pods run, or all are rolled back.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from autoscaler.core.model import CapacityType, GpuNode, Job, Reason
from autoscaler.core.policy import Policy

# A node's place in the preference order: (GPU-hour price, unknown-price rank, GPUs left).
_Key = tuple[float, int, float]

# When a job gets nothing, the most useful explanation first.


@dataclass(slots=True)
class Claim:
    """One job asking to grow from `current` workers towards `target`."""

    job: Job
    policy: Policy
    current: int
    target: int
    spend_per_hour: float  # what its staying workers cost now
    skip_min_idle: bool = False  # a refill below min does not wait for idle capacity to settle
    granted_nodes: list[str] = field(default_factory=list)
    blocked: set[Reason] = field(default_factory=set)

    @property
    def workers(self) -> int:
        return self.current + len(self.granted_nodes)


@dataclass(frozen=True, slots=True)
class Grant:
    count: int
    nodes: tuple[str, ...]
    tags: tuple[Reason, ...]
    why_not: Reason | None  # set when count == 0


class CapacityPool:
    """Idle GPUs left on nodes that may take new workers, plus the cluster's spend so far.

    Nodes are indexed by (GPU-hour price, unknown-price rank, GPUs left), names sorted within: the
    preferred node is the first that fits in that order, so a grant scans a few nodes instead of
    the whole pool. A node without a price ranks after every priced one, and an unpriced
    on-demand node after an unpriced spot node: nothing says it is the cheaper one.
    Noticed nodes take no new workers whatever the claim: they stay out of the index.
    """

    def __init__(
        self,
        nodes: Iterable[GpuNode],
        noticed: frozenset[str],
        idle_since: Mapping[str, datetime],
        now: datetime,
        cluster_budget: float | None,
        cluster_spend: float,
    ) -> None:
        self.nodes = {n.name: n for n in nodes if n.schedulable and n.idle_gpus > 0}
        self.left = {name: n.idle_gpus for name, n in self.nodes.items()}
        self._buckets: dict[_Key, list[str]] = {}  # (price, unknown rank, left) -> names
        self._keys: list[_Key] = []  # sorted; buckets may be empty
        self._noticed = [name for name in self.nodes if name in noticed]
        for name in sorted(self.nodes):
            if name not in noticed:
                self._index(name)
        self.noticed = noticed
        self.idle_for = {
            name: now - idle_since[name] if name in idle_since else None for name in self.nodes
        }
        self.cluster_budget = cluster_budget
        self.cluster_spend = cluster_spend

    def hold_for_unbound(self, gpus: float) -> None:
        """Set aside room for a pending pod not yet bound to a node, where the scheduler would put
        it (most room first): otherwise another job takes it and that ScaleOut rolls back."""
        room = [(self.left[name], name) for name in self._noticed if self.left[name] >= gpus]
        filled = [k for k in self._keys if self._buckets[k]]
        most = max((left for *_, left in filled), default=None)
        if most is not None and most >= gpus:
            room.append((most, max(self._buckets[k][-1] for k in filled if k[-1] == most)))
        if room:
            name = max(room)[1]
            self._set_left(name, self.left[name] - gpus)

    def why_not(self, claim: Claim, node: GpuNode) -> Reason | None:
        """The first rule that keeps one more worker of `claim` off `node`, or None if it fits."""
        return self._does_not_fit(claim, node) or self._not_worth_it(claim, node)

    def _does_not_fit(self, claim: Claim, node: GpuNode) -> Reason | None:
        """Room, notices, capacity type, GPU sharing."""
        rules = claim.policy.scale_out
        if self.left[node.name] < claim.job.gpus_per_worker:
            return Reason.NO_CAPACITY
        if node.name in self.noticed:
            return Reason.REBALANCE
        if node.capacity_type not in rules.capacity_types:
            return Reason.NO_CAPACITY
        if node.shared_gpu and not rules.shared_gpu:
            return Reason.NO_CAPACITY
        return None

    def _not_worth_it(self, claim: Claim, node: GpuNode) -> Reason | None:
        """Price cap, settled idleness, the job's and the cluster's budgets."""
        rules = claim.policy
        price = node.price_per_gpu_hour
        cap = rules.cost.max_price_per_gpu_hour
        if cap is not None and (price is None or price > cap):
            return Reason.PRICE_CAP
        idle_for = self.idle_for[node.name]
        if not claim.skip_min_idle and (idle_for is None or idle_for < rules.scale_out.min_idle):
            return Reason.MIN_IDLE
        cost = claim.job.gpus_per_worker * (price or 0.0)
        budget = rules.cost.budget_per_hour
        if budget is not None and (price is None or claim.spend_per_hour + cost > budget + 1e-9):
            return Reason.BUDGET
        if (
            self.cluster_budget is not None
            and self.cluster_spend + cost > self.cluster_budget + 1e-9
        ):
            return Reason.BUDGET
        return None

    def best_node(self, claim: Claim) -> GpuNode | None:
        """Cheapest GPU-hour, then tightest fit (keeps big holes for big workers), then name.

        Only a failed search visits every node; `blocked` then holds every reason that applies
        (a claim's reasons matter only when it gets nothing).
        """
        gpw = claim.job.gpus_per_worker
        for node in self.with_room(gpw):
            reason = self.why_not(claim, node)
            if reason is None:
                return node
            if reason is not Reason.NO_CAPACITY:
                claim.blocked.add(reason)
        if any(self.left[name] >= gpw for name in self._noticed):
            claim.blocked.add(Reason.REBALANCE)
        return None

    def with_room(self, gpus: float) -> Iterator[GpuNode]:
        """Un-noticed nodes with `gpus` left, best first (do not change the pool meanwhile)."""
        for key in self._keys:
            if key[-1] >= gpus:
                for name in self._buckets[key]:
                    yield self.nodes[name]

    def take(self, claim: Claim, node: GpuNode) -> None:
        gpw = claim.job.gpus_per_worker
        cost = gpw * (node.price_per_gpu_hour or 0.0)
        self._set_left(node.name, self.left[node.name] - gpw)
        claim.spend_per_hour += cost
        self.cluster_spend += cost
        claim.granted_nodes.append(node.name)

    def give_back(self, claim: Claim, count: int) -> None:
        """Undo the last `count` (> 0) reservations of `claim`."""
        for name in claim.granted_nodes[-count:]:
            node = self.nodes[name]
            cost = claim.job.gpus_per_worker * (node.price_per_gpu_hour or 0.0)
            self._set_left(name, self.left[name] + claim.job.gpus_per_worker)
            claim.spend_per_hour -= cost
            self.cluster_spend -= cost
        del claim.granted_nodes[-count:]

    def _key(self, name: str) -> _Key:
        node = self.nodes[name]
        price = node.price_per_gpu_hour
        if price is not None:
            return (price, 0, self.left[name])
        return (math.inf, 0 if node.capacity_type is CapacityType.SPOT else 1, self.left[name])

    def _index(self, name: str) -> None:
        key = self._key(name)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = []
            bisect.insort(self._keys, key)
        bisect.insort(bucket, name)

    def _set_left(self, name: str, left: float) -> None:
        if name in self.noticed:
            self.left[name] = left
            return
        bucket = self._buckets[self._key(name)]
        del bucket[bisect.bisect_left(bucket, name)]
        self.left[name] = left
        self._index(name)


def fill(pool: CapacityPool, claims: list[Claim]) -> None:
    """Grant quantum steps, always to the highest-priority, least-filled job that can take one."""
    heap = [_rank(c, i) for i, c in enumerate(claims) if c.workers < c.target]
    heapq.heapify(heap)
    while heap:
        *_, i = heapq.heappop(heap)
        claim = claims[i]
        step = claim.policy.scale_out.quantum.next_above(claim.workers) - claim.workers
        if claim.workers + step > claim.target:
            if step > 1:
                claim.blocked.add(Reason.QUANTUM)
            continue
        max_step = claim.job.most_added(claim.policy.scale_out.max_step)
        if max_step is not None and len(claim.granted_nodes) + step > max_step:
            continue
        taken = 0
        while taken < step and (node := pool.best_node(claim)) is not None:
            pool.take(claim, node)
            taken += 1
        if taken < step:
            if taken:
                pool.give_back(claim, taken)
            if taken and step > 1:
                claim.blocked.add(Reason.QUANTUM)
            continue
        if claim.workers < claim.target:
            heapq.heappush(heap, _rank(claim, i))


def _rank(claim: Claim, index: int) -> tuple:
    priority = claim.policy.priority if claim.policy.priority is not None else claim.job.priority
    fill_ratio = claim.workers / max(claim.target, 1)
    return (-priority, fill_ratio, claim.job.key, index)


def grant_of(claim: Claim, pool: CapacityPool, at_max: bool) -> Grant:
    """Summarise a claim after filling; `at_max` = its target is the job's effective max."""
    count = len(claim.granted_nodes)
    tags: list[Reason] = []
    if at_max and claim.workers >= claim.target and _could_take_more(pool, claim):
        tags.append(Reason.CLAMP_MAX)
    if count:
        return Grant(count, tuple(claim.granted_nodes), tuple(tags), None)
    explained = [r for r in claim.blocked if r.info.why_not is not None]
    why = min(explained, key=lambda r: r.info.why_not or 0, default=Reason.NO_CAPACITY)
    return Grant(0, (), tuple(tags), why)


def _could_take_more(pool: CapacityPool, claim: Claim) -> bool:
    gpw = claim.job.gpus_per_worker
    return any(pool.why_not(claim, node) is None for node in pool.with_room(gpw))
