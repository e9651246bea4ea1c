"""The checkpoint signal in standalone mode: `<discovery file>.notice` names the doomed hosts.

Written (atomically, readable by all) before the discovery file loses a host for a notice, so a
training script polling it (autoscaler.notice.pending) hears of the departure before its launcher
does: it can save a checkpoint at its next step. The JSON is autoscaler.notice's, with the
hosts, the earliest deadline known and the decision's reason.

A host stays listed while it is doomed: while any listed host's notice stands in the notice
directory. Once none does (withdrawn; a replaced host's file removed), the file goes. A host put
back into discovery leaves the file first, whatever else stands: a worker starting there must not
read itself doomed. Without a notice directory (notices posted on the board only) the file keeps
its hosts until they are back. Restart-safe: the file is read back at start.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import structlog

from autoscaler.adapters.discovery.files import remove_if_present, write_if_changed
from autoscaler.adapters.standalone.notices import read_notice
from autoscaler.notice import STANDALONE_SUFFIX, CheckpointNotice, decode

log = structlog.get_logger("autoscaler.standalone.signal")


def notice_path(discovery_file: Path) -> Path:
    return discovery_file.with_name(discovery_file.name + STANDALONE_SUFFIX)


class NoticeFile:
    def __init__(
        self, discovery_file: Path, notice_dir: Path | None, job: str, dry_run: bool = False
    ) -> None:
        self.path = notice_path(discovery_file)
        self.notice_dir = notice_dir
        self.job = job
        self.dry_run = dry_run
        self._deadlines: dict[str, datetime | None] = {}  # doomed host -> its notice's deadline
        self._reason = ""
        self._load()

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted(self._deadlines))

    def doom(
        self, hosts: Iterable[str], reason: str, deadline: datetime | None, now: datetime
    ) -> None:
        """List `hosts` as doomed (with the others still listed); `deadline`: the decision's,
        else each host's own notice says."""
        new = {h: deadline or self._notice_deadline(h) for h in hosts}
        if not new:
            return
        merged = {**self._deadlines, **new}
        if merged == self._deadlines and reason == self._reason:
            return
        self._deadlines, self._reason = merged, reason
        self._write(now)

    def forget(self, hosts: Iterable[str], now: datetime) -> None:
        """`hosts` are in discovery again: no longer doomed."""
        back = set(hosts) & set(self._deadlines)
        if back:
            for host in back:
                del self._deadlines[host]
            self._write(now)

    def prune(self, now: datetime) -> None:
        """Remove the file once no listed host's notice stands in the notice directory."""
        if not self._deadlines or self.notice_dir is None:
            return
        if any((self.notice_dir / f"{h}.json").is_file() for h in self._deadlines):
            return
        self._deadlines.clear()
        self._write(now)

    def _notice_deadline(self, host: str) -> datetime | None:
        if self.notice_dir is None:
            return None
        notice = read_notice(self.notice_dir, host)
        return notice.deadline if notice is not None else None

    def _write(self, now: datetime) -> None:
        fields = {"path": str(self.path), "job": self.job}
        if not self._deadlines:
            if self.dry_run:
                log.info("checkpoint_notice_dry_run", hosts=[], **fields)
            elif remove_if_present(self.path):
                log.info("checkpoint_notice_removed", **fields)
            return
        known = [d for d in self._deadlines.values() if d is not None]
        notice = CheckpointNotice(
            hosts=self.hosts,
            deadline=min(known, default=None),
            reason=self._reason,
            job=self.job,
            issued=now,
        )
        deadline = notice.deadline.isoformat() if notice.deadline else None
        if self.dry_run:
            log.info("checkpoint_notice_dry_run", hosts=list(notice.hosts), **fields)
            return
        write_if_changed(self.path, notice.encode() + "\n")
        log.info(
            "checkpoint_notice_written",
            hosts=list(notice.hosts),
            deadline=deadline,
            reason=self._reason,
            **fields,
        )

    def _load(self) -> None:
        """What a previous run of the daemon left: its hosts stay doomed until pruned."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("checkpoint_notice_unreadable", path=str(self.path), error=str(exc))
            return
        if not text.strip():
            return
        try:
            notice = decode(text)
        except ValueError as exc:  # rewritten at the next notice, removed at the next prune
            log.warning("checkpoint_notice_unreadable", path=str(self.path), error=str(exc))
            return
        self._deadlines = {h: notice.deadline for h in notice.hosts}
        self._reason = notice.reason
