"""Kubeflow training-operator PyTorchJob (kubeflow.org/v1): torchrun elastic jobs.

What the operator does, from its source (kubeflow/training-operator v1.9.3; docs/pytorch.md has
the details and what they cost us):
- workers are pods `<job>-worker-<i>`, i in 0..replicas-1 (pkg/core/utils.go `GenGeneralName`),
  labelled `training.kubeflow.org/job-name` and `training.kubeflow.org/replica-type: worker`,
  owned by the PyTorchJob;
- `common/pod.go` `ReconcilePods` (with pkg/core/pod.go `GetPodSlices`) creates every index
  below `spec.pytorchReplicaSpecs.Worker.replicas` that has no pod and deletes pods at or above
  it: lowering replicas removes the HIGHEST indices, and a deleted middle index is made again
  under its name once the old Pod object is gone (terminating pods still fill their slot);
- min/max come from `spec.elasticPolicy` (pytorch_defaults.go `setElasticPolicy`: one of them
  alone copies the other; neither: both are the replicas). The validating webhook does not check
  min <= replicas <= max (pkg/webhooks/pytorch): we clamp;
- `elasticPolicy.metrics` makes the operator run an HPA over the job (hpa.go `ReconcileHPA`),
  which would fight every replicas patch of ours: such a job is left alone, and so is one
  without elasticPolicy (torchrun's `--nnodes` is then fixed at the replicas: envvar.go) or
  whose workers restart `Never` (a deleted worker then fails the whole job:
  pytorchjob_controller.go `UpdateJobStatus`).

A torchrun worker leaves gracefully by being told: its pod's SIGTERM reaches torchrun, which
passes it to the workers (torch/distributed/elastic/multiprocessing/api.py `PContext.close`),
whose handler checkpoints at the next step. So a scale-in deletes its victims by name at once
(`deletes_victims`), lowering replicas only past the victims at the top, so that the operator
never takes a healthy worker instead; a middle index comes back as the job's replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import structlog
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.kinds.base import (
    JobKind,
    ReplicaSpec,
    condition_phase,
    count,
    scaled_by_replicas,
)
from autoscaler.adapters.kube.kinds.replicas import ReplicasActuator
from autoscaler.adapters.kube.outcomes import refuse, summary
from autoscaler.adapters.kube.pods import name_index
from autoscaler.adapters.kube.resources import PODS, Obj, Resource
from autoscaler.core.model import Decision, Scaler, ScalerKind, Worker

log = structlog.get_logger()

PYTORCH_JOBS = Resource("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", True)
JOB_LABEL = "training.kubeflow.org/job-name"
TYPE_LABEL = "training.kubeflow.org/replica-type"
WORKER = "Worker"  # the replica type in spec.pytorchReplicaSpecs
# status.conditions types (pkg/apis/kubeflow.org/v1 common_types.go JobConditionType)
_FINISHED = frozenset({"Succeeded", "Failed"})
_STATES = ("Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


class PyTorchJobActuator(ReplicasActuator):
    """Scale-out raises the Worker replicas (with the resourceVersion decided on: a job changed
    meanwhile gets 409 and the next pass decides again); scale-in deletes the victims by name."""

    resource = PYTORCH_JOBS
    replicas_name = "Worker replicas"

    def phase(self, job: Obj) -> str:
        return _phase(job)

    def done(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> bool:
        return not victims and _worker_spec(job).replicas == decision.to_workers

    def patch(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> Obj | None:
        replicas = _worker_spec(job).replicas
        if replicas != decision.from_workers:  # decided on a view the job moved on from
            refuse(decision, "replicas_changed", replicas=replicas)
            return None
        return _replicas_patch(job, decision.to_workers)

    def scale_in(self, job: Obj, decision: Decision, now: datetime) -> None:
        """Lower the replicas past the victims at the top (so that the operator does not make
        them again), then delete every victim by name: each one's SIGTERM is its checkpoint
        signal. A victim in the middle is made again by the operator: the replacement."""
        meta = job["metadata"]
        namespace = meta["namespace"]
        pods = {p: self._cache.get(PODS, f"{namespace}/{p}") for p in decision.pods}
        live = {p: o for p, o in pods.items() if o and not o["metadata"].get("deletionTimestamp")}
        if not live:
            refuse(decision, "no_live_victims", pods=list(decision.pods))
            return
        spec = _worker_spec(job)
        target = _replicas_after(spec, tuple(live))
        if spec.replicas is not None and target < spec.replicas:
            patched = self._objects.merge_patch(
                PYTORCH_JOBS, namespace, meta["name"], _replicas_patch(job, target)
            )
            self._cache.assume(PYTORCH_JOBS, patched)
            job = patched
        for name, pod in live.items():
            self._delete(namespace, name, pod["metadata"].get("creationTimestamp"))
        replaced = sorted(set(live) - _top(spec, tuple(live)))
        what = f"delete {', '.join(sorted(live))}"
        if replaced:
            what += f" ({', '.join(replaced)} made again by the operator: the replacement)"
        message = f"{self.replicas_name} {target}: {what}, {summary(decision)}"
        self._recorder.record(job, "ScaleInRequested", message, now)
        log.info("workers_deleted", job=decision.job, replicas=target, pods=sorted(live))

    def removable(self, job: Obj, decision: Decision, victims: Sequence[str]) -> bool:
        return True  # any worker, by name (scale_in)

    def _delete(self, namespace: str, name: str, created: object) -> None:
        """Delete the very pod decided on: the watch cache keeps no uid (kept_fields.py), so the
        server's copy gives it, and one created at another time is the operator's new pod
        under the old name (the replacement), left alone; the uid precondition holds the rest."""
        try:
            meta = self._objects.get(PODS, namespace, name, urgent=True)["metadata"]
            if meta.get("creationTimestamp") != created or meta.get("deletionTimestamp"):
                log.info("worker_already_replaced_or_going", pod=f"{namespace}/{name}")
                return
            self._objects.delete_pod(namespace, name, str(meta.get("uid") or ""))
        except ApiException as exc:
            # 404: gone already (a retry after a lost reply); 409: the name holds a new pod
            if exc.status not in (404, 409):
                raise
            log.info("worker_already_gone", pod=f"{namespace}/{name}", status=exc.status)


def _replicas_patch(job: Obj, replicas: int) -> Obj:
    return {
        "metadata": {"resourceVersion": job["metadata"].get("resourceVersion")},
        "spec": {"pytorchReplicaSpecs": {WORKER: {"replicas": replicas}}},
    }


def _top(spec: ReplicaSpec, victims: tuple[str, ...]) -> set[str]:
    """The victims that hold the highest indices without a gap: lowering the replicas past them
    removes them and no other worker."""
    indices = {name_index(v): v for v in victims}
    top: set[str] = set()
    i = (spec.replicas or 0) - 1
    while i in indices:
        top.add(indices[i])
        i -= 1
    return top


def _replicas_after(spec: ReplicaSpec, victims: tuple[str, ...]) -> int:
    """The replicas once `victims` are gone: less the ones at the top, never below the job's
    own min (torchrun waits for that many nodes: the operator's new pods are its refill)."""
    replicas = spec.replicas or 0
    return max(replicas - len(_top(spec, victims)), min(spec.bounds()[0], replicas))


# --- reading PyTorchJobs and their workers --------------------------------------------------------
def _worker_of(meta: Obj, name: str, labels: dict[str, str]) -> str | None:
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None or owner.get("kind") != PYTORCH_JOBS.kind:
        return None
    return labels.get(JOB_LABEL) if labels.get(TYPE_LABEL, "").lower() == "worker" else None


def _elastic(job: Obj) -> dict | None:
    policy = (job.get("spec") or {}).get("elasticPolicy")
    return policy if isinstance(policy, dict) else None


def _worker_spec(job: Obj) -> ReplicaSpec:
    spec = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get(WORKER) or {}
    elastic = _elastic(job) or {}
    lo, hi = count(elastic, "minReplicas"), count(elastic, "maxReplicas")
    # setElasticPolicy: one bound alone stands for both (neither: the replicas, as bounds() does)
    return ReplicaSpec(count(spec, "replicas"), lo or hi, hi or lo, spec.get("template") or {})


def _unscalable(job: Obj) -> str:
    elastic = _elastic(job)
    if elastic is None:
        return (
            "PyTorchJob has no spec.elasticPolicy: torchrun's --nnodes is fixed at the "
            "replicas (PET_NNODES), so it is not scaled"
        )
    if elastic.get("metrics"):
        return (
            "spec.elasticPolicy.metrics makes the training-operator run an HPA over this job, "
            "which would undo every scale of ours: remove metrics to let spot-autoscaler scale it"
        )
    workers = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get(WORKER) or {}
    if workers.get("restartPolicy") == "Never":
        return (
            "Worker restartPolicy Never: the training-operator fails the whole job when a worker "
            "is deleted; use OnFailure to let spot-autoscaler scale it"
        )
    return ""


def _phase(job: Obj) -> str:
    """Restarting counts as Running: the operator says Restarting whenever a worker is deleted
    (a Running pod with a deletionTimestamp counts as failed: pkg/core/status.go
    `UpdateJobReplicaStatuses`, then pytorchjob_controller.go `UpdateJobStatus`), i.e. after
    every scale-in of ours, and torchrun carries on with the others meanwhile."""
    phase = condition_phase(job, _STATES)
    return "Running" if phase == "Restarting" else phase


def _next_index(job: Obj) -> int | None:
    """New workers take indices from replicas up."""
    return _worker_spec(job).replicas


def in_flight(job: Obj, workers: tuple[Worker, ...]) -> Scaler | None:
    """No scaler objects: replicas that the worker pods do not match yet is a scale in flight
    (a deleted middle index counts until the operator has made it again)."""
    replicas = _worker_spec(job).replicas or 0
    live = [w for w in workers if not w.terminating]
    name = f"{job['metadata']['name']}-replicas"
    going = tuple(w.pod for w in live if (name_index(w.pod) or 0) >= replicas)
    if going:
        return Scaler(ScalerKind.SCALE_IN, name, pods=going)
    unborn = replicas - len(live)
    return Scaler(ScalerKind.SCALE_OUT, name, unborn=unborn) if unborn > 0 else None


def _guard_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job, TYPE_LABEL: "worker"}


KIND = JobKind(
    backend="training-operator",
    jobs=PYTORCH_JOBS,
    worker_of=_worker_of,
    worker_spec=_worker_spec,
    phase=_phase,
    finished=_FINISHED,
    inputs=scaled_by_replicas(in_flight),
    actuator=PyTorchJobActuator,
    next_index=_next_index,
    removes_highest_first=True,
    deletes_victims=True,
    unscalable=_unscalable,
    guard_labels=_guard_labels,
    # patch: Worker replicas and the drained-hosts annotation; pods: delete a scale-in's victims
    rbac={
        PYTORCH_JOBS: frozenset({"get", "list", "watch", "patch"}),
        PODS: frozenset({"delete"}),
    },
    docs="patches `spec.pytorchReplicaSpecs.Worker.replicas`; a scale-in deletes its victims "
    "by name (SIGTERM: torchrun's checkpoint) and lowers replicas past the top ones",
)
