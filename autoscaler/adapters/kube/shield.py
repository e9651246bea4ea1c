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

import structlog
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import NODES, PODS, Obj, annotations_of, key_of, labels_of
from autoscaler.annotations import DO_NOT_DISRUPT, SHIELD_MARK
from autoscaler.core.voluntary import Shield

log = structlog.get_logger()

RESCAN_EVERY = 100  # keeps between full scans for SHIELD_MARK (pods another leader marked)
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # on every node Karpenter v1 launches


class DisruptionShield:
    def __init__(self, objects: ObjectApi, cache: KubeCache) -> None:
        self._objects = objects
        self._cache = cache
        self._marked: set[str] = set()  # pods that carry SHIELD_MARK, as far as we know
        self._keeps = 0
        # pod -> its cached copy when we patched it: not patched again until the copy changes
        self._sent: dict[str, Obj] = {}

    def keep(self, shield: Shield, writes: int) -> bool:
        """At most `writes` pod patches; True when nothing was left for a later call."""
        if self._keeps % RESCAN_EVERY == 0:  # the first call too (a start, a new leader)
            pods = self._cache.items(PODS)
            self._marked = {key_of(p) for p in pods if SHIELD_MARK in annotations_of(p)}
        self._keeps += 1
        wanted = {key for ns, pod in shield if self._on_karpenters_node(key := f"{ns}/{pod}")}
        todo: list[tuple[Obj, bool]] = []  # (pod, protect)
        for key in sorted(wanted | self._marked):
            pod = self._cache.get(PODS, key)
            if pod is None:
                self._marked.discard(key)
                continue
            notes = annotations_of(pod)
            # protected: the annotation "true" (ours or the pod's own); else: none of ours
            needed = notes.get(DO_NOT_DISRUPT) != "true" if key in wanted else SHIELD_MARK in notes
            if needed and self._sent.get(key) is not pod:
                todo.append((pod, key in wanted))
        self._sent = {k: v for k, v in self._sent.items() if k in wanted | self._marked}
        for pod, protect in todo[:writes]:
            self._write(pod, protect)
        return len(todo) <= writes

    def _on_karpenters_node(self, key: str) -> bool:
        node_name = ((self._cache.get(PODS, key) or {}).get("spec") or {}).get("nodeName")
        node = self._cache.get(NODES, node_name) if node_name else None
        return node is not None and NODEPOOL_LABEL in labels_of(node)

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
