"""What a Node tells the autoscaler: GPU capacity, spot or on-demand, whether new work may land
on it, and the notices Kubernetes-side systems left on it."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from autoscaler.adapters.kube.pods import quantity
from autoscaler.adapters.kube.resources import Obj, annotations_of, key_of, labels_of, parse_time
from autoscaler.annotations import NOTICE_ANNOTATION, decode_notice
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import CapacityType, Notice, NoticeKind

ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


@dataclass(frozen=True, slots=True)
class NodeGpus:
    whole: float  # allocatable whole GPUs, shared GPUs included
    memory_per_gpu: float | None  # GiB per shared GPU; None on nodes without GPU sharing


def first_label(labels: dict[str, str], keys: tuple[str, ...]) -> str:
    return next((labels[k] for k in keys if labels.get(k)), "")


def node_gpus(node: Obj, settings: KubernetesSettings) -> NodeGpus:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    whole = sum(quantity(allocatable.get(r)) for r in settings.gpu_resources)
    shared = settings.shared_gpu
    if shared and shared.shares(labels_of(node)):
        count = quantity(allocatable.get(shared.count_resource))
        memory = quantity(allocatable.get(shared.memory_resource))
        if count > 0 and memory > 0:
            return NodeGpus(whole + count, memory / count)
    return NodeGpus(whole, None)


def capacity_type(node: Obj, settings: KubernetesSettings) -> CapacityType:
    name = str((node.get("metadata") or {}).get("name", ""))
    for pattern, override in settings.capacity_type_override.items():
        if fnmatch.fnmatchcase(name, pattern):
            return override
    labels = labels_of(node)
    for rule in settings.capacity_type_labels:
        if (matched := rule.match(labels)) is not None:
            return matched
    return settings.default_capacity_type


def ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def schedulable(node: Obj, settings: KubernetesSettings) -> bool:
    """May new workers land here: not cordoned, Ready, no taint or condition announcing its end."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable") or not ready(node):
        return False
    if any(t.get("key") in settings.notice_taints for t in spec.get("taints") or ()):
        return False
    conditions = (node.get("status") or {}).get("conditions") or ()
    noticed = settings.notice_conditions
    return not any(c.get("type") in noticed and c.get("status") == "True" for c in conditions)


def node_notices(node: Obj, settings: KubernetesSettings) -> list[Notice]:
    """Notices from taints, conditions, cordon (if configured) and our persisted annotation."""
    name = str((node.get("metadata") or {}).get("name", ""))
    spec = node.get("spec") or {}
    deleting = bool((node.get("metadata") or {}).get("deletionTimestamp"))
    out = _taint_notices(name, spec, deleting, settings) + _condition_notices(name, node, settings)
    # with eviction guards a drain waits for us: the cordon that starts it must make us act
    cordon_counts = settings.cordon_is_notice or settings.guard_evictions
    if cordon_counts and spec.get("unschedulable"):
        out.append(Notice(node=name, kind=NoticeKind.MAINTENANCE, source="k8s-cordon", id="cordon"))
    value = annotations_of(node).get(NOTICE_ANNOTATION)
    if value and (persisted := decode_notice(name, value)) is not None:
        out.append(persisted)
    return out


def _taint_notices(
    name: str, spec: Obj, deleting: bool, settings: KubernetesSettings
) -> list[Notice]:
    out: list[Notice] = []
    for taint in spec.get("taints") or ():
        key = taint.get("key")
        if key in settings.notice_taints:
            value = taint.get("value") or ""  # NTH puts its event id here
            voluntary = not deleting and key in settings.voluntary_taints
            out.append(
                Notice(
                    node=name,
                    kind=NoticeKind.DISRUPTION if voluntary else settings.notice_taints[key],
                    source="k8s-taint",
                    id=f"{key}={value}" if value else key,
                    received_at=parse_time(taint.get("timeAdded")),
                )
            )
    return out


def _condition_notices(name: str, node: Obj, settings: KubernetesSettings) -> list[Notice]:
    out: list[Notice] = []
    for cond in (node.get("status") or {}).get("conditions") or ():
        kind = settings.notice_conditions.get(cond.get("type", ""))
        if kind is not None and cond.get("status") == "True":
            since = cond.get("lastTransitionTime")
            out.append(
                Notice(
                    node=name,
                    kind=kind,
                    source="k8s-condition",
                    id=f"{cond['type']}@{since}",
                    received_at=parse_time(since),
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """All a snapshot reads of one Node object: derived once per object, not once per tick."""

    name: str
    ready: bool
    notices: tuple[Notice, ...]
    gpus: NodeGpus
    capacity_type: CapacityType
    instance_type: str
    zone: str
    schedulable: bool
    labels: dict[str, str]
    bad_notice_annotation: bool = False  # present but unreadable: rejected (rejects.py)
    # an ACK shared-GPU node (GPU memory counted as GPU equivalents): GpuNode.shared_gpu
    shared_gpu: bool = False


def node_facts(node: Obj, settings: KubernetesSettings) -> NodeFacts:
    labels = labels_of(node)
    gpus = node_gpus(node, settings)
    return NodeFacts(
        name=key_of(node),
        ready=ready(node),
        notices=tuple(node_notices(node, settings)),
        gpus=gpus,
        capacity_type=capacity_type(node, settings),
        instance_type=first_label(labels, INSTANCE_TYPE_LABELS),
        zone=first_label(labels, ZONE_LABELS),
        schedulable=schedulable(node, settings),
        labels=labels,
        bad_notice_annotation=_bad_annotation(node),
        shared_gpu=gpus.memory_per_gpu is not None,
    )


def _bad_annotation(node: Obj) -> bool:
    value = annotations_of(node).get(NOTICE_ANNOTATION)
    return value is not None and decode_notice(key_of(node), value) is None


def instance_id(provider_id: str) -> str:
    """The cloud's instance id in a node's spec.providerID.

    AWS `aws:///<az>/<id>` and GCE `gce://<project>/<zone>/<name>`: the last path part;
    Alibaba `<region>.<instance-id>`: what follows the region.
    """
    if "://" in provider_id:
        return provider_id.rstrip("/").rsplit("/", 1)[-1]
    return provider_id.split(".", 1)[1] if "." in provider_id else provider_id
