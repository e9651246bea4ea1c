"""The actuator of kinds scaled by patching a replica count on the job (no scaler objects).

A decision becomes one merge patch of the job; a kind says what the patch is, when it is already
done, and which victims its operator can remove. The patch is idempotent by nature (it sets the
target), so a retry after a lost reply finds it done.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from autoscaler.adapters.kube.outcomes import already_done, refuse, summary
from autoscaler.adapters.kube.pods import pod_alive
from autoscaler.adapters.kube.resources import Obj, Resource
from autoscaler.core.model import Decision

if TYPE_CHECKING:
    from autoscaler.adapters.kube.events import EventRecorder
    from autoscaler.adapters.kube.objects import ObjectApi
    from autoscaler.adapters.kube.view import CacheView

log = structlog.get_logger()


class ReplicasActuator:
    resource: Resource
    replicas_name: str  # how Events name the replica count, e.g. "trainer replicas"

    def __init__(self, objects: ObjectApi, cache: CacheView, recorder: EventRecorder) -> None:
        self._objects = objects
        self._cache = cache
        self._recorder = recorder

    # --- what a kind says ------------------------------------------------------------------------
    def phase(self, job: Obj) -> str:
        raise NotImplementedError

    def done(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> bool:
        """The job already asks for what the decision wants."""
        raise NotImplementedError

    def patch(self, job: Obj, decision: Decision, victims: tuple[str, ...]) -> Obj | None:
        """The merge patch that carries the decision out; None (after `refuse`) if it cannot."""
        raise NotImplementedError

    def removable(self, job: Obj, decision: Decision, victims: Sequence[str]) -> bool:
        """Whether the operator can remove exactly `victims` (else `refuse` and False)."""
        return True

    # --- the KindActuator protocol ---------------------------------------------------------------
    def scale_out(self, job: Obj, decision: Decision, now: datetime) -> None:
        self._apply(job, decision, (), now)

    def scale_in(self, job: Obj, decision: Decision, now: datetime) -> None:
        namespace = job["metadata"]["namespace"]
        victims = tuple(p for p in decision.pods if pod_alive(self._cache, namespace, p))
        if not victims:  # a pod already gone or going needs no scale-in (and names nobody)
            refuse(decision, "no_live_victims", pods=list(decision.pods))
            return
        if self.removable(job, decision, victims):
            self._apply(job, decision, victims, now)

    def cancel(self, job: Obj, decision: Decision, now: datetime) -> None:
        refuse(decision, "nothing_to_cancel")  # no scaler objects: a patch is never queued

    def _apply(self, job: Obj, decision: Decision, victims: tuple[str, ...], now: datetime) -> None:
        meta = job["metadata"]
        if self.done(job, decision, victims):
            already_done(decision, meta["name"])
            return
        if (phase := self.phase(job)) != "Running":  # e.g. the previous change is under way
            refuse(decision, "job_not_running", phase=phase)
            return
        patch = self.patch(job, decision, victims)
        if patch is None:
            return
        patched = self._objects.merge_patch(self.resource, meta["namespace"], meta["name"], patch)
        self._cache.assume(self.resource, patched)
        what = f"remove {', '.join(victims)}" if victims else f"add {decision.count} worker(s)"
        reason = "ScaleInRequested" if victims else "ScaleOutRequested"
        message = f"{self.replicas_name} {decision.to_workers}: {what}, {summary(decision)}"
        self._recorder.record(patched, reason, message, now)
        log.info(
            "replicas_patched", job=decision.job, replicas=decision.to_workers, pods=list(victims)
        )
