"""`kubernetes:` section: what the cluster observer watches and how it reads nodes and jobs."""

from __future__ import annotations

from autoscaler.core.policy import StrictModel


class KubernetesSettings(StrictModel):
    """Filled in by the Kubernetes adapter work (issue 3)."""
