"""Elastic jobs as the core sees them: et-operator TrainingJobs and CCE AITrainingJobs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autoscaler.adapters.kube.pods import PodFacts, gpu_requests, name_index
from autoscaler.adapters.kube.resources import Obj, annotations_of, labels_of
from autoscaler.adapters.kube.scalers import ScalerState
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import Backend, Job, Scaler, ScalerKind, Worker
from autoscaler.signals import (
    ASSIGNED_ANNOTATION,
    DRAINED_ANNOTATION,
    decode_assigned,
    decode_drained,
)

# A job label that sets its priority (higher gets idle GPUs first); a policy may override it.
PRIORITY_LABEL = "spot-autoscaler.io/priority"
# Phases after which a job never scales again: left out of snapshots. et-operator:
# api/v1/types.go JobSucceeded/JobFailed. CCE reports its own words (Succeed, not Succeeded) and
# ends a job also on Timeout, Preemption and node failure.
FINISHED_PHASES = {
    Backend.ET_OPERATOR: frozenset({"Succeeded", "Failed"}),
    Backend.CCE: frozenset({"Succeed", "Succeeded", "Failed", "Timeout", "Preempted", "NodeFail"}),
}
CCE_WORKER_REPLICA = "trainer"


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    replicas: int | None
    min_replicas: int | None
    max_replicas: int | None
    template: Obj
    scale_in_pods: tuple[str, ...]  # CCE: the victims of the current scale-in

    @classmethod
    def of(cls, spec: Obj) -> ReplicaSpec:
        def count(key: str) -> int | None:
            value = spec.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(count("replicas"), count("minReplicas"), count("maxReplicas"),
                   spec.get("template") or {}, tuple(spec.get("scaleInpods") or ()))

    def bounds(self) -> tuple[int, int]:
        """(min, max) workers, falling back to the initial replicas; max never below min."""
        lo = next((v for v in (self.min_replicas, self.replicas) if v is not None), 1)
        hi = next((v for v in (self.max_replicas, self.replicas) if v is not None), lo)
        return lo, max(lo, hi)


def worker_spec(job: Obj, backend: Backend) -> ReplicaSpec:
    spec = job.get("spec") or {}
    if backend is Backend.CCE:
        return ReplicaSpec.of((spec.get("replicaSpecs") or {}).get(CCE_WORKER_REPLICA) or {})
    return ReplicaSpec.of((spec.get("etReplicaSpecs") or {}).get("worker") or {})


def is_elastic_cce(job: Obj) -> bool:
    return (job.get("spec") or {}).get("faultTolerant") is True


def job_phase(job: Obj) -> str:
    return str((job.get("status") or {}).get("phase") or "")


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


def workers_of(pods: Iterable[PodFacts]) -> tuple[Worker, ...]:
    """A job's worker pods as the core's Workers, by replica index."""
    ordered = sorted(pods, key=lambda p: (p.index, p.name))
    return tuple(
        Worker(pod=p.name, node=p.node, host=p.name, index=p.index, pending=p.phase != "Running",
               ready_since=p.ready_since, terminating=p.terminating)
        for p in ordered
    )


def build_job(
    job: Obj,
    backend: Backend,
    workers: tuple[Worker, ...],
    scalers: ScalerState | None,
    scaler: Scaler | None,
    settings: KubernetesSettings,
    memory_per_gpu: float | None,
) -> Job:
    meta = job.get("metadata") or {}
    labels = labels_of(job)
    replica = worker_spec(job, backend)
    lo, hi = replica.bounds()
    return Job(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_workers=lo,
        max_workers=hi,
        gpus_per_worker=gpus_per_worker(job, replica, settings, memory_per_gpu),
        backend=backend,
        workers=workers,
        running=job_phase(job) == "Running",
        scaler=scaler,
        priority=_priority(labels),
        labels=labels,
        last_scale_out_at=scalers.last_scale_out_at if scalers else None,
        last_failed_scale_out_at=scalers.last_failed_scale_out_at if scalers else None,
        drained_hosts=decode_drained(annotations_of(job).get(DRAINED_ANNOTATION)),
        assigned_hosts=decode_assigned(annotations_of(job).get(ASSIGNED_ANNOTATION)),
        next_index=next_worker_index(job) if backend is Backend.ET_OPERATOR else None,
    )


def next_worker_index(job: Obj) -> int | None:
    """The index et-operator gives the next worker it creates: one past the highest index in
    status.targetWorkers, a list that keeps workers which died without a scaler (scaleout.go
    `setScaleOutWorkers` and worker.go `handleWorkersFailed` via `getWorkerPodsMaxIndex`, whose
    maximum starts at 0 and skips names without a numeric suffix). None before it has one."""
    names = (job.get("status") or {}).get("targetWorkers")
    if not isinstance(names, list) or not names:
        return None
    indices = [i for n in names if (i := name_index(str(n))) is not None]
    return max([0, *indices]) + 1


def cce_scaler(job: Obj, workers: Sequence[Worker]) -> Scaler | None:
    """CCE has no scaler objects: a job in phase Scaling is one scale in flight."""
    if job_phase(job) != "Scaling":
        return None
    replica = worker_spec(job, Backend.CCE)
    name = f"{(job.get('metadata') or {}).get('name', '')}-scaling"
    if (replica.replicas or 0) > len(workers):
        return Scaler(ScalerKind.SCALE_OUT, name)
    # the operator never clears scaleInpods: names from earlier scale-ins linger there
    live = {w.pod for w in workers}
    victims = tuple(p for p in replica.scale_in_pods if p in live)
    return Scaler(ScalerKind.SCALE_IN, name, pods=victims)
