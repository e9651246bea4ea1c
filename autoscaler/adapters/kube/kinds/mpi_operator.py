"""Kubeflow mpi-operator MPIJob (kubeflow.org/v2beta1): Horovod elastic jobs whose launcher runs
`horovodrun --host-discovery-script /etc/mpi/discover_hosts.sh`.

What the operator does, from its source (kubeflow/mpi-operator v0.8.2,
pkg/controller/mpi_job_controller.go; docs/mpi-operator.md has the details and what it costs us):
- workers are pods `<job>-worker-<i>`, i in 0..replicas-1 (`workerName`), labelled
  `training.kubeflow.org/job-name`, `training.kubeflow.org/job-role=worker`, owned by the MPIJob;
- lowering `spec.mpiReplicaSpecs.Worker.replicas` deletes the workers with the highest indices
  (`getOrCreateWorker`): no field names a victim, so a scale-in here can only remove the top
  indices, and only after they are drained;
- an index below replicas whose pod is gone is created again under the same name: a worker
  whose node died comes back Pending with its old name (Horovod blacklists a host name that
  failed: `reuses_names`); a pod that ended (Failed, Succeeded) is never made again while it
  exists (`getOrCreateWorker` finds it by name): its index stays dead, counted in
  `status.replicaStatuses.Worker.failed/succeeded` (`updateMPIJobStatus`), and the pod watch
  does not show it (ended pods hold nothing): replicas = live workers + dead ones;
- `discover_hosts.sh` in the ConfigMap `<job>-config` echoes `<pod>.<job>.<namespace>.svc` (plus
  `.<clusterDomain>` when the operator is given one) for each Running worker
  (`updateDiscoverHostsInConfigMap`), and reaches the launcher only when the kubelet syncs the
  volume (up to a minute). Hosts are therefore pod names here, as for et-operator: a drained
  host hides every discovered name whose first DNS label it is.
The MPIJob has no min/max: they come from annotations (`spot-autoscaler.io/min-workers`,
`max-workers`), and a job without them keeps its replicas (min = max = replicas).
"""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.adapters.kube.kinds.base import (
    JobKind,
    ReplicaSpec,
    condition_phase,
    count,
    scaled_by_replicas,
)
from autoscaler.adapters.kube.kinds.replicas import ReplicasActuator
from autoscaler.adapters.kube.outcomes import refuse
from autoscaler.adapters.kube.pods import name_index
from autoscaler.adapters.kube.resources import Obj, Resource, annotations_of
from autoscaler.core.model import Decision, Scaler, ScalerKind, Worker

MPI_JOBS = Resource("MPIJob", "kubeflow.org", "v2beta1", "mpijobs", True)
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"
WORKER = "Worker"  # the replica type in spec.mpiReplicaSpecs
MIN_ANNOTATION = "spot-autoscaler.io/min-workers"
MAX_ANNOTATION = "spot-autoscaler.io/max-workers"
# status.conditions types (pkg/apis/kubeflow/v2beta1 JobConditionType), newest state last
_FINISHED = frozenset({"Succeeded", "Failed"})
_STATES = ("Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


class MpiJobActuator(ReplicasActuator):
    """The patch carries the resourceVersion it was decided on: a job that changed meanwhile
    gets 409 and the next pass decides again."""

    resource = MPI_JOBS
    replicas_name = "Worker replicas"

    def phase(self, job: Obj) -> str:
        return _phase(job)

    def done(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> bool:
        return _worker_spec(job).replicas == decision.to_workers + _dead(job)

    def removable(self, job: Obj, decision: Decision, victims: Sequence[str]) -> bool:
        if (job.get("spec") or {}).get("runLauncherAsWorker"):
            # the index label is then i + 1 (`workerReplicaIndexLabel`) but getOrCreateWorker
            # compares it with replicas: worker replicas-1 would go too (and come back at once)
            refuse(decision, "launcher_as_worker", pods=list(victims))
            return False
        # the operator deletes indices >= replicas: the victims must be exactly those
        replicas = _worker_spec(job).replicas or 0
        top = {
            f"{job['metadata']['name']}-worker-{i}"
            for i in range(replicas - len(victims), replicas)
        }
        if set(victims) != top:
            refuse(decision, "not_highest_indices", pods=list(victims), replicas=replicas)
            return False
        return True

    def patch(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> Obj | None:
        # decisions count live workers; replicas also counts the dead indices (see _dead)
        replicas, dead = _worker_spec(job).replicas, _dead(job)
        if replicas != decision.from_workers + dead:  # decided on a view the job moved on from
            refuse(decision, "replicas_changed", replicas=replicas, dead=dead)
            return None
        return {
            "metadata": {"resourceVersion": job["metadata"].get("resourceVersion")},
            "spec": {"mpiReplicaSpecs": {WORKER: {"replicas": decision.to_workers + dead}}},
        }


# --- reading MPIJobs and their workers ------------------------------------------------------------
def _worker_of(meta: Obj, name: str, labels: dict[str, str]) -> str | None:
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None or owner.get("kind") != MPI_JOBS.kind:
        return None
    return labels.get(JOB_LABEL) if labels.get(ROLE_LABEL) == "worker" else None


def _annotated(job: Obj, key: str) -> int | None:
    value = annotations_of(job).get(key, "")
    return int(value) if value.isdigit() else None


def _worker_spec(job: Obj) -> ReplicaSpec:
    spec = ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).get(WORKER) or {}
    return ReplicaSpec(
        count(spec, "replicas"),
        _annotated(job, MIN_ANNOTATION),
        _annotated(job, MAX_ANNOTATION),
        spec.get("template") or {},
    )


def _dead(job: Obj) -> int:
    """Worker indices below replicas whose pod ended (Failed, Succeeded) and stays: mpi-operator
    v0.8.2 never replaces such a pod (pkg/controller/mpi_job_controller.go, `getOrCreateWorker`
    gets it by name and keeps it) and counts it in status.replicaStatuses.Worker
    (`updateMPIJobStatus`); our pod watch leaves ended pods out. Until the pod is deleted (by a
    person, or by the pod garbage collector once its node is gone) the index holds no worker."""
    worker = ((job.get("status") or {}).get("replicaStatuses") or {}).get(WORKER) or {}
    return sum(max(count(worker, k) or 0, 0) for k in ("failed", "succeeded"))


def _phase(job: Obj) -> str:
    return condition_phase(job, _STATES)


def _next_index(job: Obj) -> int | None:
    """New workers take indices from replicas up."""
    return _worker_spec(job).replicas


def in_flight(job: Obj, workers: tuple[Worker, ...]) -> Scaler | None:
    """No scaler objects: replicas that the worker pods do not match yet is a scale in flight.
    Dead indices (`_dead`) are not: the operator will not fill them, it would never finish."""
    replicas = _worker_spec(job).replicas or 0
    live = [w for w in workers if not w.terminating]
    name = f"{job['metadata']['name']}-replicas"
    if (unborn := replicas - len(live) - _dead(job)) > 0:
        return Scaler(ScalerKind.SCALE_OUT, name, unborn=unborn)
    going = tuple(w.pod for w in live if (name_index(w.pod) or 0) >= replicas)
    return Scaler(ScalerKind.SCALE_IN, name, pods=going) if going else None


KIND = JobKind(
    backend="mpi-operator",
    jobs=MPI_JOBS,
    worker_of=_worker_of,
    worker_spec=_worker_spec,
    phase=_phase,
    finished=_FINISHED,
    inputs=scaled_by_replicas(in_flight),
    actuator=MpiJobActuator,
    next_index=_next_index,
    reuses_names=True,
    removes_highest_first=True,
    # patch: spec.mpiReplicaSpecs.Worker.replicas, and the drained-hosts annotation
    rbac={MPI_JOBS: frozenset({"get", "list", "watch", "patch"})},
    docs="patches `spec.mpiReplicaSpecs.Worker.replicas`; a scale-in removes the highest indices",
)
