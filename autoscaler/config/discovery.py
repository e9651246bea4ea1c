"""`discovery:` and `standalone:` sections: Horovod host-discovery files and the operator-less mode."""

from __future__ import annotations

from autoscaler.core.policy import StrictModel


class DiscoverySettings(StrictModel):
    """Filled in by the discovery work (issue 5)."""


class StandaloneSettings(StrictModel):
    """Filled in by the discovery work (issue 5)."""
