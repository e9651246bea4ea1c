"""The owned discovery file of a standalone job: horovodrun `cat`s it every second.

The daemon owns all of it: every write passes validation and the guard (never empty by accident,
always a host of the previous set, and a settled one while there is one), is atomic and happens
only on change. Beside it, a JSON file records when each host entered it (restart-safe): a host
is joining until `join_grace` has passed, the time Horovod needs to start its processes and hand
them the state. Removing every settled host before that would lose the state or stop the job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from autoscaler.adapters.discovery.files import write_if_changed
from autoscaler.adapters.discovery.hostlines import (
    Guarded,
    HostSlots,
    format_host_lines,
    guard,
    parse_host_lines,
    valid_host,
)

log = structlog.get_logger("autoscaler.discovery.owned")


@dataclass(frozen=True, slots=True)
class Written:
    hosts: list[HostSlots]
    kept: str | None  # a previous host the guard kept against the proposal
    changed: bool


class OwnedHostsFile:
    def __init__(self, path: Path, joined_path: Path, join_grace: timedelta) -> None:
        self.path = path
        self.joined_path = joined_path
        self.join_grace = join_grace

    def read(self) -> list[HostSlots]:
        """The hosts in the file now; none while it does not exist."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        hosts, skipped = parse_host_lines(text)
        if skipped:
            log.warning("discovery_file_lines_skipped", path=str(self.path), lines=skipped)
        return hosts

    def joined(self) -> dict[str, datetime]:
        """When each host entered the file, as far as recorded (a hand-made file records none)."""
        try:
            data = json.loads(self.joined_path.read_text(encoding="utf-8"))
            return {str(h): datetime.fromisoformat(t) for h, t in data.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("joined_file_unreadable", path=str(self.joined_path), error=str(exc))
            return {}

    def plan(self, proposed: Sequence[HostSlots], now: datetime) -> Guarded:
        """What `write` would leave in the file at `now`."""
        return self._guard(self.read(), self.joined(), proposed, now)

    def write(self, proposed: Sequence[HostSlots], now: datetime) -> Written:
        current, joined = self.read(), self.joined()
        planned = self._guard(current, joined, proposed, now)
        if planned.kept is not None:
            log.warning("discovery_last_host_kept", path=str(self.path), host=planned.kept)
        previous = {h.host: h.slots for h in current}
        stamps: dict[str, datetime] = {}
        for h in planned.hosts:
            if h.slots > previous.get(h.host, 0):  # new Horovod processes: they start joining now
                stamps[h.host] = now
            elif h.host in joined:
                stamps[h.host] = joined[h.host]
        # the record first: a crash between the two writes then leaves no joining host unrecorded
        write_if_changed(
            self.joined_path,
            json.dumps({h: t.isoformat() for h, t in stamps.items()}, sort_keys=True) + "\n",
        )
        changed = write_if_changed(self.path, format_host_lines(planned.hosts))
        return Written(planned.hosts, planned.kept, changed)

    def _guard(
        self,
        current: list[HostSlots],
        joined: dict[str, datetime],
        proposed: Sequence[HostSlots],
        now: datetime,
    ) -> Guarded:
        since = now - self.join_grace
        return guard(current, _valid(proposed), settled=lambda h: joined.get(h, since) <= since)


def _valid(proposed: Sequence[HostSlots]) -> list[HostSlots]:
    bad = [h for h in proposed if not valid_host(h.host) or h.slots < 1]
    if bad:
        log.error("discovery_entries_invalid", entries=[f"{h.host}:{h.slots}" for h in bad])
    return [h for h in proposed if h not in bad]
