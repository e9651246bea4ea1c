"""The reconciler's actuator for Kubernetes: one entry point, dispatching on the job's kind.

Errors that outlast a few quick retries are raised: the reconciler logs them per decision and
the next pass, seeing the cluster again, decides afresh.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.annotations import notice_patch, update_drained
from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.confirm import (
    CONFIRMED_FOR,
    SEND_BUDGET,
    BoardNotices,
    ServerCheck,
    narrowed,
)
from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.eviction_guard import EvictionGuard
from autoscaler.adapters.kube.kinds import KINDS, kind_of
from autoscaler.adapters.kube.kinds.base import JobKind, KindActuator
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.outcomes import refuse, summary
from autoscaler.adapters.kube.rejects import Rejections
from autoscaler.adapters.kube.resources import NODES, Obj, annotations_of
from autoscaler.adapters.kube.shield import DisruptionShield
from autoscaler.adapters.kube.signal import CheckpointSignal
from autoscaler.annotations import DRAINED_ANNOTATION, decode_drained
from autoscaler.config import Config
from autoscaler.core.model import Action, Decision, Job, Notice, Reason
from autoscaler.core.voluntary import Shield
from autoscaler.fencing import Fence, Stale
from autoscaler.notice import ANNOTATION

log = structlog.get_logger()
CHECKS_PER_SCALE_IN = 2  # checks (each with its create) per decision: the job's other writes wait


class KubeActuator:
    dry_run = False

    def __init__(
        self,
        api_client: client.ApiClient,
        config: Config,
        recorder: EventRecorder,
        cache: KubeCache,
        rejections: Rejections | None = None,
        fence: Fence | None = None,
        notices: BoardNotices | None = None,
    ) -> None:
        self._cache = cache
        self._rejections = rejections
        retries = config.kubernetes.write_retries
        # every decision's write asks the fence first (autoscaler.fencing); give the recorder
        # the same fence
        self._objects = ObjectApi(api_client, retries, fence)
        self._recorder = recorder
        # Notices are facts read from a cloud queue, not decisions: any replica that read one
        # writes it on its Node (that is how a standby's notice reaches the leader), unfenced.
        self._notices = ObjectApi(api_client, retries)
        self._notice_recorder = recorder.unfenced()
        self._kinds = {kind.jobs: kind.actuator(self._objects, cache, recorder) for kind in KINDS}
        # reads for the server's word before a removal (confirm.py): not fenced, reads
        self._check = ServerCheck(self._notices, cache, config.kubernetes, notices)
        self._signal = CheckpointSignal(self._objects, recorder)
        guarded = config.kubernetes.guard_evictions
        self._guard = EvictionGuard(self._objects, cache) if guarded else None
        self._shield = DisruptionShield(self._objects, cache)

    def keep(self, jobs: list[Job], now: datetime, writes: int, shield: Shield) -> bool:
        """Warning Events for objects the observer rejected; one PodDisruptionBudget per managed
        job of a kind that guards its workers (eviction_guard.py), none for others; Karpenter's
        do-not-disrupt on the `shield`'s pods and no others (shield.py); at most `writes`
        writes of each, True when none were left over."""
        for obj, message in self._rejections.untold() if self._rejections else ():
            self._recorder.record(obj, "ObjectRejected", message, now, warning=True)
        if not self._cache.synced():
            return True
        shielded = self._shield.keep(shield, writes)
        if self._guard is None:
            return shielded
        guarded = []
        for job in jobs:
            found = self._cache.find_job(job.key)
            if found is not None and (labels := kind_of(found[0]).guard_labels) is not None:
                guarded.append((found[1], labels(job.name)))
        return self._guard.keep(guarded, writes) and shielded

    def apply(self, decision: Decision, now: datetime) -> None:
        if not self._cache.synced():  # a partial view could hide a scaler that already runs
            raise RuntimeError("the cluster cache is not synced yet")
        found = self._cache.find_job(decision.job)
        if found is None:
            raise LookupError(f"job {decision.job} is not in the cache (deleted, or not managed)")
        resource, job = found
        kind, backend = kind_of(resource), self._kinds[resource]
        scaling = decision.action in (Action.SCALE_OUT, Action.SCALE_IN)
        if scaling and not self._cache.backends().get(kind.backend, False):
            # e.g. TrainingJobs served but the ScaleIn CRD not installed: nothing could run it
            refuse(decision, "backend_not_served", backend=kind.backend)
            return
        if decision.action is Action.NOOP:  # an alert (Reason.info.alert): tell people
            self._recorder.record(job, _event_reason(decision), decision.message, now, warning=True)
        elif decision.action is Action.CANCEL:
            backend.cancel(job, decision, now)
        elif decision.action is Action.SCALE_OUT:
            backend.scale_out(job, decision, now)
        elif decision.action is Action.SCALE_IN:
            self._scale_in(kind, backend, job, decision, now)
        elif decision.action is Action.DRAIN:  # only for notices the view is sure of
            self._checked_drain(kind, job, decision, now)
        elif decision.action is Action.UNDRAIN:
            self._drain(kind, job, decision, now)

    def _scale_in(
        self, kind: JobKind, backend: KindActuator, job: Obj, decision: Decision, now: datetime
    ) -> None:
        """Irreversible: only what the server still supports (confirm.py) goes out. A create that
        could not land while its check held is checked and tried again at once: left to the next
        pass, it waited out the loop's back-off (2-6 s after its notice under API faults). So is
        one whose check left it too little time (SEND_BUDGET). Checked again, a notice's victims
        want only their nodes read."""
        checked = self._check.scale_in(job, kind, decision, now)
        for attempt in range(1, CHECKS_PER_SCALE_IN + 1):
            if checked.left() < SEND_BUDGET:  # a retry's too: its check ran out
                checked = self._check.again(checked, job, kind, now)
            if not checked.decision.pods:
                refuse(decision, "not_confirmed_by_server", pods=list(decision.pods))
                return
            # what the server said holds for CONFIRMED_FOR: a ScaleIn that cannot land by then
            # (API trouble, retries) is not sent (a notice withdrawn meanwhile would otherwise
            # remove a healthy worker). Its name is the request's: a try whose reply was lost
            # makes the next one a 409 that finds it (kinds' `_create`), never a second ScaleIn.
            try:
                with self._objects.fence.until(checked.until, "the ScaleIn's victims"):
                    backend.scale_in(job, checked.decision, now)
                return
            except Stale as exc:
                if attempt == CHECKS_PER_SCALE_IN:
                    raise
                log.info("scale_in_checked_again", job=decision.job, attempt=attempt, why=str(exc))

    def _checked_drain(self, kind: JobKind, job: Obj, decision: Decision, now: datetime) -> None:
        """A drain for the notices the view or the server confirms (confirm.py), landing within
        CONFIRMED_FOR of that check, as a ScaleIn must: retried past it (a 429's Retry-After: 1),
        it could land after its notice was withdrawn. One that could not is checked again and
        sent in the same apply (the pods are told once)."""
        # the ScaleIn that follows a notice's first drain: its check's GETs go beside the drain
        ahead = bool(decision.for_notice) and not _drained_already(job, decision.hosts)
        # the second check wants a notice on every node: a withdrawn one's current copy would
        # pass for a clamp's worker's node (which goes with the next pass then)
        strict = replace(decision, tags=(*decision.tags, Reason.STALE_VIEW))
        for attempt in range(1, CHECKS_PER_SCALE_IN + 1):
            checked = time.monotonic()  # the cache's copy, or the server's GET, read after this
            if ahead and attempt == 1:  # the drain's own reads may take them (after `checked`)
                self._check.read_ahead(job["metadata"]["namespace"], decision.for_notice, now)
            asked = self._check.drain(
                decision if attempt == 1 else strict, job, kind, now, self._cache, checked
            )
            confirmed = narrowed(decision, asked.pods)
            if not confirmed.pods:
                return
            try:
                with self._objects.fence.until(checked + CONFIRMED_FOR, "the drain's notices"):
                    self._drain(kind, job, confirmed, now, tell=attempt == 1)
                return
            except Stale as exc:
                if attempt == CHECKS_PER_SCALE_IN:
                    raise
                log.info("drain_checked_again", job=decision.job, attempt=attempt, why=str(exc))

    @property
    def signal_failures(self) -> int:
        """Pods the checkpoint signal did not reach (annotation or POST)."""
        return self._signal.failures

    def stop_signals(self) -> None:
        """At shutdown, before the Lease goes: no more checkpoint signals to pods."""
        self._signal.close()

    def persist_notice(self, node: str, notice: Notice) -> bool:
        """Keep a cloud notice on its Node (NOTICE_ANNOTATION) so a restart still knows it.
        False when nothing was written: the node is gone, or already holds it or a harder one."""
        try:
            current = self._cache.get(NODES, node) or self._notices.get(NODES, "", node)
            patch = notice_patch(current, notice)
            if patch is None:
                return False
            patched = self._notices.merge_patch(NODES, "", node, patch)
        except ApiException as exc:
            if exc.status == 404:
                log.info("notice_node_gone", node=node, notice=notice.id)
                return False
            raise
        self._cache.assume(NODES, patched)
        deadline = f", deadline {notice.deadline.isoformat()}" if notice.deadline else ""
        message = f"{notice.kind.value} notice from {notice.source} ({notice.id}){deadline}"
        when = notice.received_at or datetime.now(UTC)
        self._notice_recorder.record(patched, "PreemptionNotice", message, when, warning=True)
        return True

    def _drain(
        self, kind: JobKind, job: Obj, decision: Decision, now: datetime, tell: bool = True
    ) -> None:
        """Hide hosts from (or show them again to) the job's Horovod discovery. A drain tells
        the job first (the checkpoint signal: its pods behind, its own annotation in the same
        patch); the last undrain takes the signal back."""
        hosts = frozenset(decision.hosts)
        drain = decision.action is Action.DRAIN
        resource = kind.jobs
        # told already when its hosts are drained (a second writer's same drain): the signal is
        # a list and a PATCH per worker, and repeated it queued thousands at 2,000 nodes
        if drain and tell and not _drained_already(job, hosts):
            self._signal.tell_pods(kind, job, decision, now)
        if drain:
            told = self._signal.annotations(job, decision, now)
        result = update_drained(
            self._objects,
            resource,
            job,
            (lambda held: held | hosts) if drain else (lambda held: held - hosts),
            (lambda _: told) if drain else (lambda after: {} if after else {ANNOTATION: None}),
        )
        if result is None:
            log.info(
                "drain_unchanged",
                job=decision.job,
                action=decision.action.value,
                hosts=sorted(hosts),
            )
            return
        patched, before, after = result
        self._cache.assume(resource, patched)
        changed = sorted(after - before if drain else before - after)
        verb = "hidden from" if drain else "shown again to"
        message = f"{len(changed)} host(s) {verb} Horovod discovery ({', '.join(changed)}), "
        self._recorder.record(
            patched, "HostsDrained" if drain else "HostsUndrained", message + summary(decision), now
        )


def _drained_already(job: Obj, hosts: Iterable[str]) -> bool:
    """Every one of `hosts` is drained on the job as the cache has it (a repeated drain)."""
    return set(hosts) <= decode_drained(annotations_of(job).get(DRAINED_ANNOTATION))


def _event_reason(decision: Decision) -> str:
    """`scaler_stuck` -> `ScalerStuck`: Event reasons are UpperCamelCase."""
    return "".join(word.capitalize() for word in decision.reason.value.split("_"))


class DryRunActuator:
    """Read-only: the reconciler already logs each decision with dry_run=true; writes nothing."""

    dry_run = True
    signal_failures = 0  # it signals nobody

    def apply(self, decision: Decision, now: datetime) -> None:
        log.debug("dry_run_skipped", job=decision.job, action=decision.action.value)

    def stop_signals(self) -> None:
        pass

    def persist_notice(self, node: str, notice: Notice) -> bool:
        log.debug("dry_run_notice_not_persisted", node=node, notice=notice.id)
        return False
