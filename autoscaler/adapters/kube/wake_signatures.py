"""Which cache changes are worth a reconcile pass now rather than at the next tick.

Each kind has a signature of the fields decisions depend on; a change wakes the daemon only when
the signature changes. Nodes send a MODIFIED every few seconds for heartbeats alone: those must not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable

from autoscaler.adapters.kube.pods import TERMINATED_PHASES, gpu_requests
from autoscaler.adapters.kube.resources import (
    NODES,
    PDBS,
    PODS,
    Obj,
    Resource,
    annotations_of,
    labels_of,
)
from autoscaler.annotations import DRAINED_ANNOTATION, NOTICE_ANNOTATION
from autoscaler.config.kubernetes import KubernetesSettings


def _frozen(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _node(node: Obj) -> Hashable:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    # type=status only: lastHeartbeatTime changes every few seconds and means nothing here
    conditions = sorted(f"{c.get('type')}={c.get('status')}" for c in status.get("conditions", []))
    return (
        _frozen(spec.get("taints") or []),
        bool(spec.get("unschedulable")),
        annotations_of(node).get(NOTICE_ANNOTATION),
        tuple(conditions),
        _frozen(status.get("allocatable") or {}),
        _frozen(labels_of(node)),
    )


def may_bring_notice(old: Obj | None, new: Obj | None) -> bool:
    """Whether a Node change may bring a notice: its taints or our notice annotation changed and
    it has some. Only those go to the notice responder at once; the rest (a node added, Ready
    again, its GPUs, a notice withdrawn) wait for the pass, and with a node replaced every
    second (2,000 nodes with churn) they kept the responder from the notices."""

    def fields(node: Obj | None) -> tuple[str, str | None]:
        taints = ((node or {}).get("spec") or {}).get("taints") or []
        return _frozen(taints), annotations_of(node or {}).get(NOTICE_ANNOTATION)

    after = fields(new)
    return new is not None and after != fields(old) and after != (_frozen([]), None)


def _pod(pod: Obj, settings: KubernetesSettings) -> Hashable:
    gpus, memory = gpu_requests(pod.get("spec") or {}, settings)
    if not gpus and not memory:
        return None  # pods without GPUs change nothing we decide on
    phase = (pod.get("status") or {}).get("phase")
    return ((pod.get("spec") or {}).get("nodeName"), phase, phase in TERMINATED_PHASES)


def _job(phase: Callable[[Obj], str], job: Obj) -> Hashable:
    status = job.get("status") or {}
    return (
        _frozen(job.get("spec") or {}),
        phase(job),
        status.get("currentScaler"),
        annotations_of(job).get(DRAINED_ANNOTATION),
        _frozen(labels_of(job)),
    )


def _scaler(scaler: Obj) -> Hashable:
    status = scaler.get("status") or {}
    conditions = status.get("conditions") or [{}]
    return (status.get("phase"), (conditions[-1] or {}).get("type"))


def signature(
    resource: Resource,
    obj: Obj | None,
    settings: KubernetesSettings,
    job_phase: Callable[[Obj], str] | None = None,
) -> Hashable:
    """What about `obj` decisions depend on; None for an absent object. `job_phase`: `obj` is a
    job, whose kind reads its phase so. Our budgets are standing objects no decision reads: their
    writes (thousands at start-up) must not each wake a pass; one deleted by someone else is
    written again at the next tick."""
    if obj is None or resource is PDBS:
        return None
    if resource is NODES:
        return _node(obj)
    if resource is PODS:
        return _pod(obj, settings)
    if job_phase is not None:
        return _job(job_phase, obj)
    return _scaler(obj)
