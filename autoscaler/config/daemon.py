"""`daemon:` section: ticks, metrics/health port, leader election."""

from __future__ import annotations

from autoscaler.core.policy import StrictModel


class DaemonSettings(StrictModel):
    """Filled in by the daemon work (issue 3)."""
