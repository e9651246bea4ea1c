"""Reaction time: a spot interruption published on SQS -> the worker's host drained -> the ScaleIn.

    .venv/bin/python benchmarks/reaction.py                        # 100 and 2,000 nodes
    .venv/bin/python benchmarks/reaction.py --sizes 100 --notices 300 --json reaction.json

The real daemon (`spot-autoscaler run`, Kubernetes wiring, SQS consumer, leader election) runs
in its own process against the test Kubernetes API emulator (tests/support/kube_api.py) and
moto's SQS, both served from this process. Every node has 8 one-GPU workers, 4 of job k and 4 of
job k-1, so a notice dooms workers of two jobs. Notices go out in rounds (100 ms apart, nodes
whose jobs do not overlap). A stand-in for et-operator completes each ScaleIn (deletes the named
pods, marks it ScaleSucceeded); then the node is replaced by a fresh one with fresh workers.

Per notice: drain = the last of its node's hosts appears in its job's drained-hosts annotation,
ScaleIn = the last of its pods is named by a ScaleIn object, both from the moment before the
message was sent, as seen by watches from this process. Figures, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from autoscaler.adapters.kube.guard import desired_guard  # noqa: E402
from autoscaler.adapters.kube.kinds import et_operator  # noqa: E402
from autoscaler.annotations import DRAINED_ANNOTATION, decode_drained  # noqa: E402
from benchmarks.scale import raw_job  # noqa: E402
from tests.support.kube_api import KubeApiServer  # noqa: E402

REGION, NS, GROUP, VERSION = "us-east-1", "ml", "kai.alibabacloud.com", "v1alpha1"
ET_API = f"{GROUP}/{VERSION}"
PER_JOB_ON_NODE = 4
Obj = dict[str, Any]

CONFIG = """
kubernetes: {{namespaces: [{ns}]}}
aws: {{enabled: true, region: {region}, queue_url: "{queue}", prices: {{enabled: false}}}}
daemon:
  metrics_port: {port}
  metrics_bind_address: 127.0.0.1
  log_format: json
  log_level: warning
  leader_election: {{lease_namespace: default}}
"""


class Cluster:
    """The emulated cluster: node i hosts 4 workers of job i and 4 of job i-1 (mod n)."""

    def __init__(self, api: KubeApiServer, nodes: int) -> None:
        self.api = api
        self.n = nodes
        self.generation = [0] * nodes
        self.next_index: dict[int, int] = defaultdict(int)
        self.pods_on: dict[int, list[tuple[str, str]]] = {}  # node slot -> (job, pod)

    def node_name(self, slot: int) -> str:
        return f"node-{slot:05d}-{self.generation[slot]}"

    def instance(self, slot: int) -> str:
        return f"i-{slot:05d}{self.generation[slot]:06d}"

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
        name = self.node_name(slot)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "karpenter.sh/capacity-type": "spot",
                    "node.kubernetes.io/instance-type": "p3.16xlarge",
                    "topology.kubernetes.io/zone": f"{REGION}a",
                },
            },
            "spec": {"providerID": f"aws:///{REGION}a/{self.instance(slot)}"},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(2 * PER_JOB_ON_NODE)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        pods, out = [], [node]
        for job in (slot, (slot - 1) % self.n):
            for _ in range(PER_JOB_ON_NODE):
                index = self.next_index[job]
                self.next_index[job] += 1
                pod = f"job-{job:05d}-worker-{index}"
                pods.append((f"job-{job:05d}", pod))
                out.append(_worker(f"job-{job:05d}", pod, index, name))
        self.pods_on[slot] = pods
        return out


def _worker(job: str, pod: str, index: int, node: str) -> Obj:
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
                    "uid": "u",
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


class Observed:
    """When each host was first seen drained and each pod first named by a ScaleIn."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.drained: dict[str, float] = {}
        self.scaled_in: dict[str, float] = {}
        self.scale_ins: list[Obj] = []  # for the operator stand-in

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


def operator_stand_in(api: KubeApiServer, seen: Observed, stop: threading.Event) -> None:
    """Complete every ScaleIn as et-operator would: delete its pods, mark it ScaleSucceeded."""
    while not stop.is_set():
        with seen.lock:
            seen.lock.wait_for(lambda: seen.scale_ins or stop.is_set(), timeout=0.5)
            todo, seen.scale_ins = seen.scale_ins, []
        for obj in todo:
            meta = obj["metadata"]
            for pod in (obj.get("spec", {}).get("toDelete") or {}).get("podNames") or []:
                if api.get("pods", pod, NS) is not None:
                    api.delete("pods", pod, NS)
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            api.patch(
                "scaleins",
                meta["name"],
                {
                    "status": {
                        "conditions": [
                            {"type": "Created", "status": "True", "lastTransitionTime": stamp},
                            {
                                "type": "ScaleSucceeded",
                                "status": "True",
                                "lastTransitionTime": stamp,
                            },
                        ]
                    }
                },
                NS,
            )


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


def run_size(
    nodes: int, notices: int, round_size: int, spacing: float, guards: str = "seeded"
) -> dict[str, Any]:
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
    # a long event history: watches resume instead of relisting (no 410 Gone mid-run)
    with KubeApiServer(history_limit=500_000) as api, tempfile.TemporaryDirectory() as tmp:
        # The disruption controller runs in kube-controller-manager, not in a write's path; the
        # emulator's, which recomputes budgets on every pod change, would make each write cost
        # O(pods x budgets) here (~165 ms at 2,000 nodes) and measure the emulator, not the daemon
        api.pdb_controller = False
        api.seed(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NS},
                "status": {"phase": "Active"},
            }
        )
        cluster = Cluster(api, nodes)
        cluster.seed()
        if guards == "seeded":
            cluster.seed_guards()
        kubeconfig = api.kubeconfig(str(Path(tmp) / "kubeconfig"))
        config = Path(tmp) / "config.yaml"
        port = _free_port()
        config.write_text(CONFIG.format(ns=NS, region=REGION, queue=queue, port=port))
        threads = [
            threading.Thread(target=watch_kind, args=(api.api_client(), p, f, stop), daemon=True)
            for p, f in (("trainingjobs", seen.saw_job), ("scaleins", seen.saw_scale_in))
        ]
        threads.append(
            threading.Thread(target=operator_stand_in, args=(api, seen, stop), daemon=True)
        )
        for t in threads:
            t.start()
        cli = Path(sys.executable).with_name("spot-autoscaler")
        daemon = subprocess.Popen(
            [str(cli), "run", "--config", str(config), "--kubeconfig", kubeconfig],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ready = _wait_for_daemon(api, jobs=nodes)
            samples = _rounds(cluster, sqs, queue, seen, notices, round_size, spacing, daemon)
            metrics = _scrape(port)
            guard_writes = sum(
                api.count(method, "poddisruptionbudgets") for method in ("POST", "PUT", "PATCH")
            )
        finally:
            daemon.terminate()
            _, err = daemon.communicate(timeout=30)
            stop.set()
            moto.stop()
    drain = [s["drain"] for s in samples]
    scale_in = [s["scale_in"] for s in samples]
    return {
        "nodes": nodes,
        "pods": nodes * 2 * PER_JOB_ON_NODE,
        "notices": len(samples),
        "daemon_ready_s": round(ready, 1),
        "drain_s": _stats(drain),
        "scale_in_s": _stats(scale_in),
        "daemon_errors": _errors(err),
        # budgets the daemon wrote (seeded ones found right are left alone; replaced nodes'
        # fresh workers need none: the budget selects by job)
        "guard_writes": guard_writes,
        # the daemon's own view: one pass, and a notice received -> its drain/ScaleIn applied
        "pass_mean_s": _mean(metrics, "spot_autoscaler_reconcile_duration_seconds"),
        "daemon_reaction_mean_s": _mean(metrics, "spot_autoscaler_reaction_latency_seconds"),
    }


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


def _rounds(
    cluster: Cluster,
    sqs: Any,
    queue: str,
    seen: Observed,
    notices: int,
    round_size: int,
    spacing: float,
    daemon: subprocess.Popen[str],
) -> list[dict[str, float]]:
    # nodes 0, 2, 4, ... touch disjoint pairs of jobs: one round never has two scalers per job
    slots = list(range(0, cluster.n - 1, 2))
    samples: list[dict[str, float]] = []
    cursor = 0
    while len(samples) < notices:
        batch = [slots[(cursor + i) % len(slots)] for i in range(round_size)]
        cursor += round_size
        sent: dict[int, float] = {}
        for slot in batch:
            sent[slot] = time.monotonic()
            sqs.send_message(QueueUrl=queue, MessageBody=interruption(cluster.instance(slot)))
            time.sleep(spacing)
        pods = {slot: [p for _, p in cluster.pods_on[slot]] for slot in batch}
        if not seen.wait_for_pods([p for ps in pods.values() for p in ps], timeout=60):
            raise RuntimeError(
                f"round {cursor // round_size}: no reaction within 60 s "
                f"(daemon exit code {daemon.poll()})"
            )
        for slot in batch:
            samples.append(
                {
                    "drain": max(seen.drained[p] for p in pods[slot]) - sent[slot],
                    "scale_in": max(seen.scaled_in[p] for p in pods[slot]) - sent[slot],
                }
            )
        time.sleep(1.0)  # the stand-in deletes the pods and marks the ScaleIns done
        for slot in batch:
            cluster.replace(slot)
        time.sleep(1.0)  # the daemon sees the fresh nodes before the next round
    return samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def _mean(metrics: dict[str, float], histogram: str) -> float | None:
    count = metrics.get(f"{histogram}_count", 0.0)
    return round(metrics[f"{histogram}_sum"] / count, 3) if count else None


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {
        "median": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
    }


def _errors(stderr: str) -> int:
    return sum(1 for line in stderr.splitlines() if '"level": "error"' in line)


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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for size in map(int, args.sizes.split(",")):
        r = run_size(size, args.notices, args.round, args.spacing, args.guards)
        results.append(r)
        print(
            f"{r['nodes']:,} nodes / {r['pods']:,} pods, {r['notices']} notices "
            f"(daemon ready in {r['daemon_ready_s']} s, {r['daemon_errors']} error lines):\n"
            f"  notice -> drain:   median {r['drain_s']['median']} s, "
            f"p99 {r['drain_s']['p99']} s, max {r['drain_s']['max']} s\n"
            f"  notice -> ScaleIn: median {r['scale_in_s']['median']} s, "
            f"p99 {r['scale_in_s']['p99']} s, max {r['scale_in_s']['max']} s\n"
            f"  daemon: mean pass {r['pass_mean_s']} s, mean notice received -> applied "
            f"{r['daemon_reaction_mean_s']} s",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
