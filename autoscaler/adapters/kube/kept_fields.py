"""What the watch cache keeps of each object: only the fields the adapter reads.

A pod as the API returns it is ~20 KB of Python objects once decoded (`managedFields`, env,
volumes, images, tolerations, every string its own copy); at 50,000 pods that is a gigabyte. Like
client-go's informer transforms, the cache projects every object once, as it comes in (list,
watch or our own writes), onto the shapes below. A reader of a field not listed here would see
it missing: add it here (tests/test_kube_kept_fields.py checks that every reader sees the same).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final

from autoscaler.adapters.kube.resources import NODES, PODS, Obj, Resource
from autoscaler.annotations import DO_NOT_DISRUPT, NOTICE_ANNOTATION, SHIELD_MARK


@dataclass(frozen=True, slots=True)
class Where:
    """The items of a list whose `key` has one of `values`, each with `shape`."""

    key: str
    values: frozenset[str]
    shape: Shape


@dataclass(frozen=True, slots=True)
class Shared:
    """A value with `shape` that many objects hold equal (a job's workers share their pod
    template's containers and their owner): one object, held by all of them."""

    shape: Shape


# A shape: KEEP (the value whole), a dict of the keys to keep (each with its own shape), a
# one-element list (every item of a list, with that shape), a Where (some items of a list), or
# a Shared shape.
Shape = bool | dict[str, "Shape"] | list["Shape"] | Where | Shared
KEEP: Final = True

_CONDITION: Shape = {"type": KEEP, "status": KEEP, "lastTransitionTime": KEEP}

POD_SHAPE: Shape = {
    "apiVersion": KEEP,
    "kind": KEEP,
    # no uid: nothing reads it. creationTimestamp tells a pod from an older one of the same name
    # (et-operator reuses indices): et_operator.py `_named_before`
    "metadata": {
        "name": KEEP,
        "namespace": KEEP,
        "resourceVersion": KEEP,
        "deletionTimestamp": KEEP,
        "creationTimestamp": KEEP,
        "labels": KEEP,  # et-operator's worker labels, the replica index
        # the two the disruption shield keeps (shield.py)
        "annotations": {DO_NOT_DISRUPT: KEEP, SHIELD_MARK: KEEP},
        "ownerReferences": Shared(  # the controller: whose worker it is
            [{"apiVersion": KEEP, "kind": KEEP, "name": KEEP, "uid": KEEP, "controller": KEEP}]
        ),
    },
    "spec": {  # the scheduler's view of the GPUs it holds (pods.effective_request)
        "nodeName": KEEP,
        "containers": Shared([{"name": KEEP, "resources": KEEP}]),
        "initContainers": Shared([{"name": KEEP, "resources": KEEP, "restartPolicy": KEEP}]),
        "overhead": Shared(KEEP),
    },
    "status": {  # pods.pod_facts: phase and ready_since
        "phase": KEEP,
        "conditions": Where("type", frozenset({"Ready"}), _CONDITION),  # the only one read
        # read only when no Ready condition says since when (trimmed then: _without_fallback)
        "containerStatuses": [{"name": KEEP, "state": {"running": {"startedAt": KEEP}}}],
    },
}

NODE_SHAPE: Shape = {
    "apiVersion": KEEP,
    "kind": KEEP,
    "metadata": {
        "name": KEEP,
        "uid": KEEP,
        "resourceVersion": KEEP,
        "creationTimestamp": KEEP,
        "deletionTimestamp": KEEP,
        # capacity type, zone, instance type; the core's policies may match on any label
        "labels": KEEP,
        "annotations": {NOTICE_ANNOTATION: KEEP},  # the only one read
    },
    "spec": {"providerID": KEEP, "unschedulable": KEEP, "taints": KEEP},
    # every condition: wake_signatures.py's signature lists them all
    "status": {"allocatable": Shared(KEEP), "conditions": [_CONDITION]},
}


def project(value: Any, shape: Shape = KEEP) -> Any:
    """A copy of `value` with only what `shape` names (absent keys stay absent), every string in
    it interned: 50,000 pods repeat the same few hundred node names, label values, quantities and
    timestamps. A value of another type than the shape expects is copied whole."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(shape, Shared):
        return _SHARED.one(project(value, shape.shape))
    if isinstance(value, dict):
        if isinstance(shape, dict):
            return {k: project(value[k], sub) for k, sub in shape.items() if k in value}
        return {project(k): project(v) for k, v in value.items()}
    if isinstance(value, list):
        if isinstance(shape, Where):
            return [project(v, shape.shape) for v in value if _matches(v, shape)]
        item = shape[0] if isinstance(shape, list) else KEEP
        return [project(v, item) for v in value]
    return value


class _Interner:
    """One object per distinct value (JSON: dicts, lists, scalars), for values nobody changes:
    the cache replaces an object, never edits one. Values no object holds any more are dropped
    each time the table has doubled."""

    def __init__(self) -> None:
        self._table: dict[Hashable, Any] = {}
        self._prune_at = 1024

    def one(self, value: Any) -> Any:
        key = _frozen(value)
        kept = self._table.setdefault(key, value)  # atomic: the watch threads share this
        if len(self._table) >= self._prune_at:
            self._prune()
        return kept

    def _prune(self) -> None:
        for key, value in list(self._table.items()):
            # held by nobody else: the table, the listed item, `value`, getrefcount's argument
            if sys.getrefcount(value) <= 4:
                self._table.pop(key, None)
        self._prune_at = max(1024, 2 * len(self._table))


def _frozen(value: Any) -> Hashable:
    if isinstance(value, dict):
        return ("{", *((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("[", *map(_frozen, value))
    return (type(value).__name__, value)  # 1, 1.0 and True stay apart


_SHARED = _Interner()


def _matches(item: Any, where: Where) -> bool:
    return isinstance(item, dict) and item.get(where.key) in where.values


def _without_managed_fields(obj: Obj) -> Obj:
    """Custom resources are few and read in many places: kept whole, but for managedFields."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return project(obj)


def _pod(obj: Obj) -> Obj:
    return _without_fallback(project(obj, POD_SHAPE))


def _without_fallback(pod: Obj) -> Obj:
    """Container statuses only tell since when a pod runs when no Ready condition does
    (pods._ready_since): most pods have one, and the statuses are 4 objects of each pod."""
    status = pod.get("status")
    if not isinstance(status, dict) or "containerStatuses" not in status:
        return pod
    ready = [c for c in status.get("conditions") or () if isinstance(c, dict)]
    if not any(c.get("status") == "True" for c in ready):
        return pod
    status = {k: v for k, v in status.items() if k != "containerStatuses"}
    return {**pod, "status": status}


def _node(obj: Obj) -> Obj:
    return project(obj, NODE_SHAPE)


_TRIMMERS: dict[Resource, Callable[[Obj], Obj]] = {PODS: _pod, NODES: _node}


def trimmer(resource: Resource) -> Callable[[Obj], Obj]:
    """The transform the cache applies to every object of `resource` it takes in. It returns a
    new dict and never changes its argument (callers go on using what the API returned)."""
    return _TRIMMERS.get(resource, _without_managed_fields)
