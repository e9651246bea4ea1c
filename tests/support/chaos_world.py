"""Where the fault suite (tests/test_chaos.py) runs: the API emulator, or the real control plane.

Both give the suite the same surface: GPU nodes of one pool (4 GPUs each), TrainingJobs run by
the stand-in et-operator (`support.et_operator`, stepped by the suite), the fault proxy the
daemon's kubeconfig names, the server-wide storms (`faults.ServerFaults`), the spot notice as an
NTH taint, its withdrawal, the reclaim (the node's pods killed, the node deleted), a fresh node,
the Lease's holder, and the record the invariants replay.

- `EmulatorWorld`: `RecordingServer` (the emulator keeping its own event record and the writes
  the daemon's replicas send), a small scheduler in the stand-in (`ScheduledEtOperator`), the
  emulator's own watch drops and compaction.
- `RealWorld`: kube-apiserver of `support.control_plane` (kwok nodes, the real scheduler binds
  every worker, kwok runs it), et-operator's CRDs from tests/support/crds, a namespace of the run's
  own; the stand-in acts over the real API as the admin; the daemon runs as a ServiceAccount bound
  to deploy/rbac.yaml's rules, each replica with a token bound to its own Pod (as the kubelet's),
  under deploy/leader-fence.yaml, through the fault proxy (plain HTTP to the proxy, TLS upstream);
  the proxy breaks the watches and serves the 410s (`faults.ProxyStorms`); the record is read
  from the server's watches (`watch_record.WatchRecorder`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import ssl
from pathlib import Path
from typing import Any, Protocol

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from . import raw_api
from .control_plane import ControlPlane
from .et_operator import EtOperator
from .faults import EmulatorStorms, FaultProxy, FaultRates, ProxyStorms, ServerFaults
from .invariants import NTH_ITN, Record, RecordingServer
from .leader_fence import leader_fence
from .real_api import RealApi
from .real_daemon import grant_deploy_rbac
from .waiting import wait_for
from .watch_record import WatchRecorder

Obj = dict[str, Any]
GPUS_PER_NODE = 4
LEASE_NAME = "spot-autoscaler"
ACCOUNT = "spot-autoscaler"  # the daemon's ServiceAccount (RealWorld)
POOL = "spot-autoscaler.test/pool"
CRDS = ("trainingjobs", "scaleins", "scaleouts")  # et-operator's, as it installs them
CRD_DIR = Path(__file__).resolve().parent / "crds"


def _taints(node: Obj, notice: str | None) -> list[Obj]:
    """The node's taints without the NTH one, plus it with `notice` as its value."""
    kept = [t for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != NTH_ITN]
    if notice is not None:
        kept.append({"key": NTH_ITN, "value": notice, "effect": "NoSchedule"})
    return kept


class World(Protocol):
    namespace: str
    lease_namespace: str
    proxy: FaultProxy
    storms: ServerFaults
    record: Record

    def node_name(self, slot: int, generation: int) -> str: ...
    def start(self, nodes: list[str], jobs: list[Obj]) -> None: ...
    def step(self) -> None: ...  # the stand-in et-operator, until it has nothing to do
    def kubeconfig(self, path: str, replica: str) -> str: ...  # a replica's: through the proxy
    def pods(self) -> list[Obj]: ...
    def phase(self, job: str) -> str: ...
    def wait_running(self, jobs: list[str], timeout: float) -> None: ...
    def notice(self, node: str, value: str) -> None: ...
    def withdraw(self, node: str) -> None: ...
    def reclaim(self, node: str) -> None: ...
    def add_node(self, node: str) -> None: ...
    def lease_holder(self) -> str | None: ...
    def caught_up(self) -> None: ...  # the record has everything the server has now
    def close(self) -> None: ...


class ScheduledEtOperator(EtOperator):
    """The stand-in, with pending workers bound to a node that has a free GPU and no taint."""

    def _start_pending(self, job: str) -> None:
        for pod in self.workers(job):
            meta, status = pod["metadata"], pod.get("status") or {}
            if status.get("phase") != "Pending" or meta.get("deletionTimestamp"):
                continue
            target = self._fit()
            if target is None:
                return
            self.server.patch(
                "Pod",
                meta["name"],
                {
                    "spec": {"nodeName": target},
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                },
                self.namespace,
            )

    def _fit(self) -> str | None:
        used: dict[str, int] = {}
        for pod in self.server.objects("Pod"):
            where = (pod.get("spec") or {}).get("nodeName")
            if where and not pod["metadata"].get("deletionTimestamp"):
                used[where] = used.get(where, 0) + 1
        free = [
            (GPUS_PER_NODE - used.get(n["metadata"]["name"], 0), n["metadata"]["name"])
            for n in self.server.objects("Node")
            if not (n.get("spec") or {}).get("taints")
        ]
        best = max(free, default=(0, ""))
        return best[1] if best[0] > 0 else None


class EmulatorWorld:
    def __init__(self, namespace: str, rates: FaultRates, seed: int) -> None:
        from kube_fixtures import node

        self._node = node
        self.namespace, self.lease_namespace = namespace, "default"
        # refuses a non-holder's writes, as deploy/leader-fence.yaml does on kube-apiserver
        self.server = RecordingServer(leader_fence=True)
        self.server.start()
        self.record: Record = self.server
        self.proxy = FaultProxy(self.server.url, rates, seed=seed).start()
        self.storms = ServerFaults(EmulatorStorms(self.server), seed=seed + 1, every=(3.0, 8.0))
        self.operator = ScheduledEtOperator(self.server, namespace)

    def node_name(self, slot: int, generation: int) -> str:
        return f"node-{slot}-g{generation}"

    def start(self, nodes: list[str], jobs: list[Obj]) -> None:
        self.server.seed(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": self.namespace},
                "status": {"phase": "Active"},
            }
        )
        self.server.seed(*(self._node(n, GPUS_PER_NODE) for n in nodes))
        self.server.seed(*jobs)

    def step(self) -> None:
        self.operator.step()

    def kubeconfig(self, path: str, replica: str) -> str:
        return self.proxy.kubeconfig(path)

    def pods(self) -> list[Obj]:
        return self.server.objects("Pod", self.namespace)

    def phase(self, job: str) -> str:
        found = self.server.get("TrainingJob", job, self.namespace) or {}
        return str((found.get("status") or {}).get("phase") or "")

    def wait_running(self, jobs: list[str], timeout: float) -> None:
        for job in jobs:
            wait_for(lambda j=job: self.phase(j) == "Running", timeout, f"{job} Running")

    def notice(self, node: str, value: str) -> None:
        self.server.patch("Node", node, {"spec": {"taints": _taints({}, value)}})

    def withdraw(self, node: str) -> None:
        self.server.patch("Node", node, {"spec": {"taints": []}})

    def reclaim(self, node: str) -> None:
        for pod in self.pods():
            if (pod.get("spec") or {}).get("nodeName") == node:
                self.server.reclaim_pod(pod["metadata"]["name"], self.namespace)
        self.server.delete("Node", node)

    def add_node(self, node: str) -> None:
        self.server.seed(self._node(node, GPUS_PER_NODE))

    def lease_holder(self) -> str | None:
        lease = self.server.get("leases", LEASE_NAME, self.lease_namespace)
        return lease["spec"].get("holderIdentity") if lease else None

    def caught_up(self) -> None:
        pass  # the emulator records under its own lock, in commit order

    def close(self) -> None:
        self.proxy.stop()
        self.storms.stop()
        self.server.stop()


class RealWorld:
    def __init__(self, plane: ControlPlane, rates: FaultRates, seed: int) -> None:
        self.plane = plane
        # cluster-wide names (nodes) carry the namespace: runs in one session never share one
        self.namespace = self.lease_namespace = f"chaos-{seed}-{secrets.token_hex(3)}"
        self.admin: ApiClient = plane.api_client()
        for crd in CRDS:
            plane.apply_crd(self.admin, CRD_DIR / f"kai.alibabacloud.com_{crd}.yaml")
        self.api = RealApi(plane, self.namespace)  # makes the namespace
        context = ssl.create_default_context(cafile=str(plane.dir / "pki" / "ca.crt"))
        self.proxy = FaultProxy(plane.server, rates, seed=seed, context=context).start()
        storms = ProxyStorms(self.proxy, lambda: self.api.resource_version)
        self.storms = ServerFaults(storms, seed=seed + 1, every=(3.0, 8.0))
        self.recorder = WatchRecorder(
            self.admin,
            self.namespace,
            f"{POOL}={self.namespace}",
            (LEASE_NAME, self.lease_namespace),
            self.proxy,
        ).start()
        self.record: Record = self.recorder
        # the real scheduler binds the workers, kwok runs them: the stand-in only reconciles
        self.operator = EtOperator(self.api, self.namespace, pods_run=False)  # type: ignore[arg-type]
        grant_deploy_rbac(self.admin, plane, self.namespace, ACCOUNT)
        self._fence = contextlib.ExitStack()
        self._fence.enter_context(leader_fence(self.admin, self.namespace, ACCOUNT, LEASE_NAME))
        self._launchers = f"{self.namespace}-launchers"

    def node_name(self, slot: int, generation: int) -> str:
        return f"{self.namespace}-n{slot}-g{generation}"

    def start(self, nodes: list[str], jobs: list[Obj]) -> None:
        """kwok nodes (Ready, their not-ready taint lifted), the launchers' own node (never
        noticed: a reclaimed launcher fails its job), each job's launcher ServiceAccount (the
        real et-operator makes it; the stand-in does not), the jobs, placed on the pool."""
        self.plane.add_gpu_nodes(nodes, GPUS_PER_NODE, labels={POOL: self.namespace})
        self.plane.add_gpu_nodes([self._launchers], 0, labels={POOL: self._launchers})
        for job in jobs:
            name = job["metadata"]["name"]
            self.api.seed(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": f"{name}-launcher", "namespace": self.namespace},
                }
            )
            job = copy.deepcopy(job)
            job["metadata"]["namespace"] = self.namespace
            roles = job["spec"]["etReplicaSpecs"]
            roles["worker"]["template"]["spec"]["nodeSelector"] = {POOL: self.namespace}
            roles["launcher"]["template"] = {
                "spec": {
                    "nodeSelector": {POOL: self._launchers},
                    "containers": [{"name": "launcher", "image": "launcher"}],
                }
            }
            self.api.seed(job)

    def step(self) -> None:
        self.operator.step()

    def kubeconfig(self, path: str, replica: str) -> str:
        """The replica's token is bound to a Pod of its name (the Lease's holder identity): the
        leader fence admits its writes only while the Lease names that pod."""
        token = self.plane.token_for(ACCOUNT, self.namespace, pod=replica)
        return self.proxy.kubeconfig(path, token)

    def pods(self) -> list[Obj]:
        return self.api.objects("Pod", self.namespace)

    def phase(self, job: str) -> str:
        found = self.api.get("TrainingJob", job, self.namespace) or {}
        return str((found.get("status") or {}).get("phase") or "")

    def notice(self, node: str, value: str) -> None:
        self._taints(node, value)

    def withdraw(self, node: str) -> None:
        self._taints(node, None)

    def _taints(self, node: str, notice: str | None) -> None:
        """The NTH taint set or taken off, the node's other taints kept (the node lifecycle
        controller writes its own): read, then patched at that resourceVersion."""
        for _ in range(10):
            current = self.api.get("Node", node)
            if current is None:
                return
            meta = {"resourceVersion": current["metadata"]["resourceVersion"]}
            patch = {"metadata": meta, "spec": {"taints": _taints(current, notice)}}
            try:
                self.api.patch("Node", node, patch)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise AssertionError(f"node {node}: its taints kept changing")

    def reclaim(self, node: str) -> None:
        """The spot reclaim: the node's pods killed (grace 0, recorded as the reclaim's), then
        the node deleted."""
        listed = raw_api.send(
            self.admin,
            "GET",
            f"/api/v1/namespaces/{self.namespace}/pods",
            query=[("fieldSelector", f"spec.nodeName={node}")],
        )
        for pod in json.loads(listed.data).get("items") or ():
            meta = pod["metadata"]
            self.recorder.reclaimed.add(meta["uid"])
            body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            with contextlib.suppress(ApiException):  # gone already, or another by that name
                raw_api.send(
                    self.admin,
                    "DELETE",
                    f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}",
                    body,
                )
        self.api.delete("Node", node)

    def add_node(self, node: str) -> None:
        self.plane.add_gpu_nodes(
            [node], GPUS_PER_NODE, labels={POOL: self.namespace}, wait_ready=False
        )

    def wait_running(self, jobs: list[str], timeout: float) -> None:
        for job in jobs:
            wait_for(lambda j=job: self.phase(j) == "Running", timeout, f"{job} Running")

    def lease_holder(self) -> str | None:
        return self.recorder.holder()

    def caught_up(self) -> None:
        self.recorder.wait_caught_up()

    def close(self) -> None:
        self.proxy.stop()
        self.storms.stop()
        self.recorder.stop()
        self._fence.close()
        # the pods at once (their nodes go next: nothing would finish a graceful delete), then
        # the namespace, and the cluster-wide grants grant_deploy_rbac made
        gone = {"gracePeriodSeconds": 0}
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        grants = f"spot-autoscaler-{self.namespace}"
        for path in (
            f"/api/v1/namespaces/{self.namespace}/pods",
            f"/api/v1/namespaces/{self.namespace}",
            f"{rbac}/clusterrolebindings/{grants}",
            f"{rbac}/clusterroles/{grants}",
        ):
            with contextlib.suppress(ApiException):
                raw_api.send(self.admin, "DELETE", path, gone)
        for node in self.api.objects("Node"):
            labels = node["metadata"].get("labels") or {}
            if labels.get(POOL) in (self.namespace, self._launchers):
                self.api.delete("Node", node["metadata"]["name"])
        self.api.close()
        self.admin.close()
