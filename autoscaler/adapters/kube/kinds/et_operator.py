"""et-operator (kai.alibabacloud.com TrainingJob): workers are pods named `<job>-worker-<i>`;
a decision becomes one ScaleOut or ScaleIn object with a deterministic name.

The name hashes the state the decision was made from, so a restarted daemon that makes the same
decision again gets 409 AlreadyExists instead of a second scaler. The last finished scaler is part
of that state: after a ScaleOut fails (or a pod index is reused), the retry gets a fresh name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import structlog
import urllib3
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.kinds.base import (
    JobContext,
    JobInputs,
    JobKind,
    ReplicaSpec,
    count,
    status_phase,
)
from autoscaler.adapters.kube.kinds.et_operator_scalers import (
    FAILED,
    SUCCEEDED,
    ScalerFacts,
    ScalerState,
    scaler_facts,
    scaler_state,
)
from autoscaler.adapters.kube.outcomes import already_done, refuse, summary
from autoscaler.adapters.kube.pods import TERMINATED_PHASES, name_index, pod_alive, pod_created
from autoscaler.adapters.kube.resources import (
    MANAGED_BY_LABEL,
    MANAGER,
    REASON_ANNOTATION,
    Obj,
    Resource,
    key_of,
    labels_of,
)
from autoscaler.core.model import Decision, ScalerKind, Worker
from autoscaler.core.policy import ScaleOutRules

if TYPE_CHECKING:
    from autoscaler.adapters.kube.events import EventRecorder
    from autoscaler.adapters.kube.objects import ObjectApi
    from autoscaler.adapters.kube.view import CacheView

log = structlog.get_logger()

_KAI = "kai.alibabacloud.com"
TRAINING_JOBS = Resource("TrainingJob", _KAI, "v1alpha1", "trainingjobs", True)
SCALE_OUTS = Resource("ScaleOut", _KAI, "v1alpha1", "scaleouts", True)
SCALE_INS = Resource("ScaleIn", _KAI, "v1alpha1", "scaleins", True)

# et-operator's worker pod labels (pkg/controllers: GenLabels + labelTrainingRoleType)
JOB_LABEL = "training-job-name"
ROLE_LABEL = "training-job-role"

# et-operator copies a ScaleOut's name into a label of the pods it adds: label values are <= 63.
_MAX_NAME = 63
_DIGEST = 10


def scaler_name(job: str, tag: str, state: list[str]) -> str:
    digest = hashlib.sha256("\x00".join(state).encode()).hexdigest()[:_DIGEST]
    prefix = job[: _MAX_NAME - len(tag) - _DIGEST - 2].rstrip("-.")
    return f"{prefix}-{tag}-{digest}"


@dataclass(frozen=True, slots=True)
class _Request:
    resource: Resource
    name: str
    spec: Obj
    event_reason: str
    message: str
    # asked last, right before the create: False (after `refuse`) writes nothing
    confirm: Callable[[Obj, Decision], bool] | None = None


class EtOperatorActuator:
    """A ScaleOut adds a COUNT of workers to whatever the job has, so it is sized on the server's
    word, not the view's, and never while a scaler of ours may still run. This is what the
    ReplicaSet controller's expectations are for (kubernetes pkg/controller/controller_utils.go
    `ControllerExpectations`, used by pkg/controller/replicaset/replica_set.go `syncReplicaSet`:
    after creating pods it does not act on the ReplicaSet again until its informer has observed
    them, because a watch cache lags its own writes). Here: our last scaler of each job is
    remembered until the cache has it finished; a cache that lost it (a re-list served before
    the create replaces everything held) is not trusted, the server is asked for it; and the
    job's live workers are counted on the server before the ScaleOut goes (`_room_on_server`).
    The pods a finished ScaleOut added but the pod view has not shown yet are counted by the
    observer (`with_unseen`), so the core sizes the next ScaleOut right in the first place."""

    def __init__(self, objects: ObjectApi, cache: CacheView, recorder: EventRecorder) -> None:
        self._objects = objects
        self._cache = cache
        self._recorder = recorder
        # job key -> (kind, name) of the last scaler we made for it, until seen finished
        self._ours: dict[str, tuple[Resource, str]] = {}

    def scale_out(self, job: Obj, decision: Decision, now: datetime) -> None:
        if decision.count <= 0:
            refuse(decision, "nothing_to_add")
            return
        state = self._state(job)
        name = scaler_name(
            job["metadata"]["name"],
            "out",
            [
                "ScaleOut",
                decision.job,
                str(decision.from_workers),
                str(decision.to_workers),
                state.latest_finished,
            ],
        )
        spec = {
            "selector": {"name": job["metadata"]["name"]},
            "toAdd": {"count": decision.count},
            "timeout": max(1, int((decision.timeout or ScaleOutRules().timeout).total_seconds())),
        }
        message = f"ScaleOut {name}: add {decision.count} worker(s), {summary(decision)}"
        request = _Request(
            SCALE_OUTS, name, spec, "ScaleOutCreated", message, confirm=self._room_on_server
        )
        self._create(job, state, decision, request, now)

    def _room_on_server(self, job: Obj, decision: Decision) -> bool:
        """Whether the job's live workers on the server (not the watch cache: it may miss the
        pods of the last ScaleOut), plus the ScaleOut's count, stay within the decision's
        target (never above max: the core's target is). A consistent list of the job's
        workers by their labels; a view that missed some is refused: the next pass, on a view
        that has caught up, decides again (by name: a deterministic ScaleOut keeps its count).
        Asked once: a ScaleOut that cannot be checked now waits for the next pass."""
        meta = job["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        selector = f"{JOB_LABEL}={name},{ROLE_LABEL}=worker"
        try:  # one try: a pass that waits out retries (a 429's second) holds the next notice
            listed = self._objects.pods(namespace, selector, once=True)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            refuse(decision, "server_unsure", error=f"{type(exc).__name__}: {exc}"[:200])
            return False
        live = sum(
            1
            for pod in listed
            if _worker_of(pod["metadata"], pod["metadata"]["name"], labels_of(pod)) == name
            and _alive(pod)
        )
        if live + decision.count <= decision.to_workers:
            return True
        refuse(
            decision,
            "view_behind_server",
            live_on_server=live,
            in_view=decision.from_workers,
            count=decision.count,
            target=decision.to_workers,
        )
        return False

    def scale_in(self, job: Obj, decision: Decision, now: datetime) -> None:
        namespace = job["metadata"]["namespace"]
        # et-operator keeps only named pods that exist when it first runs the ScaleIn, and none
        # means EVERY worker goes (scalein.go `setsSaleInToDelete` leaves status.toDeletePods
        # empty; worker.go `DeleteWorkerPods(job, nil)` deletes all pods with grace 0). So name
        # only pods that exist and are not already Terminating, and never create one without.
        facts = self._facts(job)
        named = self._named_before(namespace, facts)
        victims = sorted(
            p for p in decision.pods if pod_alive(self._cache, namespace, p) and p not in named
        )
        if not victims:  # never fall back to a count either: it removes the highest indices
            refuse(decision, "no_live_victims", pods=list(decision.pods), named_before=named)
            return
        state = scaler_state(job, key_of(job), facts)
        name = scaler_name(
            job["metadata"]["name"],
            "in",
            ["ScaleIn", decision.job, *victims, state.latest_finished],
        )
        spec = {"selector": {"name": job["metadata"]["name"]}, "toDelete": {"podNames": victims}}
        message = f"ScaleIn {name}: remove {', '.join(victims)}, {summary(decision)}"
        request = _Request(SCALE_INS, name, spec, "ScaleInCreated", message)
        self._create(job, state, decision, request, now)

    def cancel(self, job: Obj, decision: Decision, now: datetime) -> None:
        """Delete our not-yet-started ScaleIn whose pods are all gone (see core `_cancel`)."""
        namespace = job["metadata"]["namespace"]
        state = self._state(job)
        for scaler in state.in_flight:
            obj = self._cache.get(SCALE_INS, f"{namespace}/{scaler.name}")
            if obj is None or scaler.kind.value != SCALE_INS.kind:
                continue
            facts = scaler_facts(SCALE_INS, obj)
            alive = any(pod_alive(self._cache, namespace, p) for p in facts.pods)
            if not facts.ours or facts.started or alive:
                continue  # not ours, picked up, or a victim is back: nothing to undo
            try:
                self._objects.delete(
                    SCALE_INS,
                    namespace,
                    facts.name,
                    str(obj["metadata"].get("resourceVersion", "")),
                )
            except ApiException as exc:
                if exc.status == 404:
                    continue  # gone already
                if exc.status == 409:  # changed meanwhile: the next pass looks again
                    refuse(decision, "scaler_changed", scaler=facts.name)
                    continue
                raise
            self._cache.forget(SCALE_INS, obj)
            self._recorder.record(
                job,
                "ScaleInCancelled",
                f"ScaleIn {facts.name} deleted before et-operator ran it: none of "
                f"{', '.join(facts.pods)} is left, and an empty ScaleIn deletes every worker",
                now,
                warning=True,
            )
            log.warning(
                "scaler_cancelled", job=decision.job, scaler=facts.name, pods=list(facts.pods)
            )

    def _facts(self, job: Obj) -> list[ScalerFacts]:
        key = key_of(job)
        return [
            f
            for resource in (SCALE_OUTS, SCALE_INS)
            for obj in self._cache.items(resource)
            if (f := scaler_facts(resource, obj)).job == key
        ]

    def _state(self, job: Obj) -> ScalerState:
        return scaler_state(job, key_of(job), self._facts(job))

    def _unfinished_elsewhere(self, job: Obj) -> str | None:
        """The name of our last scaler for `job` if it has not finished though the cache holds
        no unfinished copy of it: it lost the copy (a re-list replaces what it held, our own
        writes too) or has not seen it yet. The server's copy tells; gone or finished, it is
        forgotten (the ReplicaSet controller's expectations, but asked of the server instead of
        waiting out a timeout)."""
        key = key_of(job)
        ours = self._ours.get(key)
        if ours is None:
            return None
        resource, name = ours
        namespace = job["metadata"]["namespace"]
        obj = self._cache.get(resource, f"{namespace}/{name}")
        if obj is None:
            try:
                obj = self._objects.get(resource, namespace, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        if obj is None or scaler_facts(resource, obj).outcome is not None:
            self._ours.pop(key, None)
            return None
        log.info("scaler_not_in_cache", job=key, scaler=name)
        return name

    def _named_before(self, namespace: str, facts: list[ScalerFacts]) -> list[str]:
        """Pods an earlier ScaleIn of ours already names (in flight, or done: the cache may
        still hold a pod it deleted). Naming one again could make a ScaleIn whose pods are all
        gone when et-operator reads it, i.e. one that deletes every worker. A pod created after
        that ScaleIn is a new pod under a reused name (et-operator reuses indices) and may go."""
        out = []
        for f in facts:
            if f.kind is not ScalerKind.SCALE_IN or not f.ours or f.outcome == FAILED:
                continue
            for pod in f.pods:
                born = pod_created(self._cache, namespace, pod)
                if born is None or f.created_at is None or born <= f.created_at:
                    out.append(pod)
        return sorted(set(out))

    def _create(
        self, job: Obj, state: ScalerState, decision: Decision, request: _Request, now: datetime
    ) -> None:
        resource, name = request.resource, request.name
        if not self._may_create(job, state, decision, request):
            return
        namespace = job["metadata"]["namespace"]
        body = {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {MANAGED_BY_LABEL: MANAGER},
                "annotations": {REASON_ANNOTATION: decision.reason.value},
            },
            "spec": request.spec,
        }
        try:
            created = self._objects.create(resource, namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._ours_already(job, decision, request, exc)
            return
        self._cache.assume(resource, created)
        self._ours[key_of(job)] = (resource, name)
        self._recorder.record(job, request.event_reason, request.message, now)
        log.info(
            "scaler_created",
            job=decision.job,
            kind=resource.kind,
            scaler=name,
            count=decision.count,
            pods=list(decision.pods),
        )

    def _may_create(
        self, job: Obj, state: ScalerState, decision: Decision, request: _Request
    ) -> bool:
        """Whether the scaler may go out now; if not, the decision is refused (or already
        done) here."""
        if any(s.name == request.name for s in state.in_flight):
            already_done(decision, request.name)
            return False
        if state.in_flight:  # et-operator runs one at a time, newest first: never queue another
            refuse(decision, "scaler_in_flight", scalers=[s.name for s in state.in_flight])
            return False
        if status_phase(job) != "Running":  # scalers run only while Running; a queued one goes LIFO
            refuse(decision, "job_not_running", phase=status_phase(job))
            return False
        if (unseen := self._unfinished_elsewhere(job)) is not None:
            refuse(decision, "scaler_in_flight_on_server", scalers=[unseen])
            return False
        return request.confirm is None or request.confirm(job, decision)

    def _ours_already(
        self, job: Obj, decision: Decision, request: _Request, exc: ApiException
    ) -> None:
        """A 409 on create: made before a restart, by a pass whose watch event has not come
        yet, or by an earlier try whose reply was lost: success only if it is ours and the
        same request."""
        resource, name = request.resource, request.name
        namespace = job["metadata"]["namespace"]
        existing = self._objects.get(resource, namespace, name)
        theirs = (existing.get("metadata") or {}).get("labels") or {}
        spec = existing.get("spec") or {}
        if theirs.get(MANAGED_BY_LABEL) != MANAGER or any(
            spec.get(k) != v for k, v in request.spec.items()
        ):
            raise RuntimeError(
                f"{resource.kind} {namespace}/{name} exists and is not the "
                "one this decision asks for"
            ) from exc
        self._cache.assume(resource, existing)
        self._ours[key_of(job)] = (resource, name)
        already_done(decision, name)


def _alive(pod: Obj) -> bool:
    """Neither Terminating nor ended: a worker that counts against max."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in TERMINATED_PHASES


# --- reading TrainingJobs and their workers ------------------------------------------------------
def _worker_of(meta: Obj, name: str, labels: dict[str, str]) -> str | None:
    if labels.get(ROLE_LABEL) == "worker" and labels.get(JOB_LABEL):
        return labels[JOB_LABEL]
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None or owner.get("kind") != TRAINING_JOBS.kind:
        return None
    job = str(owner.get("name", ""))
    return job if re.fullmatch(rf"{re.escape(job)}-worker-\d+", name) else None


def _worker_spec(job: Obj) -> ReplicaSpec:
    spec = ((job.get("spec") or {}).get("etReplicaSpecs") or {}).get("worker") or {}
    return ReplicaSpec(
        count(spec, "replicas"),
        count(spec, "minReplicas"),
        count(spec, "maxReplicas"),
        spec.get("template") or {},
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


def with_unseen(
    workers: tuple[Worker, ...], scalers: list[ScalerFacts], pods_seen: int
) -> tuple[Worker, ...]:
    """Workers as the scalers that finished after the pod view say they are: plus those a
    ScaleOut has already added, minus those a ScaleIn has already deleted.

    Watches are independent streams: after a cut pod watch, a scaler can be seen finished while
    its pods' changes are not. Counting the added pods as (pending) workers keeps a pass from
    scaling out again past max; dropping the deleted ones keeps it from clamping ghosts to max
    and so removing healthy workers (the expectations of the ReplicaSet controller, read from
    the scaler's own record). Only scalers that succeeded at a resourceVersion newer than the pod
    view's count."""
    ahead = [f for f in scalers if f.outcome == SUCCEEDED and f.resource_version > pods_seen]
    if not ahead:  # nearly always: no pod set is built for every job on every pass
        return workers
    known = {w.pod for w in workers}
    added, deleted = _replayed(ahead, known)
    if not added and not deleted & known:
        return workers
    extra = (
        Worker(pod=p, node=None, host=p, index=name_index(p) or 0, pending=True) for p in added
    )
    return (*(w for w in workers if w.pod not in deleted), *extra)


def _replayed(ahead: list[ScalerFacts], known: set[str]) -> tuple[dict[str, None], set[str]]:
    """The pods the scalers added (not among `known`, in order) and those they deleted,
    replayed in the order they finished: et-operator gives a ScaleOut the indices a ScaleIn
    freed, so a name a ScaleIn deleted may be a new worker's again."""
    deleted: set[str] = set()
    added: dict[str, None] = {}
    for f in sorted(ahead, key=lambda f: f.finish_order):
        if f.kind is ScalerKind.SCALE_IN:
            deleted.update(f.pods)
            for pod in f.pods:
                added.pop(pod, None)
        else:
            deleted.difference_update(f.pods)
            added.update((p, None) for p in f.pods if p not in known)
    return added, deleted


def _inputs(job: Obj, ctx: JobContext) -> JobInputs:
    key = key_of(job)
    facts = ctx.scalers.get(key, [])
    state = scaler_state(job, key, facts)
    workers = with_unseen(ctx.workers(key), facts, ctx.pods_seen)
    return JobInputs(workers, state, ctx.newest(key, state.in_flight, (w.pod for w in workers)))


_READ = frozenset({"get", "list", "watch"})
KIND = JobKind(
    backend="et-operator",
    jobs=TRAINING_JOBS,
    helpers=(SCALE_OUTS, SCALE_INS),
    worker_of=_worker_of,
    worker_spec=_worker_spec,
    phase=status_phase,
    # api/v1/types.go JobSucceeded/JobFailed
    finished=frozenset({"Succeeded", "Failed"}),
    inputs=_inputs,
    actuator=EtOperatorActuator,
    next_index=next_worker_index,
    reuses_names=True,  # a ScaleOut after a ScaleIn gets the freed indices back
    guard_labels=lambda name: {JOB_LABEL: name, ROLE_LABEL: "worker"},
    rbac={
        TRAINING_JOBS: _READ | {"patch"},  # patch: the drained-hosts annotation
        SCALE_OUTS: _READ | {"create"},
        # delete: only our ScaleIn whose pods are all gone, before et-operator runs it
        SCALE_INS: _READ | {"create", "delete"},
    },
    docs="ScaleOut/ScaleIn objects naming the pods to delete; hosts are pod names",
)
