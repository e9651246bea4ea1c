"""et-operator ScaleOut/ScaleIn objects read as facts: whose they are, and how they ended."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from autoscaler.adapters.kube.resources import (
    MANAGED_BY_LABEL,
    MANAGER,
    REASON_ANNOTATION,
    Obj,
    Resource,
    parse_time,
)
from autoscaler.core.model import Reason, Scaler, ScalerKind

SCALING = "Scaling"
SUCCEEDED = "ScaleSucceeded"
FAILED = "ScaleFailed"
_FINISHED = (SUCCEEDED, FAILED)
_EPOCH = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ScalerFacts:
    kind: ScalerKind
    name: str
    job: str  # `ns/name` of the TrainingJob in spec.selector.name
    created_at: datetime | None
    pods: tuple[str, ...]  # ScaleIn: its victims; ScaleOut: the pods it added
    outcome: str | None  # ScaleSucceeded | ScaleFailed; None while it has not finished
    finished_at: datetime | None
    refill: bool = False  # a ScaleOut we made to bring the job back to min
    ours: bool = False  # labelled as created by spot-autoscaler
    # a ScaleIn whose victims et-operator has frozen in status.toDeletePods (scalein.go
    # `setsSaleInToDelete`); before that it names pods in spec only
    started: bool = True
    # when et-operator took it up (its Scaling condition, scaler.go `updateCurrentScaler`)
    picked_up_at: datetime | None = None
    resource_version: int = 0  # the object's, when numeric: to tell which watches have seen it
    count: int = 0  # a ScaleOut's spec.toAdd.count (0: unknown)
    # a ScaleOut's workers Running when et-operator last looked (status.replicaStatuses.Worker
    # .active, set in scaleout.go `executeScaleOut` before its timeout check; a failed one keeps
    # the count it failed with: scaler.go `updateScalerState` changes only the condition)
    active: int = 0

    def as_scaler(self, workers: Iterable[str] = ()) -> Scaler:
        """The core's scaler; `workers`: the job's worker pods now, for a ScaleOut's unborn ones.
        et-operator persists status.addPods with or after the pods it makes (scaleout.go
        `setScaleOutWorkers` fills it in memory, `ScaleOutWorkers` creates them): until then
        the whole count is unborn, which may hold the room of pods already made for a pass."""
        unborn = 0
        if self.kind is ScalerKind.SCALE_OUT:
            unborn = max(0, self.count - len(set(self.pods).intersection(workers)))
        return Scaler(
            self.kind,
            self.name,
            self.created_at,
            self.pods,
            self.ours,
            self.started,
            unborn,
            self.picked_up_at,
        )

    @property
    def order(self) -> tuple[datetime, str]:
        """Newest last: et-operator runs the newest pending scaler first (LIFO, 1 s resolution)."""
        return (self.created_at or _EPOCH, self.name)

    @property
    def finish_order(self) -> tuple[datetime, datetime, str]:
        return (self.finished_at or _EPOCH, self.created_at or _EPOCH, self.name)


def _last_condition(status: Obj) -> Obj | None:
    conditions = [c for c in status.get("conditions") or () if isinstance(c, dict)]
    return conditions[-1] if conditions else None


def scaler_facts(resource: Resource, obj: Obj) -> ScalerFacts:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    kind = ScalerKind(resource.kind)  # the kinds are named as the operator's: ScaleIn, ScaleOut
    created = parse_time(meta.get("creationTimestamp"))
    outcome, finished = _outcome(status, created)
    return ScalerFacts(
        kind=kind,
        name=str(meta.get("name", "")),
        job=f"{meta.get('namespace', '')}/{(spec.get('selector') or {}).get('name', '')}",
        created_at=created,
        pods=_pods(kind, spec, status),
        outcome=outcome,
        finished_at=finished,
        refill=(meta.get("annotations") or {}).get(REASON_ANNOTATION) == Reason.BELOW_MIN.value,
        ours=(meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGER,
        started=kind is ScalerKind.SCALE_OUT or bool(status.get("toDeletePods")),
        picked_up_at=_since(status, SCALING),
        resource_version=int(rv) if (rv := str(meta.get("resourceVersion", ""))).isdigit() else 0,
        count=_count(kind, spec),
        active=_active(status),
    )


def _since(status: Obj, ctype: str) -> datetime | None:
    """When the scaler's condition `ctype` was last set (None: it has none)."""
    times = [
        _set_at(c)
        for c in status.get("conditions") or ()
        if isinstance(c, dict) and c.get("type") == ctype
    ]
    return max((t for t in times if t is not None), default=None)


def _active(status: Obj) -> int:
    worker = (status.get("replicaStatuses") or {}).get("Worker") or {}
    active = worker.get("active")
    return active if isinstance(active, int) and active > 0 else 0


def _count(kind: ScalerKind, spec: Obj) -> int:
    """A ScaleOut's spec.toAdd.count (0 when absent or not a number)."""
    count = (spec.get("toAdd") or {}).get("count") if kind is ScalerKind.SCALE_OUT else None
    return count if isinstance(count, int) and count > 0 else 0


def _pods(kind: ScalerKind, spec: Obj, status: Obj) -> tuple[str, ...]:
    """A ScaleIn's victims (frozen in status once et-operator took it up, else as asked in spec);
    a ScaleOut's added pods."""
    if kind is ScalerKind.SCALE_IN:
        pods = status.get("toDeletePods") or (spec.get("toDelete") or {}).get("podNames") or ()
    else:
        pods = status.get("addPods") or ()
    return tuple(str(p) for p in pods)


def _outcome(status: Obj, created: datetime | None) -> tuple[str | None, datetime | None]:
    """(ScaleSucceeded | ScaleFailed, when) once the scaler has finished, else (None, None)."""
    last = _last_condition(status) or {}
    state = last.get("type") or status.get("phase")
    if state not in _FINISHED:
        return None, None
    return state, _set_at(last) or created


def _set_at(condition: Obj) -> datetime | None:
    """When a condition was set: its transition, else its last update."""
    return parse_time(condition.get("lastTransitionTime")) or parse_time(
        condition.get("lastUpdateTime")
    )


def by_job(facts: Iterable[ScalerFacts]) -> dict[str, list[ScalerFacts]]:
    out: dict[str, list[ScalerFacts]] = defaultdict(list)
    for f in facts:
        out[f.job].append(f)
    return out


def current_scaler(job: Obj, job_key: str) -> ScalerFacts | None:
    """status.currentScaler (`ScaleOut:<ns>/<name>`) as an unfinished scaler, if a scale runs."""
    value = str((job.get("status") or {}).get("currentScaler") or "")
    kind, _, ref = value.partition(":")
    if not ref or kind not in (ScalerKind.SCALE_OUT.value, ScalerKind.SCALE_IN.value):
        return None
    return ScalerFacts(ScalerKind(kind), ref.rsplit("/", 1)[-1], job_key, None, (), None, None)


@dataclass(frozen=True, slots=True)
class ScalerState:
    """A job's scalers summed up for the core."""

    in_flight: tuple[ScalerFacts, ...]  # unfinished, newest last
    last_scale_out_at: datetime | None  # the last ScaleOut that grew the job (not a refill)
    last_failed_scale_out_at: datetime | None
    latest_finished: str  # name of the scaler that finished last ("" if none): a naming input
    failed_with: int | None = None  # the last ScaleOut to finish failed with so many Running


def scaler_state(job: Obj, job_key: str, scalers: list[ScalerFacts]) -> ScalerState:
    finished = sorted((s for s in scalers if s.outcome), key=lambda s: s.finish_order)
    outs = [s for s in finished if s.kind is ScalerKind.SCALE_OUT]
    failed_outs = [s for s in outs if s.outcome == FAILED]
    grown = [s for s in outs if s.outcome != FAILED and not s.refill]
    return ScalerState(
        in_flight=_in_flight(job, job_key, scalers),
        last_scale_out_at=_last_finished_at(grown),
        last_failed_scale_out_at=_last_finished_at(failed_outs),
        latest_finished=finished[-1].name if finished else "",
        failed_with=outs[-1].active if outs and outs[-1].outcome == FAILED else None,
    )


def _in_flight(job: Obj, job_key: str, scalers: list[ScalerFacts]) -> tuple[ScalerFacts, ...]:
    """The unfinished scalers, newest last. The job's own pointer covers a scaler this cache does
    not hold (yet); a pointer to a scaler we know has finished is stale."""
    running = [s for s in scalers if not s.outcome]
    pointer = current_scaler(job, job_key)
    if pointer is not None and all(s.name != pointer.name for s in scalers):
        running.append(pointer)
    return tuple(sorted(running, key=lambda s: s.order))


def _last_finished_at(finished: list[ScalerFacts]) -> datetime | None:
    """When the last of `finished` (in finishing order) finished."""
    return finished[-1].finished_at if finished else None
