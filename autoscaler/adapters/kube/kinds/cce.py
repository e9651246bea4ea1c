"""Baidu CCE AITrainingJob: workers are its `trainer` replicas; a decision becomes a merge patch
of the trainer replica spec.

Setting replicas to the decision's target is idempotent by nature; a scale-in also names its
victims in `scaleInpods`, so the operator removes those pods rather than any.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.adapters.kube.kinds.base import (
    JobKind,
    ReplicaSpec,
    count,
    scaled_by_replicas,
    status_phase,
)
from autoscaler.adapters.kube.kinds.replicas import ReplicasActuator
from autoscaler.adapters.kube.outcomes import refuse
from autoscaler.adapters.kube.resources import Obj, Resource
from autoscaler.core.model import Decision, Scaler, ScalerKind, Worker

# The group's misspelling ("baiudbce") is the real one.
AI_TRAINING_JOBS = Resource(
    "AITrainingJob", "kongming.cce.baiudbce.com", "v1", "aitrainingjobs", True
)
WORKER_REPLICA = "trainer"


class CceActuator(ReplicasActuator):
    """A scale-in also names its victims in `scaleInpods`: the operator removes those pods. The
    target is absolute (never above max: the core's target is not); a scale-out never lowers
    it, and the patch carries the resourceVersion it was decided on."""

    resource = AI_TRAINING_JOBS
    replicas_name = "trainer replicas"

    def phase(self, job: Obj) -> str:
        return status_phase(job)  # Scaling: the previous change is still under way

    def done(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> bool:
        current = _worker_spec(job)
        same_victims = not victims or current.scale_in_pods == victims
        return current.replicas == decision.to_workers and same_victims

    def patch(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> Obj | None:
        replicas = _worker_spec(job).replicas
        if not victims and replicas is not None and replicas > decision.to_workers:
            # a scale-out sized on a view that misses workers the job already asks for: its
            # target would lower replicas, and the operator would remove workers
            refuse(decision, "replicas_above_target", replicas=replicas)
            return None
        # the operator never clears scaleInpods: a scale-out clears it, so old victims named
        # there cannot be taken for the next scale-in's
        trainer: Obj = {"replicas": decision.to_workers, "scaleInpods": list(victims) or None}
        # decided on the job as it was: one changed meanwhile (the cache behind) gets 409
        version = {"resourceVersion": job["metadata"].get("resourceVersion")}
        return {"metadata": version, "spec": {"replicaSpecs": {WORKER_REPLICA: trainer}}}


# --- reading AITrainingJobs and their trainers ---------------------------------------------------
def _worker_of(meta: Obj, name: str, labels: dict[str, str]) -> str | None:
    """CCE names its replica types in the pod name and labels; only trainers are elastic."""
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None or owner.get("kind") != AI_TRAINING_JOBS.kind:
        return None
    if f"-{WORKER_REPLICA}-" in name or WORKER_REPLICA in labels.values():
        return str(owner.get("name", ""))
    return None


def _worker_spec(job: Obj) -> ReplicaSpec:
    spec = ((job.get("spec") or {}).get("replicaSpecs") or {}).get(WORKER_REPLICA) or {}
    return ReplicaSpec(
        count(spec, "replicas"),
        count(spec, "minReplicas"),
        count(spec, "maxReplicas"),
        spec.get("template") or {},
        tuple(spec.get("scaleInpods") or ()),
    )


def is_elastic(job: Obj) -> bool:
    return (job.get("spec") or {}).get("faultTolerant") is True


def in_flight(job: Obj, workers: Sequence[Worker]) -> Scaler | None:
    """CCE has no scaler objects: a job in phase Scaling is one scale in flight."""
    if status_phase(job) != "Scaling":
        return None
    replica = _worker_spec(job)
    name = f"{(job.get('metadata') or {}).get('name', '')}-scaling"
    if (replica.replicas or 0) > len(workers):
        return Scaler(ScalerKind.SCALE_OUT, name, unborn=(replica.replicas or 0) - len(workers))
    # the operator never clears scaleInpods: names from earlier scale-ins linger there
    live = {w.pod for w in workers}
    victims = tuple(p for p in replica.scale_in_pods if p in live)
    return Scaler(ScalerKind.SCALE_IN, name, pods=victims)


KIND = JobKind(
    backend="cce",
    jobs=AI_TRAINING_JOBS,
    worker_of=_worker_of,
    worker_spec=_worker_spec,
    phase=status_phase,
    # CCE reports its own words (Succeed, not Succeeded) and ends a job also on Timeout,
    # Preemption and node failure
    finished=frozenset({"Succeed", "Succeeded", "Failed", "Timeout", "Preempted", "NodeFail"}),
    inputs=scaled_by_replicas(in_flight),
    actuator=CceActuator,
    keep=is_elastic,
    # patch: spec.replicaSpecs.trainer.replicas / scaleInpods, and the drained-hosts annotation
    rbac={AI_TRAINING_JOBS: frozenset({"get", "list", "watch", "patch"})},
    docs="patches `spec.replicaSpecs.trainer.replicas` and names victims in `scaleInpods`",
)
