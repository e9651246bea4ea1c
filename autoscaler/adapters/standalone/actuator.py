"""Carry out decisions on the owned discovery file: Horovod's next discovery tick follows it.

drain / scale_in: the named workers' slots leave the file (drain first, so Horovod removes them
gracefully; the scale-in then finds them gone); for a notice, the hosts that leave are named in
the notice file first (standalone/signal.py: the job's checkpoint signal). scale_out: workers go
onto the nodes the core chose, which leave the notice file first. The file's guard still applies:
never empty, always a host of the previous set, never only hosts still joining (the core then
repeats its drain each pass until the guard lets it happen).
"""

from __future__ import annotations

from datetime import datetime

import structlog

from autoscaler.adapters.discovery.hostlines import HostSlots
from autoscaler.adapters.standalone.signal import NoticeFile
from autoscaler.adapters.standalone.workers import job_of, owned_file, with_workers, without_workers
from autoscaler.config.discovery import StandaloneSettings
from autoscaler.core.model import Action, Decision, Job, Reason
from autoscaler.core.voluntary import Shield

# departures that answer a notice: the job hears of them before discovery changes
_NOTICE_REASONS = frozenset({Reason.PREEMPTION_NOTICE, Reason.MAINTENANCE, Reason.REBALANCE})

log = structlog.get_logger("autoscaler.standalone.actuator")


class OwnedDiscoveryActuator:
    def __init__(self, settings: StandaloneSettings, dry_run: bool = False) -> None:
        job = job_of(settings)
        self.dry_run = dry_run
        self.job_key = f"{job.namespace}/{job.name}"
        self.gpus_per_worker = job.gpus_per_worker
        self.capacity = {h.name: h.slots for h in settings.hosts}
        self.file = owned_file(settings)
        self.notice = NoticeFile(
            settings.discovery_file, settings.notice_dir, self.job_key, dry_run=dry_run
        )

    def apply(self, decision: Decision, now: datetime) -> None:
        if decision.job != self.job_key:
            raise ValueError(f"not the standalone job {self.job_key}: {decision.job}")
        current = self.file.read()
        if decision.action is Action.SCALE_OUT:
            proposed, unplaced = with_workers(
                current, decision.nodes, decision.count, self.capacity, self.gpus_per_worker
            )
            if unplaced:
                nodes = list(decision.nodes)
                log.warning("scale_out_short", job=self.job_key, nodes=nodes, unplaced=unplaced)
            self.notice.forget((h.host for h in proposed), now)  # before a worker starts there
        elif decision.action in (Action.DRAIN, Action.SCALE_IN):
            proposed = without_workers(current, decision.pods, self.gpus_per_worker)
            if decision.reason in _NOTICE_REASONS:
                self._signal(decision, current, proposed, now)
        else:  # undrain, noop: a drained host left the file with its workers; nothing to show again
            return
        self._write(decision, proposed, now)

    def keep(self, jobs: list[Job], now: datetime, writes: int, shield: Shield) -> bool:
        """Each pass: the notice file goes once no host in it is doomed any more."""
        self.notice.prune(now)
        return True

    def _signal(
        self,
        decision: Decision,
        current: list[HostSlots],
        proposed: list[HostSlots],
        now: datetime,
    ) -> None:
        """Name the hosts this write takes out of discovery (the guard may keep one) in the
        notice file, before the discovery file changes."""
        after = {h.host for h in self.file.plan(proposed, now).hosts}
        leaving = [h.host for h in current if h.host not in after]
        # the core's earliest notice deadline (Decision.deadline), else each host's notice file
        deadline: datetime | None = getattr(decision, "deadline", None)
        self.notice.doom(leaving, decision.reason.value, deadline, now)

    def _write(self, decision: Decision, proposed: list[HostSlots], now: datetime) -> None:
        fields = {"job": self.job_key, "action": decision.action.value, "path": str(self.file.path)}
        if self.dry_run:
            planned = self.file.plan(proposed, now)
            hosts = [h.line for h in planned.hosts]
            log.info("discovery_file_dry_run", hosts=hosts, kept=planned.kept, **fields)
            return
        written = self.file.write(proposed, now)
        log.info(
            "discovery_file_written" if written.changed else "discovery_file_unchanged",
            hosts=[h.line for h in written.hosts],
            kept=written.kept,
            **fields,
        )
