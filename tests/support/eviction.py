"""A pod's eviction through the official client, as kubectl drain (and NTH) ask for it."""

from __future__ import annotations

from typing import Any

from kubernetes import client


def evict(core: client.CoreV1Api, name: str, namespace: str) -> Any:
    """POST a policy/v1 Eviction of pod NAME; the API's answer, or its ApiException (429 while a
    PodDisruptionBudget forbids it)."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    return core.create_namespaced_pod_eviction(name, namespace, eviction)
