"""Karpenter's `karpenter.sh/do-not-disrupt` on the workers a policy protects (core/voluntary.py),
kept level-triggered: added where it is missing, removed from pods that are no longer protected
(their job unmanaged, or its policy now `voluntary: drain`).

Karpenter v1.8.0 does not pick a node for consolidation, nor for drift without a
terminationGracePeriod, while an active pod on it has the annotation "true"
(pkg/controllers/state/statenode.go `ValidatePodsDisruptable`; pkg/controllers/disruption/
types.go `NewCandidate`), and its drain never evicts such a pod (pkg/utils/pod/scheduling.go
`IsEvictable`); expiry and interruption delete the NodeClaim regardless (docs/cloud.md).
Every pod we annotate also gets SHIELD_MARK: only an annotation we wrote is ever removed, and a pod
whose own template asks for do-not-disrupt is left as it is. Only pods on nodes Karpenter launched
(labelled `karpenter.sh/nodepool`: pkg/apis/v1/labels.go `NodePoolLabelKey`) are annotated: on
other nodes the annotation means nothing, and a cluster without Karpenter would pay a PATCH per
worker (40,000 at 5,000 nodes) for it.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.reflector import KeyTracker
from autoscaler.adapters.kube.resources import NODES, PODS, Obj, annotations_of, key_of, labels_of
from autoscaler.annotations import DO_NOT_DISRUPT, SHIELD_MARK
from autoscaler.core.voluntary import Shield

log = structlog.get_logger()

RESCAN_EVERY = 100  # keeps between full scans (a safety net: changes are followed in between)
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # on every node Karpenter v1 launches


class DisruptionShield:
    """Kept incrementally: a pod is looked at again when it changed (a tracker on the pod view),
    when its job's entry in the Shield is a new one, or when its node's Karpenter label came or
    went. Looking at all 16,000 workers of 2,000 nodes on every pass (three cache reads each)
    was a seventh of the daemon's CPU and held the interpreter from the notice path."""

    def __init__(self, objects: ObjectApi, cache: KubeCache) -> None:
        self._objects = objects
        self._cache = cache
        self._keeps = 0
        self._pods: KeyTracker | None = None  # pods changed since the last keep
        self._nodes: KeyTracker | None = None  # nodes changed since the last keep
        self._karpenters: set[str] = set()  # nodes Karpenter launched
        self._shield: Shield = {}  # the last keep's
        self._wanted: dict[str, frozenset[str]] = {}  # job -> its pods to protect
        self._protected: set[str] = set()  # every job's pods to protect
        self._marked: set[str] = set()  # pods that carry SHIELD_MARK, as far as we know
        self._pending: set[str] = set()  # pods to look at again
        # pod -> its cached copy when we patched it: not patched again until the copy changes
        self._sent: dict[str, Obj] = {}

    def keep(self, shield: Shield, writes: int) -> bool:
        """At most `writes` pod patches; True when nothing was left for a later call."""
        if self._pods is None or self._nodes is None or self._keeps % RESCAN_EVERY == 0:
            self._rescan(shield)  # the first call too (a start, a new leader)
        else:
            self._follow(shield)
        self._keeps += 1
        todo: list[tuple[Obj, bool]] = []  # (pod, protect)
        for key in sorted(self._pending):
            pod = self._cache.get(PODS, key)
            notes = annotations_of(pod) if pod is not None else {}
            if SHIELD_MARK in notes:
                self._marked.add(key)
            else:
                self._marked.discard(key)
            wanted = key in self._protected
            # protected: the annotation "true" (ours or the pod's own); else: none of ours
            needed = notes.get(DO_NOT_DISRUPT) != "true" if wanted else SHIELD_MARK in notes
            if pod is not None and needed and self._sent.get(key) is not pod:
                todo.append((pod, wanted))
                continue
            self._pending.discard(key)  # settled, or its patch's watch event will bring it back
            if not needed:
                self._sent.pop(key, None)
        for pod, protect in todo[:writes]:
            self._write(pod, protect)
            self._pending.discard(key_of(pod))
        return len(todo) <= writes

    def _rescan(self, shield: Shield) -> None:
        """Everything from the cache anew; the trackers, emptied before it is read, hold every
        change after that."""
        self._pods, self._nodes = self._cache.track(PODS), self._cache.track(NODES)
        self._pods.take()
        self._nodes.take()
        self._karpenters = {
            key_of(node) for node in self._cache.items(NODES) if NODEPOOL_LABEL in labels_of(node)
        }
        marked = {key_of(p) for p in self._cache.items(PODS) if SHIELD_MARK in annotations_of(p)}
        self._shield, self._wanted, self._protected = {}, {}, set()
        self._take(shield, shield.keys())
        self._pending = self._protected | marked
        self._sent = {k: v for k, v in self._sent.items() if k in self._pending}

    def _follow(self, shield: Shield) -> None:
        """What changed since the last keep goes to `_pending`."""
        assert self._pods is not None and self._nodes is not None
        flipped = False
        for name in self._nodes.take():
            node = self._cache.get(NODES, name)
            launched = node is not None and NODEPOOL_LABEL in labels_of(node)
            if launched != (name in self._karpenters):
                flipped = True
                (self._karpenters.add if launched else self._karpenters.discard)(name)
        jobs = shield.keys() | self._shield.keys()
        if not flipped:  # a job whose entry is the very same protects the very same pods
            jobs = {job for job in jobs if shield.get(job) is not self._shield.get(job)}
        self._pending |= self._take(shield, jobs)
        self._pending |= self._pods.take()

    def _take(self, shield: Shield, jobs: Iterable[str]) -> set[str]:
        """Take `jobs`' entries of `shield`; the pods whose protection that changed."""
        changed: set[str] = set()
        for job in jobs:
            wanted = frozenset(
                f"{ns}/{pod}" for ns, pod, node in shield.get(job, ()) if node in self._karpenters
            )
            before = self._wanted.pop(job, frozenset())
            if wanted:
                self._wanted[job] = wanted
            self._protected -= before - wanted
            self._protected |= wanted
            changed |= before ^ wanted
        self._shield = shield
        return changed

    def _write(self, pod: Obj, protect: bool) -> None:
        meta, key = pod["metadata"], key_of(pod)
        value = "true" if protect else None
        patch = {"metadata": {"annotations": {DO_NOT_DISRUPT: value, SHIELD_MARK: value}}}
        try:
            self._objects.merge_patch(PODS, meta["namespace"], meta["name"], patch)
        except ApiException as exc:
            if exc.status != 404:  # 404: the pod is gone, nothing to keep
                raise
            self._marked.discard(key)
            return
        self._sent[key] = pod
        if protect:
            self._marked.add(key)
        else:
            self._marked.discard(key)
        log.info(
            "disruption_shield_written" if protect else "disruption_shield_removed",
            namespace=meta["namespace"],
            pod=meta["name"],
            annotation=DO_NOT_DISRUPT,
        )
