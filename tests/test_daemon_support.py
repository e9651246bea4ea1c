"""Shared pieces of the daemon tests (this module holds no tests).

Fakes implement the PROTOCOLS (Observer, Actuator, LeaderLock), never patch our code: a locked
SimulatedCluster stands for the cluster, a recording actuator tells who acted.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from structlog.testing import CapturingLogger

from autoscaler.config import Config, parse_config
from autoscaler.config.schema import SimJob
from autoscaler.core import CapacityType, Decision, Notice, NoticeKind, Snapshot
from autoscaler.daemon.loop import WakeSignal
from autoscaler.daemon.metrics import Metrics
from autoscaler.daemon.service import Daemon, Parts
from autoscaler.daemon.wiring import build_parts
from autoscaler.sim.cluster import SimNode, SimulatedCluster

# Fast clocks: everything a test waits for happens within a second or two.
CONFIG = """
policies:
  - name: default
    scale_out: {min_idle: 0s, cooldown: 0s}
daemon:
  tick_interval: 30s          # the tests wake the loop themselves
  wake_coalesce: 0.02s
  config_reload_interval: 0.1s
  metrics_port: 0
  metrics_bind_address: 127.0.0.1
  leader_election:
    lease_namespace: default
    lease_duration: 1s
    renew_deadline: 0.6s
    retry_period: 0.1s
    renew_in: thread          # the locks are the tests' objects (a cut network, a fake)
"""


def config(**daemon: Any) -> Config:
    """The test config, with `daemon:` settings overridden (e.g. tick_interval=timedelta(...))."""
    cfg = parse_config(CONFIG)
    return cfg.model_copy(update={"daemon": cfg.daemon.model_copy(update=daemon)})


class World:
    """A SimulatedCluster made safe for the daemon's thread and the test's thread at once."""

    def __init__(self, nodes: int = 2, gpus: int = 2) -> None:
        self._lock = threading.Lock()
        self.cluster = SimulatedCluster(
            [SimJob(name="bert", min_workers=1, max_workers=4)],
            pod_startup=timedelta(0),
            scale_out_timeout=timedelta(minutes=5),
            scale_in_grace=timedelta(0),
        )
        for i in range(nodes):
            self.cluster.add_node(SimNode(f"node-{i}", gpus, CapacityType.SPOT, 1.0, "p3.2xlarge"))

    def snapshot(self, now: datetime) -> Snapshot:
        with self._lock:
            self.cluster.advance(now)
            return self.cluster.snapshot(now)

    def apply_to_cluster(self, decision: Decision, now: datetime) -> None:
        with self._lock:
            self.cluster.apply(decision, now)

    def notice(self, node: str, notice_id: str = "n-1") -> Notice:
        now = datetime.now(UTC)
        notice = Notice(
            node,
            NoticeKind.INTERRUPTION,
            "test",
            notice_id,
            deadline=now + timedelta(minutes=2),
            received_at=now,
        )
        with self._lock:
            self.cluster.post_notice(notice)
        return notice


class Recorder:
    """An Actuator that records what it was asked to do, then lets the world do it."""

    def __init__(self, world: World, dry_run: bool = False) -> None:
        self.world = world
        self.dry_run = dry_run
        self.applied: list[tuple[Decision, float]] = []

    def apply(self, decision: Decision, now: datetime) -> None:
        self.applied.append((decision, time.monotonic()))
        if not self.dry_run:
            self.world.apply_to_cluster(decision, now)

    def actions(self) -> list[str]:
        return [d.action.value for d, _ in self.applied]


def wired_daemon(cfg: Config, kubeconfig: Path | None) -> tuple[Daemon, CapturingLogger]:
    """A daemon wired as `spot-autoscaler run` wires it (real adapters); its log captured."""
    wake, metrics, log = WakeSignal(), Metrics(), CapturingLogger()
    parts = build_parts(cfg, wake, log, metrics.error, kubeconfig=kubeconfig, dry_run=False)
    return Daemon(cfg, parts, wake, log, log, metrics=metrics), log


def daemon(
    cfg: Config, parts: Parts, wake: WakeSignal, config_path: Path | None = None
) -> tuple[Daemon, CapturingLogger]:
    log = CapturingLogger()
    return Daemon(cfg, parts, wake, log, CapturingLogger(), config_path=config_path), log


def events(log: CapturingLogger) -> list[str]:
    return [call.args[0] for call in log.calls if call.args]


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition, or None if absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    sample = f"{name}{{{want}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if _normal(key) == sample:
            return float(value)
    return None


def _normal(key: str) -> str:
    if "{" not in key:
        return key
    name, _, rest = key.partition("{")
    pairs = sorted(p for p in rest.rstrip("}").split(",") if p)
    return f"{name}{{{','.join(pairs)}}}"


# --- a small et-operator cluster for the API emulator --------------------------------------
KUBE_CONFIG = """
policies: [{name: default, scale_out: {min_idle: 0s, cooldown: 0s}}]
kubernetes: {label_selector: spot-autoscaler.io/enabled=true}
daemon:
  tick_interval: 30s
  wake_coalesce: 0.02s
  metrics_port: 0
  metrics_bind_address: 127.0.0.1
  log_format: json
  sync_timeout: 10s
  leader_election:
    {lease_namespace: default, lease_duration: 2s, renew_deadline: 1.5s, retry_period: 0.1s}
"""


def node(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i}",
            "labels": {
                "karpenter.sh/capacity-type": "spot",
                "node.kubernetes.io/instance-type": "p3.8xlarge",
            },
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{i:04d}"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "2"},
            "capacity": {"nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def worker(i: int, on: str = "node-0") -> dict[str, Any]:
    """A Running et-operator worker pod of the job `bert`, with one GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"bert-worker-{i}",
            "namespace": "default",
            "labels": {"training-job-name": "bert", "training-job-role": "worker"},
        },
        "spec": {
            "nodeName": on,
            "containers": [
                {
                    "name": "worker",
                    "image": "horovod",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


JOB = {
    "apiVersion": "kai.alibabacloud.com/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {
        "name": "bert",
        "namespace": "default",
        "labels": {"spot-autoscaler.io/enabled": "true"},
    },
    "spec": {
        "etReplicaSpecs": {
            "launcher": {"replicas": 1},
            "worker": {
                "replicas": 1,
                "minReplicas": 1,
                "maxReplicas": 4,
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                        ]
                    }
                },
            },
        }
    },
    "status": {"phase": "Running", "currentWorkers": ["bert-worker-0"]},
}
