"""Shared by the cloud source tests: the Kubernetes observer's side of the node-index seam."""

from __future__ import annotations


class Index:
    """instance id -> node name, as the observer reads it from spec.providerID."""

    def __init__(self, known: dict[str, str] | None = None) -> None:
        self.known = known or {}

    def node_for_instance(self, instance_id: str) -> str | None:
        return self.known.get(instance_id)
