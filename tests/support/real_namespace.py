"""One test's corner of the shared real control plane: its kwok GPU nodes (tainted so only its
pods land there, labelled with a pool its pods select) and the jobs it made, for the tests that
drive a real operator (test_real_mpi_operator.py, test_real_pytorchjob.py, ...), plus the daemon
config those tests share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient

from support.control_plane import ControlPlane

Obj = dict[str, Any]
POOL = "spot-autoscaler.test/pool"
SETTLE = 30.0  # the real plane on a shared 2-core machine: generous, never slept


def isolated(namespace: str) -> Obj:
    """The taint on a test module's nodes; its pods tolerate it."""
    return {"key": f"spot-autoscaler.test/{namespace}", "value": "only", "effect": "NoSchedule"}


def daemon_config(namespace: str, *policies: str) -> str:
    """The product's config for a test namespace: jobs labelled spot-autoscaler.io/enabled=true;
    `grow` scales out at once, `hold` never grows (departures still apply); more `policies` as
    YAML flow mappings."""
    extra = "".join(f"\n  - {p}" for p in policies)
    return f"""
kubernetes:
  namespaces: [{namespace}]
  label_selector: spot-autoscaler.io/enabled=true
  watch_timeout: 30s
  watch_backoff_max: 1s
policies:
  - {{name: grow, scale_out: {{min_idle: 0s, cooldown: 0s}}, preemption: {{join_grace: 0s}}}}
  - {{name: hold, scale_out: {{enabled: false}}, preemption: {{join_grace: 0s}}}}{extra}
default_policy: hold
daemon:
  tick_interval: 2s
  wake_coalesce: 0.02s
  config_reload_interval: 0s
  metrics_port: 0
  metrics_bind_address: 127.0.0.1
  log_format: json
  sync_timeout: 20s
  leader_election:
    {{lease_namespace: {namespace}, lease_duration: 4s, renew_deadline: 3s, retry_period: 0.5s}}
"""


@dataclass
class RealNamespace:
    plane: ControlPlane
    api: ApiClient
    namespace: str
    resource: tuple[str, str, str]  # (group, version, plural) of the operator's jobs
    node_prefix: str = ""
    nodes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def add_nodes(
        self, pool: str, count: int, gpus: int = 1, pod_cidrs: Sequence[str] = ()
    ) -> list[str]:
        """kwok GPU nodes of our pool, tainted so only our pods land there."""
        names = [f"{self.node_prefix}{pool}-{i}" for i in range(count)]
        self.nodes += names
        self.plane.add_gpu_nodes(
            names, gpus=gpus, labels={POOL: pool}, timeout=SETTLE, pod_cidrs=pod_cidrs
        )
        for name in names:
            self.core.patch_node(name, {"spec": {"taints": [isolated(self.namespace)]}})
        return names

    def taint(self, node: str, taint: Obj) -> None:
        taints = [t.to_dict() for t in self.core.read_node(node).spec.taints or []]
        taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
        self.core.patch_node(node, {"spec": {"taints": [*taints, taint]}})

    def create(self, job: Obj) -> Obj:
        self.jobs.append(job["metadata"]["name"])
        return self._jobs("create", job)

    def job(self, name: str) -> Obj:
        return self._jobs("get", name)

    def patch_job(self, name: str, patch: Obj) -> Obj:
        return self._jobs("patch", name, patch)

    def _jobs(self, verb: str, *args: Any) -> Obj:
        call = getattr(self.custom, f"{verb}_namespaced_custom_object")
        got: Obj = call(*self.resource[:2], self.namespace, self.resource[2], *args)
        return got
