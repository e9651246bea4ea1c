"""Scale benchmark: one reconcile tick on synthetic clusters. It reports figures; it is not a test.

    .venv/bin/python benchmarks/scale.py                      # 500 / 5,000 / 20,000 GPU nodes
    .venv/bin/python benchmarks/scale.py --sizes 5000:500 --repeat 9 --json scale.json
    .venv/bin/python benchmarks/scale.py --api                # + API requests/min in steady state

Every node has 8 GPUs and 10 pods: 6-8 one-GPU workers of the elastic jobs, the rest system pods.
A quarter of the nodes have 2 idle GPUs, 1% carry a spot-interruption taint, every job may grow
by 8: the tick drains, scales in and shares idle GPUs between all jobs (the expensive path).

- `decide`: the core alone on ready-made snapshot dataclasses.
- `kube`: raw API objects (realistic pods, managedFields included), each decoded from JSON as a
  watch event is, fed one by one into the adapter's watch cache without any HTTP; then
  `Reconciler.tick`: `KubeObserver.snapshot` + idle tracking + `decide` + decision logging, with
  a dry-run actuator. Cold = first snapshot, warm = later ones with nothing changed; "1% changed"
  = a tick after every 100th node and pod was replaced by a new version of itself (equal in
  all we read: a status heartbeat); "1% restarted" = every 101st (a stride that spreads them over
  the jobs), and those pods' Ready time moved: their jobs change and are planned again. A tick's
  `decide` reuses the last pass's plans where nothing changed (core/memo.py; `jobs_replanned` in
  the JSON); the `decide` row, without a memo, is what a pass pays when everything changed.
- `--api`: the cache against the test API emulator (tests/support/kube_api.py): API requests per
  minute once synced, with reconcile ticks running, for two cluster sizes. `--cluster real`:
  against a real control plane instead (etcd, kube-apiserver, controller-manager, scheduler,
  kwok; `make control-plane` builds them): the nodes are kwok nodes, the pods real ones made
  Running by kwok, all created through the API in parallel (measure_api_real); requests are
  then counted on the cache's client, and the report adds the setup times, CPU seconds and
  peak RSS of this process and of each control-plane process, and the versions.

Each size runs in its own process, so its peak RSS (ru_maxrss) is its own. Times are CPU time of
the process (median of --repeat), robust to other load on a shared machine; wall time beside it.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
import types
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoscaler.core import (  # noqa: E402
    CapacityType,
    GpuNode,
    Job,
    Notice,
    NoticeKind,
    Snapshot,
    Worker,
    decide,
)
from tests.support.kube_pods import DEFAULT_TOLERATIONS  # noqa: E402

SIZES = [(500, 50), (5000, 500), (20000, 2000)]
NOW = datetime(2026, 3, 2, 12, tzinfo=UTC)
GPUS, PODS_PER_NODE, HEADROOM = 8, 10, 8
ET_API = "kai.alibabacloud.com/v1alpha1"
NTH_TAINT = "aws-node-termination-handler/spot-itn"
Obj = dict[str, Any]


# --- the synthetic cluster ------------------------------------------------------------------
NodeRow = tuple[str, int, bool, bool]  # name, workers on it, spot, noticed


def layout(nodes: int, jobs: int) -> tuple[list[NodeRow], list[list[tuple[str, int]]]]:
    """Every node's row, and per job its workers as (node, index)."""
    placed: list[list[tuple[str, int]]] = [[] for _ in range(jobs)]
    out = []
    k = 0
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        busy = GPUS - (2 if i % 4 == 0 else 0)
        for _ in range(busy):
            job = placed[k % jobs]
            job.append((name, len(job)))
            k += 1
        out.append((name, busy, i % 10 < 7, i % 100 == 0))
    return out, placed


def pods(nodes: int) -> int:
    return nodes * PODS_PER_NODE


def core_snapshot(nodes: int, jobs: int) -> Snapshot:
    node_rows, placed = layout(nodes, jobs)
    gpu_nodes = tuple(
        GpuNode(
            name,
            GPUS,
            busy,
            CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
            7.34 if spot else 24.48,
            schedulable=not noticed,
        )
        for name, busy, spot, noticed in node_rows
    )
    notices = tuple(
        Notice(name, NoticeKind.INTERRUPTION, "k8s-taint", f"{NTH_TAINT}={name}")
        for name, _, _, noticed in node_rows
        if noticed
    )
    job_objs = tuple(
        Job(
            "ml",
            f"job-{j:04d}",
            1,
            len(ws) + HEADROOM,
            1.0,
            workers=tuple(
                Worker(f"job-{j:04d}-worker-{i}", node, f"job-{j:04d}-worker-{i}", i)
                for node, i in ws
            ),
        )
        for j, ws in enumerate(placed)
    )
    idle = {n.name: NOW - timedelta(hours=1) for n in gpu_nodes}
    return Snapshot(gpu_nodes, notices, job_objs, idle)


def _managed_fields(manager: str) -> list[Obj]:
    fields = {f"f:{k}": {} for k in ("labels", "ownerReferences", "spec", "status", "conditions")}
    return [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-03-02T11:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        }
    ]


def raw_node(name: str, spot: bool, noticed: bool) -> Obj:
    taints = (
        [
            {
                "key": NTH_TAINT,
                "value": f"evt-{name}",
                "effect": "NoSchedule",
                "timeAdded": "2026-03-02T11:59:00Z",
            }
        ]
        if noticed
        else []
    )
    labels = {
        "karpenter.sh/capacity-type": "spot" if spot else "on-demand",
        "node.kubernetes.io/instance-type": "p3.16xlarge",
        "kubernetes.io/os": "linux",
        "topology.kubernetes.io/zone": "us-east-1a",
        "kubernetes.io/hostname": name,
    }
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"Kubelet{t}",
            "lastHeartbeatTime": "2026-03-02T11:59:30Z",
            "lastTransitionTime": "2026-03-02T10:00:00Z",
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    conditions.append(
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": "2026-03-02T11:59:30Z",
            "lastTransitionTime": "2026-03-02T10:00:00Z",
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": _managed_fields("kubelet"),
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{name}", "taints": taints},
        "status": {
            "allocatable": {
                "cpu": "63",
                "memory": "480Gi",
                "nvidia.com/gpu": str(GPUS),
                "pods": "110",
            },
            "capacity": {
                "cpu": "64",
                "memory": "488Gi",
                "nvidia.com/gpu": str(GPUS),
                "pods": "110",
            },
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.30.0",
                "containerRuntimeVersion": "containerd://1.7.11",
                "osImage": "Amazon Linux 2",
            },
        },
    }


def raw_pod(name: str, node: str, gpus: int, job: str | None, index: int) -> Obj:
    labels = {"app": job or "node-exporter"}
    owners = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "node-exporter",
            "uid": "uid-ds",
            "controller": True,
        }
    ]
    if job is not None:
        labels = {
            "group-name": "kai.alibabacloud.com",
            "training-job-name": job,
            "training-job-role": "worker",
            "replica-index": str(index),
        }
        owners = [
            {
                "apiVersion": ET_API,
                "kind": "TrainingJob",
                "name": job,
                "uid": f"uid-{job}",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    resources = {
        "limits": {"nvidia.com/gpu": str(gpus), "cpu": "7", "memory": "60Gi"},
        "requests": {"nvidia.com/gpu": str(gpus), "cpu": "7", "memory": "60Gi"},
    }
    container = {
        "name": "main",
        "image": "registry.example.com/train/horovod:0.28.1-torch2",
        "command": ["/bin/sh", "-c"],
        "args": ["sleep infinity"],
        "env": [{"name": f"ENV_{i}", "value": f"value-{i}"} for i in range(8)],
        "resources": resources if gpus else {"requests": {"cpu": "50m", "memory": "64Mi"}},
        "volumeMounts": [
            {
                "name": "kube-api-access",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            },
            {"name": "edl", "mountPath": "/etc/edl"},
        ],
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml" if job else "kube-system",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-03-02T10:00:00Z",
            "labels": labels,
            "ownerReferences": owners,
            "managedFields": _managed_fields("kubelet"),
        },
        "spec": {
            "nodeName": node,
            "containers": [container],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "dnsPolicy": "ClusterFirst",
            "priority": 0,
            "enableServiceLinks": True,
            "tolerations": [dict(t) for t in DEFAULT_TOLERATIONS],
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                        ],
                    },
                },
                {"name": "edl", "emptyDir": {}},
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.1",
            "qosClass": "Guaranteed",
            "startTime": "2026-03-02T10:00:00Z",
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-03-02T10:00:05Z",
                }
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": container["image"],
                    "imageID": "sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "started": True,
                    "state": {"running": {"startedAt": "2026-03-02T10:00:04Z"}},
                }
            ],
        },
    }


def raw_job(
    name: str, workers: int, namespace: str = "ml", headroom: int = HEADROOM, stored: bool = True
) -> Obj:
    """A Running et-operator TrainingJob of WORKERS one-GPU workers that may grow by HEADROOM.
    STORED: with the uid and resourceVersion of an object read from the API (the watch cache's
    fill); without them for a create, which leaves both to the server."""
    template = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        }
    }
    metadata = {"name": name, "namespace": namespace}
    if stored:
        metadata |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    return {
        "apiVersion": ET_API,
        "kind": "TrainingJob",
        "metadata": metadata,
        "spec": {
            "etReplicaSpecs": {
                "launcher": {"replicas": 1},
                "worker": {
                    "replicas": workers,
                    "minReplicas": 1,
                    "maxReplicas": workers + headroom,
                    "template": template,
                },
            }
        },
        "status": {"phase": "Running", "currentScaler": ""},
    }


def raw_objects(nodes: int, jobs: int) -> Iterator[Obj]:
    """Nodes, then pods, then jobs, made one at a time: whoever takes them in one by one never
    holds all the raw objects at once (nor does a watch cache, listing pages of 500)."""
    node_rows, placed = layout(nodes, jobs)
    on_node: dict[str, list[tuple[int, int]]] = {}
    for j, ws in enumerate(placed):
        for node, i in ws:
            on_node.setdefault(node, []).append((j, i))
    for name, _, spot, noticed in node_rows:
        yield raw_node(name, spot, noticed)
    for name, *_ in node_rows:
        workers = on_node.get(name, [])
        for j, i in workers:
            yield raw_pod(f"job-{j:04d}-worker-{i}", name, 1, f"job-{j:04d}", i)
        for s in range(PODS_PER_NODE - len(workers)):
            yield raw_pod(f"sys-{name}-{s}", name, 0, None, 0)
    for j, ws in enumerate(placed):
        yield raw_job(f"job-{j:04d}", len(ws))


# --- measuring ------------------------------------------------------------------------------
def cpu_and_wall(
    fn: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None
) -> dict[str, float]:
    """`setup` runs before each call, untimed."""
    cpu, wall = [], []
    for _ in range(repeat):
        if setup is not None:
            setup()
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {
        "cpu_ms": round(statistics.median(cpu) * 1000, 1),
        "wall_ms": round(statistics.median(wall) * 1000, 1),
    }


def traced_peak_mb(fn: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return round(peak / 2**20, 1)


def rss_mb() -> float:
    """Peak resident set of this process so far."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(nodes: int, jobs: int, repeat: int, kube: bool) -> dict[str, Any]:
    """Times first, peak RSS next, traced allocation peaks last (tracing inflates memory)."""
    from autoscaler.config import Config

    config = Config()
    out: dict[str, Any] = {
        "nodes": nodes,
        "jobs": jobs,
        "pods": pods(nodes),
        "rss_baseline_mb": round(current_rss_mb(), 1),
    }
    snapshot = core_snapshot(nodes, jobs)
    decisions = decide(snapshot, config.policy_set, NOW)
    out["workers"] = sum(len(j.workers) for j in snapshot.jobs)
    out["decisions"] = {
        a: sum(1 for d in decisions if d.action.value == a)
        for a in ("scale_out", "scale_in", "drain", "noop")
    }
    out["decide"] = cpu_and_wall(lambda: decide(snapshot, config.policy_set, NOW), repeat)
    del snapshot, decisions  # the daemon holds no second cluster of dataclasses: not in its RSS
    gc.collect()
    reconciler = measure_kube(nodes, jobs, repeat, config, out) if kube else None
    out["rss_peak_mb"] = rss_mb()
    snapshot = core_snapshot(nodes, jobs)
    out["decide"]["alloc_peak_mb"] = traced_peak_mb(
        lambda: decide(snapshot, config.policy_set, NOW)
    )
    if reconciler is not None:
        tick = reconciler.tick
        out["kube"]["tick"]["alloc_peak_mb"] = traced_peak_mb(lambda: tick(NOW + timedelta(days=1)))
    return out


def measure_kube(nodes: int, jobs: int, repeat: int, config: Any, out: dict[str, Any]) -> Any:
    """Fill the watch cache without HTTP, then time snapshots and ticks; the reconciler."""
    from kubernetes import client

    from autoscaler.adapters.kube import DryRunActuator, KubeCache, KubeObserver
    from autoscaler.adapters.kube.kinds import WATCHLIST
    from autoscaler.adapters.kube.kinds.et_operator import TRAINING_JOBS
    from autoscaler.adapters.kube.resources import NODES, PODS
    from autoscaler.notices_and_prices import NoticeBoard, PriceBook
    from autoscaler.reconcile import Reconciler

    gc.collect()
    before = current_rss_mb()
    kinds = {r.kind: r for r in (NODES, PODS, TRAINING_JOBS)}
    cache = KubeCache(client.ApiClient(), config.kubernetes, WATCHLIST)  # never started: no HTTP
    sizes = []
    rss_at: dict[str, float] = {}  # the RSS when the first object of a kind came
    for n, obj in enumerate(raw_objects(nodes, jobs)):
        if obj["kind"] not in rss_at:  # nodes, then pods, then jobs
            gc.collect()
            rss_at[obj["kind"]] = current_rss_mb()
        text = json.dumps(obj)
        if obj["kind"] == "Pod" and n % (PODS_PER_NODE * nodes // 200) == 0:
            sizes.append(len(text))
        # decoded as a watch event is (no string shared with another object), then the
        # write-through path: as if the watch delivered it
        cache.assume(kinds[obj["kind"]], json.loads(text))
    gc.collect()
    cache_mb = current_rss_mb() - before
    observer = KubeObserver(cache, config.kubernetes, config.prices, NoticeBoard(), PriceBook())
    reconciler = Reconciler(observer, DryRunActuator(), config.policy_set, structlog.get_logger())
    ticks = iter(NOW + timedelta(minutes=2 * k) for k in range(10**6))  # idle clocks settle
    cold = cpu_and_wall(lambda: observer.snapshot(NOW), 1)
    gc.collect()
    observer_mb = current_rss_mb() - before - cache_mb
    warm = cpu_and_wall(lambda: observer.snapshot(NOW), repeat)
    reconciler.tick(next(ticks))  # first tick: starts the idle clocks
    mib = 2**20
    out["kube"] = {
        "pod_json_bytes": int(statistics.median(sizes)),
        "cache_rss_mb": round(cache_mb, 1),
        # resident bytes per object in the cache, and of what the observer derives per pod
        "cache_bytes_per_node": round((rss_at["Pod"] - rss_at["Node"]) * mib / nodes),
        "cache_bytes_per_pod": round((rss_at["TrainingJob"] - rss_at["Pod"]) * mib / pods(nodes)),
        "observer_bytes_per_pod": round(observer_mb * mib / pods(nodes)),
        "snapshot_cold": cold,
        "snapshot_warm": warm,
        "tick": cpu_and_wall(lambda: reconciler.tick(next(ticks)), repeat),
    }
    out["kube"]["tick"]["jobs_replanned"] = reconciler.memo.replanned
    out["kube"]["tick_churn"] = cpu_and_wall(
        lambda: reconciler.tick(next(ticks)), repeat, churn(cache)
    )
    out["kube"]["tick_churn"]["jobs_replanned"] = reconciler.memo.replanned
    out["kube"]["tick_restarts"] = cpu_and_wall(
        lambda: reconciler.tick(next(ticks)), repeat, churn(cache, every=101, restart=True)
    )
    out["kube"]["tick_restarts"]["jobs_replanned"] = reconciler.memo.replanned
    return reconciler


def churn(cache: Any, every: int = 100, restart: bool = False) -> Callable[[], None]:
    """Every `every`-th node and pod replaced by a new version of itself, as watch events
    deliver them (a status update): the objects the snapshot must read again. `restart`: the
    pods' Ready condition moves too (a container restarted), so their jobs change."""
    from autoscaler.adapters.kube.resources import NODES, PODS

    versions = itertools.count(2)

    def replace() -> None:
        for kind in (NODES, PODS):
            for obj in cache.items(kind)[::every]:
                version = next(versions)
                meta = {**obj["metadata"], "resourceVersion": str(version)}
                new = {**obj, "metadata": meta}
                if restart and kind is PODS:
                    ready = (NOW + timedelta(seconds=version)).isoformat().replace("+00:00", "Z")
                    condition = {"type": "Ready", "status": "True", "lastTransitionTime": ready}
                    new["status"] = {**obj["status"], "conditions": [condition]}
                cache.assume(kind, new)

    return replace


# --- API requests in steady state -----------------------------------------------------------
def measure_api(
    nodes: int, jobs: int, window: float, watch_timeout: float, cluster: str = "emulator"
) -> dict[str, Any]:
    from autoscaler.config import Config

    config = Config.model_validate({"kubernetes": {"watch_timeout": watch_timeout}})
    if cluster == "real":
        return measure_api_real(nodes, jobs, window, config)
    from tests.support.kube_api import KubeApiServer

    with KubeApiServer(history_limit=100) as api:
        api.seed(*raw_objects(nodes, jobs))
        out = _steady_state(
            api.api_client(), config, window, api.count, api.clear_requests, api.requests
        )
    return {"cluster": "emulator", "nodes": nodes, "pods": pods(nodes), **out}


def _steady_state(
    api_client: Any,
    config: Any,
    window: float,
    count: Callable[[], int],
    clear: Callable[[], None],
    requests: Callable[[], list[Any]],
    phase: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The cache synced from the API, then reconcile ticks once a second for `window` s: the
    requests of each part (`count`/`requests`: records with `.watch`) and the ticks' CPU."""
    from autoscaler.adapters.kube import DryRunActuator, KubeCache, KubeObserver
    from autoscaler.adapters.kube.kinds import WATCHLIST
    from autoscaler.notices_and_prices import NoticeBoard, PriceBook
    from autoscaler.reconcile import Reconciler

    cache = KubeCache(api_client, config.kubernetes, WATCHLIST)
    started = time.perf_counter()
    cache.start()
    try:
        if not cache.wait_synced(600):
            raise RuntimeError("cache did not sync")
        synced = time.perf_counter() - started
        phase("synced")
        initial = count()
        clear()
        observer = KubeObserver(cache, config.kubernetes, config.prices, NoticeBoard(), PriceBook())
        reconciler = Reconciler(
            observer, DryRunActuator(), config.policy_set, structlog.get_logger()
        )
        begin, ticks, tick_cpu = time.perf_counter(), 0, []
        while time.perf_counter() - begin < window:
            c = time.process_time()
            reconciler.tick(datetime.now(UTC))
            tick_cpu.append(time.process_time() - c)
            ticks += 1
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - begin) % 1.0))
        elapsed = time.perf_counter() - begin
        steady = requests()
        phase("window")
    finally:
        cache.stop()
    return {
        "initial_sync_s": round(synced, 1),
        "initial_requests": initial,
        "window_s": round(elapsed, 1),
        "ticks": ticks,
        # CPU of one tick (observer snapshot + decide + dry-run acting), median of the window's
        "tick_cpu_ms": round(statistics.median(tick_cpu) * 1000, 1) if tick_cpu else None,
        "watch_timeout_s": config.kubernetes.watch_timeout.total_seconds(),
        "requests": len(steady),
        "watch_requests": sum(1 for r in steady if r.watch),
        "requests_per_min": round(len(steady) * 60 / elapsed, 1),
    }


class _Counted:
    """Requests an ApiClient sends, counted on the client (the real server counts everyone's)."""

    def __init__(self, api_client: Any) -> None:
        self.log: list[Any] = []
        self.lock = threading.Lock()
        rest = api_client.rest_client
        send = rest.request

        def request(method: str, url: str, query_params: Any = None, **kw: Any) -> Any:
            query = dict(query_params or ())
            watching = str(query.get("watch", "")).lower() in ("true", "1")
            with self.lock:
                self.log.append(types.SimpleNamespace(method=method, url=url, watch=watching))
            return send(method, url, query_params=query_params, **kw)

        rest.request = request

    def count(self) -> int:
        with self.lock:
            return len(self.log)

    def clear(self) -> None:
        with self.lock:
            self.log.clear()

    def requests(self) -> list[Any]:
        with self.lock:
            return list(self.log)


def measure_api_real(nodes: int, jobs: int, window: float, config: Any) -> dict[str, Any]:
    """The same against a real control plane (benchmarks/real_plane.py): the nodes are kwok
    nodes, the pods real ones created with spec.nodeName (no scheduler: setup speed) and made
    Running by kwok, the TrainingJobs created through the API with their status through
    /status; the workers' owner references carry their job's uid, the system pods have none
    (no DaemonSet). Requests are counted on the cache's client. Besides: setup times, CPU
    seconds and peak RSS of this process (the cache, the observer and the ticks; in the setup
    the bulk client) and of each control-plane process, and the versions."""
    from benchmarks.real_plane import Meter, Rest, health, start_plane, versions

    meter = Meter()
    meter.mark("begin")
    setup: dict[str, float] = {}
    t0 = time.monotonic()
    plane = start_plane()
    setup["control_plane"] = round(time.monotonic() - t0, 1)
    try:
        meter.watch_plane(plane)
        rest = Rest(plane)
        try:
            setup |= seed_real(rest, nodes, jobs)
            setup["total"] = round(time.monotonic() - t0, 1)
            meter.mark("setup")
            api_client = plane.api_client()
            counted = _Counted(api_client)
            out = _steady_state(
                api_client,
                config,
                window,
                counted.count,
                counted.clear,
                counted.requests,
                meter.mark,
            )
            meter.peaks()
            ran = versions(plane, rest)
            healthy = health(rest, "ml")
        finally:
            rest.close()
    finally:
        plane.stop()
    return {
        "cluster": "real",
        "nodes": nodes,
        "pods": pods(nodes),
        **out,
        "setup_s": setup,
        # this process: in the setup the bulk client; then the cache, the observer, the ticks
        "cpu_s": {
            "setup": meter.cpu("begin", "setup"),
            "sync": meter.cpu("setup", "synced"),
            "window": meter.cpu("synced", "window"),
        },
        "peak_rss_mb": meter.rss,
        "cluster_health": healthy,  # after the window
        "versions": ran,
    }


def seed_real(rest: Any, nodes: int, jobs: int) -> dict[str, float]:
    """The synthetic cluster of raw_objects through the API, in parallel; each step's seconds."""
    from benchmarks.real_plane import KWOK_ANNOTATION, wait_cluster_ready

    steps: dict[str, float] = {}
    t = time.monotonic()
    rest.apply_crds(
        [f"kai.alibabacloud.com_{p}" for p in ("trainingjobs", "scaleins", "scaleouts")]
    )
    rest.namespace("ml")
    rest.namespace("kube-system")
    steps["crds_namespaces"] = round(time.monotonic() - t, 1)
    uids: dict[str, str] = {}

    def create_job(job: Obj) -> None:
        status = job.pop("status")  # dropped by a create: through /status
        status |= {"conditions": [], "replicaStatuses": {}, "restartCount": 0}  # the CRD's
        base = f"/apis/{ET_API}/namespaces/ml/trainingjobs"
        made = rest.call("POST", base, job)
        uids[made["metadata"]["name"]] = made["metadata"]["uid"]
        path = f"{base}/{made['metadata']['name']}/status"
        rest.call("PATCH", path, {"status": status}, merge=True)

    def create(obj: Obj) -> None:
        meta = {
            k: v
            for k, v in obj["metadata"].items()
            if k not in ("uid", "resourceVersion", "creationTimestamp", "managedFields")
        }
        obj = {**obj, "metadata": meta}
        if obj["kind"] == "Node":  # kwok's: it fills conditions, addresses and nodeInfo
            meta["annotations"] = {**meta.get("annotations", {}), KWOK_ANNOTATION: "fake"}
            status = obj["status"]
            obj["status"] = {k: status[k] for k in ("capacity", "allocatable")}
            rest.call("POST", "/api/v1/nodes", obj)
            return
        del obj["status"]  # kwok makes it Running
        refs = meta["ownerReferences"]
        owners = [{**o, "uid": uids[o["name"]]} for o in refs if o["kind"] == "TrainingJob"]
        if owners:
            meta["ownerReferences"] = owners
        else:
            del meta["ownerReferences"]
        rest.call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", obj)

    _, placed = layout(nodes, jobs)
    t = time.monotonic()
    made = [raw_job(f"job-{j:04d}", len(ws), stored=False) for j, ws in enumerate(placed)]
    rest.parallel(create_job, made)
    steps["jobs"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    rest.parallel(create, (o for o in raw_objects(nodes, jobs) if o["kind"] != "TrainingJob"))
    steps["nodes_pods"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    wait_cluster_ready(rest)
    steps["nodes_ready_pods_running"] = round(time.monotonic() - t, 1)
    return steps


# --- driver ---------------------------------------------------------------------------------
def run_child(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| nodes | jobs | pods | decide ms | snapshot cold ms | snapshot warm ms | tick ms "
        "| tick, 1% changed ms | 1% restarted ms | cache RSS MB | cache B/node | cache B/pod "
        "| observer B/pod "
        "| peak RSS MB | tick alloc peak MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        k = r.get("kube") or {}
        cells = [
            k.get("snapshot_cold", {}).get("cpu_ms"),
            k.get("snapshot_warm", {}).get("cpu_ms"),
            k.get("tick", {}).get("cpu_ms"),
            k.get("tick_churn", {}).get("cpu_ms"),
            k.get("tick_restarts", {}).get("cpu_ms"),
            k.get("cache_rss_mb"),
            k.get("cache_bytes_per_node"),
            k.get("cache_bytes_per_pod"),
            k.get("observer_bytes_per_pod"),
            r["rss_peak_mb"],
            k.get("tick", {}).get("alloc_peak_mb"),
        ]
        head = f"| {r['nodes']:,} | {r['jobs']:,} | {r['pods']:,} | {r['decide']['cpu_ms']} | "
        lines.append(head + " | ".join(_or_dash(c) for c in cells) + " |")
    return "\n".join(lines)


def _or_dash(v: object) -> str:
    return "—" if v is None else f"{v}"


def growth(results: list[dict[str, Any]]) -> str:
    out = []
    for a, b in zip(results, results[1:], strict=False):
        f = b["nodes"] / a["nodes"]
        d = b["decide"]["cpu_ms"] / max(a["decide"]["cpu_ms"], 0.1)
        line = f"{a['nodes']:,} -> {b['nodes']:,} nodes (x{f:g}): decide x{d:.1f}"
        if a.get("kube") and b.get("kube"):
            t = b["kube"]["tick"]["cpu_ms"] / max(a["kube"]["tick"]["cpu_ms"], 0.1)
            m = b["rss_peak_mb"] / a["rss_peak_mb"]
            line += f", tick x{t:.1f}, peak RSS x{m:.1f}"
        out.append(line)
    return "\n".join(out)


def api_report(a: dict[str, Any]) -> str:
    text = (
        f"\nAPI ({a['cluster']}), {a['nodes']:,} nodes / {a['pods']:,} pods: initial sync "
        f"{a['initial_sync_s']} s in {a['initial_requests']} requests; steady state "
        f"{a['requests_per_min']} requests/min over {a['window_s']} s with "
        f"{a['ticks']} ticks of {a['tick_cpu_ms']} ms CPU (watch timeout "
        f"{a['watch_timeout_s']} s: {a['watch_requests']} re-watches)"
    )
    if a["cluster"] == "real":
        from benchmarks.real_plane import control_plane_total

        setup = ", ".join(f"{k} {v}" for k, v in a["setup_s"].items())
        text += f"\n  setup (s): {setup}"
        for phase, cpu in a["cpu_s"].items():
            each = ", ".join(f"{k} {v}" for k, v in cpu.items() if k != "harness")
            text += (
                f"\n  CPU s, {phase}: this process {cpu['harness']}; control plane "
                f"{control_plane_total(cpu)} ({each})"
            )
        text += "\n  peak RSS MB: " + ", ".join(f"{k} {v}" for k, v in a["peak_rss_mb"].items())
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default=",".join(f"{n}:{j}" for n, j in SIZES), help="comma-separated nodes:jobs"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-kube", action="store_true", help="measure decide only")
    parser.add_argument("--api", action="store_true", help="also count API requests")
    parser.add_argument(
        "--cluster",
        choices=["emulator", "real"],
        default="emulator",
        help="--api against the API emulator, or a real control plane with kwok nodes",
    )
    parser.add_argument("--api-sizes", default="500:50,5000:500")
    parser.add_argument("--api-window", type=float, default=45.0, help="seconds per size")
    parser.add_argument("--json", type=Path, help="write all figures here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--one-api", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one or args.one_api:
        from autoscaler.logs import configure

        configure(json_lines=True, level="warning")  # the dry-run actuator's lines are noise here
    if args.one:
        n, j = map(int, args.one.split(":"))
        print(json.dumps(measure(n, j, args.repeat, not args.no_kube)))
        return 0
    if args.one_api:
        n, j = map(int, args.one_api.split(":"))
        print(json.dumps(measure_api(n, j, args.api_window, 15.0, args.cluster)))
        return 0
    flags = ["--repeat", str(args.repeat), *(["--no-kube"] if args.no_kube else [])]
    results = []
    for size in args.sizes.split(","):
        results.append(run_child(["--one", size, *flags]))
        print(f"measured {size}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {"sizes": results}
    print(table(results))
    print()
    print(growth(results))
    if args.api:
        window = ["--api-window", str(args.api_window), "--cluster", args.cluster]
        report["api"] = [run_child(["--one-api", s, *window]) for s in args.api_sizes.split(",")]
        for a in report["api"]:
            print(api_report(a))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
