"""`hostname:slots` lines as Horovod reads them, and the guard every change of them passes.

The shipped `discover_hosts.sh` applies the same rules in sh; tests hold the two to one table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# Horovod's strict form `^[\w.-]+:[0-9]+$`, ASCII only, and at least one slot.
_HOST_LINE = re.compile(r"^([A-Za-z0-9_.-]+):([0-9]*[1-9][0-9]*)$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True, slots=True)
class HostSlots:
    host: str
    slots: int

    @property
    def line(self) -> str:
        return f"{self.host}:{self.slots}"


def valid_host(name: str) -> bool:
    return bool(_HOST_NAME.match(name))


def parse_host_lines(text: str) -> tuple[list[HostSlots], list[str]]:
    """Valid entries in order (the first of a repeated host wins), and the lines skipped.

    Blanks around a line are dropped (hostnames have none); anything else odd skips the line.
    """
    hosts: list[HostSlots] = []
    seen: set[str] = set()
    skipped: list[str] = []
    for raw in text.split("\n"):
        line = raw.strip(" \t")
        if not line:
            continue
        m = _HOST_LINE.match(line)
        if m is None:
            skipped.append(raw)
        elif m.group(1) not in seen:
            seen.add(m.group(1))
            hosts.append(HostSlots(m.group(1), int(m.group(2))))
    return hosts, skipped


def format_host_lines(hosts: Iterable[HostSlots]) -> str:
    return "".join(f"{h.line}\n" for h in hosts)


@dataclass(frozen=True, slots=True)
class Guarded:
    hosts: list[HostSlots]
    kept: str | None  # a previous host kept against the proposal, if any


def guard(
    previous: Sequence[HostSlots],
    proposed: Sequence[HostSlots],
    settled: Callable[[str], bool] = lambda _: True,
) -> Guarded:
    """The proposal, unless it keeps no host of `previous` (Horovod stops the job then): the
    first previous host stays, in front. This also keeps a non-empty set from emptying.

    With `settled`, a settled previous host must stay if there is one: hosts that only just
    joined cannot hand Horovod's state on yet, so they cannot be the only ones left.
    """
    anchors = [h for h in previous if settled(h.host)] or list(previous)
    names = {h.host for h in anchors}
    if not anchors or any(h.host in names for h in proposed):
        return Guarded(list(proposed), None)
    kept = anchors[0]
    return Guarded([kept, *proposed], kept.host)
