"""The discovery scripts shipped in the package, and copying them where horovodrun can run them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from autoscaler.adapters.discovery.files import write_if_changed

OVERLAY_SCRIPT = "discover_hosts.sh"  # the operator's hosts minus drained ones (et-/mpi-operator)
OWNED_SCRIPT = "owned_hosts.sh"  # standalone: prints the file the daemon owns


def script_path(name: str) -> Path:
    return Path(str(resources.files("autoscaler.adapters.discovery").joinpath(name)))


def install_scripts(dest: Path) -> list[Path]:
    """Copy both scripts into `dest` (mode 0755, atomic, idempotent); return their paths."""
    installed = []
    for name in (OVERLAY_SCRIPT, OWNED_SCRIPT):
        target = dest / name
        write_if_changed(target, script_path(name).read_text(encoding="utf-8"), mode=0o755)
        installed.append(target)
    return installed
