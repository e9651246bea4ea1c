"""The owned discovery file of a standalone job: horovodrun `cat`s it every second.

The daemon owns all of it: every write passes validation and the guard (never empty by accident,
always a host of the previous set, and a settled one while there is one), is atomic and happens
only on change. Beside it, a JSON file records when each host entered it (restart-safe): a host
is joining until `join_grace` has passed, the time Horovod needs to start its processes and hand
them the state. Removing every settled host before that would lose the state or stop the job.

Where `owned_hosts.sh` reports which hosts run a Horovod worker (`<file>.assigned`, rewritten at
each of horovodrun's discovery calls), the guard uses that instead: a host in Horovod's current
rank assignment satisfies Horovod's rule (driver.py `_update_host_assignments` needs one host of
the previous assignment), and when such a host has also received the state is the core's call
(preemption.assigned_settle, release_margin: it knows the deadlines). A report older than
`ASSIGNED_FRESH` (horovodrun gone or stalled) counts as none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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

ASSIGNED_FRESH = timedelta(seconds=10)  # horovodrun runs the script about every 1.35 s


@dataclass(frozen=True, slots=True)
class Written:
    hosts: list[HostSlots]
    kept: str | None  # a previous host the guard kept against the proposal
    changed: bool


class OwnedHostsFile:
    def __init__(
        self,
        path: Path,
        joined_path: Path,
        join_grace: timedelta,
        assigned_path: Path | None = None,
    ) -> None:
        self.path = path
        self.joined_path = joined_path
        self.join_grace = join_grace
        self.assigned_path = assigned_path

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

    def assigned(self, now: datetime) -> dict[str, datetime] | None:
        """The hosts owned_hosts.sh saw running a Horovod worker, and since when; None without a
        fresh report (none written, no worker seen, or older than ASSIGNED_FRESH at `now`)."""
        if self.assigned_path is None:
            return None
        try:
            lines = self.assigned_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        try:
            head, scanned = lines[0].split()
            if head != "scanned":
                raise ValueError(lines[0])
            at = datetime.fromtimestamp(int(scanned), UTC)
            hosts = {}
            for line in lines[1:]:
                if line.strip():
                    host, since = line.split()
                    hosts[host] = datetime.fromtimestamp(int(since), UTC)
        except (ValueError, IndexError) as exc:
            log.warning("assigned_file_unreadable", path=str(self.assigned_path), error=str(exc))
            return None
        # the script stamps whole seconds: a scan up to 1 s "ahead" of now is the same second
        if not hosts or now - at > ASSIGNED_FRESH:
            return None
        return hosts

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
        assigned = self.assigned(now)
        if assigned is not None:
            return guard(current, _valid(proposed), settled=lambda h: h in assigned)
        since = now - self.join_grace
        return guard(current, _valid(proposed), settled=lambda h: joined.get(h, since) <= since)


def _valid(proposed: Sequence[HostSlots]) -> list[HostSlots]:
    bad = [h for h in proposed if not valid_host(h.host) or h.slots < 1]
    if bad:
        log.error("discovery_entries_invalid", entries=[f"{h.host}:{h.slots}" for h in bad])
    return [h for h in proposed if h not in bad]
