"""The standalone snapshot: configured hosts, one job whose workers are the owned file's hosts.

Level-triggered and restart-safe: every snapshot reads the discovery file back (what Horovod sees
is what we have), its mtime (the last scale, for cooldown) and the notice directory's files.
GPUs requested on a host = the slots our file gives it.
"""

from __future__ import annotations

from datetime import datetime

from autoscaler.adapters.standalone.notices import NoticeDirectory
from autoscaler.adapters.standalone.workers import job_of, owned_file, workers_of
from autoscaler.config.discovery import StandaloneSettings
from autoscaler.core.model import GpuNode, Job, Snapshot
from autoscaler.notices_and_prices import NoticeBoard, Wake


class StandaloneObserver:
    def __init__(self, settings: StandaloneSettings, board: NoticeBoard, wake: Wake) -> None:
        self.settings = settings
        self.job = job_of(settings)
        self.board = board
        self.file = owned_file(settings)
        self.notice_dir = (
            NoticeDirectory(settings.notice_dir, wake, settings.notice_poll)
            if settings.notice_dir
            else None
        )

    def start(self) -> None:
        if self.notice_dir is not None:
            self.notice_dir.start()

    def stop(self) -> None:
        if self.notice_dir is not None:
            self.notice_dir.stop()

    def synced(self) -> bool:
        return self.notice_dir is None or self.notice_dir.scans > 0

    def snapshot(self, now: datetime) -> Snapshot:
        hosts, joined = self.file.read(), self.file.joined()
        assigned = self.file.assigned(now)
        used = {h.host: h.slots for h in hosts}
        nodes = tuple(
            GpuNode(
                name=h.name,
                gpus_allocatable=float(h.slots),
                gpus_requested=float(used.get(h.name, 0)),
                capacity_type=h.capacity_type,
                price_per_hour=h.price_per_hour,
            )
            for h in self.settings.hosts
        )
        notices = self.board.active(now) + (self.notice_dir.notices() if self.notice_dir else ())
        spec = self.job
        job = Job(
            namespace=spec.namespace,
            name=spec.name,
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            gpus_per_worker=float(spec.gpus_per_worker),
            backend="standalone",
            labels=spec.labels,
            workers=workers_of(hosts, spec.gpus_per_worker, joined),
            last_scale_out_at=max(joined.values(), default=None),
            # a drained host leaves the file at once, with its workers: nothing stays drained
            drained_hosts=frozenset(),
            # owned_hosts.sh's report of Horovod's rank assignment; None: fall back to join_grace
            assigned_hosts=frozenset(assigned) if assigned is not None else None,
            assigned_since=assigned or {},
        )
        return Snapshot(nodes=nodes, notices=notices, jobs=(job,))
