"""Elastic jobs as the core sees them, whatever their kind (kinds/ reads each kind's fields)."""

from __future__ import annotations

from collections.abc import Iterable

from autoscaler.adapters.kube.kinds.base import JobInputs, JobKind, ReplicaSpec
from autoscaler.adapters.kube.pods import PodFacts, gpu_requests
from autoscaler.adapters.kube.resources import Obj, annotations_of, labels_of, parse_time
from autoscaler.annotations import (
    ASSIGNED_ANNOTATION,
    DRAINED_ANNOTATION,
    PROGRESS_ANNOTATION,
    decode_assigned,
    decode_drained,
    decode_progress,
)
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import Job, Worker

# A job label that sets its priority (higher gets idle GPUs first); a policy may override it.
PRIORITY_LABEL = "spot-autoscaler.io/priority"


def _priority(labels: dict[str, str]) -> int:
    try:
        return int(labels.get(PRIORITY_LABEL, "0"))
    except ValueError:
        return 0


def gpus_per_worker(
    job: Obj, replica: ReplicaSpec, settings: KubernetesSettings, memory_per_gpu: float | None
) -> float:
    """What one worker takes from a node: the template's GPU request (what the scheduler sees),
    else `slotsPerWorker`, else one. Shared-GPU memory counts at the smallest GiB-per-GPU known."""
    gpus, memory = gpu_requests(replica.template.get("spec") or {}, settings)
    if memory and memory_per_gpu:
        gpus += memory / memory_per_gpu
    if gpus > 0:
        return gpus
    slots = (job.get("spec") or {}).get("slotsPerWorker")
    return float(slots) if isinstance(slots, int | float) and slots > 0 else 1.0


def worker_of(pod: PodFacts) -> Worker:
    """A worker pod as the core's Worker: made once per version of the pod (pod index)."""
    return Worker(
        pod=pod.name,
        node=pod.node,
        host=pod.name,
        index=pod.index,
        pending=pod.phase != "Running",
        ready_since=pod.ready_since,
        terminating=pod.terminating,
        created_at=pod.created_at,
    )


def by_index(workers: Iterable[Worker]) -> tuple[Worker, ...]:
    """A job's workers by replica index."""
    return tuple(sorted(workers, key=lambda w: (w.index, w.pod)))


def build_job(
    job: Obj,
    kind: JobKind,
    inputs: JobInputs,
    settings: KubernetesSettings,
    memory_per_gpu: float | None,
) -> Job:
    meta = job.get("metadata") or {}
    labels = labels_of(job)
    replica = kind.worker_spec(job)
    lo, hi = replica.bounds()
    scalers = inputs.scalers
    annotations = annotations_of(job)
    return Job(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_workers=lo,
        max_workers=hi,
        gpus_per_worker=gpus_per_worker(job, replica, settings, memory_per_gpu),
        backend=kind.backend,
        workers=inputs.workers,
        running=kind.phase(job) == "Running",
        scaler=inputs.scaler,
        priority=_priority(labels),
        labels=labels,
        last_scale_out_at=scalers.last_scale_out_at if scalers else None,
        last_failed_scale_out_at=scalers.last_failed_scale_out_at if scalers else None,
        failed_with=scalers.failed_with if scalers else None,
        drained_hosts=decode_drained(annotations.get(DRAINED_ANNOTATION)),
        assigned_hosts=decode_assigned(annotations.get(ASSIGNED_ANNOTATION)),
        next_index=kind.next_index(job),
        reuses_names=kind.reuses_names,
        removes_highest_first=kind.removes_highest_first,
        deletes_victims=kind.deletes_victims,
        unscalable=kind.unscalable(job),
        started_at=parse_time(meta.get("creationTimestamp")),
        progress=decode_progress(annotations.get(PROGRESS_ANNOTATION)),
    )
