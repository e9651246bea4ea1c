"""Reaction time: a spot interruption published on SQS -> the worker's host drained -> the ScaleIn.

    .venv/bin/python benchmarks/reaction.py                        # 100 and 2,000 nodes
    .venv/bin/python benchmarks/reaction.py --sizes 100 --notices 300 --json reaction.json
    .venv/bin/python benchmarks/reaction.py --cluster real --sizes 2000 --notices 100

The real daemon (`spot-autoscaler run`, Kubernetes wiring, SQS consumer, leader election) runs
in its own process against moto's SQS, served from this process, and a Kubernetes API:

- `--cluster emulator` (the default): the test API emulator (tests/support/kube_api.py), served
  from this process, its objects seeded through its backdoor;
- `--cluster real`: a real control plane (tests/support/control_plane.py: etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler, kwok; `make control-plane` builds the pinned
  binaries, env SPOT_AUTOSCALER_CONTROL_PLANE_BIN names another directory). Everything goes
  through the API, in parallel (benchmarks/real_plane.py): the GPU nodes are kwok nodes
  (8 nvidia.com/gpu, capacity-type spot, instance-type p3.16xlarge, a providerID naming the
  instance), et-operator's CRDs (tests/support/crds) are installed and the TrainingJobs created
  with their status written through /status and their rank assignment reported as the
  discovery sidecar does (spot-autoscaler.io/assigned-hosts: jobs that have run a while, see
  RealCluster._create_job); the workers are real pods created with
  spec.nodeName set (the scheduler is skipped to make the setup fast; binding 40,000 pods
  through it would add minutes) and made Running by kwok; the stand-in's deletes, its ScaleIn
  status and the replacement nodes and pods go through the API too. The daemon uses the
  admin kubeconfig and its own client settings.

Every node has 8 one-GPU workers, 4 of job k and 4 of job k-1, so a notice dooms workers of two
jobs. Notices go out in rounds (100 ms apart, nodes whose jobs do not overlap). A stand-in for
et-operator completes each ScaleIn (deletes the named pods, marks it ScaleSucceeded); then the
node is replaced by a fresh one with fresh workers, and the next round waits until they run.

Per notice: drain = the last of its node's hosts appears in its job's drained-hosts annotation,
ScaleIn = the last of its pods is named by a ScaleIn object, both from the moment before the
message was sent, as seen by watches from this process. Beside them, per phase (setup, daemon
start, rounds): CPU seconds of the daemon's process, of this harness (the emulator or the bulk
client, moto, the watches and the stand-in) and of each control-plane process, from
/proc/<pid>/stat; the daemon's passes in the rounds from its /metrics histogram; the peak RSS
(VmHWM) of each process. `--py-spy FILE` samples the daemon during the rounds. Figures, not a
test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from autoscaler.adapters.kube.guard import desired_guard  # noqa: E402
from autoscaler.adapters.kube.kinds import et_operator  # noqa: E402
from autoscaler.annotations import (  # noqa: E402
    ASSIGNED_ANNOTATION,
    DRAINED_ANNOTATION,
    decode_drained,
    encode_assigned,
)
from autoscaler.decisionlog import read_decisions  # noqa: E402
from autoscaler.times import parse_utc  # noqa: E402
from benchmarks.scale import raw_job  # noqa: E402
from tests.support.kube_api import KubeApiServer  # noqa: E402

if TYPE_CHECKING:
    from benchmarks.real_plane import Meter, Rest

REGION, NS, GROUP, VERSION = "us-east-1", "ml", "kai.alibabacloud.com", "v1alpha1"
ET_API = f"{GROUP}/{VERSION}"
PER_JOB_ON_NODE = 4
NUDGE_EVERY = 5.0  # seconds a fresh worker may stay Pending before the harness touches it
Obj = dict[str, Any]
ET_CRDS = tuple(f"{GROUP}_{p}" for p in ("trainingjobs", "scaleins", "scaleouts"))
RECONCILE = "spot_autoscaler_reconcile_duration_seconds"
REACTION = "spot_autoscaler_reaction_latency_seconds"

CONFIG = """
kubernetes: {{namespaces: [{ns}]}}
aws: {{enabled: true, region: {region}, queue_url: "{queue}", prices: {{enabled: false}}}}
daemon:
  metrics_port: {port}
  metrics_bind_address: 127.0.0.1
  log_format: json
  log_level: info
  leader_election: {{lease_namespace: default}}
"""


class Layout:
    """Node i hosts 4 workers of job i and 4 of job i-1 (mod n); a replaced node gets fresh
    workers of the same two jobs under new indices."""

    def __init__(self, nodes: int) -> None:
        self.n = nodes
        self.generation = [0] * nodes
        self.next_index: dict[int, int] = defaultdict(int)
        self.pods_on: dict[int, list[tuple[str, str]]] = {}  # node slot -> (job, pod)

    def node_name(self, slot: int) -> str:
        return f"node-{slot:05d}-{self.generation[slot]}"

    def instance(self, slot: int) -> str:
        return f"i-{slot:05d}{self.generation[slot]:06d}"

    def provider_id(self, slot: int) -> str:
        return f"aws:///{REGION}a/{self.instance(slot)}"

    @staticmethod
    def node_labels() -> dict[str, str]:
        return {
            "karpenter.sh/capacity-type": "spot",
            "node.kubernetes.io/instance-type": "p3.16xlarge",
            "topology.kubernetes.io/zone": f"{REGION}a",
        }

    def workers_for(self, slot: int) -> list[Obj]:
        """The slot's fresh workers (new indices); pods_on[slot] names them."""
        name = self.node_name(slot)
        pods, out = [], []
        for job in (slot, (slot - 1) % self.n):
            for _ in range(PER_JOB_ON_NODE):
                index = self.next_index[job]
                self.next_index[job] += 1
                pod = f"job-{job:05d}-worker-{index}"
                pods.append((f"job-{job:05d}", pod))
                out.append(_worker(f"job-{job:05d}", pod, index, name))
        self.pods_on[slot] = pods
        return out


class Cluster(Layout):
    """The layout in the emulator, seeded through its backdoor."""

    def __init__(self, api: KubeApiServer, nodes: int) -> None:
        super().__init__(nodes)
        self.api = api

    def seed(self) -> None:
        # seeded as if created: the emulator gives each job its uid and resourceVersion
        workers = 2 * PER_JOB_ON_NODE
        objs = [
            raw_job(f"job-{k:05d}", workers, NS, headroom=0, stored=False) for k in range(self.n)
        ]
        for slot in range(self.n):
            objs += self._node_and_pods(slot)
        self.api.seed(*objs)

    def seed_guards(self) -> None:
        """Every job's eviction guard, as the daemon writes it (guard.desired_guard), so the run
        starts in the steady state of a daemon that has been up a while; without it the daemon
        writes them first, a few per pass (5,000 take longer than the benchmark may)."""
        labels = et_operator.KIND.guard_labels
        assert labels is not None
        self.api.seed(
            *(
                desired_guard(job, labels(job["metadata"]["name"]))
                for job in self.api.objects("trainingjobs", NS)
            )
        )

    def replace(self, slot: int) -> None:
        """The reclaimed node is gone; a fresh one arrives with fresh workers for the same jobs."""
        self.api.delete("nodes", self.node_name(slot))
        self.generation[slot] += 1
        self.api.seed(*self._node_and_pods(slot))

    def _node_and_pods(self, slot: int) -> list[Obj]:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name(slot), "labels": self.node_labels()},
            "spec": {"providerID": self.provider_id(slot)},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(2 * PER_JOB_ON_NODE)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        return [node, *self.workers_for(slot)]


def _worker(job: str, pod: str, index: int, node: str, uid: str = "u") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod,
            "namespace": NS,
            "labels": {
                "training-job-name": job,
                "training-job-role": "worker",
                "replica-index": str(index),
            },
            "ownerReferences": [
                {
                    "apiVersion": ET_API,
                    "kind": "TrainingJob",
                    "name": job,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


class RealCluster(Layout):
    """The layout on a real control plane, made through the API by a thread pool."""

    def __init__(self, rest: Rest, nodes: int) -> None:
        super().__init__(nodes)
        self.rest = rest
        self.uids: dict[str, str] = {}  # job -> its uid (owner references must carry it)
        self.assigned: dict[str, list[str]] = {}  # job -> its first workers
        self.steps: dict[str, float] = {}
        self.unready_at_start = 0  # nodes not Ready when the run started (--max-unready-nodes)

    def _step(self, name: str, fn: Any, items: Any) -> None:
        t0 = time.monotonic()
        done = self.rest.parallel(fn, items)
        self.steps[name] = round(time.monotonic() - t0, 1)
        print(f"setup: {len(done)} {name} in {self.steps[name]} s", file=sys.stderr, flush=True)

    def seed(self, guards: bool, max_unready_nodes: int = 0) -> None:
        """Jobs first: the nodes' Lease renewals (kwok, every 10 s each) load the apiserver
        from the moment the nodes exist. The guards last, once the pods run: with them the
        disruption controller matches every pod change against every budget."""
        pods = [pod for slot in range(self.n) for pod in self.workers_for(slot)]
        for slot in range(self.n):
            for job, pod in self.pods_on[slot]:
                self.assigned.setdefault(job, []).append(pod)
        self._step("jobs", self._create_job, range(self.n))
        self._step("nodes", self._create_node, range(self.n))
        self._step("pods", self._create_pod, pods)
        from benchmarks.real_plane import wait_cluster_ready

        t0 = time.monotonic()
        self.unready_at_start = wait_cluster_ready(self.rest, max_unready_nodes)
        self.steps["nodes_ready_pods_running"] = round(time.monotonic() - t0, 1)
        if guards:
            self._step("guards", self._create_guard, range(self.n))

    def _create_node(self, slot: int) -> None:
        from benchmarks.real_plane import kwok_node

        body = kwok_node(
            self.node_name(slot),
            self.node_labels(),
            self.provider_id(slot),
            gpus=2 * PER_JOB_ON_NODE,
        )
        self.rest.call("POST", "/api/v1/nodes", body)

    def _create_job(self, k: int) -> None:
        name = f"job-{k:05d}"
        job = raw_job(name, 2 * PER_JOB_ON_NODE, NS, headroom=0, stored=False)
        # Horovod's rank assignment, as the discovery sidecar reports it for a job that has run
        # a while. Without it the daemon counts a worker as a settled survivor only join_grace
        # (30 s) after its Ready time, which kwok sets when the pod is made: it would keep a
        # job's last settled host out of the drain (LAST_HOST_KEPT) until the setup is 30 s
        # old, and the figure would measure that. (The emulator's pods carry no Ready time:
        # settled from the start.) A replacement is left out, as the sidecar reports it only
        # once Horovod has synced it; the job's workers on its other node stay settled.
        job["metadata"]["annotations"] = {
            ASSIGNED_ANNOTATION: encode_assigned(set(self.assigned[name]))
        }
        status = job.pop("status")  # a create drops it: written through /status
        # conditions, replicaStatuses and restartCount are required by et-operator's CRD
        status |= {"conditions": [], "replicaStatuses": {}, "restartCount": 0}
        made = self.rest.call("POST", f"/apis/{ET_API}/namespaces/{NS}/trainingjobs", job)
        assert made is not None
        self.uids[name] = made["metadata"]["uid"]
        path = f"/apis/{ET_API}/namespaces/{NS}/trainingjobs/{name}/status"
        self.rest.call("PATCH", path, {"status": status}, merge=True)

    def _create_guard(self, k: int) -> None:
        labels = et_operator.KIND.guard_labels
        assert labels is not None
        name = f"job-{k:05d}"
        job = {
            "apiVersion": ET_API,
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": NS, "uid": self.uids[name]},
        }
        guard = desired_guard(job, labels(name))
        self.rest.call("POST", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", guard)

    def _create_pod(self, pod: Obj) -> None:
        pod = {**pod, "metadata": dict(pod["metadata"])}
        del pod["status"]  # kwok makes it Running
        [owner] = pod["metadata"]["ownerReferences"]
        pod["metadata"]["ownerReferences"] = [{**owner, "uid": self.uids[owner["name"]]}]
        self.rest.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)

    def replace_all(self, slots: list[int]) -> None:
        """The reclaimed nodes are gone; fresh ones arrive with fresh workers for the same jobs."""
        self.rest.parallel(
            lambda name: self.rest.call("DELETE", f"/api/v1/nodes/{name}", missing_ok=True),
            [self.node_name(slot) for slot in slots],
        )
        for slot in slots:
            self.generation[slot] += 1
        self.rest.parallel(self._create_node, slots)
        self._wait_ready(slots)
        self.rest.parallel(self._create_pod, [p for slot in slots for p in self.workers_for(slot)])

    def _wait_ready(self, slots: list[int]) -> None:
        """Until kwok runs the fresh nodes. A pod bound to a node before kwok holds its Lease in
        its own cache is skipped for good: kwok v0.8.0 lists a node's pods once, when it starts
        managing the node, right after creating the Lease, and skips each as `read only` while
        its Lease informer has not caught up (pkg/kwok/controllers: node_lease_controller.go
        `sync` calls `onNodeManaged` after `ensureLease`; pod_controller.go `watchResources`
        asks `readOnly`, `Held` reads the informer). At 2,000 nodes every fresh pod stayed
        Pending so (docs/testing.md)."""
        from benchmarks.real_plane import node_ready
        from tests.support.control_plane import wait_until

        def ready(slot: int) -> bool:
            node = self.rest.get(f"/api/v1/nodes/{self.node_name(slot)}")
            return node is not None and node_ready(node)

        wait_until(lambda: all(ready(s) for s in slots), 60, "fresh nodes Ready", 0.2)


class Observed:
    """When each host was first seen drained and each pod first named by a ScaleIn."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.drained: dict[str, float] = {}
        self.scaled_in: dict[str, float] = {}
        self.scale_ins: list[Obj] = []  # for the operator stand-in
        self.done: set[str] = set()  # pods of the ScaleIns it completed

    def saw_job(self, obj: Obj) -> None:
        hosts = decode_drained(
            (obj.get("metadata", {}).get("annotations") or {}).get(DRAINED_ANNOTATION)
        )
        now = time.monotonic()
        with self.lock:
            for host in hosts:
                self.drained.setdefault(host, now)
            self.lock.notify_all()

    def wait_for_pods(self, pods: list[str], timeout: float) -> bool:
        """Until every pod has been seen drained and named by a ScaleIn."""
        with self.lock:
            return self.lock.wait_for(
                lambda: all(p in self.drained and p in self.scaled_in for p in pods), timeout
            )

    def saw_scale_in(self, obj: Obj) -> None:
        now = time.monotonic()
        pods = (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []
        with self.lock:
            for pod in pods:
                self.scaled_in.setdefault(pod, now)
            self.scale_ins.append(obj)
            self.lock.notify_all()

    def completed(self, obj: Obj) -> None:
        """The stand-in deleted this ScaleIn's pods and marked it done."""
        with self.lock:
            self.done.update((obj.get("spec", {}).get("toDelete") or {}).get("podNames") or [])
            self.lock.notify_all()

    def wait_completed(self, pods: list[str], timeout: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.done.issuperset(pods), timeout)

    def take_scale_ins(self, stop: threading.Event) -> list[Obj]:
        with self.lock:
            self.lock.wait_for(lambda: self.scale_ins or stop.is_set(), timeout=0.5)
            todo, self.scale_ins = self.scale_ins, []
        return todo


def watch_kind(
    api_client: client.ApiClient, plural: str, on_event: Any, stop: threading.Event
) -> None:
    custom = client.CustomObjectsApi(api_client)
    rv = ""
    while not stop.is_set():
        w = watch.Watch()
        try:
            for event in w.stream(
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                NS,
                plural,
                resource_version=rv or None,
                timeout_seconds=5,
            ):
                obj = event["object"]
                if event["type"] == "ERROR":  # 410 Gone: watch again from now
                    rv = ""
                    break
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if event["type"] in ("ADDED", "MODIFIED"):
                    on_event(obj)
                if stop.is_set():
                    break
        except Exception:  # the emulator dropping a watch: resume
            time.sleep(0.05)


def _succeeded() -> Obj:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "conditions": [
            {"type": "Created", "status": "True", "lastTransitionTime": stamp},
            {"type": "ScaleSucceeded", "status": "True", "lastTransitionTime": stamp},
        ]
    }


def operator_stand_in(api: KubeApiServer, seen: Observed, stop: threading.Event) -> None:
    """Complete every ScaleIn as et-operator would: delete its pods, mark it ScaleSucceeded."""
    while not stop.is_set():
        for obj in seen.take_scale_ins(stop):
            meta = obj["metadata"]
            for pod in (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []:
                if api.get("pods", pod, NS) is not None:
                    api.delete("pods", pod, NS)
            api.patch("scaleins", meta["name"], {"status": _succeeded()}, NS)
            seen.completed(obj)


def real_operator_stand_in(rest: Rest, seen: Observed, stop: threading.Event) -> None:
    """The same through the real API: DELETE each named pod (kwok ends it at once), then the
    ScaleIn's status through /status (the CRD requires conditions, replicaStatuses and
    restartCount). ScaleIns in parallel."""

    def complete(obj: Obj) -> None:
        for pod in (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []:
            rest.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}", missing_ok=True)
        status = _succeeded() | {"replicaStatuses": {}, "restartCount": 0}
        path = f"/apis/{ET_API}/namespaces/{NS}/scaleins/{obj['metadata']['name']}/status"
        rest.call("PATCH", path, {"status": status}, merge=True, missing_ok=True)
        seen.completed(obj)

    while not stop.is_set():
        todo = seen.take_scale_ins(stop)
        try:
            rest.parallel(complete, todo)
        except Exception as e:  # reported; a round's timeout then shows the effect
            print(f"stand-in: {e}", file=sys.stderr, flush=True)


def interruption(instance: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": REGION,
            "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance}"],
            "detail": {"instance-id": instance, "instance-action": "terminate"},
        }
    )


# --- the two clusters -----------------------------------------------------------------------
class EmulatedBench:
    """The emulator in this process, the cluster seeded through its backdoor."""

    name = "emulator"

    def __init__(self, nodes: int, guards: str) -> None:
        self.nodes, self.guards = nodes, guards
        self.setup: dict[str, float] = {}

    def __enter__(self) -> EmulatedBench:
        t0 = time.monotonic()
        # a long event history: watches resume instead of relisting (no 410 Gone mid-run)
        self.api = KubeApiServer(history_limit=500_000).__enter__()
        # The disruption controller runs in kube-controller-manager, not in a write's path; the
        # emulator's, which recomputes budgets on every pod change, would make each write cost
        # O(pods x budgets) here (~165 ms at 2,000 nodes) and measure the emulator, not the daemon
        self.api.pdb_controller = False
        self.api.seed(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NS},
                "status": {"phase": "Active"},
            }
        )
        self.cluster = Cluster(self.api, self.nodes)
        self.cluster.seed()
        if self.guards == "seeded":
            self.cluster.seed_guards()
        self.setup["total"] = round(time.monotonic() - t0, 1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.__exit__(*exc)

    def api_client(self) -> client.ApiClient:
        return self.api.api_client()

    def kubeconfig(self, tmp: Path) -> str:
        return self.api.kubeconfig(str(tmp / "kubeconfig"))

    def stand_in(self, seen: Observed, stop: threading.Event) -> None:
        operator_stand_in(self.api, seen, stop)

    def wait_for_daemon(self, daemon: subprocess.Popen[bytes], port: int) -> float:
        return _wait_for_daemon(self.api, jobs=self.nodes)

    def replace(self, slots: list[int]) -> None:
        for slot in slots:
            self.cluster.replace(slot)

    def guards_marked(self) -> None:
        pass

    def guard_writes(self) -> int:
        methods = ("POST", "PUT", "PATCH")
        return sum(self.api.count(method, "poddisruptionbudgets") for method in methods)

    def server_times_marked(self) -> None:
        pass

    def server_times(self) -> dict[str, Any]:
        return {}  # the emulator's time is not the product's question

    def versions(self) -> dict[str, Any]:
        return {"kube_api": "emulator (tests/support/kube_api.py)"}

    def watch_processes(self, meter: Meter) -> None:
        pass

    def health(self) -> dict[str, int] | None:
        return None


class RealBench:
    """A real control plane with kwok nodes (benchmarks/real_plane.py), everything through the
    API."""

    name = "real"

    def __init__(self, nodes: int, guards: str, threads: int, max_unready_nodes: int = 0) -> None:
        self.nodes, self.guards, self.threads = nodes, guards, threads
        self.nudges = 0  # fresh workers kwok skipped and the harness touched (replace)
        self.max_unready_nodes = max_unready_nodes
        self.setup: dict[str, float] = {}
        self._guard_writes_before = 0

    def __enter__(self) -> RealBench:
        from benchmarks.real_plane import Rest, start_plane

        t0 = time.monotonic()
        self.plane = start_plane()
        self.setup["control_plane"] = round(time.monotonic() - t0, 1)
        try:
            self.rest = Rest(self.plane, self.threads)
            t1 = time.monotonic()
            self.rest.apply_crds(ET_CRDS)
            self.setup["crds"] = round(time.monotonic() - t1, 1)
            t1 = time.monotonic()
            self.rest.namespace(NS)
            self.setup["namespace"] = round(time.monotonic() - t1, 1)
            self.cluster = RealCluster(self.rest, self.nodes)
            self.cluster.seed(self.guards == "seeded", self.max_unready_nodes)
            self.setup |= self.cluster.steps
        except BaseException:
            self.plane.stop()
            raise
        self.setup["total"] = round(time.monotonic() - t0, 1)
        self.setup["requests_retried"] = self.rest.retried
        return self

    def __exit__(self, *exc: object) -> None:
        self.rest.close()
        self.plane.stop()

    def api_client(self) -> client.ApiClient:
        return self.plane.api_client()

    def kubeconfig(self, tmp: Path) -> str:
        return str(self.plane.kubeconfig_path)

    def stand_in(self, seen: Observed, stop: threading.Event) -> None:
        real_operator_stand_in(self.rest, seen, stop)

    def wait_for_daemon(self, daemon: subprocess.Popen[bytes], port: int) -> float:
        """Until the daemon holds the Lease, has synced (/readyz), every job has its eviction
        guard and a pass has run: the steady state, not the start-up."""
        from tests.support.control_plane import wait_until

        started = time.monotonic()

        def alive(ok: Any) -> Any:
            if daemon.poll() is not None:
                raise RuntimeError(f"the daemon exited with code {daemon.returncode}")
            return ok

        lease = "/apis/coordination.k8s.io/v1/namespaces/default/leases/spot-autoscaler"
        guards = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
        wait_until(
            lambda: alive(((self.rest.get(lease) or {}).get("spec") or {}).get("holderIdentity")),
            600,
            "the daemon's Lease",
        )
        wait_until(lambda: alive(_get_ok(f"http://127.0.0.1:{port}/readyz")), 600, "/readyz")
        wait_until(lambda: alive(len(self.rest.list_all(guards)) >= self.nodes), 600, "guards", 1.0)
        wait_until(lambda: alive(_scrape(port).get(f"{RECONCILE}_count", 0) >= 1), 600, "a pass")
        time.sleep(2.0)  # the pass after the last guard
        return time.monotonic() - started

    def replace(self, slots: list[int]) -> None:
        """Until the fresh workers run (kwok starts them). A pod kwok skipped is nudged (an
        annotation: one more watch event) every NUDGE_EVERY seconds it stays Pending: kwok v0.8.0
        plays a pod's stages only on its events, and skips it for good while its node's Lease
        is not yet in kwok's own cache (RealCluster._wait_ready; docs/testing.md)."""
        from benchmarks.real_plane import pod_running

        pods = f"/api/v1/namespaces/{NS}/pods"

        def pending() -> tuple[list[str], int]:
            """The fresh workers not running yet, and how many are not even listed."""
            waiting, missing = [], 0
            for slot in slots:
                on = f"fieldSelector=spec.nodeName%3D{self.cluster.node_name(slot)}"
                listed = self.rest.list_all(pods, on)
                waiting += [p["metadata"]["name"] for p in listed if not pod_running(p)]
                missing += max(0, 2 * PER_JOB_ON_NODE - len(listed))
            return waiting, missing

        self.cluster.replace_all(slots)
        started = nudged = time.monotonic()
        while (state := pending()) != ([], 0):
            waiting, missing = state
            now = time.monotonic()
            if now - started > 60:
                raise TimeoutError(
                    f"fresh workers not running after 60 s: {waiting}, {missing} not listed"
                )
            if now - nudged > NUDGE_EVERY:
                nudged = now
                self.nudges += len(waiting)
                touch = {"metadata": {"annotations": {"spot-autoscaler.test/nudged": str(now)}}}
                self.rest.parallel(
                    partial(self.rest.call, "PATCH", body=touch, merge=True, missing_ok=True),
                    [f"{pods}/{pod}" for pod in waiting],
                )
            time.sleep(0.2)

    def guards_marked(self) -> None:
        """Budget writes so far (the setup's): the daemon's are counted from here."""
        from benchmarks.real_plane import apiserver_requests

        self._guard_writes_before = apiserver_requests(
            self.rest, "poddisruptionbudgets", ("POST", "PUT", "PATCH")
        )

    def server_times_marked(self) -> None:
        from benchmarks.real_plane import apiserver_durations

        self._durations_before = apiserver_durations(self.rest)

    def server_times(self) -> dict[str, Any]:
        """The API server's own time on each kind of request the notices cost, since the mark."""
        from benchmarks.real_plane import DURATION, apiserver_durations

        after = apiserver_durations(self.rest)
        return {
            what: _window(self._durations_before.get(what, {}), series, DURATION)
            for what, series in after.items()
        }

    def guard_writes(self) -> int:
        """Budget writes since the mark (the server's apiserver_request_total: only the daemon
        writes budgets then; the disruption controller writes their status subresource)."""
        from benchmarks.real_plane import apiserver_requests

        verbs = ("POST", "PUT", "PATCH")
        after = apiserver_requests(self.rest, "poddisruptionbudgets", verbs)
        return after - self._guard_writes_before

    def versions(self) -> dict[str, Any]:
        from benchmarks.real_plane import versions

        return versions(self.plane, self.rest)

    def watch_processes(self, meter: Meter) -> None:
        meter.watch_plane(self.plane)

    def health(self) -> dict[str, int] | None:
        from benchmarks.real_plane import health

        return health(self.rest, NS) | {
            "pods_expected": self.nodes * 2 * PER_JOB_ON_NODE,
            "nodes_not_ready_at_start": self.cluster.unready_at_start,
            "fresh_workers_nudged": self.nudges,  # since the cluster was made (replace)
        }


Bench = EmulatedBench | RealBench


def run_size(
    nodes: int,
    notices: int,
    round_size: int,
    spacing: float,
    guards: str = "seeded",
    cluster: str = "emulator",
    threads: int = 24,
    py_spy: tuple[Path, float] | None = None,
    max_unready_nodes: int = 0,
    repeat: int = 1,
) -> list[dict[str, Any]]:
    """`repeat` runs on one cluster (made once: at 2,000 real nodes that is most of the time),
    each with a daemon of its own, started afresh, and notices on nodes no earlier run touched."""
    from benchmarks.real_plane import Meter

    meter = Meter()
    meter.mark("begin")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_DEFAULT_REGION": REGION,
        "POD_NAME": "reaction-bench",
        "POD_NAMESPACE": "default",
    }
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"])
    queue = sqs.create_queue(QueueName=f"notices-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    stop = threading.Event()
    seen = Observed()
    bench: Bench = (
        EmulatedBench(nodes, guards)
        if cluster == "emulator"
        else RealBench(nodes, guards, threads, max_unready_nodes)
    )
    with bench, tempfile.TemporaryDirectory() as tmp, _stopping(stop, moto):
        bench.watch_processes(meter)
        meter.mark("setup")
        kubeconfig = bench.kubeconfig(Path(tmp))
        threads_ = [
            threading.Thread(target=watch_kind, args=(bench.api_client(), p, f, stop), daemon=True)
            for p, f in (("trainingjobs", seen.saw_job), ("scaleins", seen.saw_scale_in))
        ]
        threads_.append(threading.Thread(target=bench.stand_in, args=(seen, stop), daemon=True))
        for t in threads_:
            t.start()
        bench.guards_marked()
        setup_cpu = meter.cpu("begin", "setup")
        runs = [
            _one_run(bench, meter, env, Path(tmp), kubeconfig, (sqs, queue), seen, plan, py_spy)
            for plan in _plans(bench, notices, round_size, spacing, repeat)
        ]
    return [
        {
            "cluster": bench.name,
            "nodes": nodes,
            "pods": nodes * 2 * PER_JOB_ON_NODE,
            "run": i + 1,
            "setup_s": bench.setup,
            **run,
            "cpu_s": {"setup": setup_cpu, **run["cpu_s"]},
        }
        for i, run in enumerate(runs)
    ]


@contextmanager
def _stopping(stop: threading.Event, moto: ThreadedMotoServer) -> Iterator[None]:
    """The harness's threads and moto end with the size, whatever happened."""
    try:
        yield
    finally:
        stop.set()
        moto.stop()


@dataclass(frozen=True)
class Plan:
    """One run's notices: `notices` of them, in rounds, from slot index `first` on."""

    notices: int
    round_size: int
    spacing: float
    first: int


def _plans(bench: Bench, notices: int, round_size: int, spacing: float, repeat: int) -> list[Plan]:
    slots = len(_slots(bench.cluster))
    if repeat * notices > slots:
        raise SystemExit(
            f"{repeat} runs of {notices} notices need {repeat * notices} node pairs: {slots} here"
        )
    return [Plan(notices, round_size, spacing, i * notices) for i in range(repeat)]


def _one_run(
    bench: Bench,
    meter: Any,
    env: dict[str, str],
    tmp: Path,
    kubeconfig: str,
    queue: tuple[Any, str],
    seen: Observed,
    plan: Plan,
    py_spy: tuple[Path, float] | None,
) -> dict[str, Any]:
    """A fresh daemon, its notices, its figures."""
    config = tmp / "config.yaml"
    port = _free_port()
    config.write_text(CONFIG.format(ns=NS, region=REGION, queue=queue[1], port=port))
    cli = Path(sys.executable).with_name("spot-autoscaler")
    # its log and decision lines (when each drain was decided) to files: a full pipe would stall it
    stderr = (tmp / "daemon.err").open("wb")
    stdout = (tmp / "daemon.out").open("wb")
    daemon = subprocess.Popen(
        [str(cli), "run", "--config", str(config), "--kubeconfig", kubeconfig],
        cwd=ROOT,
        env=env,
        stdout=stdout,
        stderr=stderr,
    )
    meter.watch("daemon", daemon.pid)
    meter.mark("daemon_started")
    profiler = None
    try:
        ready = bench.wait_for_daemon(daemon, port)
        before = _scrape(port)
        bench.server_times_marked()
        meter.mark("daemon_ready")
        profiler = _start_py_spy(daemon.pid, py_spy)
        t0 = time.monotonic()
        samples = _rounds(bench, *queue, seen, plan, daemon)
        rounds_s = time.monotonic() - t0
        meter.mark("rounds")
        metrics = _scrape(port)
        guard_writes = bench.guard_writes()
        server_times = bench.server_times()
        meter.peaks()
        versions = bench.versions()
        healthy = bench.health()
    finally:
        if profiler is not None:
            _finish_py_spy(profiler)
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        stderr.close()
        stdout.close()
        err = (tmp / "daemon.err").read_text(errors="replace")
    lines = (tmp / "daemon.out").read_text(errors="replace").splitlines()
    decided = _decided(lines)
    drain = [s["drain"] for s in samples]
    scale_in = [s["scale_in"] for s in samples]
    return {
        "notices": len(samples),
        "daemon_ready_s": round(ready, 1),
        "rounds_s": round(rounds_s, 1),
        "drain_s": _stats(drain),
        "scale_in_s": _stats(scale_in),
        # the drain's time split where the daemon's pass or fast path that decided it began
        # (its decision line's ts): before = SQS, waiting for the loop; after = the cache's
        # snapshot, deciding, the PATCH and this process's watch
        "drain_split_s": _split(samples, decided),
        # what the daemon decided over its run, by action and reason (a run with many more
        # passes than another: what they did)
        "decisions": _decision_counts(lines),
        # the API server's own time per kind of request in the rounds (a real plane's only)
        "server_times": server_times,
        "daemon_errors": _errors(err),
        # budgets the daemon wrote (seeded ones found right are left alone; replaced nodes'
        # fresh workers need none: the budget selects by job)
        "guard_writes": guard_writes,
        # the daemon's own view: one pass, and a notice received -> its drain/ScaleIn applied
        "pass_mean_s": _mean(metrics, RECONCILE),
        "daemon_reaction_mean_s": _mean(metrics, REACTION),
        # its passes during the rounds only (the histogram's difference)
        "daemon_passes": _window(before, metrics, RECONCILE),
        # CPU seconds per process and phase: setup (the cluster made, shared by the runs),
        # daemon_start (start to steady state), rounds (the notices); the harness is this process
        "cpu_s": {
            "daemon_start": meter.cpu("daemon_started", "daemon_ready"),
            "rounds": meter.cpu("daemon_ready", "rounds"),
        },
        "peak_rss_mb": meter.rss,
        # after the rounds: nodes not Ready (kwok late with their Leases: an overloaded
        # machine; also how many were at the start), worker pods Running of those expected
        "cluster_health": healthy,
        "versions": versions | _ours(),
    }


def _start_py_spy(pid: int, py_spy: tuple[Path, float] | None) -> subprocess.Popen[bytes] | None:
    """py-spy (pip install py-spy) sampling the daemon for a while: collapsed stacks per thread,
    idle ones too (the notice path mostly waits on the API server: where it waits is the point)."""
    if py_spy is None:
        return None
    out, seconds = py_spy
    binary = Path(sys.executable).with_name("py-spy")
    argv = [str(binary), "record", "--pid", str(pid), "--duration", f"{seconds:g}"]
    argv += ["--format", "raw", "--output", str(out), "--nonblocking", "--idle", "--threads"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish_py_spy(profiler: subprocess.Popen[bytes]) -> None:
    try:
        _, err = profiler.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        profiler.kill()
        _, err = profiler.communicate()
    if profiler.returncode != 0:
        print(f"py-spy: {err.decode(errors='replace')[-500:]}", file=sys.stderr)


def _ours() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {"spot_autoscaler": commit or "?", "python": platform.python_version()}


def _wait_for_daemon(api: KubeApiServer, jobs: int, timeout: float = 600.0) -> float:
    """Until the daemon holds the Lease, has listed everything (its watches are open) and has
    written every job's eviction guard: the steady state, not the start-up."""
    started = time.monotonic()
    api.wait_until(lambda: api.count(watch=True, path_contains="/pods") > 0, timeout=timeout)
    api.wait_until(
        lambda: api.get("leases", "spot-autoscaler", "default") is not None, timeout=timeout
    )
    api.wait_until(lambda: len(api.objects("PodDisruptionBudget", NS)) >= jobs, timeout=timeout)
    time.sleep(2.0)  # the pass after the last guard
    return time.monotonic() - started


def _slots(cluster: Any) -> list[int]:
    # nodes 0, 2, 4, ... touch disjoint pairs of jobs: one round never has two scalers per job
    return list(range(0, cluster.n - 1, 2))


def _rounds(
    bench: Bench,
    sqs: Any,
    queue: str,
    seen: Observed,
    plan: Plan,
    daemon: subprocess.Popen[bytes],
) -> list[dict[str, Any]]:
    cluster = bench.cluster
    slots = _slots(cluster)
    samples: list[dict[str, Any]] = []
    cursor = plan.first
    while len(samples) < plan.notices:
        batch = [slots[(cursor + i) % len(slots)] for i in range(plan.round_size)]
        cursor += plan.round_size
        sent: dict[int, float] = {}
        wall: dict[int, float] = {}
        for slot in batch:
            sent[slot] = time.monotonic()
            wall[slot] = time.time()
            sqs.send_message(QueueUrl=queue, MessageBody=interruption(cluster.instance(slot)))
            time.sleep(plan.spacing)
        pods = {slot: [p for _, p in cluster.pods_on[slot]] for slot in batch}
        if not seen.wait_for_pods([p for ps in pods.values() for p in ps], timeout=60):
            raise RuntimeError(
                f"round {(cursor - plan.first) // plan.round_size}: no reaction within 60 s "
                f"(daemon exit code {daemon.poll()})"
            )
        for slot in batch:
            samples.append(
                {
                    "drain": max(seen.drained[p] for p in pods[slot]) - sent[slot],
                    "scale_in": max(seen.scaled_in[p] for p in pods[slot]) - sent[slot],
                    "sent_at": wall[slot],  # wall clock, to compare with the daemon's log
                    "pods": pods[slot],
                }
            )
        # the stand-in deletes the round's pods and marks its ScaleIns done; fresh nodes with
        # fresh workers replace the reclaimed ones, running before the next round (a cluster
        # replaces a reclaimed node minutes later, not while the next notices arrive)
        doomed = [p for ps in pods.values() for p in ps]
        if not seen.wait_completed(doomed, timeout=60):
            raise RuntimeError("the stand-in did not complete the round's ScaleIns within 60 s")
        bench.replace(batch)
    return samples


def _decided(log: list[str]) -> dict[str, float]:
    """Pod -> when the pass that first decided to drain it began (epoch seconds), from the
    daemon's decision lines."""
    out: dict[str, float] = {}
    for line in read_decisions(log):
        at = parse_utc(line["ts"])
        if line["action"] == "drain" and at is not None:
            for pod in line["pods"]:
                out.setdefault(pod, at.timestamp())
    return out


def _decision_counts(log: list[str]) -> dict[str, int]:
    """`action reason` -> decision lines of the daemon's run, most first."""
    counts = Counter(f"{line['action']} {line['reason']}" for line in read_decisions(log))
    return dict(counts.most_common())


def _split(samples: list[dict[str, Any]], decided: dict[str, float]) -> dict[str, Any]:
    """Each notice's drain split at its decision: the later of its two jobs' drains."""
    before, after = [], []
    for s in samples:
        times = [decided.get(p.rsplit("/", 1)[-1]) for p in s["pods"]]
        if None in times:
            continue  # not drained by a decision of this daemon (or its line was lost)
        at = max(t for t in times if t is not None)
        before.append(at - s["sent_at"])
        after.append(s["drain"] - before[-1])
    return {"to_decision": _stats(before), "decision_to_seen": _stats(after)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _scrape(port: int) -> dict[str, float]:
    """Every series of /metrics, by its name and labels as written."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _mean(metrics: dict[str, float], histogram: str) -> float | None:
    count = metrics.get(f"{histogram}_count", 0.0)
    return round(metrics[f"{histogram}_sum"] / count, 3) if count else None


def _window(before: dict[str, float], after: dict[str, float], histogram: str) -> dict[str, Any]:
    """A histogram between two scrapes: count, mean, and the bucket bounds under which half
    and 99% of the observations fall."""
    diff = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith(histogram)}
    count = diff.get(f"{histogram}_count", 0.0)
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), v)
        for k, v in diff.items()
        if k.startswith(f"{histogram}_bucket{{")
    )

    def bound(q: float) -> float | None:
        return next((le for le, n in buckets if n >= q * count), None) if count else None

    return {
        "count": int(count),
        "mean_s": round(diff[f"{histogram}_sum"] / count, 3) if count else None,
        "p50_le_s": bound(0.5),
        "p99_le_s": bound(0.99),
    }


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {
        "median": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
    }


def _errors(stderr: str) -> int:
    return sum(1 for line in stderr.splitlines() if '"level": "error"' in line)


def _cpu_line(cpu: dict[str, float | None]) -> str:
    from benchmarks.real_plane import COMPONENTS, control_plane_total

    parts = [f"daemon {cpu.get('daemon')}", f"harness {cpu.get('harness')}"]
    if any(cpu.get(c) is not None for c in COMPONENTS):
        each = ", ".join(f"{c} {cpu.get(c)}" for c in COMPONENTS)
        parts.append(f"control plane {control_plane_total(cpu)} ({each})")
    return "; ".join(parts)


def spread(runs: list[dict[str, Any]]) -> str:
    """min / median / max over the runs of one size, of each run's figure."""

    def mmm(values: list[float]) -> str:
        return " / ".join(f"{v:.3f}" for v in (min(values), statistics.median(values), max(values)))

    lines = [f"{len(runs)} runs, min / median / max of the runs:"]
    for label, key, stat in (
        ("drain p99", "drain_s", "p99"),
        ("drain median", "drain_s", "median"),
        ("ScaleIn p99", "scale_in_s", "p99"),
        ("ScaleIn median", "scale_in_s", "median"),
    ):
        lines.append(f"  {label}: {mmm([r[key][stat] for r in runs])} s")
    lines.append(
        f"  notice received -> applied (daemon, mean): "
        f"{mmm([r['daemon_reaction_mean_s'] for r in runs])} s"
    )
    return "\n".join(lines)


def report(r: dict[str, Any]) -> str:
    setup = ", ".join(f"{k} {v}" for k, v in r["setup_s"].items())
    p = r["daemon_passes"]
    rss = ", ".join(f"{k} {v}" for k, v in r["peak_rss_mb"].items())
    cpu = r["cpu_s"]
    split, after = r["drain_split_s"]["to_decision"], r["drain_split_s"]["decision_to_seen"]
    return (
        f"{r['nodes']:,} nodes / {r['pods']:,} pods on the {r['cluster']}, {r['notices']} "
        f"notices (daemon ready in {r['daemon_ready_s']} s, {r['daemon_errors']} error lines):\n"
        f"  notice -> drain:   median {r['drain_s']['median']} s, "
        f"p99 {r['drain_s']['p99']} s, max {r['drain_s']['max']} s\n"
        f"  notice -> ScaleIn: median {r['scale_in_s']['median']} s, "
        f"p99 {r['scale_in_s']['p99']} s, max {r['scale_in_s']['max']} s\n"
        f"  drain split at its decision: notice -> pass began median {split['median']} s, "
        f"p99 {split['p99']} s; pass began -> drain seen median {after['median']} s, "
        f"p99 {after['p99']} s\n"
        + "".join(
            f"  API server's time, {what}: {w['count']}, mean {w['mean_s']} s, "
            f"p99 <= {w['p99_le_s']} s\n"
            for what, w in r.get("server_times", {}).items()
        )
        + f"  decisions: {', '.join(f'{k} {n}' for k, n in r['decisions'].items())}\n"
        + f"  daemon: mean pass {r['pass_mean_s']} s, mean notice received -> applied "
        f"{r['daemon_reaction_mean_s']} s; in the rounds {p['count']} passes, mean "
        f"{p['mean_s']} s, p50 <= {p['p50_le_s']} s, p99 <= {p['p99_le_s']} s\n"
        f"  setup (s): {setup}\n"
        f"  CPU s, setup: {_cpu_line(cpu['setup'])}\n"
        f"  CPU s, daemon start: {_cpu_line(cpu['daemon_start'])}\n"
        f"  CPU s, rounds ({r['rounds_s']} s): {_cpu_line(cpu['rounds'])}\n"
        f"  peak RSS MB: {rss}"
        + (f"\n  after the rounds: {r['cluster_health']}" if r["cluster_health"] else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,2000", help="comma-separated node counts")
    parser.add_argument("--notices", type=int, default=200, help="notices per size")
    parser.add_argument("--round", type=int, default=10, help="notices per round")
    parser.add_argument("--spacing", type=float, default=0.1, help="seconds between notices")
    parser.add_argument(
        "--guards",
        choices=["seeded", "daemon"],
        default="seeded",
        help="eviction guards already there (steady state), or written by the daemon first",
    )
    parser.add_argument(
        "--cluster",
        choices=["emulator", "real"],
        default="emulator",
        help="the API emulator in this process, or a real control plane with kwok nodes",
    )
    parser.add_argument(
        "--setup-threads", type=int, default=24, help="parallel requests making a real cluster"
    )
    parser.add_argument(
        "--max-unready-nodes",
        type=int,
        default=0,
        help="--cluster real: start although this many nodes are not Ready (a loaded machine); "
        "the report says how many were",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per size on one cluster, each with a fresh daemon (min/median/max at the end)",
    )
    parser.add_argument("--py-spy", type=Path, help="sample the daemon in the rounds: raw stacks")
    parser.add_argument("--py-spy-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        py_spy = None
        if args.py_spy:  # one file per size when there are several
            out = (
                args.py_spy
                if len(sizes) == 1
                else args.py_spy.with_name(f"{size}-{args.py_spy.name}")
            )
            py_spy = (out, args.py_spy_seconds)
        r = run_size(
            size,
            args.notices,
            args.round,
            args.spacing,
            args.guards,
            args.cluster,
            args.setup_threads,
            py_spy,
            args.max_unready_nodes,
            args.repeat,
        )
        results += r
        for run in r:
            print(report(run), flush=True)
        if len(r) > 1:
            print(spread(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
