"""Karpenter v1.8.0's kwok cloud provider as a process beside the real control plane
(support/control_plane.py), for tests/test_real_karpenter.py and
benchmarks/karpenter_interruptions.py.

The binary (`karpenter-kwok`) and the CRDs it came with are built by scripts/build-karpenter.sh
(`make karpenter`); env ``SPOT_AUTOSCALER_KARPENTER_BIN`` names another bin dir. Without them a
test asking for Karpenter is skipped with one line saying how to build it, or fails with
``REQUIRE_REAL_CLUSTER=1`` (CI).

What `Karpenter.start()` sets up (the facts behind it: docs/testing.md, "Karpenter v1.8.0"):
- the CRDs NodePool, NodeClaim, NodeOverlay and KWOKNodeClass, and the KWOKNodeClass `default`
  (its CRD defaults its status to Ready: no controller needed);
- custom instance types (``INSTANCE_TYPES``, a file given as INSTANCE_TYPES_FILE_PATH): one GPU
  type with spot and on-demand offerings, since the provider's embedded 144 types have no GPUs;
- the process, as the admin (KUBECONFIG: it has no --kubeconfig flag), leader election off,
  metrics and health on free ports (its defaults :8080/:8081 bind every interface; 8080 is
  mpi-operator's fixed health port), ready once /readyz answers (which checks the CRDs).

The Nodes it creates carry kwok's annotation `kwok.x-k8s.io/node=fake`, which is the selector
our kwok runs with, so kwok makes them Ready and runs their pods. NodePools made here never
consolidate, drift or expire on their own (`consolidateAfter: Never`, a budget of 0 nodes,
`expireAfter: Never`): the tests disrupt nodes themselves, by deleting the NodeClaim, which is
all the AWS provider does on a spot interruption (aws/karpenter-provider-aws v1.8.0
pkg/controllers/interruption/controller.go `deleteNodeClaim`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from support.control_plane import ControlPlane, free_port
from support.pytorch_cluster import Cluster, pytorch_job
from support.real_daemon import deployed, forbidden
from support.real_namespace import POOL, isolated
from support.waiting import wait_for

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-karpenter.sh"
BIN_ENV = "SPOT_AUTOSCALER_KARPENTER_BIN"
BINARY = "karpenter-kwok"
NAME = "karpenter"  # its process in ControlPlane.processes
KARPENTER = ("karpenter.sh", "v1")
NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}
CAPACITY_TYPE = "karpenter.sh/capacity-type"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
DISRUPTED = "karpenter.sh/disrupted"  # the taint of a node being terminated (pkg/apis/v1/taints.go)
TERMINATION_TIME = "karpenter.sh/nodeclaim-termination-timestamp"
INSTANCE_TYPE = "gpu1.2xlarge"  # one GPU a node: one worker a node, one worker an interruption
ZONE = "test-zone-a"
# The provider's JSON (kwok/cloudprovider/helpers.go `InstanceTypeOptions`): offerings carry
# their capacity type and zone as requirements; `resources` is a ResourceList, so
# nvidia.com/gpu goes there. Spot is cheaper, so a pool allowing both launches spot.
INSTANCE_TYPES = [
    {
        "name": INSTANCE_TYPE,
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"},
        "offerings": [
            {
                "Price": price,
                "Available": True,
                "Requirements": [
                    {"key": CAPACITY_TYPE, "operator": "In", "values": [capacity]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                ],
            }
            for capacity, price in (("spot", 0.4), ("on-demand", 1.2))
        ],
    }
]
SETTLE = 30.0
# the NodePools `gpu_pools` makes and the pool label value their nodes carry (jobs select it)
SPOT, ON_DEMAND = "ka-spot", "ka-on-demand"
POOLS = (SPOT, ON_DEMAND)
POOL_VALUE = "karpenter"


def karpenter_bin_dir() -> Path:
    """The bin dir with karpenter-kwok and crds/; skips the test (fails it with
    REQUIRE_REAL_CLUSTER=1) when it is not built."""
    why = f"{BIN_ENV}={os.environ.get(BIN_ENV)} has no {BINARY}"
    bin_dir: Path | None = Path(os.environ[BIN_ENV]) if os.environ.get(BIN_ENV) else None
    if bin_dir is None:
        found = subprocess.run(
            [str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, timeout=60
        )
        if found.returncode == 0:
            bin_dir = Path(found.stdout.strip().splitlines()[-1])
        why = (found.stderr.strip().splitlines() or ["no output"])[-1]
    if bin_dir is not None and os.access(bin_dir / BINARY, os.X_OK):
        return bin_dir
    message = f"no Karpenter: {why.replace('[build-karpenter] ERROR: ', '')}"
    if os.environ.get("REQUIRE_REAL_CLUSTER") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def taints_of(node: Obj) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def tainted(node: Obj) -> bool:
    return any(t["key"] == DISRUPTED and t["effect"] == "NoSchedule" for t in taints_of(node))


class Karpenter:
    """The kwok provider on `plane` (see the module's docstring); `with` starts and stops it."""

    def __init__(self, plane: ControlPlane, bin_dir: Path, *, log_level: str = "info") -> None:
        self.plane = plane
        self.bin_dir = bin_dir
        self.log_level = log_level
        self.api = plane.api_client()
        self.exit_code: int | None = None
        self.started_in = 0.0

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def __enter__(self) -> Karpenter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        t0 = time.monotonic()
        for crd in sorted((self.bin_dir / "crds").glob("*.yaml")):
            self.plane.apply_crd(self.api, crd, SETTLE)
        with contextlib.suppress(ApiException):  # 409: made by an earlier start
            self.custom.create_cluster_custom_object(
                NODE_CLASS["group"],
                "v1alpha1",
                "kwoknodeclasses",
                {
                    "apiVersion": f"{NODE_CLASS['group']}/v1alpha1",
                    "kind": NODE_CLASS["kind"],
                    "metadata": {"name": NODE_CLASS["name"]},
                },
            )
        workdir = self.plane.dir / NAME
        workdir.mkdir(exist_ok=True)
        types = workdir / "instance-types.json"
        types.write_text(json.dumps(INSTANCE_TYPES, indent=1))
        ports = {"metrics": free_port(), "probe": free_port()}
        self.plane.ports.update({f"{NAME}-{k}": v for k, v in ports.items()})
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(
            KUBECONFIG=str(self.plane.kubeconfig_path),  # it has no --kubeconfig flag
            DISABLE_LEADER_ELECTION="true",
            METRICS_PORT=str(ports["metrics"]),
            HEALTH_PROBE_PORT=str(ports["probe"]),
            INSTANCE_TYPES_FILE_PATH=str(types),
            LOG_LEVEL=self.log_level,
            # a pending pod's NodeClaim after 0.2 s of no new pods, not 1 s (10 s at most while
            # pods keep coming): launches, not the termination flow, are what this speeds up
            BATCH_IDLE_DURATION="200ms",
            BATCH_MAX_DURATION="2s",
        )
        readyz = f"http://127.0.0.1:{ports['probe']}/readyz"
        self.plane.start_extra(
            NAME, [str(self.bin_dir / BINARY)], env, lambda: self.plane._get_ok(readyz), SETTLE
        )
        self.started_in = time.monotonic() - t0

    def stop(self) -> None:
        """Our NodePools and their nodes go first (Karpenter must run to remove its finalizers),
        then SIGTERM; its exit code in `exit_code`."""
        try:
            if NAME in self.plane.processes:
                for pool in self.node_pools():
                    self.delete_node_pool(pool["metadata"]["name"])
        finally:
            self.exit_code = self.plane.stop_extra(NAME)
            self.api.close()

    def log(self) -> str:
        return (self.plane.dir / "logs" / f"{NAME}.log").read_text(errors="replace")

    # --- NodePools and NodeClaims -------------------------------------------------------------

    def node_pool(
        self,
        name: str,
        capacity_types: Sequence[str],
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Obj] = (),
        termination_grace_period: str | None = None,
        weight: int | None = None,
    ) -> Obj:
        """A NodePool of our GPU type (`capacity_types` allowed) that never disrupts on its own;
        the higher `weight` is tried first. Returns it once Ready."""
        spec: Obj = {
            "nodeClassRef": NODE_CLASS,
            "requirements": [
                {"key": CAPACITY_TYPE, "operator": "In", "values": list(capacity_types)},
                {
                    "key": "node.kubernetes.io/instance-type",
                    "operator": "In",
                    "values": [INSTANCE_TYPE],
                },
            ],
            "taints": list(taints),
            "expireAfter": "Never",
        }
        if termination_grace_period is not None:
            spec["terminationGracePeriod"] = termination_grace_period
        body = {
            "apiVersion": "/".join(KARPENTER),
            "kind": "NodePool",
            "metadata": {"name": name},
            "spec": {
                **({"weight": weight} if weight is not None else {}),
                "template": {"metadata": {"labels": dict(labels or {})}, "spec": spec},
                "disruption": {
                    "consolidationPolicy": "WhenEmpty",
                    "consolidateAfter": "Never",
                    "budgets": [{"nodes": "0"}],
                },
            },
        }
        return self.create_node_pool(body)

    def create_node_pool(self, body: Obj) -> Obj:
        """Create the NodePool `body`; returns it once Ready."""
        name = body["metadata"]["name"]
        self.custom.create_cluster_custom_object(*KARPENTER, "nodepools", body)

        def ready() -> Obj | None:
            pool: Obj = self.custom.get_cluster_custom_object(*KARPENTER, "nodepools", name)
            return pool if condition(pool, "Ready") else None

        pool: Obj = wait_for(ready, SETTLE, f"NodePool {name} Ready")
        return pool

    def gpu_pools(self, namespace: str, termination_grace_period: str | None = None) -> None:
        """A spot NodePool (weight 10: tried first) and an on-demand one, their nodes labelled
        with our pool label and tainted so that only `namespace`'s pods land there (the taint
        support.real_namespace.isolated gives, which support.pytorch_cluster's jobs tolerate)."""
        for name, types, weight in ((SPOT, ["spot"], 10), (ON_DEMAND, ["on-demand"], 1)):
            self.node_pool(
                name,
                types,
                labels={POOL: POOL_VALUE},
                taints=[isolated(namespace)],
                termination_grace_period=termination_grace_period,
                weight=weight,
            )

    def node_pools(self) -> list[Obj]:
        return list(self.custom.list_cluster_custom_object(*KARPENTER, "nodepools")["items"])

    def node_claims(self, pool: str | None = None) -> list[Obj]:
        selector = f"{NODEPOOL_LABEL}={pool}" if pool else ""
        found = self.custom.list_cluster_custom_object(
            *KARPENTER, "nodeclaims", label_selector=selector
        )
        return list(found["items"])

    def claim_of(self, node: str) -> Obj:
        [claim] = [c for c in self.node_claims() if (c.get("status") or {}).get("nodeName") == node]
        return claim

    def delete_node_pool(self, name: str) -> None:
        """Delete its NodeClaims (their nodes drain, which is quick once their pods are gone),
        wait until they and their nodes are gone, then the NodePool. Each look deletes the
        claims it finds: the provisioner may still be launching one for a pod deleted a moment
        ago (a replacement worker), created after an earlier look."""
        nodes: set[str] = set()

        def gone() -> bool:
            claims = self.node_claims(name)
            for claim in claims:
                if node := (claim.get("status") or {}).get("nodeName"):
                    nodes.add(node)
                if claim["metadata"].get("deletionTimestamp"):
                    continue
                with contextlib.suppress(ApiException):  # 404: gone already
                    self.custom.delete_cluster_custom_object(
                        *KARPENTER, "nodeclaims", claim["metadata"]["name"]
                    )
            return not claims and not (nodes & names_now(self.core))

        wait_for(gone, SETTLE, f"the NodeClaims and nodes of NodePool {name} gone")
        with contextlib.suppress(ApiException):
            self.custom.delete_cluster_custom_object(*KARPENTER, "nodepools", name)

    def interrupt(self, node: str) -> float:
        """A spot interruption as the AWS provider handles one: its NodeClaim deleted, nothing
        else. The monotonic time of the request."""
        claim = self.claim_of(node)["metadata"]["name"]
        t = time.monotonic()
        self.custom.delete_cluster_custom_object(*KARPENTER, "nodeclaims", claim)
        return t

    def events(self, namespace: str, reason: str) -> list[client.CoreV1Event]:
        """Karpenter's Events of `reason` in `namespace` ("default" holds those on Nodes)."""
        found = self.core.list_namespaced_event(namespace, field_selector=f"reason={reason}")
        return [e for e in found.items if (e.source and e.source.component) == NAME]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a counter's series whose labels include `labels`, from /metrics."""
        url = f"http://127.0.0.1:{self.plane.ports[f'{NAME}-metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        total = 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series.split("{")[0] == name and all(w in series for w in wanted):
                total += float(value)
        return total

    def evictions(self, code: int) -> float:
        """Karpenter's eviction requests answered `code` (pkg/controllers/node/termination/
        terminator/metrics.go: karpenter_nodes_eviction_requests_total{code})."""
        return self.metric("karpenter_nodes_eviction_requests_total", code=str(code))


def karpenter_job(
    name: str,
    replicas: int = 1,
    *,
    managed: bool = False,
    capacity_type: str | None = None,
    grace: int | None = None,
) -> Obj:
    """A PyTorchJob (support.pytorch_cluster) whose workers (1 GPU each) land on `gpu_pools`'
    nodes; `managed`: by the daemon under the `hold` policy; `capacity_type`: a nodeSelector on
    it; `grace`: the pods' terminationGracePeriodSeconds."""
    body = pytorch_job(
        name, POOL_VALUE, replicas=replicas, hi=replicas, policy="hold" if managed else None
    )
    spec = body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    if capacity_type:
        spec["nodeSelector"][CAPACITY_TYPE] = capacity_type
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return body


def condition(obj: Obj, kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def names_now(core: client.CoreV1Api) -> set[str]:
    return {n.metadata.name for n in core.list_node().items}


@pytest.fixture(scope="module")
def karpenter(training_operator: ControlPlane) -> Iterator[Karpenter]:
    """Karpenter on the session's plane (with training-operator) for one test module; stopped
    at the module's end, its NodePools and nodes removed first: it has no shutdown to wait for.
    kwok/main.go runs the operator on context.Background() (pkg/operator/operator.go
    `NewOperator`), with no signal handler, so SIGTERM ends it where it stands: exit by the
    signal, which is what the fixture checks (not a crash, not a hang)."""
    with Karpenter(training_operator, karpenter_bin_dir()) as k:
        yield k
    assert k.exit_code == -signal.SIGTERM, f"karpenter exited {k.exit_code}:\n{k.log()[-3000:]}"


@contextlib.contextmanager
def daemon_beside(karpenter: Karpenter, tmp: Path, namespace: str, config: str) -> Iterator[Path]:
    """`spot-autoscaler run` as deployed (support.real_daemon) for `namespace` with `config`;
    yields its logs' directory. It must still run at the end, exit 0 when stopped, and never
    have been forbidden anything."""
    api = karpenter.plane.api_client()
    with contextlib.suppress(ApiException):  # 409: made by an earlier test
        client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    try:
        with deployed(api, karpenter.plane, namespace, tmp, config) as proc:
            yield tmp
            assert proc.poll() is None, (tmp / "err.log").read_text()[-3000:]
        assert proc.returncode == 0, (tmp / "err.log").read_text()[-3000:]
        assert forbidden(tmp / "err.log") == []
    finally:
        api.close()


def remove_test_objects(cluster: Cluster) -> None:
    """A test's jobs and pods (an empty node drains at once), and the daemon's guards."""
    cluster.cleanup()
    policy = client.PolicyV1Api(cluster.api)
    for pdb in policy.list_namespaced_pod_disruption_budget(cluster.namespace).items:
        with contextlib.suppress(ApiException):
            policy.delete_namespaced_pod_disruption_budget(pdb.metadata.name, cluster.namespace)


# --- watching what happens, with the time each change was seen --------------------
@dataclass
class Seen:
    n: int  # its place in the recording: the order the server sent them
    at: float  # time.monotonic() when the event arrived
    type: str
    obj: Obj


class Recorder:
    """Every change one watch delivers after a list (whose items come first, as type LISTED),
    from a thread, each with the time it arrived. Watching from the list's resourceVersion, no
    change made after the constructor returns can be missed."""

    def __init__(self, list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.seen: list[Seen] = []
        self.error: Exception | None = None
        self._serializer = client.ApiClient()
        self._lock = threading.Lock()
        self._stopped = False
        self._watch = watch.Watch()
        listed = self._plain(list_call(*args, **kwargs))
        now = time.monotonic()
        self.seen = [
            Seen(i, now, "LISTED", item) for i, item in enumerate(listed.get("items") or [])
        ]
        kwargs = {**kwargs, "resource_version": listed["metadata"]["resourceVersion"]}
        stream = self._watch.stream(list_call, *args, timeout_seconds=600, **kwargs)
        threading.Thread(target=self._run, args=(stream,), daemon=True).start()

    def _plain(self, obj: Any) -> Obj:
        plain: Obj = (
            obj if isinstance(obj, dict) else self._serializer.sanitize_for_serialization(obj)
        )
        return plain

    def _run(self, stream: Iterator[Obj]) -> None:
        try:
            for event in stream:
                obj = self._plain(event["object"])
                with self._lock:
                    self.seen.append(Seen(len(self.seen), time.monotonic(), event["type"], obj))
        except Exception as e:  # a broken watch would leave changes out: the caller must know
            if not self._stopped:
                self.error = e

    def first(self, predicate: Callable[[Seen], bool], after: float = 0.0) -> Seen | None:
        """The first change seen at or after `after` for which `predicate` holds."""
        assert self.error is None, f"the watch broke: {self.error!r}"
        with self._lock:
            return next((s for s in self.seen if s.at >= after and predicate(s)), None)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


@contextlib.contextmanager
def recording(list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Recorder]:
    recorder = Recorder(list_call, *args, **kwargs)
    try:
        yield recorder
    finally:
        recorder.stop()


# --- interruptions of a PyTorchJob's workers, measured --------------------
@dataclass
class Interruption:
    """One worker's node interrupted: what was seen when (monotonic seconds)."""

    pod: str
    node: str
    requested: float  # the NodeClaim's DELETE sent
    tainted: float  # the node's karpenter.sh/disrupted taint seen
    drained: float | None  # the job's drained-hosts annotation naming the pod seen
    deleting: float | None  # the pod's deletionTimestamp seen
    evicted: bool  # removed by the eviction API (DisruptionTarget: EvictionByEvictionAPI first)
    forced: bool  # deleted by Karpenter at its terminationGracePeriod (Event `Disrupted`)
    # an eviction that reached the pod after the daemon's DELETE: kwok made it not Ready, so the
    # guard's unhealthyPodEvictionPolicy AlwaysAllow let Karpenter's retried eviction through
    late_eviction: bool = False

    @property
    def graceful(self) -> bool:
        """Drained from discovery, then deleted by the daemon: no eviction, no forced delete."""
        return (
            not (self.evicted or self.forced)
            and self.drained is not None
            and self.deleting is not None
            and self.drained <= self.deleting
        )

    @property
    def hit_visible(self) -> bool:
        """An eviction reached the worker while discovery still showed it."""
        return self.evicted and (
            self.drained is None or self.deleting is None or self.drained > self.deleting
        )


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] if ordered else float("nan")


def summary(runs: Sequence[Interruption]) -> Obj:
    """The figures: graceful removals, evictions that hit a still-visible worker, forced
    deletes, and taint -> drain / taint -> delete latency (p50, p99, max; seconds)."""

    def spread(values: list[float]) -> Obj:
        return {
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": max(values, default=float("nan")),
        }

    return {
        "interruptions": len(runs),
        "graceful": sum(r.graceful for r in runs),
        "evicted_visible": sum(r.hit_visible for r in runs),
        "evicted": sum(r.evicted for r in runs),
        "late_evictions": sum(r.late_eviction for r in runs),
        "forced": sum(r.forced for r in runs),
        "claim_delete_to_taint": spread([r.tainted - r.requested for r in runs]),
        "taint_to_drain": spread([r.drained - r.tainted for r in runs if r.drained is not None]),
        "taint_to_delete": spread([r.deleting - r.tainted for r in runs if r.deleting is not None]),
    }


def has_eviction(pod: Obj) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def interrupt_worker(
    karpenter: Karpenter,
    cluster: Cluster,
    job: str,
    pod: str,
    workers: int,
    drained_annotation: str,
) -> Interruption:
    """Delete the NodeClaim under `pod` and record what follows until the job has `workers`
    Running again (the operator makes the pod again under its name; Karpenter launches a node
    for it) and the daemon shows the new pod to discovery again."""
    ns = cluster.namespace
    cluster.wait_settled(job, workers)
    before = cluster.workers(job)[pod]
    node, uid = before.spec.node_name, before.metadata.uid
    with (
        recording(karpenter.core.list_node, field_selector=f"metadata.name={node}") as nodes,
        recording(
            karpenter.core.list_namespaced_pod, ns, field_selector=f"metadata.name={pod}"
        ) as pods,
        recording(
            karpenter.custom.list_namespaced_custom_object,
            *cluster.resource[:2],
            ns,
            cluster.resource[2],
            field_selector=f"metadata.name={job}",
        ) as jobs,
    ):
        requested = karpenter.interrupt(node)
        mine = lambda s: s.obj["metadata"].get("uid") == uid  # noqa: E731
        wait_for(
            lambda: pods.first(lambda s: mine(s) and s.type == "DELETED"), SETTLE, f"{pod} gone"
        )
        cluster.wait_settled(job, workers)

        def shown_again() -> bool:
            value = (cluster.job(job)["metadata"].get("annotations") or {}).get(drained_annotation)
            return pod not in json.loads(value or "[]")

        wait_for(shown_again, SETTLE, f"{pod} shown to discovery again")
        taint = nodes.first(lambda s: tainted(s.obj))
        assert taint is not None, f"{node}: no {DISRUPTED} taint seen"
        drain = jobs.first(
            lambda s: (
                pod
                in json.loads(
                    (s.obj["metadata"].get("annotations") or {}).get(drained_annotation) or "[]"
                )
            ),
            after=requested,
        )
        deleting = pods.first(
            lambda s: mine(s) and bool(s.obj["metadata"].get("deletionTimestamp"))
        )
        evicted = pods.first(lambda s: mine(s) and has_eviction(s.obj))
        first = evicted is not None and (deleting is None or evicted.n <= deleting.n)
    forced = any(e.involved_object.uid == uid for e in karpenter.events(ns, "Disrupted"))
    return Interruption(
        pod=pod,
        node=node,
        requested=requested,
        tainted=taint.at,
        drained=drain.at if drain else None,
        deleting=deleting.at if deleting else None,
        evicted=first,
        forced=forced,
        late_eviction=evicted is not None and not first,
    )
