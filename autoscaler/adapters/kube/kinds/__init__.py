"""The registry of job kinds: one module per operator. Add a kind by adding its module here.

Everything that differs between operators lives in the kind's module (`base.JobKind` says what
that is); the cache, pod index, observer, actuator, RBAC check and docs iterate over `KINDS`.
"""

from __future__ import annotations

from autoscaler.adapters.kube.kinds import cce, et_operator, mpi_operator, pytorch
from autoscaler.adapters.kube.kinds.base import JobKind
from autoscaler.adapters.kube.resources import Obj, Resource
from autoscaler.adapters.kube.view import WatchedJobs, Watchlist

KINDS: tuple[JobKind, ...] = (et_operator.KIND, cce.KIND, mpi_operator.KIND, pytorch.KIND)

# every kind a kind needs: a backend acts only while the API server serves all of them
BACKENDS: dict[str, tuple[Resource, ...]] = {k.backend: k.resources for k in KINDS}
_BY_JOBS = {k.jobs: k for k in KINDS}
# what the watch cache is given to watch (it imports no kind)
WATCHLIST = Watchlist(
    jobs=tuple(WatchedJobs(k.jobs, k.keep, k.phase) for k in KINDS),
    helpers=tuple(r for k in KINDS for r in k.helpers),
    backends=BACKENDS,
)


def kind_of(resource: Resource) -> JobKind:
    """The kind whose job resource `resource` is."""
    return _BY_JOBS[resource]


def recognise(meta: Obj, name: str, labels: dict[str, str]) -> tuple[JobKind, str] | None:
    """(kind, job name) if the pod is a worker of an elastic job of any kind."""
    for kind in KINDS:
        if (job := kind.worker_of(meta, name, labels)) is not None:
            return kind, job
    return None
