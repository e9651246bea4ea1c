"""Baidu CCE AITrainingJob: a decision becomes a merge patch of the trainer replica spec.

Setting replicas to the decision's target is idempotent by nature; a scale-in also names its
victims in `scaleInpods`, so the operator removes those pods rather than any.
"""

from __future__ import annotations

from datetime import datetime

import structlog

from autoscaler.adapters.kube.cache import KubeCache, pod_alive
from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.jobs import CCE_WORKER_REPLICA, job_phase, worker_spec
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.outcomes import already_done, refuse, summary
from autoscaler.adapters.kube.resources import AI_TRAINING_JOBS, Obj
from autoscaler.core.model import Backend, Decision

log = structlog.get_logger()


class CceActuator:
    def __init__(self, objects: ObjectApi, cache: KubeCache, recorder: EventRecorder) -> None:
        self._objects = objects
        self._cache = cache
        self._recorder = recorder

    def scale_out(self, job: Obj, decision: Decision, now: datetime) -> None:
        self._patch(job, decision, (), now)

    def scale_in(self, job: Obj, decision: Decision, now: datetime) -> None:
        namespace = job["metadata"]["namespace"]
        victims = tuple(p for p in decision.pods if pod_alive(self._cache, namespace, p))
        if not victims:  # a pod already gone or going needs no scale-in (and names nobody)
            refuse(decision, "no_live_victims", pods=list(decision.pods))
            return
        self._patch(job, decision, victims, now)

    def _patch(self, job: Obj, decision: Decision, victims: tuple[str, ...], now: datetime) -> None:
        meta = job["metadata"]
        current = worker_spec(job, Backend.CCE)
        same_victims = not victims or current.scale_in_pods == victims
        if current.replicas == decision.to_workers and same_victims:
            already_done(decision, meta["name"])
            return
        if job_phase(job) != "Running":  # Scaling = the previous change is still being carried out
            refuse(decision, "job_not_running", phase=job_phase(job))
            return
        # the operator never clears scaleInpods: a scale-out clears it, so old victims named
        # there cannot be taken for the next scale-in's
        trainer: Obj = {"replicas": decision.to_workers, "scaleInpods": list(victims) or None}
        patch = {"spec": {"replicaSpecs": {CCE_WORKER_REPLICA: trainer}}}
        namespace, name = meta["namespace"], meta["name"]
        patched = self._objects.merge_patch(AI_TRAINING_JOBS, namespace, name, patch)
        self._cache.assume(AI_TRAINING_JOBS, patched)
        what = f"remove {', '.join(victims)}" if victims else f"add {decision.count} worker(s)"
        reason = "ScaleInRequested" if victims else "ScaleOutRequested"
        message = f"trainer replicas {decision.to_workers}: {what}, {summary(decision)}"
        self._recorder.record(patched, reason, message, now)
        log.info("replicas_patched", job=decision.job, replicas=decision.to_workers,
                 pods=list(victims))
