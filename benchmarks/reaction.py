"""Reaction time: a spot notice (SQS, NTH's taint or Karpenter's) -> the worker's host drained ->
the ScaleIn, while the cluster churns.

    .venv/bin/python benchmarks/reaction.py                        # 1,000 and 2,000 nodes
    .venv/bin/python benchmarks/reaction.py --sizes 2000 --notices 300 --json reaction.json
    .venv/bin/python benchmarks/reaction.py --cluster real --sizes 2000 --repeat 3 --out-dir out

The real daemon (`spot-autoscaler run`, Kubernetes wiring, SQS consumer, leader election) runs
in its own process against moto's SQS, served from this process, and a Kubernetes API:

- `--cluster emulator` (the default): the test API emulator (tests/support/kube_api.py), served
  from this process, its objects seeded through its backdoor, pods seeded on their nodes;
- `--cluster real`: a real control plane (tests/support/control_plane.py: etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler, kwok; `make control-plane` builds the pinned
  binaries, env SPOT_AUTOSCALER_CONTROL_PLANE_BIN names another directory). Everything goes
  through the API, in parallel (benchmarks/real_plane.py): the GPU nodes are kwok nodes
  (8 nvidia.com/gpu, capacity-type spot, instance-type p3.16xlarge, a providerID naming the
  instance), et-operator's CRDs (tests/support/crds) are installed and the TrainingJobs created
  with their status written through /status and their rank assignment reported as the
  discovery sidecar does (spot-autoscaler.io/assigned-hosts: jobs that have run a while, see
  RealCluster._create_job). Every worker is a real pod the real kube-scheduler binds (the
  harness never sets spec.nodeName): the first ones carry a required node affinity on
  metadata.name, as a DaemonSet's pods do, so the layout below is known (the scheduler still
  queues, checks the fit and binds each); the ones added later go wherever it puts them; kwok
  runs them. The daemon runs as deploy/ runs it (benchmarks/deployed.py): deploy/'s
  ServiceAccount with a bound token, deploy/rbac.yaml's rules, deploy/flowschema.yaml's
  FlowSchemas (`--flowschema none`: without them), so RBAC decides and API Priority and
  Fairness queues each of its requests; the report says which FlowSchema and priority level
  its requests landed in and how long they waited there. `--identity admin` runs it with the
  admin's certificate instead (system:masters: RBAC bypassed, APF exempt), as until issue 34.

Every node has 8 one-GPU workers, 4 of job k and 4 of job k-1, so a notice dooms workers of two
jobs. Notices go out in rounds of `--round` (`--spacing` apart) at `--rate` notices a second,
on nodes no earlier notice touched whose jobs do not overlap, each by one of the `--paths` in
turn: `sqs` (an EventBridge spot interruption warning on the queue the daemon reads), `nth`
(aws-node-termination-handler's taint aws-node-termination-handler/spot-itn=<event>:NoSchedule,
then its cordon), `karpenter` (Karpenter v1's interruption: the Node deleted, held by Karpenter's
finalizer, then its karpenter.sh/disrupted:NoSchedule; the notice's clock starts at the taint,
as a taint on a live Node is a voluntary disruption, not a notice). Nothing waits
between rounds: a stand-in for et-operator completes each ScaleIn (deletes the named pods, marks
it ScaleSucceeded), then the reclaimed node is deleted and a fresh one created, while the next
notices arrive. On the real plane the fresh node comes empty and the daemon grows the two jobs
back onto it (its ScaleOuts, once the GPUs have been idle for its min_idle; the stand-in
creates their pods, the scheduler binds them, kwok runs them, the stand-in marks the ScaleOut
done): replacements join and other jobs scale while notices arrive. On the emulator the fresh
node comes with fresh workers of the same two jobs.

Per notice: drain = the last of its node's hosts appears in its job's drained-hosts annotation,
ScaleIn = the last of its pods is named by a ScaleIn object, both from the moment before the
message was sent or the taint's PATCH went out, as seen by watches from this process; per path
and over all. Beside them, per phase (setup, daemon start, rounds): CPU seconds of the daemon's
process, of this harness (the emulator or the bulk client, moto, the watches and the stand-in)
and of each control-plane process, from /proc/<pid>/stat; the daemon's passes in the rounds from
its /metrics histogram; the peak RSS (VmHWM) of each process; the churn of the run (nodes
replaced, ScaleOuts completed, pods the scheduler bound, fresh workers kwok left Pending and the
harness touched). `--py-spy FILE` samples the daemon during the rounds. `--out-dir DIR` writes
a JSON per run and one per size aggregating every notice of its runs. Figures, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
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
from collections.abc import Callable, Iterator
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

from autoscaler.adapters.kube.eviction_guard import desired_guard  # noqa: E402
from autoscaler.adapters.kube.kinds import et_operator  # noqa: E402
from autoscaler.annotations import (  # noqa: E402
    ASSIGNED_ANNOTATION,
    DRAINED_ANNOTATION,
    decode_drained,
    encode_assigned,
)
from autoscaler.config.kubernetes import DEFAULT_NOTICE_TAINTS  # noqa: E402
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
REACT_WITHIN = 60.0  # seconds a notice may wait for its drain and ScaleIn before the run fails
Obj = dict[str, Any]
ET_CRDS = tuple(f"{GROUP}_{p}" for p in ("trainingjobs", "scaleins", "scaleouts"))
RECONCILE = "spot_autoscaler_reconcile_duration_seconds"
REACTION = "spot_autoscaler_reaction_latency_seconds"
STEPS = "spot_autoscaler_fast_path_step_seconds"  # by step: wait, look, decide
TOUCHED = "spot-autoscaler.test/nudged"

# The notice paths: a cloud queue the daemon reads, and the taints two node handlers put on a
# node before they drain it (the daemon's defaults read both: config notice_taints).
NTH_TAINT = "aws-node-termination-handler/spot-itn"  # NTH: value = its event id
KARPENTER_TAINT = "karpenter.sh/disrupted"  # Karpenter v1: pkg/apis/v1/taints.go, no value
# held on a deleted Node until its drain is done (pkg/apis/v1/labels.go TerminationFinalizer)
KARPENTER_FINALIZER = "karpenter.sh/termination"
PATHS = ("sqs", "nth", "karpenter")
assert NTH_TAINT in DEFAULT_NOTICE_TAINTS and KARPENTER_TAINT in DEFAULT_NOTICE_TAINTS

CONFIG = """
kubernetes: {{namespaces: [{ns}]}}
aws: {{enabled: true, region: {region}, queue_url: "{queue}", prices: {{enabled: false}}}}
daemon:
  metrics_port: {port}
  metrics_bind_address: 127.0.0.1
  log_format: json
  log_level: info
  leader_election: {{lease_namespace: {lease_ns}}}
"""


def _worker(
    job: str, pod: str, index: int, node: str | None, uid: str = "u", pin: str = "name"
) -> Obj:
    """A one-GPU worker of `job`. On `node`: by spec.nodeName (`pin="name"`, the emulator: no
    scheduler), or by a required node affinity on metadata.name (`pin="affinity"`: the
    scheduler binds it there, as a DaemonSet's pods); none: wherever the scheduler puts it."""
    spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": "trainer",
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }
        ]
    }
    if node is not None and pin == "name":
        spec["nodeName"] = node
    elif node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        required = {"nodeSelectorTerms": [term]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
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
        "spec": spec,
        "status": {"phase": "Running"},
    }


class Layout:
    """Node i hosts 4 workers of job i and 4 of job i-1 (mod n); a replaced node gets a new
    name (its generation) and, on the emulator, fresh workers of the same two jobs under new
    indices."""

    pin = "name"

    def __init__(self, nodes: int) -> None:
        self.n = nodes
        self.generation = [0] * nodes
        self.next_index: dict[int, int] = defaultdict(int)
        self.pods_on: dict[int, list[tuple[str, str]]] = {}  # node slot -> (job, pod)
        self.index_lock = threading.Lock()

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

    def new_indices(self, job: int, count: int) -> list[int]:
        with self.index_lock:
            first = self.next_index[job]
            self.next_index[job] += count
        return list(range(first, first + count))

    def workers_for(self, slot: int) -> list[Obj]:
        """The slot's fresh workers (new indices); pods_on[slot] names them."""
        name = self.node_name(slot)
        pods, out = [], []
        for job in (slot, (slot - 1) % self.n):
            for index in self.new_indices(job, PER_JOB_ON_NODE):
                pod = f"job-{job:05d}-worker-{index}"
                pods.append((f"job-{job:05d}", pod))
                out.append(_worker(f"job-{job:05d}", pod, index, name, pin=self.pin))
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
        """Every job's eviction guard, as the daemon writes it (eviction_guard.desired_guard), so
        the run starts in the steady state of a daemon that has been up a while; without it the
        daemon writes them first, a few per pass (5,000 take longer than the benchmark may)."""
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


class RealCluster(Layout):
    """The layout on a real control plane, made through the API by a thread pool; its first
    workers pinned to their nodes by node affinity, for the scheduler to bind."""

    pin = "affinity"

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
        self._step("pods", self.create_pod, pods)
        from benchmarks.real_plane import wait_cluster_ready

        t0 = time.monotonic()
        # bound by the scheduler (each to the node its affinity names), then run by kwok
        self.unready_at_start = wait_cluster_ready(self.rest, max_unready_nodes)
        self.steps["pods_bound_and_running"] = round(time.monotonic() - t0, 1)
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
        # settled from the start.) The workers added later are left out, as the sidecar
        # reports them only once Horovod has synced them; the job's workers on its other node
        # stay settled.
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

    def create_pod(self, pod: Obj) -> None:
        pod = {**pod, "metadata": dict(pod["metadata"])}
        pod.pop("status", None)  # kwok makes it Running
        [owner] = pod["metadata"]["ownerReferences"]
        pod["metadata"]["ownerReferences"] = [{**owner, "uid": self.uids[owner["name"]]}]
        self.rest.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)

    def _delete_node(self, name: str) -> None:
        """Gone: Karpenter's finalizer (a Karpenter notice's) lifted first, as its drain ends."""
        unheld = {"metadata": {"finalizers": None}}
        self.rest.call("PATCH", f"/api/v1/nodes/{name}", unheld, merge=True, missing_ok=True)
        self.rest.call("DELETE", f"/api/v1/nodes/{name}", missing_ok=True)

    def replace_nodes(self, slots: list[int]) -> None:
        """The reclaimed nodes are gone; fresh, empty ones arrive (kwok makes them Ready, the
        node lifecycle controller lifts their not-ready taint; the daemon grows onto them)."""
        self.rest.parallel(self._delete_node, [self.node_name(slot) for slot in slots])
        for slot in slots:
            self.generation[slot] += 1
        self.rest.parallel(self._create_node, slots)


class Observed:
    """When each host was first seen drained and each pod first named by a ScaleIn; the
    scalers for the operator stand-in to run."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.drained: dict[str, float] = {}
        self.scaled_in: dict[str, float] = {}
        self.scale_ins: list[Obj] = []  # for the operator stand-in
        self.scale_outs: list[Obj] = []
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

    def reacted(self, pods: list[str]) -> bool:
        """Every pod seen drained and named by a ScaleIn (call with the lock held)."""
        return all(p in self.drained and p in self.scaled_in for p in pods)

    def wait_for_pods(self, pods: list[str], timeout: float) -> bool:
        """Until every pod has been seen drained and named by a ScaleIn."""
        with self.lock:
            return self.lock.wait_for(lambda: self.reacted(pods), timeout)

    def saw_scale_in(self, obj: Obj) -> None:
        now = time.monotonic()
        pods = (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []
        with self.lock:
            for pod in pods:
                self.scaled_in.setdefault(pod, now)
            if _outcome(obj) is None:  # not one the stand-in has finished
                self.scale_ins.append(obj)
            self.lock.notify_all()

    def saw_scale_out(self, obj: Obj) -> None:
        if _outcome(obj) is not None:
            return  # finished (by the stand-in): nothing to run
        with self.lock:
            self.scale_outs.append(obj)
            self.lock.notify_all()

    def completed(self, obj: Obj) -> None:
        """The stand-in deleted this ScaleIn's pods and marked it done."""
        with self.lock:
            self.done.update((obj.get("spec", {}).get("toDelete") or {}).get("podNames") or [])
            self.lock.notify_all()

    def wait_completed(self, pods: list[str], timeout: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.done.issuperset(pods), timeout)

    def take_scalers(
        self, stop: threading.Event, timeout: float = 0.5
    ) -> tuple[list[Obj], list[Obj]]:
        """The ScaleIns and ScaleOuts seen since the last take (waits up to `timeout` for one)."""
        with self.lock:
            self.lock.wait_for(lambda: self.scale_ins or self.scale_outs or stop.is_set(), timeout)
            ins, self.scale_ins = self.scale_ins, []
            outs, self.scale_outs = self.scale_outs, []
        return ins, outs


def _outcome(obj: Obj) -> str | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    last = conditions[-1].get("type") if conditions else None
    return last if last in ("ScaleSucceeded", "ScaleFailed") else None


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


def _succeeded(**status: Any) -> Obj:
    return _finished("ScaleSucceeded", **status)


def _finished(outcome: str, **status: Any) -> Obj:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "conditions": [
            {"type": "Created", "status": "True", "lastTransitionTime": stamp},
            {"type": outcome, "status": "True", "lastTransitionTime": stamp},
        ],
        **status,
    }


def operator_stand_in(api: KubeApiServer, seen: Observed, stop: threading.Event) -> None:
    """Complete every ScaleIn as et-operator would: delete its pods, mark it ScaleSucceeded.
    (On the emulator every job is back at its max with its fresh workers: no ScaleOuts.)"""
    done: set[str] = set()
    while not stop.is_set():
        ins, _ = seen.take_scalers(stop)
        for obj in ins:
            meta = obj["metadata"]
            if meta["name"] in done:
                continue
            done.add(meta["name"])
            for pod in (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []:
                if api.get("pods", pod, NS) is not None:
                    api.delete("pods", pod, NS)
            api.patch("scaleins", meta["name"], {"status": _succeeded()}, NS)
            seen.completed(obj)


@dataclass
class _Growing:
    """A ScaleOut the stand-in has made the pods of, until they run."""

    name: str
    pods: list[str]
    started: float
    timeout: float
    touched: float = 0.0


class RealOperator:
    """et-operator's part through the real API, in parallel. A ScaleIn: DELETE each named pod
    (kwok ends it at once), then its status through /status (the CRD requires conditions,
    replicaStatuses and restartCount). A ScaleOut: its `toAdd.count` new workers of the job
    (new indices; no node named: the scheduler places them), then, once they run,
    ScaleSucceeded with `addPods` (or ScaleFailed and its pods deleted after `spec.timeout`,
    as et-operator's IsScaleOutTimeout). A new worker kwok left Pending for NUDGE_EVERY s is
    touched (an annotation: one more watch event): kwok v0.8.0 plays a pod's stages only on its
    events and skips one for good while its node's Lease is not yet in its own cache
    (pkg/kwok/controllers: node_lease_controller.go `sync` calls `onNodeManaged` after
    `ensureLease`; pod_controller.go `watchResources` asks `readOnly`, `Held` reads the
    informer; docs/testing.md)."""

    def __init__(self, rest: Rest, cluster: RealCluster, seen: Observed) -> None:
        self.rest, self.cluster, self.seen = rest, cluster, seen
        self.growing: dict[str, _Growing] = {}
        self.started: set[str] = set()
        self.counts: Counter[str] = Counter()  # scale_outs, scale_out_pods, failed, touched
        self._checked = 0.0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            ins, outs = self.seen.take_scalers(stop)
            # each once: the stand-in's own status writes come back as MODIFIED events
            ins = list({o["metadata"]["name"]: o for o in ins}.values())
            ins = [o for o in ins if o["metadata"]["name"] not in self.started]
            self.started.update(o["metadata"]["name"] for o in ins)
            try:
                self.rest.parallel(self._complete_scale_in, ins)
                for obj in outs:
                    self._start_scale_out(obj)
                if self.growing and time.monotonic() - self._checked > 1.0:
                    self._check_growing()
            except Exception as e:  # reported; a notice's timeout then shows the effect
                print(f"stand-in: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _complete_scale_in(self, obj: Obj) -> None:
        """Its victims frozen in status.toDeletePods first, as et-operator's
        setsSaleInToDelete does before it deletes them: a ScaleIn whose pods are gone and
        that never started is one the daemon cancels (victims_gone)."""
        pods = (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []
        path = f"/apis/{ET_API}/namespaces/{NS}/scaleins/{obj['metadata']['name']}/status"
        frozen: Obj = {
            "conditions": [],
            "toDeletePods": pods,
            "replicaStatuses": {},
            "restartCount": 0,
        }
        if self.rest.call("PATCH", path, {"status": frozen}, merge=True, missing_ok=True):
            for pod in pods:
                self.rest.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}", missing_ok=True)
            status = _succeeded(replicaStatuses={}, restartCount=0)
            self.rest.call("PATCH", path, {"status": status}, merge=True, missing_ok=True)
        self.seen.completed(obj)

    def _start_scale_out(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name in self.started:
            return
        self.started.add(name)
        spec = obj.get("spec") or {}
        job = (spec.get("selector") or {}).get("name") or ""
        count = int((spec.get("toAdd") or {}).get("count") or 0)
        k = int(job.rsplit("-", 1)[-1])
        indices = self.cluster.new_indices(k, count)
        pods = [_worker(job, f"{job}-worker-{i}", i, None) for i in indices]
        self.rest.parallel(self.cluster.create_pod, pods)
        self.counts["scale_outs"] += 1
        self.counts["scale_out_pods"] += len(pods)
        names = [p["metadata"]["name"] for p in pods]
        timeout = float(spec.get("timeout") or 180)
        self.growing[name] = _Growing(name, names, time.monotonic(), timeout)

    def _check_growing(self) -> None:
        """One list of the namespace's pods that are not Running: a ScaleOut none of whose pods
        is there is done (kwok makes a pod Running and Ready at once; a pod whose node went is
        gone: nothing to wait for)."""
        self._checked = time.monotonic()
        pods = f"/api/v1/namespaces/{NS}/pods"
        listed = self.rest.list_all(pods, "fieldSelector=status.phase!=Running")
        waiting = {p["metadata"]["name"] for p in listed}
        now = time.monotonic()
        for g in list(self.growing.values()):
            late = [p for p in g.pods if p in waiting]
            if not late:
                self._finish(g, "ScaleSucceeded")
            elif now - g.started > g.timeout:
                self._finish(g, "ScaleFailed")
            elif now - max(g.started, g.touched) > NUDGE_EVERY:
                g.touched = now
                self.counts["touched"] += len(late)
                touch = {"metadata": {"annotations": {TOUCHED: str(now)}}}
                self.rest.parallel(
                    partial(self.rest.call, "PATCH", body=touch, merge=True, missing_ok=True),
                    [f"{pods}/{pod}" for pod in late],
                )

    def _finish(self, g: _Growing, outcome: str) -> None:
        del self.growing[g.name]
        if outcome == "ScaleFailed":  # all or nothing, as et-operator's ScaleOutFailed
            self.counts["scale_outs_failed"] += 1
            self.rest.parallel(
                lambda p: self.rest.call(
                    "DELETE", f"/api/v1/namespaces/{NS}/pods/{p}", missing_ok=True
                ),
                g.pods,
            )
        status = _finished(outcome, addPods=g.pods, replicaStatuses={}, restartCount=0)
        path = f"/apis/{ET_API}/namespaces/{NS}/scaleouts/{g.name}/status"
        self.rest.call("PATCH", path, {"status": status}, merge=True, missing_ok=True)


class Replacer:
    """The cloud and the node provisioner: a noticed node goes once the stand-in has completed
    its ScaleIns (its workers deleted), and a fresh one comes, while notices go on."""

    def __init__(self, seen: Observed, replace: Callable[[list[int]], None]) -> None:
        self.seen, self.replace = seen, replace
        self.queue: dict[int, list[str]] = {}  # slot -> its doomed pods
        self.busy = False
        self.replaced = 0

    def retire(self, slot: int, pods: list[str]) -> None:
        with self.seen.lock:
            self.queue[slot] = pods
            self.seen.lock.notify_all()

    def _ready(self) -> list[int]:
        return [s for s, pods in self.queue.items() if self.seen.done.issuperset(pods)]

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self.seen.lock:
                self.seen.lock.wait_for(lambda: self._ready() or stop.is_set(), 0.5)
                slots = self._ready()
                for slot in slots:
                    del self.queue[slot]
                self.busy = bool(slots)
            if not slots:
                continue
            try:
                self.replace(slots)
                self.replaced += len(slots)
            except Exception as e:
                print(f"replacer: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            finally:
                with self.seen.lock:
                    self.busy = False
                    self.seen.lock.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self.seen.lock:
            return self.seen.lock.wait_for(lambda: not self.queue and not self.busy, timeout)


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


def nth_taint() -> Obj:
    """NTH's spot interruption taint (pkg/node/node.go TaintSpotItn: value = its event id)."""
    return {"key": NTH_TAINT, "value": f"spot-itn-{uuid.uuid4().hex[:16]}", "effect": "NoSchedule"}


def karpenter_taint() -> Obj:
    """Karpenter v1's DisruptedNoScheduleTaint (pkg/apis/v1/taints.go)."""
    return {"key": KARPENTER_TAINT, "effect": "NoSchedule"}


# --- the two clusters -----------------------------------------------------------------------
class EmulatedBench:
    """The emulator in this process, the cluster seeded through its backdoor."""

    name = "emulator"
    lease_namespace = "default"
    identity = "kubeconfig of the emulator (no RBAC, no APF)"

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

    def taint(self, node: str, taint: Obj, cordon: bool = False) -> float:
        """The taint, then (NTH) the cordon; when the taint's write was answered (monotonic)."""
        current = self.api.get("nodes", node) or {}
        taints = [*((current.get("spec") or {}).get("taints") or []), taint]
        self.api.patch("nodes", node, {"spec": {"taints": taints}})
        written = time.monotonic()
        if cordon:
            self.api.patch("nodes", node, {"spec": {"unschedulable": True}})
        return written

    def terminating(self, node: str) -> None:
        """Deleted, held by Karpenter's finalizer (the backdoor sets what a DELETE would)."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = {"finalizers": [KARPENTER_FINALIZER], "deletionTimestamp": stamp}
        self.api.patch("nodes", node, {"metadata": meta})

    def marked(self) -> None:
        pass

    def guard_writes(self) -> int:
        methods = ("POST", "PUT", "PATCH")
        return sum(self.api.count(method, "poddisruptionbudgets") for method in methods)

    def server_times(self) -> dict[str, Any]:
        return {}  # the emulator's time is not the product's question

    def apf(self) -> dict[str, Any] | None:
        return None

    def churn(self) -> dict[str, int]:
        return {}

    def controllers(self) -> dict[str, float]:
        return {}  # the emulator runs no controller-manager

    def versions(self) -> dict[str, Any]:
        return {"kube_api": "emulator (tests/support/kube_api.py)"}

    def watch_processes(self, meter: Meter) -> None:
        pass

    def health(self) -> dict[str, int] | None:
        return None


class RealBench:
    """A real control plane with kwok nodes (benchmarks/real_plane.py), everything through the
    API; the daemon as deploy/ runs it (benchmarks/deployed.py), or as the admin."""

    name = "real"

    def __init__(
        self,
        nodes: int,
        guards: str,
        threads: int,
        max_unready_nodes: int = 0,
        identity: str = "serviceaccount",
        flowschema: bool = True,
    ) -> None:
        from benchmarks.deployed import NAMESPACE

        self.nodes, self.guards, self.threads = nodes, guards, threads
        self.max_unready_nodes = max_unready_nodes
        self.as_deployed = identity == "serviceaccount"
        self.flowschema = flowschema
        self.lease_namespace = NAMESPACE
        self.identity = (
            f"ServiceAccount {NAMESPACE}/{NAMESPACE} (deploy/rbac.yaml"
            + (", deploy/flowschema.yaml)" if flowschema else ", no FlowSchema of ours)")
            if self.as_deployed
            else "admin (system:masters: no RBAC, APF exempt)"
        )
        self.setup: dict[str, Any] = {}
        self._token = ""
        self._marks: dict[str, Any] = {}

    def __enter__(self) -> RealBench:
        from benchmarks import deployed
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
            # deploy/'s namespace, ServiceAccount, RBAC and FlowSchemas (the Lease is there)
            self.setup["deploy_objects"] = deployed.install(self.rest, self.flowschema)
            deployed.wait_rbac(self.rest)
            self.setup["namespaces"] = round(time.monotonic() - t1, 1)
            self.cluster = RealCluster(self.rest, self.nodes)
            self.cluster.seed(self.guards == "seeded", self.max_unready_nodes)
            self.setup |= self.cluster.steps
            # every worker so far was bound by the scheduler (POST pods/binding)
            self.setup["pods_created"] = self.nodes * 2 * PER_JOB_ON_NODE
            self.setup["scheduler_bindings"] = self._bindings()
            self.operator = RealOperator(self.rest, self.cluster, Observed())
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
        """The admin's, or a kubeconfig with a fresh bound token of deploy/'s ServiceAccount."""
        from benchmarks import deployed

        if not self.as_deployed:
            return str(self.plane.kubeconfig_path)
        self._token = deployed.token(self.rest)
        return deployed.write_kubeconfig(self.plane, tmp / "daemon.kubeconfig", self._token)

    def stand_in(self, seen: Observed, stop: threading.Event) -> None:
        self.operator.seen = seen
        self.operator.run(stop)

    def wait_for_daemon(self, daemon: subprocess.Popen[bytes], port: int) -> float:
        """Until the daemon holds the Lease, has synced (/readyz), every job has its eviction
        guard and a pass has run: the steady state, not the start-up."""
        from tests.support.control_plane import wait_until

        started = time.monotonic()

        def alive(ok: Any) -> Any:
            if daemon.poll() is not None:
                raise RuntimeError(f"the daemon exited with code {daemon.returncode}")
            return ok

        lease = (
            f"/apis/coordination.k8s.io/v1/namespaces/{self.lease_namespace}/leases/spot-autoscaler"
        )
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
        self.cluster.replace_nodes(slots)

    def taint(self, node: str, taint: Obj, cordon: bool = False) -> float:
        """A strategic merge patch of the node's taints (merged by key, as the taint manager's
        and kubectl's), then, for NTH, its cordon (NTH taints first, then cordons and drains:
        pkg/node/node.go TaintSpotItn, CordonAndDrain). When the taint's write was answered
        (monotonic)."""
        from benchmarks.real_plane import ApiError

        path = f"{self.rest.base}/api/v1/nodes/{node}"
        body = json.dumps({"spec": {"taints": [taint]}}).encode()
        headers = {
            "Content-Type": "application/strategic-merge-patch+json",
            "Accept": "application/json",
        }
        r = self.rest.http.request("PATCH", path, body=body, headers=headers)
        if r.status >= 400:
            raise ApiError("PATCH", path, r.status, r.data.decode(errors="replace"))
        written = time.monotonic()
        if cordon:
            self.rest.call(
                "PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, merge=True
            )
        return written

    def terminating(self, node: str) -> None:
        """Karpenter's finalizer on the Node, then its DELETE: the Node stays, being deleted."""
        self.rest.call(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"finalizers": [KARPENTER_FINALIZER]}},
            merge=True,
        )
        self.rest.call("DELETE", f"/api/v1/nodes/{node}", missing_ok=True)

    def marked(self) -> None:
        """The counters the run's figures are differences of, read as its rounds begin."""
        from benchmarks import deployed
        from benchmarks.real_plane import apiserver_durations, apiserver_requests, controller_work

        self._marks = {
            "controllers": controller_work(self.plane),
            "guards": apiserver_requests(
                self.rest, "poddisruptionbudgets", ("POST", "PUT", "PATCH")
            ),
            "durations": apiserver_durations(self.rest),
            "flowcontrol": deployed.flowcontrol(self.rest),
            "bindings": self._bindings(),
            "operator": Counter(self.operator.counts),
        }

    def server_times(self) -> dict[str, Any]:
        """The API server's own time on each kind of request the notices cost, since the mark."""
        from benchmarks.real_plane import DURATION, apiserver_durations

        after = apiserver_durations(self.rest)
        return {
            what: _window(self._marks["durations"].get(what, {}), series, DURATION)
            for what, series in after.items()
        }

    def controllers(self, top: int = 6) -> dict[str, float]:
        """The controller-manager's busiest workqueues since the mark: seconds worked."""
        from benchmarks.real_plane import controller_work

        before = self._marks["controllers"]
        worked = {k: v - before.get(k, 0.0) for k, v in controller_work(self.plane).items()}
        busiest = sorted(worked.items(), key=lambda kv: -kv[1])[:top]
        return {k: round(v, 1) for k, v in busiest}

    def guard_writes(self) -> int:
        """Budget writes since the mark (the server's apiserver_request_total: only the daemon
        writes budgets then; the disruption controller writes their status subresource)."""
        from benchmarks.real_plane import apiserver_requests

        verbs = ("POST", "PUT", "PATCH")
        after = apiserver_requests(self.rest, "poddisruptionbudgets", verbs)
        return after - int(self._marks["guards"])

    def apf(self) -> dict[str, Any]:
        """Which FlowSchema and priority level API Priority and Fairness gave the daemon's kinds
        of request (sent with its token now, writes as dry runs), and what APF did with the
        requests of those FlowSchemas since the mark: dispatched, rejected, their wait."""
        from benchmarks import deployed

        first = self.cluster.node_name(1)  # never noticed (odd)
        probes = [
            ("list pods (all namespaces)", "GET", "/api/v1/pods?limit=1"),
            ("get node", "GET", f"/api/v1/nodes/{first}"),
            ("patch node (dry run)", "PATCH", f"/api/v1/nodes/{first}"),
            ("list trainingjobs", "GET", f"/apis/{ET_API}/namespaces/{NS}/trainingjobs?limit=1"),
            (
                "patch trainingjob (dry run)",
                "PATCH",
                f"/apis/{ET_API}/namespaces/{NS}/trainingjobs/job-00001",
            ),
            (
                "get the Lease",
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{self.lease_namespace}/leases/"
                "spot-autoscaler",
            ),
        ]
        landed = deployed.classify(self.plane, self.rest, self._token or None, probes)
        schemas = {v["flow_schema"] for v in landed.values() if v["flow_schema"]}
        after = deployed.flowcontrol(self.rest)
        window = deployed.flowcontrol_window(self._marks["flowcontrol"], after, schemas)
        return {"identity": self.identity, "requests": landed, "flow_schemas": window}

    def churn(self) -> dict[str, int]:
        """What else happened in the cluster since the mark: pods the scheduler bound, the
        stand-in's ScaleOuts and the workers they added, new workers kwok left Pending that the
        harness touched (this run's only)."""
        before: Counter[str] = self._marks["operator"]
        now = self.operator.counts
        return {
            "scheduler_bindings": self._bindings() - int(self._marks["bindings"]),
            "scale_outs_run": now["scale_outs"] - before["scale_outs"],
            "scale_outs_failed": now["scale_outs_failed"] - before["scale_outs_failed"],
            "workers_added": now["scale_out_pods"] - before["scale_out_pods"],
            "fresh_workers_touched": now["touched"] - before["touched"],
            "scale_outs_still_growing": len(self.operator.growing),
            # every ScaleIn is the stand-in's to finish: one left means the harness lost it
            "scale_ins_unfinished": sum(
                _outcome(s) is None
                for s in self.rest.list_all(f"/apis/{ET_API}/namespaces/{NS}/scaleins")
            ),
        }

    def _bindings(self) -> int:
        """POST pods/binding answered by the API server so far: pods the scheduler bound."""
        r = self.rest.http.request("GET", self.rest.base + "/metrics")
        total = 0.0
        for line in r.data.decode().splitlines():
            if (
                line.startswith("apiserver_request_total{")
                and 'resource="pods"' in line
                and 'subresource="binding"' in line
                and 'verb="POST"' in line
                and 'code="2' in line
            ):
                total += float(line.rpartition(" ")[2])
        return int(total)

    def versions(self) -> dict[str, Any]:
        from benchmarks.real_plane import versions

        return versions(self.plane, self.rest)

    def watch_processes(self, meter: Meter) -> None:
        meter.watch_plane(self.plane)

    def health(self) -> dict[str, int] | None:
        from benchmarks.real_plane import health

        return health(self.rest, NS) | {"nodes_not_ready_at_start": self.cluster.unready_at_start}


Bench = EmulatedBench | RealBench


@dataclass(frozen=True)
class Plan:
    """One run's notices: `notices` of them, from slot index `first` on, in rounds of
    `round_size` (`spacing` s apart) at `rate` notices a second, by `paths` in turn."""

    notices: int
    round_size: int
    spacing: float
    rate: float
    paths: tuple[str, ...]
    first: int


def run_size(
    nodes: int,
    plan: Plan,
    guards: str = "seeded",
    cluster: str = "emulator",
    threads: int = 24,
    py_spy: tuple[Path, float] | None = None,
    max_unready_nodes: int = 0,
    repeat: int = 1,
    identity: str = "serviceaccount",
    flowschema: bool = True,
    logs: Path | None = None,
    finished: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """`repeat` runs on one cluster (made once: at 2,000 real nodes that is most of the time),
    each with a daemon of its own, started afresh, and notices on nodes no earlier run touched;
    with `logs`, each daemon's stdout (its decisions) and stderr are kept there. `finished` gets
    each run's result as soon as it ends: a later run that stops the series keeps it."""
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
    }
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"])
    queue = sqs.create_queue(QueueName=f"notices-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    stop = threading.Event()
    seen = Observed()
    bench: Bench = (
        EmulatedBench(nodes, guards)
        if cluster == "emulator"
        else RealBench(nodes, guards, threads, max_unready_nodes, identity, flowschema)
    )
    threads_: list[threading.Thread] = []
    with bench, tempfile.TemporaryDirectory() as tmp, _stopping(stop, moto, threads_):
        env["POD_NAMESPACE"] = bench.lease_namespace
        bench.watch_processes(meter)
        meter.mark("setup")
        replacer = Replacer(seen, bench.replace)
        watched = [("trainingjobs", seen.saw_job), ("scaleins", seen.saw_scale_in)]
        watched.append(("scaleouts", seen.saw_scale_out))
        threads_ += [
            threading.Thread(target=watch_kind, args=(bench.api_client(), p, f, stop), daemon=True)
            for p, f in watched
        ]
        threads_.append(threading.Thread(target=bench.stand_in, args=(seen, stop), daemon=True))
        threads_.append(threading.Thread(target=replacer.run, args=(stop,), daemon=True))
        for t in threads_:
            t.start()
        setup_cpu = meter.cpu("begin", "setup")
        notify = Notifier(bench, sqs, queue)
        plans, kept = _plans(bench, plan, repeat), _log_names(logs, nodes, repeat)
        runs = []
        for i, (p, keep) in enumerate(zip(plans, kept, strict=True)):
            run = _one_run(bench, meter, env, Path(tmp), (notify, replacer), seen, p, py_spy, keep)
            runs.append(
                {
                    "cluster": bench.name,
                    "nodes": nodes,
                    "pods": nodes * 2 * PER_JOB_ON_NODE,
                    "run": i + 1,
                    "setup_s": bench.setup,
                    **run,
                    "cpu_s": {"setup": setup_cpu, **run["cpu_s"]},
                }
            )
            if finished is not None:
                finished(runs[-1])
    return runs


@contextmanager
def _stopping(
    stop: threading.Event, moto: ThreadedMotoServer, threads: list[threading.Thread]
) -> Iterator[None]:
    """The harness's threads and moto end with the size, whatever happened; the threads before
    the cluster goes (the stand-in and the replacer call its API)."""
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        moto.stop()


class Notifier:
    """Sends one notice by a path; the taint paths through the bench's API."""

    def __init__(self, bench: Bench, sqs: Any, queue: str) -> None:
        self.bench, self.sqs, self.queue = bench, sqs, queue

    def before(self, slot: int, path: str) -> None:
        """What comes before a notice by `path`, before its clock starts: Karpenter deletes the
        Node (its finalizer holds it) and only its termination controller taints it
        (node/termination/controller.go `finalize`)."""
        if path == "karpenter":
            self.bench.terminating(self.bench.cluster.node_name(slot))

    def __call__(self, slot: int, path: str) -> float:
        """When the notice's own write was answered (monotonic): SQS's SendMessage, the taint's
        PATCH (NTH's cordon comes after it)."""
        cluster = self.bench.cluster
        if path == "sqs":
            body = interruption(cluster.instance(slot))
            self.sqs.send_message(QueueUrl=self.queue, MessageBody=body)
            return time.monotonic()
        if path == "nth":
            return self.bench.taint(cluster.node_name(slot), nth_taint(), cordon=True)
        if path == "karpenter":
            return self.bench.taint(cluster.node_name(slot), karpenter_taint())
        raise ValueError(f"unknown notice path {path!r}")


def _log_names(logs: Path | None, nodes: int, repeat: int) -> list[Path | None]:
    if logs is None:
        return [None] * repeat
    return [logs / f"reaction-{nodes}-run{i + 1}" for i in range(repeat)]


def _plans(bench: Bench, plan: Plan, repeat: int) -> list[Plan]:
    slots = len(_slots(bench.cluster))
    if repeat * plan.notices > slots:
        raise SystemExit(
            f"{repeat} runs of {plan.notices} notices need {repeat * plan.notices} node pairs: "
            f"{slots} here"
        )
    return [
        Plan(plan.notices, plan.round_size, plan.spacing, plan.rate, plan.paths, i * plan.notices)
        for i in range(repeat)
    ]


def _one_run(
    bench: Bench,
    meter: Any,
    env: dict[str, str],
    tmp: Path,
    harness: tuple[Notifier, Replacer],
    seen: Observed,
    plan: Plan,
    py_spy: tuple[Path, float] | None,
    keep: Path | None = None,
) -> dict[str, Any]:
    """A fresh daemon, its notices, its figures; its output kept as `keep`.out / .err."""
    notify, replacer = harness
    config = tmp / "config.yaml"
    port = _free_port()
    queue = notify.queue
    config.write_text(
        CONFIG.format(ns=NS, region=REGION, queue=queue, port=port, lease_ns=bench.lease_namespace)
    )
    kubeconfig = bench.kubeconfig(tmp)
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
        bench.marked()
        replaced_before = replacer.replaced
        meter.mark("daemon_ready")
        profiler = _start_py_spy(daemon.pid, py_spy)
        t0 = time.monotonic()
        samples = _rounds(bench, notify, replacer, seen, plan, daemon)
        rounds_s = time.monotonic() - t0
        meter.mark("rounds")
        metrics = _scrape(port)
        guard_writes = bench.guard_writes()
        server_times = bench.server_times()
        controllers = bench.controllers()
        apf = bench.apf()
        meter.peaks()
        # the run's last reclaimed nodes replaced, so the next run starts from a whole cluster
        if not replacer.wait_idle(120):
            print("the last reclaimed nodes were not replaced within 120 s", file=sys.stderr)
        churn = {"nodes_replaced": replacer.replaced - replaced_before, **bench.churn()}
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
        if keep is not None:
            for suffix in ("out", "err"):
                shutil.copyfile(tmp / f"daemon.{suffix}", keep.with_suffix(f".daemon.{suffix}"))
    lines = (tmp / "daemon.out").read_text(errors="replace").splitlines()
    decided = _decided(lines)
    return {
        "notices": len(samples),
        "plan": {
            "round": plan.round_size,
            "spacing_s": plan.spacing,
            "rate_per_s": plan.rate,
            "paths": list(plan.paths),
        },
        "daemon_identity": bench.identity,
        "daemon_ready_s": round(ready, 1),
        "rounds_s": round(rounds_s, 1),
        **_figures(samples),
        # the drain's time split where the daemon's pass or fast path that decided it began
        # (its decision line's ts): before = SQS or the Node watch, waiting for the loop;
        # after = the cache's snapshot, deciding, the PATCH and this process's watch
        "drain_split_s": _split(samples, decided),
        # what the daemon decided over its run, by action and reason (a run with many more
        # passes than another: what they did)
        "decisions": _decision_counts(lines),
        # the API server's own time per kind of request in the rounds (a real plane's only)
        "server_times": server_times,
        # the controller-manager's busiest controllers in the rounds, seconds worked (a real
        # plane's only: its CPU is a third of the machine's there)
        "controllers_s": controllers,
        # API Priority and Fairness: where the daemon's requests landed, their wait in APF
        "apf": apf,
        "daemon_errors": _errors(err),
        "daemon_forbidden": _forbidden(err + "\n".join(lines)),
        # budgets the daemon wrote (seeded ones found right are left alone; replaced nodes'
        # fresh workers need none: the budget selects by job)
        "guard_writes": guard_writes,
        # the daemon's own view: one pass, and a notice received -> its drain/ScaleIn applied
        "pass_mean_s": _mean(metrics, RECONCILE),
        "daemon_reaction_mean_s": _mean(metrics, REACTION),
        # its passes during the rounds only (the histogram's difference)
        "daemon_passes": _window(before, metrics, RECONCILE),
        # the fast path's steps in the rounds: its wait for a pass's snapshot, its own, deciding
        "fast_path_s": {
            step: _window(before, metrics, STEPS, f'step="{step}"')
            for step in ("wait", "look", "decide")
        },
        # what else the cluster did while the notices came (this run's only)
        "churn": churn,
        # CPU seconds per process and phase: setup (the cluster made, shared by the runs),
        # daemon_start (start to steady state), rounds (the notices); the harness is this process
        "cpu_s": {
            "daemon_start": meter.cpu("daemon_started", "daemon_ready"),
            "rounds": meter.cpu("daemon_ready", "rounds"),
        },
        "peak_rss_mb": meter.rss,
        # after the rounds: nodes not Ready (kwok late with their Leases: an overloaded
        # machine; also how many were at the start), worker pods Running and Pending
        "cluster_health": healthy,
        "versions": versions | _ours(),
        # every notice: its path and latencies (the aggregate over runs is made of these)
        "samples": [
            {k: s[k] for k in ("path", "drain", "scale_in", "sent_at", "sent_in")} for s in samples
        ],
    }


def _path_figures(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "drain_s": _stats([s["drain"] for s in samples]),
        "scale_in_s": _stats([s["scale_in"] for s in samples]),
        "notice_write_s": _stats([s["sent_in"] for s in samples if "sent_in" in s]),
    }


def _figures(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 / p99 / max of drain and ScaleIn over the notices, and per notice path."""
    out: dict[str, Any] = _path_figures(samples)
    by_path: dict[str, Any] = {}
    for path in dict.fromkeys(s["path"] for s in samples):
        by_path[path] = _path_figures([s for s in samples if s["path"] == path])
    out["by_path"] = by_path
    return out


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
    # nodes 0, 2, 4, ... touch disjoint pairs of jobs: one notice per job and run
    return list(range(0, cluster.n - 1, 2))


def _rounds(
    bench: Bench,
    notify: Notifier,
    replacer: Replacer,
    seen: Observed,
    plan: Plan,
    daemon: subprocess.Popen[bytes],
) -> list[dict[str, Any]]:
    """Send the plan's notices at its rate, never waiting for a reaction, a ScaleIn's completion
    or a replacement (those go on in the stand-in's and the replacer's threads meanwhile); then
    wait for every notice's drain and ScaleIn. A notice without both within REACT_WITHIN s
    fails the run."""
    cluster = bench.cluster
    slots = _slots(cluster)
    period = plan.round_size / plan.rate
    sent: list[dict[str, Any]] = []
    start = time.monotonic()
    for i in range(plan.notices):
        if i % plan.round_size == 0:
            _check_reactions(sent, seen, daemon)
            time.sleep(max(0.0, start + (i // plan.round_size) * period - time.monotonic()))
        elif plan.spacing:
            time.sleep(plan.spacing)
        slot = slots[(plan.first + i) % len(slots)]
        path = plan.paths[i % len(plan.paths)]
        pods = [p for _, p in cluster.pods_on[slot]]
        notify.before(slot, path)
        at, wall = time.monotonic(), time.time()
        # the notice's own write (the taint's PATCH answered, or SQS's SendMessage): the floor
        # under a drain, which needs one more write and a watch on the same server
        written = notify(slot, path) - at
        sent.append(
            {
                "slot": slot,
                "path": path,
                "at": at,
                "sent_at": wall,
                "pods": pods,
                "sent_in": written,
            }
        )
        replacer.retire(slot, pods)
    deadline = sent[-1]["at"] + REACT_WITHIN if sent else time.monotonic()
    with seen.lock:
        seen.lock.wait_for(
            lambda: all(seen.reacted(s["pods"]) for s in sent),
            max(0.0, deadline - time.monotonic()),
        )
    _check_reactions(sent, seen, daemon, final=True)
    samples = []
    with seen.lock:
        for s in sent:
            samples.append(
                s
                | {
                    "drain": max(seen.drained[p] for p in s["pods"]) - s["at"],
                    "scale_in": max(seen.scaled_in[p] for p in s["pods"]) - s["at"],
                }
            )
    return samples


def _check_reactions(
    sent: list[dict[str, Any]],
    seen: Observed,
    daemon: subprocess.Popen[bytes],
    final: bool = False,
) -> None:
    now = time.monotonic()
    with seen.lock:
        late = [
            s
            for s in sent
            if (final or now - s["at"] > REACT_WITHIN) and not seen.reacted(s["pods"])
        ]
    if late:
        first = late[0]
        raise RuntimeError(
            f"{len(late)} notice(s) without a drain and a ScaleIn within {REACT_WITHIN:.0f} s, "
            f"the first by {first['path']} on slot {first['slot']} (daemon exit code "
            f"{daemon.poll()})"
        )


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


def _window(
    before: dict[str, float], after: dict[str, float], histogram: str, label: str = ""
) -> dict[str, Any]:
    """A histogram between two scrapes (its series with `label`, e.g. 'step="wait"'): count,
    mean, and the bucket bounds under which half and 99% of the observations fall."""
    diff = {
        k.replace(f"{{{label}}}", "").replace(f"{label},", ""): after[k] - before.get(k, 0.0)
        for k in after
        if k.startswith(histogram) and label in k
    }
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


def _stats(values: list[float]) -> dict[str, Any]:
    """n, p50, p99 (nearest rank: of 300 notices the 298th, of 900 the 891st) and max."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
    }


def _errors(stderr: str) -> int:
    return sum(1 for line in stderr.splitlines() if '"level": "error"' in line)


def _forbidden(log: str) -> int:
    """Log lines of the daemon that carry a 403 (RBAC refused one of its requests)."""
    return sum(1 for line in log.splitlines() if "Forbidden" in line or '"status": 403' in line)


def _cpu_line(cpu: dict[str, float | None]) -> str:
    from benchmarks.real_plane import COMPONENTS, control_plane_total

    parts = [f"daemon {cpu.get('daemon')}", f"harness {cpu.get('harness')}"]
    if any(cpu.get(c) is not None for c in COMPONENTS):
        each = ", ".join(f"{c} {cpu.get(c)}" for c in COMPONENTS)
        parts.append(f"control plane {control_plane_total(cpu)} ({each})")
    return "; ".join(parts)


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One size's runs together: p50 / p99 / max over every notice of every run, overall and
    per path, and each figure's min / median / max over the runs."""
    samples = [s for r in runs for s in r["samples"]]

    def per_run(key: str, stat: str, path: str | None = None) -> dict[str, float | None]:
        values = [(r["by_path"].get(path, {}).get(key) if path else r[key]) or {} for r in runs]
        got = [v[stat] for v in values if v.get(stat) is not None]
        if not got:
            return {"min": None, "median": None, "max": None}
        return {"min": min(got), "median": statistics.median(got), "max": max(got)}

    paths = list(dict.fromkeys(s["path"] for s in samples))
    return {
        "cluster": runs[0]["cluster"],
        "nodes": runs[0]["nodes"],
        "runs": len(runs),
        "notices": len(samples),
        "daemon_identity": runs[0].get("daemon_identity"),
        "plan": runs[0].get("plan"),
        "versions": runs[-1].get("versions"),
        **_figures(samples),
        "runs_p99": {
            "drain_s": per_run("drain_s", "p99"),
            "scale_in_s": per_run("scale_in_s", "p99"),
            "by_path": {
                p: {
                    "drain_s": per_run("drain_s", "p99", p),
                    "scale_in_s": per_run("scale_in_s", "p99", p),
                }
                for p in paths
            },
        },
    }


def spread(runs: list[dict[str, Any]]) -> str:
    """Every notice of the size's runs together, overall and per path; and min / median / max
    over the runs of each run's p99."""
    agg = aggregate(runs)

    def mmm(d: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:.3f}" for v in d.values())

    def line(label: str, figures: dict[str, Any]) -> str:
        d, s, w = figures["drain_s"], figures["scale_in_s"], figures.get("notice_write_s") or {}
        return (
            f"  {label}: drain p50 {d['p50']} p99 {d['p99']} max {d['max']} s; "
            f"ScaleIn p50 {s['p50']} p99 {s['p99']} max {s['max']} s (n {d['n']}); "
            f"the notice's own write p50 {w.get('p50')} p99 {w.get('p99')} s"
        )

    lines = [f"{len(runs)} runs, {agg['notices']} notices together:", line("all", agg)]
    lines += [line(path, figures) for path, figures in agg["by_path"].items()]
    lines.append("  each run's p99, min / median / max of the runs:")
    lines.append(f"    drain {mmm(agg['runs_p99']['drain_s'])} s")
    lines.append(f"    ScaleIn {mmm(agg['runs_p99']['scale_in_s'])} s")
    reaction = [r["daemon_reaction_mean_s"] for r in runs if r["daemon_reaction_mean_s"]]
    if reaction:
        lines.append(
            f"  notice received -> applied (daemon, mean): "
            f"{min(reaction):.3f} / {statistics.median(reaction):.3f} / {max(reaction):.3f} s"
        )
    return "\n".join(lines)


def report(r: dict[str, Any]) -> str:
    setup = ", ".join(f"{k} {v}" for k, v in r["setup_s"].items() if isinstance(v, int | float))
    p = r["daemon_passes"]
    rss = ", ".join(f"{k} {v}" for k, v in r["peak_rss_mb"].items())
    cpu = r["cpu_s"]
    split, after = r["drain_split_s"]["to_decision"], r["drain_split_s"]["decision_to_seen"]
    plan = r["plan"]

    def figures(label: str, f: dict[str, Any]) -> str:
        d, s, w = f["drain_s"], f["scale_in_s"], f.get("notice_write_s") or {}
        return (
            f"  {label}: drain p50 {d['p50']} / p99 {d['p99']} / max {d['max']} s, "
            f"ScaleIn p50 {s['p50']} / p99 {s['p99']} / max {s['max']} s (n {d['n']}); "
            f"the notice's own write p50 {w.get('p50')} / p99 {w.get('p99')} s\n"
        )

    apf = ""
    if r.get("apf"):
        landed = r["apf"]["requests"]
        where = Counter(f"{v['flow_schema']} -> {v['priority_level']}" for v in landed.values())
        apf = f"  APF, the daemon's requests: {', '.join(f'{k} ({n})' for k, n in where.items())}\n"
        for fs, w in r["apf"]["flow_schemas"].items():
            wait = w["wait"]
            apf += (
                f"    {fs}: {w['dispatched']} dispatched in the rounds, rejected "
                f"{w['rejected'] or 0}, APF wait mean {wait['mean_s']} s, p99 <= "
                f"{wait['p99_le_s']} s; seats {w.get('seats')}\n"
            )
    return (
        f"{r['nodes']:,} nodes / {r['pods']:,} pods on the {r['cluster']}, {r['notices']} "
        f"notices ({', '.join(plan['paths'])} in turn; rounds of {plan['round']} at "
        f"{plan['rate_per_s']}/s) to a daemon as {r['daemon_identity']} (ready in "
        f"{r['daemon_ready_s']} s, {r['daemon_errors']} error lines, "
        f"{r['daemon_forbidden']} forbidden):\n"
        + figures("all", r)
        + "".join(figures(path, f) for path, f in r["by_path"].items())
        + f"  drain split at its decision: notice -> pass began p50 {split['p50']} s, "
        f"p99 {split['p99']} s; pass began -> drain seen p50 {after['p50']} s, "
        f"p99 {after['p99']} s\n"
        + apf
        + "".join(
            f"  API server's time, {what}: {w['count']}, mean {w['mean_s']} s, "
            f"p99 <= {w['p99_le_s']} s\n"
            for what, w in r.get("server_times", {}).items()
        )
        + f"  decisions: {', '.join(f'{k} {n}' for k, n in r['decisions'].items())}\n"
        + f"  churn: {', '.join(f'{k} {v}' for k, v in r['churn'].items())}\n"
        + (
            "  controller-manager, busiest queues (s worked): "
            + ", ".join(f"{k} {v}" for k, v in r["controllers_s"].items())
            + "\n"
            if r.get("controllers_s")
            else ""
        )
        + f"  daemon: mean pass {r['pass_mean_s']} s, mean notice received -> applied "
        f"{r['daemon_reaction_mean_s']} s; in the rounds {p['count']} passes, mean "
        f"{p['mean_s']} s, p50 <= {p['p50_le_s']} s, p99 <= {p['p99_le_s']} s\n"
        + "  fast path, in the rounds: "
        + "; ".join(
            f"{step} {w['count']}, mean {w['mean_s']} s, p99 <= {w['p99_le_s']} s"
            for step, w in r.get("fast_path_s", {}).items()
        )
        + "\n"
        f"  setup (s): {setup}\n"
        f"  CPU s, setup: {_cpu_line(cpu['setup'])}\n"
        f"  CPU s, daemon start: {_cpu_line(cpu['daemon_start'])}\n"
        f"  CPU s, rounds ({r['rounds_s']} s): {_cpu_line(cpu['rounds'])}\n"
        f"  peak RSS MB: {rss}"
        + (f"\n  after the rounds: {r['cluster_health']}" if r["cluster_health"] else "")
    )


def _run_finished(out_dir: Path | None, run: dict[str, Any]) -> None:
    """A run's figures, printed and kept as soon as it ends."""
    print(report(run), flush=True)
    if out_dir:
        path = out_dir / f"reaction-{run['nodes']}-run{run['run']}.json"
        path.write_text(json.dumps(run, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="1000,2000",
        help="comma-separated node counts (each run notices nodes no earlier one touched: a size "
        "holds repeat x notices <= nodes / 2)",
    )
    parser.add_argument("--notices", type=int, default=300, help="notices per run")
    parser.add_argument("--round", type=int, default=10, help="notices per round")
    parser.add_argument("--spacing", type=float, default=0.1, help="seconds between notices")
    parser.add_argument(
        "--rate",
        type=float,
        default=1.0,
        help="notices a second on average: a round starts every ROUND/RATE s, whatever the "
        "last one's reactions, completions and replacements are doing",
    )
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"notice paths, taken in turn (of {', '.join(PATHS)})",
    )
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
        "--identity",
        choices=["serviceaccount", "admin"],
        default="serviceaccount",
        help="--cluster real: the daemon as deploy/ runs it (its ServiceAccount's token, "
        "deploy/rbac.yaml), or with the admin's certificate (no RBAC, exempt from APF)",
    )
    parser.add_argument(
        "--flowschema",
        choices=["shipped", "none"],
        default="shipped",
        help="--cluster real: install deploy/flowschema.yaml, or leave the daemon's requests "
        "to the bootstrap FlowSchemas",
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
        help="runs per size on one cluster, each with a fresh daemon (the notices of all runs "
        "together at the end)",
    )
    parser.add_argument("--py-spy", type=Path, help="sample the daemon in the rounds: raw stacks")
    parser.add_argument("--py-spy-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path, help="every run of every size, in one list")
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="reaction-<size>-run<i>.json per run (and its daemon's output, .daemon.out/.err), "
        "reaction-<size>-aggregate.json per size",
    )
    args = parser.parse_args()
    paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths: of {', '.join(PATHS)}")
    plan = Plan(args.notices, args.round, args.spacing, args.rate, paths, 0)
    results = []
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
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
            plan,
            args.guards,
            args.cluster,
            args.setup_threads,
            py_spy,
            args.max_unready_nodes,
            args.repeat,
            args.identity,
            args.flowschema == "shipped",
            args.out_dir,
            partial(_run_finished, args.out_dir),
        )
        results += r
        if len(r) > 1:
            print(spread(r), flush=True)
        if args.out_dir:
            path = args.out_dir / f"reaction-{size}-aggregate.json"
            path.write_text(json.dumps(aggregate(r), indent=2) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
