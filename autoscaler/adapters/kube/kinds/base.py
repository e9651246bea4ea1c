"""What a job kind (an operator's elastic training job) must tell the rest of the adapter.

One module per kind declares a `JobKind`: its resources, how its worker pods are recognised and
named for Horovod, how min/max, phase and an in-flight scale are read from its objects, and how
a decision becomes writes. The cache, pod index, observer, actuator, wiring, RBAC check and docs
iterate over the registry (`kinds.KINDS`); nothing outside a kind's module names its resources.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from autoscaler.adapters.kube.resources import Obj, Resource, key_of
from autoscaler.core.model import Decision, Scaler, Worker

if TYPE_CHECKING:  # only types: the cache imports the kinds (view.CacheView is what they read)
    from autoscaler.adapters.kube.events import EventRecorder
    from autoscaler.adapters.kube.kinds.et_operator_scalers import ScalerFacts, ScalerState
    from autoscaler.adapters.kube.objects import ObjectApi
    from autoscaler.adapters.kube.view import CacheView


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """The worker replica spec of a job, whatever its kind calls it."""

    replicas: int | None
    min_replicas: int | None
    max_replicas: int | None
    template: Obj
    scale_in_pods: tuple[str, ...] = ()  # CCE: the victims of the current scale-in

    def bounds(self) -> tuple[int, int]:
        """(min, max) workers, falling back to the initial replicas; max never below min."""
        lo = next((v for v in (self.min_replicas, self.replicas) if v is not None), 1)
        hi = next((v for v in (self.max_replicas, self.replicas) if v is not None), lo)
        return lo, max(lo, hi)


def status_phase(job: Obj) -> str:
    """`status.phase`, where et-operator and CCE report it."""
    return str((job.get("status") or {}).get("phase") or "")


def condition_phase(job: Obj, states: tuple[str, ...]) -> str:
    """The newest of `states` whose condition holds, as a phase: Kubeflow's jobs (MPIJob,
    PyTorchJob) report conditions, no phase, and append each new state's condition last."""
    held = [
        c.get("type")
        for c in (job.get("status") or {}).get("conditions") or ()
        if isinstance(c, dict) and c.get("status") == "True" and c.get("type") in states
    ]
    return str(held[-1]) if held else ""


def count(spec: Mapping[str, object], key: str) -> int | None:
    """An integer field of a spec; None when absent or not an integer."""
    value = spec.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class JobContext:
    """What building one job may read besides its own object: this snapshot's other views."""

    workers: Callable[[str], tuple[Worker, ...]]  # job key -> its worker pods (this kind's)
    scalers: Mapping[str, list[ScalerFacts]]  # job key -> scaler objects naming it
    # the resourceVersion the pod view is complete up to; compared with scaler facts' only (the
    # observer reuses a job while the workers, the facts and those comparisons are the same)
    pods_seen: int
    # the one to report, given the job's worker pods (a ScaleOut's unborn ones)
    newest: Callable[[str, tuple[ScalerFacts, ...], Iterable[str]], Scaler | None]


@dataclass(frozen=True, slots=True)
class JobInputs:
    """What a job is built from besides its object; equal inputs build an equal job."""

    workers: tuple[Worker, ...]
    scalers: ScalerState | None  # scaler objects' history (kinds that have scaler objects)
    scaler: Scaler | None  # the scale in flight, if any


def scaled_by_replicas(
    in_flight: Callable[[Obj, tuple[Worker, ...]], Scaler | None],
) -> Callable[[Obj, JobContext], JobInputs]:
    """The inputs of a kind without scaler objects: its workers, and the scale in flight that
    its job object and workers show."""

    def inputs(job: Obj, ctx: JobContext) -> JobInputs:
        workers = ctx.workers(key_of(job))
        return JobInputs(workers, None, in_flight(job, workers))

    return inputs


class KindActuator(Protocol):
    """Carries out the scale decisions for one kind; drains are the same for every kind."""

    def scale_out(self, job: Obj, decision: Decision, now: datetime) -> None: ...

    def scale_in(self, job: Obj, decision: Decision, now: datetime) -> None: ...

    def cancel(self, job: Obj, decision: Decision, now: datetime) -> None: ...


ActuatorFactory = Callable[["ObjectApi", "CacheView", "EventRecorder"], KindActuator]


def _every(_: Obj) -> bool:
    return True


def _no_index(_: Obj) -> int | None:
    return None


def _scalable(_: Obj) -> str:
    return ""


@dataclass(frozen=True)
class JobKind:
    backend: str  # the operator's name in logs, metrics and /readyz
    jobs: Resource
    # pod (metadata, name, labels) -> the name of the job it is a worker of, or None
    worker_of: Callable[[Obj, str, dict[str, str]], str | None]
    worker_spec: Callable[[Obj], ReplicaSpec]
    phase: Callable[[Obj], str]  # "Running" when scaling may happen
    finished: frozenset[str]  # phases after which a job never scales again
    inputs: Callable[[Obj, JobContext], JobInputs]
    actuator: ActuatorFactory
    # verbs per resource this kind needs, besides what every kind needs (deploy/rbac.yaml)
    rbac: Mapping[Resource, frozenset[str]]
    helpers: tuple[Resource, ...] = ()  # other kinds it needs served (its scaler objects)
    keep: Callable[[Obj], bool] = _every  # which objects of `jobs` are elastic jobs at all
    next_index: Callable[[Obj], int | None] = _no_index  # the index of the next worker made
    reuses_names: bool = False  # a new worker may get a removed one's name (Horovod blacklists)
    removes_highest_first: bool = False  # lowering replicas removes the top indices, no victims
    # a scale-in deletes its victims by name wherever they are (core.model.Job.deletes_victims)
    deletes_victims: bool = False
    # why a job cannot be scaled as it is ("" when it can): the core leaves it alone and says so
    unscalable: Callable[[Obj], str] = _scalable
    # job name -> the labels of its worker pods, for a PodDisruptionBudget over them
    # (eviction_guard.py); None: evictions are not held for this kind
    guard_labels: Callable[[str], dict[str, str]] | None = None
    docs: str = field(default="", compare=False)  # one line for docs/kubernetes.md

    @property
    def names_victims(self) -> bool:
        """A scale-in removes exactly the pods it names (else: the top indices, all or none)."""
        return not self.removes_highest_first or self.deletes_victims

    @property
    def resources(self) -> tuple[Resource, ...]:
        return (self.jobs, *self.helpers)
