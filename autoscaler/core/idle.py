"""Since when each node has had idle GPUs: the state behind the `min_idle` hysteresis.

Kept by the shell between ticks and passed in the snapshot; after a restart it starts empty, which
only delays scale-out by `min_idle` (the safe direction).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from autoscaler.core.model import GpuNode


def track_idle(
    previous: Mapping[str, datetime], nodes: Iterable[GpuNode], now: datetime
) -> dict[str, datetime]:
    """Keep the first-seen time of nodes still idle and schedulable; start new ones' clocks."""
    return {n.name: previous.get(n.name, now) for n in nodes if n.schedulable and n.idle_gpus > 0}
