"""What the benchmarks need of a real control plane (tests/support/control_plane.py), as a harness.

- `start_plane()`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from
  the pinned binaries (env SPOT_AUTOSCALER_CONTROL_PLANE_BIN, else
  `scripts/build-control-plane.sh --print-bin-dir`; `make control-plane` builds them), with
  the apiserver's flags left at their defaults (--max-requests-inflight 400, mutating 200; the
  admin user is in system:masters, which API Priority and Fairness exempts).
- `Rest`: JSON over HTTPS with the admin client certificate, one urllib3 pool shared by a thread
  pool, no client-side rate limit: bulk creation of nodes, pods and custom resources in parallel
  (the official client's models, one request at a time, would make a 5,000-node setup take
  minutes more). 429 and 5xx answers are retried after a short pause.
- `kwok_node()`: a Node that kwok manages (annotation kwok.x-k8s.io/node=fake), its status
  (capacity/allocatable with nvidia.com/gpu) given on creation, which the server keeps and kwok's
  node-initialize stage keeps too.
- `Meter`: CPU seconds (utime + stime from /proc/<pid>/stat, children reaped included) and peak
  RSS (VmHWM from /proc/<pid>/status) of any process: the daemon, this harness and each
  control-plane component, read at named marks so a phase's CPU is a difference of two marks.
- `controller_work()`: the controller-manager's busy seconds per controller (its workqueues'
  `workqueue_work_duration_seconds_sum`), so a run can say which controllers took its CPU.
- `versions()`: which binaries ran (the pinned versions, the apiserver's /version, etcd's and
  kwok's --version).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.control_plane import (  # noqa: E402
    KWOK_ANNOTATION,
    ControlPlane,
    KwokParallelism,
    proc_stat,
    wait_until,
)
from tests.support.real_cluster import find_bin_dir  # noqa: E402

Obj = dict[str, Any]
T = TypeVar("T")
R = TypeVar("R")
CRDS = ROOT / "tests" / "support" / "crds"
VERSIONS_FILE = ROOT / "scripts" / "control-plane.versions"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
_TICKS = os.sysconf("SC_CLK_TCK")


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


# kwok stands in for one kubelet per node, each renewing its own Lease every 10 s and starting
# its own pods. By default it renews 4 Leases at a time, which keeps up with 2,000 nodes (200
# renewals/s) only while the apiserver answers in under 20 ms: on a loaded machine ~9% of 2,000
# nodes went Unknown (Leases 5 min old), the node lifecycle controller tainted them unreachable
# and evicted their pods; and it plays 4 pod stages at a time: 16,000 pods took ~35 min to be
# Running there (8/s). More workers make the simulation closer to real kubelets. (kwok logs
# "failed to apply stage ... status.podIPs ... no more than one IP" now and then, with 4
# workers too: a second pod-ready patch from a stale copy of a pod already Running, refused.)
KWOK_PARALLELISM = KwokParallelism(node_leases=64, node_stages=16, pod_stages=16)
# thousands of new nodes untainted at once rather than ~5 a second (control_plane.py)
CONTROLLER_QPS = 5000.0


def start_plane() -> ControlPlane:
    """A started control plane of the pinned binaries; SystemExit with one line if there are
    none."""
    bin_dir, why = find_bin_dir()
    if bin_dir is None:
        raise SystemExit(f"--cluster real needs the control-plane binaries: {why}")
    plane = ControlPlane(
        bin_dir, timeout=120, kwok_parallelism=KWOK_PARALLELISM, controller_qps=CONTROLLER_QPS
    )
    return plane.start()


class Rest:
    """The admin's JSON API over one keep-alive pool, and a thread pool to call it in parallel."""

    def __init__(self, plane: ControlPlane, threads: int = 24) -> None:
        conf = yaml.safe_load(plane.kubeconfig_path.read_text())
        cluster = conf["clusters"][0]["cluster"]
        user = conf["users"][0]["user"]
        self.base = cluster["server"]
        self.http = urllib3.PoolManager(
            num_pools=2,
            maxsize=threads + 8,
            block=True,
            cert_reqs="CERT_REQUIRED",
            ca_certs=cluster["certificate-authority"],
            cert_file=user["client-certificate"],
            key_file=user["client-key"],
            retries=False,
            timeout=urllib3.Timeout(connect=10, read=120),
        )
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="rest")
        self.retried = 0

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        merge: bool = False,
        missing_ok: bool = False,
        exists_ok: bool = False,
    ) -> Obj | None:
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/merge-patch+json" if merge else "application/json",
        }
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(20):
            r = self.http.request(method, self.base + path, body=data, headers=headers)
            if r.status == 429 or r.status >= 500:
                self.retried += 1
                time.sleep(min(2.0, 0.05 * 2**attempt))
                continue
            if r.status == 404 and missing_ok or r.status == 409 and exists_ok:
                return None
            if r.status >= 400:
                raise ApiError(method, path, r.status, r.data.decode(errors="replace"))
            out: Obj = json.loads(r.data)
            return out
        raise ApiError(method, path, r.status, r.data.decode(errors="replace"))

    def get(self, path: str) -> Obj | None:
        return self.call("GET", path, missing_ok=True)

    def parallel(self, fn: Callable[[T], R], items: Iterable[T], chunk: int = 4096) -> list[R]:
        """fn over the items on the thread pool, a chunk at a time (a generator of 50,000 pods
        is never held whole); the first exception is raised."""
        out: list[R] = []
        it = iter(items)
        while batch := list(itertools.islice(it, chunk)):
            out += self.pool.map(fn, batch)
        return out

    def list_all(self, path: str, query: str = "", page: int = 2000) -> list[Obj]:
        """Every item, in pages (as informers list)."""
        items: list[Obj] = []
        token = ""
        while True:
            sep = "&" if query else ""
            cont = f"&continue={token}" if token else ""
            got = self.call("GET", f"{path}?{query}{sep}limit={page}{cont}")
            assert got is not None
            items += got.get("items") or []
            token = (got.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def apply_crds(self, names: Sequence[str], timeout: float = 60) -> None:
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for name in names:
            body = yaml.safe_load((CRDS / f"{name}.yaml").read_text())
            self.call("POST", crds, body, exists_ok=True)
        for name in names:
            group, plural = name.split("_", 1)
            crd = f"{plural}.{group}"

            def established(crd: str = crd) -> bool:
                got = self.get(f"{crds}/{crd}")
                conds = ((got or {}).get("status") or {}).get("conditions") or []
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            wait_until(established, timeout, f"CRD {crd} Established")

    def namespace(self, name: str, timeout: float = 60) -> None:
        """Create it and wait for its `default` ServiceAccount (pods are refused without)."""
        self.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}}, exists_ok=True)
        wait_until(
            lambda: self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            timeout,
            f"ServiceAccount {name}/default",
        )

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.clear()


def kwok_node(
    name: str, labels: dict[str, str], provider_id: str, gpus: int = 8, pods: str = "110"
) -> Obj:
    resources = {"cpu": "96", "memory": "1152Gi", "pods": pods, "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
            "annotations": {KWOK_ANNOTATION: "fake"},
        },
        "spec": {"providerID": provider_id},
        "status": {"capacity": resources, "allocatable": resources},
    }


def wait_cluster_ready(rest: Rest, max_unready_nodes: int = 0, timeout: float = 900) -> int:
    """Until every pod is Running (kwok) and at most `max_unready_nodes` nodes are not Ready or
    still carry the not-ready/unreachable taints (kwok, the node lifecycle controller); how
    many nodes are not. TimeoutError saying how many are not after `timeout` s, or longer while
    pods still start (at least 10 a second); progress on stderr."""
    deadline = time.monotonic() + timeout
    extended = False
    said = time.monotonic()
    while True:
        nodes = [n for n in rest.list_all("/api/v1/nodes") if not node_ready(n)]
        pods = rest.list_all("/api/v1/pods", "fieldSelector=status.phase!=Running")
        if len(nodes) <= max_unready_nodes and not pods:
            return len(nodes)
        example = nodes[0]["metadata"]["name"] if nodes else "-"
        state = f"{len(nodes)} nodes not Ready or tainted (e.g. {example}), "
        state += f"{len(pods)} pods not Running"
        if time.monotonic() > deadline and not extended:
            extended = True  # once: time for the pods still to start
            deadline += len(pods) / 10
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out, {state}: is the machine overloaded (kwok renewing Leases or "
                "starting pods late)?"
            )
        if time.monotonic() - said > 30:
            print(f"setup: waiting: {state}", file=sys.stderr, flush=True)
            said = time.monotonic()
        time.sleep(2.0)


def health(rest: Rest, namespace: str) -> dict[str, int]:
    """Nodes not Ready (or tainted by the node lifecycle controller) and pods Running (not being
    deleted) in the namespace: a run on an overloaded machine shows here."""
    nodes = rest.list_all("/api/v1/nodes")
    pods = rest.list_all(f"/api/v1/namespaces/{namespace}/pods")
    live = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
    return {
        "nodes": len(nodes),
        "nodes_not_ready": sum(not node_ready(n) for n in nodes),
        "pods_running": sum((p.get("status") or {}).get("phase") == "Running" for p in live),
        "pods_pending": sum((p.get("status") or {}).get("phase") == "Pending" for p in live),
    }


def node_ready(node: Obj) -> bool:
    """Ready, and without the not-ready/unreachable taints new nodes are born with."""
    conds = (node.get("status") or {}).get("conditions") or []
    taints = (node.get("spec") or {}).get("taints") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not any(
        t["key"].startswith("node.kubernetes.io/") for t in taints
    )


def pod_running(pod: Obj) -> bool:
    status = pod.get("status") or {}
    conds = status.get("conditions") or []
    return status.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conds
    )


# --- processes ------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float | None:
    """utime + stime + cutime + cstime of a process (its reaped children included)."""
    fields = proc_stat(pid)
    return None if fields is None else sum(int(f) for f in fields[11:15]) / _TICKS


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class Meter:
    """CPU seconds of named processes at named marks; peak RSS when asked (before they end)."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {"harness": os.getpid()}
        self.marks: dict[str, dict[str, float | None]] = {}
        self.rss: dict[str, float | None] = {}
        self.lock = threading.Lock()

    def watch(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def watch_plane(self, plane: ControlPlane) -> None:
        for name in COMPONENTS:
            self.pids[name] = plane.processes[name].popen.pid

    def mark(self, label: str) -> None:
        with self.lock:
            self.marks[label] = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def peaks(self) -> None:
        """Peak RSS of every process (call while they still run)."""
        for name, pid in self.pids.items():
            if name == "harness":  # KiB on Linux
                self.rss[name] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
            else:
                self.rss[name] = peak_rss_mb(pid)

    def cpu(self, start: str, end: str) -> dict[str, float | None]:
        a, b = self.marks[start], self.marks[end]
        out: dict[str, float | None] = {}
        for name in self.pids:
            before, after = a.get(name), b.get(name)
            if after is None:
                out[name] = None
            else:
                out[name] = round(after - (before or 0.0), 2)
        return out


def control_plane_total(cpu: dict[str, float | None]) -> float:
    return round(sum(cpu.get(name) or 0.0 for name in COMPONENTS), 2)


# --- versions -------------------------------------------------------------------------------
def versions(plane: ControlPlane, rest: Rest) -> dict[str, Any]:
    pinned = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isupper() and not line.startswith("#"):
            pinned[key.lower()] = value.strip()
    served = rest.get("/version") or {}

    def first_line(binary: str, *args: str) -> str:
        try:
            out = subprocess.run(
                [str(plane.bin_dir / binary), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"? ({e})"
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0] if text else "?"

    return {
        "pinned": pinned,
        "kube_apiserver": served.get("gitVersion"),
        "go": served.get("goVersion"),
        "etcd": first_line("etcd", "--version"),
        "kwok": first_line("kwok", "--version"),
        "bin_dir": str(plane.bin_dir),
    }


# The API server's own time on the requests a notice costs the daemon (a drain is a PATCH of the
# job, a ScaleIn its victims' GETs and a POST; the notice is kept on its Node; Events go out).
SERVER_TIMES = (
    ("PATCH", "trainingjobs"),
    ("GET", "pods"),
    ("POST", "scaleins"),
    ("PATCH", "nodes"),
    ("POST", "events"),
)
DURATION = "apiserver_request_duration_seconds"


def apiserver_durations(rest: Rest) -> dict[str, dict[str, float]]:
    """apiserver_request_duration_seconds of each of SERVER_TIMES ("VERB resource"), summed
    over its other labels, as the series of one histogram named DURATION."""
    r = rest.http.request("GET", rest.base + "/metrics")
    out: dict[str, dict[str, float]] = {f"{v} {res}": {} for v, res in SERVER_TIMES}
    for line in r.data.decode().splitlines():
        if not line.startswith(DURATION) or 'subresource=""' not in line:
            continue
        series, _, value = line.rpartition(" ")
        for verb, kind in SERVER_TIMES:
            if f'verb="{verb}"' in series and f'resource="{kind}"' in series:
                name = series.split("{", 1)[0]
                le = series.split('le="')[1].split('"')[0] if 'le="' in series else None
                key = f'{name}{{le="{le}"}}' if le is not None else name
                sums = out[f"{verb} {kind}"]
                sums[key] = sums.get(key, 0.0) + float(value)
    return out


def apiserver_requests(rest: Rest, resource_name: str, verbs: Sequence[str]) -> int:
    """apiserver_request_total for one resource (no subresource), summed over the verbs."""
    r = rest.http.request("GET", rest.base + "/metrics")
    total = 0.0
    for line in r.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        if (
            f'resource="{resource_name}"' in labels
            and 'subresource=""' in labels
            and any(f'verb="{v}"' in labels for v in verbs)
        ):
            total += float(value)
    return int(total)


WORK = "workqueue_work_duration_seconds_sum"


def controller_work(plane: ControlPlane) -> dict[str, float]:
    """Seconds each of the controller-manager's workqueues has spent working so far (by queue
    name: "disruption", "garbage_collector_attempt_to_delete", ...). Its serving certificate is
    self-signed (no CA to check it against); the admin's client certificate authorizes."""
    user = yaml.safe_load(plane.kubeconfig_path.read_text())["users"][0]["user"]
    http = urllib3.PoolManager(
        cert_reqs="CERT_NONE",
        cert_file=user["client-certificate"],
        key_file=user["client-key"],
        retries=False,
        timeout=urllib3.Timeout(connect=5, read=30),
    )
    url = f"https://127.0.0.1:{plane.ports['kube-controller-manager']}/metrics"
    with warnings.catch_warnings():  # loopback, self-signed: nothing to verify against
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        r = http.request("GET", url)
    out: dict[str, float] = {}
    for line in r.data.decode().splitlines():
        if line.startswith(WORK + "{"):
            series, _, value = line.rpartition(" ")
            name = series.split('name="', 1)[1].split('"', 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out
