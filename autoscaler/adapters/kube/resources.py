"""The Kubernetes kinds the adapter reads and writes, and how the official client lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client

from autoscaler.times import parse_utc

Obj = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# on our scalers: the decision's reason code (a refill to min does not start the cooldown)
REASON_ANNOTATION = "spot-autoscaler.io/reason"
MANAGER = "spot-autoscaler"


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def lister(self, api: client.ApiClient, namespace: str | None) -> Callable[..., Any]:
        """The client's list function for this kind, bound to a namespace (None = all)."""
        if not self.group:
            core = client.CoreV1Api(api)
            if not self.namespaced:
                return getattr(core, f"list_{self.kind.lower()}")
            if namespace is None:
                return getattr(core, f"list_{self.kind.lower()}_for_all_namespaces")
            fn = getattr(core, f"list_namespaced_{self.kind.lower()}")
            return lambda **kw: fn(namespace, **kw)
        custom = client.CustomObjectsApi(api)
        if namespace is None:
            fn = custom.list_cluster_custom_object
            return lambda **kw: fn(self.group, self.version, self.plural, **kw)
        fn = custom.list_namespaced_custom_object
        return lambda **kw: fn(self.group, self.version, namespace, self.plural, **kw)


NODES = Resource("Node", "", "v1", "nodes", namespaced=False)
PODS = Resource("Pod", "", "v1", "pods", namespaced=True)
PDBS = Resource("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", True)


def key_of(obj: Obj) -> str:
    """`ns/name` (or `name` for cluster-scoped objects): the cache key and the core's job key."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def labels_of(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def annotations_of(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def parse_time(value: object) -> datetime | None:
    return parse_utc(value)
