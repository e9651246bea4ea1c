"""The overlay drain file: hosts to hide from Horovod, one per line, read by `discover_hosts.sh`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import structlog

from autoscaler.adapters.discovery.files import write_if_changed
from autoscaler.adapters.discovery.hostlines import valid_host

log = structlog.get_logger("autoscaler.discovery.drain_file")


def write_drain_file(path: Path, hosts: Iterable[str]) -> bool:
    """Write the sorted valid hostnames atomically; False when the file already says so.

    A name Horovod could not know (spaces, newlines, `:`) cannot be hidden either: it is skipped
    rather than allowed to break the file's one-name-per-line format.
    """
    names = set(hosts)
    invalid = sorted(n for n in names if not valid_host(n))
    if invalid:
        log.warning("drain_hosts_invalid", hosts=invalid)
    text = "".join(f"{n}\n" for n in sorted(names - set(invalid)))
    return write_if_changed(path, text)
