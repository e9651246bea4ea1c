"""What the watch cache keeps of each object: only the fields the adapter reads.

A pod as the API returns it is ~20 KB of Python objects once decoded (`managedFields`, env,
volumes, images, tolerations, every string its own copy); at 50,000 pods that is a gigabyte. Like
client-go's informer transforms, the cache projects every object once, as it comes in (list,
watch or our own writes), onto the shapes below. A reader of a field not listed here would see
it missing: add it here (tests/test_kube_lean.py checks that every reader sees the same).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from autoscaler.adapters.kube.resources import NODES, PODS, Obj, Resource
from autoscaler.annotations import NOTICE_ANNOTATION


@dataclass(frozen=True, slots=True)
class Where:
    """The items of a list whose `key` has one of `values`, each with `shape`."""

    key: str
    values: frozenset[str]
    shape: Shape


# A shape: KEEP (the value whole), a dict of the keys to keep (each with its own shape), a
# one-element list (every item of a list, with that shape), or a Where (some items of a list).
Shape = bool | dict[str, "Shape"] | list["Shape"] | Where
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
        "ownerReferences": [  # the controller: whose worker it is
            {"apiVersion": KEEP, "kind": KEEP, "name": KEEP, "uid": KEEP, "controller": KEEP}
        ],
    },
    "spec": {  # the scheduler's view of the GPUs it holds (pods.effective_request)
        "nodeName": KEEP,
        "containers": [{"name": KEEP, "resources": KEEP}],
        "initContainers": [{"name": KEEP, "resources": KEEP, "restartPolicy": KEEP}],
        "overhead": KEEP,
    },
    "status": {  # pods.pod_facts: phase and ready_since
        "phase": KEEP,
        "conditions": Where("type", frozenset({"Ready"}), _CONDITION),  # the only one read
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
    # every condition: wakes.py's signature lists them all
    "status": {"allocatable": KEEP, "conditions": [_CONDITION]},
}


def project(value: Any, shape: Shape = KEEP) -> Any:
    """A copy of `value` with only what `shape` names (absent keys stay absent), every string in
    it interned: 50,000 pods repeat the same few hundred node names, label values, quantities and
    timestamps. A value of another type than the shape expects is copied whole."""
    if isinstance(value, str):
        return sys.intern(value)
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


def _matches(item: Any, where: Where) -> bool:
    return isinstance(item, dict) and item.get(where.key) in where.values


def _without_managed_fields(obj: Obj) -> Obj:
    """Custom resources are few and read in many places: kept whole, but for managedFields."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return project(obj)


_SHAPES: dict[Resource, Shape] = {PODS: POD_SHAPE, NODES: NODE_SHAPE}


def trimmer(resource: Resource) -> Callable[[Obj], Obj]:
    """The transform the cache applies to every object of `resource` it takes in. It returns a
    new dict and never changes its argument (callers go on using what the API returned)."""
    shape = _SHAPES.get(resource)
    if shape is None:
        return _without_managed_fields
    return lambda obj: project(obj, shape)
