"""MPIJob end to end with the REAL mpi-operator (kubeflow/mpi-operator v0.8.2) on the real control
plane (support/control_plane.py): kube-apiserver, controller-manager, kube-scheduler and kwok GPU
nodes. Workers are bound by the real scheduler and run on kwok; the product acts through its own
code (the daemon `spot-autoscaler run` under the deploy/ ClusterRole's rules, or its cache,
observer, reconciler and actuator in-process); mpi-operator does what it does.

Upstream source read for every expectation: pkg/controller/mpi_job_controller.go at v0.8.2
(`caa3c47`), function named in each comment; docs/mpi-operator.md lists what differs from our
stand-in (support/mpi_operator.py) and from what the docs assumed.

Isolation in a session shared with other real-cluster tests: one namespace of our own, our nodes
carry a taint that only our pods tolerate and a pool label our pods select, and each test deletes
its MPIJob (the garbage collector takes its pods, Job, Service, ConfigMap and Secret) and its
nodes. Idle GPUs on other tests' nodes are still counted by the product, so every scale-out here
is bounded by the job's max annotation, and jobs that must not grow use a policy that never does.

mpi-operator serves health on :8080, hard-coded: one pytest session on the machine can run it at a
time; `mpi_operator` waits (bounded) while another holds the port.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_fixtures import Kube, now
from kubernetes import client, watch
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException
from support.control_plane import (
    MPI_OPERATOR_HEALTH_PORT,
    MPIJOB_CRD,
    ControlPlane,
    ControlPlaneError,
    port_in_use,
)
from support.mpi_operator import discover_hosts, hostfile, overlay_hosts
from support.real_api import RealApi
from support.real_daemon import deployed, forbidden, json_lines
from support.real_namespace import POOL, RealNamespace, daemon_config, isolated
from support.sidecar import sidecar_thread
from support.waiting import wait_for

from autoscaler.adapters.kube.kinds.jobref import JobRef
from autoscaler.adapters.kube.kinds.mpi_operator import MAX_ANNOTATION, MIN_ANNOTATION, MPI_JOBS
from autoscaler.adapters.kube.resources import MANAGER
from autoscaler.annotations import DRAINED_ANNOTATION, decode_drained
from autoscaler.config import parse_config
from autoscaler.core import Action, Decision, Reason
from autoscaler.reconcile import Reconciler

pytestmark = pytest.mark.real_cluster

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[1]
NS = "mpi-e2e"
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
ISOLATED = isolated(NS)
NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-1", "effect": "NoSchedule"}
WORKER_SELECTOR = "training.kubeflow.org/job-role=worker,training.kubeflow.org/job-name={}"
FINISH = "spot-autoscaler.test/finish"  # kwok_stages.yaml: a pod finishes only when told
OPERATOR_WAIT = 600.0  # another session's mpi-operator holds :8080 at most this long
SETTLE = 30.0  # the real plane on a shared 2-core machine: generous, never slept

# One config for the daemon and the in-process product: `grow` scales out at once, `hold` never
# grows (departures still apply). join_grace 0s: a worker counts as settled in Horovod as soon as
# it is Ready (there is no launcher reporting its assignment here).
CONFIG = daemon_config(NS)


# --- mpi-operator, once per module --------------------------------------------------------------
@pytest.fixture(scope="module")
def mpi_operator(control_plane: ControlPlane) -> ControlPlane:
    """The session's plane with mpi-operator running (started here unless a test module before
    did). Its health port is hard-coded (cmd/mpi-operator/app/server.go, healthCheckPort): while
    another session's operator holds it, wait for it to go, then start."""
    deadline = time.monotonic() + OPERATOR_WAIT
    while True:
        if "mpi-operator" in control_plane.processes or not port_in_use(MPI_OPERATOR_HEALTH_PORT):
            try:
                control_plane.start_mpi_operator()
                return _healthy(control_plane)
            except ControlPlaneError as e:
                if "in use" not in str(e) or time.monotonic() > deadline:
                    raise
        if time.monotonic() > deadline:
            pytest.fail(f"port {MPI_OPERATOR_HEALTH_PORT} stayed in use {OPERATOR_WAIT:.0f} s")
        wait_for(
            lambda: not port_in_use(MPI_OPERATOR_HEALTH_PORT),
            OPERATOR_WAIT,
            f"port {MPI_OPERATOR_HEALTH_PORT} free",
        )


def _healthy(plane: ControlPlane) -> ControlPlane:
    """mpi-operator up (started by an earlier module, it may have died since) and its CRD there
    (another module may have removed and reinstalled it)."""
    with contextlib.closing(plane.api_client()) as api:
        plane.apply_crd(api, MPIJOB_CRD, SETTLE)
    try:
        wait_for(lambda: plane.health().get("mpi-operator"), SETTLE, "mpi-operator healthy")
    except AssertionError as e:
        pytest.fail(f"{e}; its log:\n{plane.processes['mpi-operator'].tail()}")
    return plane


# --- a test's cluster: namespace, nodes, jobs; cleaned up after -------------------------------
@dataclass
class Cluster(RealNamespace):
    def replicas(self, name: str) -> int:
        return int(self.job(name)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])

    def drained(self, name: str) -> frozenset[str]:
        annotations = self.job(name)["metadata"].get("annotations") or {}
        return decode_drained(annotations.get(DRAINED_ANNOTATION))

    def workers(self, job: str) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(NS, label_selector=WORKER_SELECTOR.format(job))
        return sorted(pods.items, key=lambda p: p.metadata.name)

    def running(self, job: str) -> list[str]:
        """The worker pods whose phase is Running (Terminating ones too, as the operator counts)."""
        return [p.metadata.name for p in self.workers(job) if p.status.phase == "Running"]

    def config(self, job: str) -> dict[str, str]:
        try:
            cm = self.core.read_namespaced_config_map(f"{job}-config", NS)
        except ApiException as e:
            if e.status == 404:
                return {}
            raise
        return dict(cm.data or {})

    def script(self, job: str) -> str:
        return self.config(job).get("discover_hosts.sh", "")

    def condition(self, name: str, kind: str) -> bool:
        conditions = (self.job(name).get("status") or {}).get("conditions") or []
        return any(c["type"] == kind and c["status"] == "True" for c in conditions)

    def settled(self, job: str, count: int) -> bool:
        """`count` workers, all Running, the job Running and the operator's script listing them."""
        running = self.running(job)
        return (
            len(self.workers(job)) == count
            and len(running) == count
            and self.condition(job, "Running")
            and self.script(job) == discover_hosts(job, NS, running)
        )

    def wait_settled(self, job: str, count: int) -> None:
        wait_for(lambda: self.settled(job, count), SETTLE, f"{job}: {count} workers Running")

    def node_of(self, pod: str) -> str:
        return str(self.core.read_namespaced_pod(pod, NS).spec.node_name)

    def cleanup(self) -> None:
        for name in self.jobs:
            with contextlib.suppress(ApiException):
                self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, NS, PLURAL, name, propagation_policy="Background"
                )
        # The garbage collector would delete what the jobs owned, but it picks up a CRD installed
        # after its start only at its next discovery resync (up to 30 s later): the launcher Jobs
        # and the pods are deleted here (again, if mpi-operator had not seen its job go yet).
        batch = client.BatchV1Api(self.api)
        batch.delete_collection_namespaced_job(NS, propagation_policy="Background")

        def gone() -> bool:
            pods = self.core.list_namespaced_pod(NS).items
            for pod in pods:
                if not pod.metadata.deletion_timestamp:
                    with contextlib.suppress(ApiException):
                        self.core.delete_namespaced_pod(pod.metadata.name, NS)
            return not pods

        wait_for(gone, SETTLE, f"the pods of {NS} gone")
        for node in self.nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(node)


@pytest.fixture
def cluster(mpi_operator: ControlPlane) -> Iterator[Cluster]:
    api = mpi_operator.api_client()
    c = Cluster(mpi_operator, api, NS, (GROUP, VERSION, PLURAL))
    with contextlib.suppress(ApiException):  # 409: made by an earlier test
        c.core.create_namespace({"metadata": {"name": NS}})
    try:
        yield c
    finally:
        c.cleanup()
        api.close()


def mpi_job(
    name: str,
    pool: str,
    *,
    replicas: int,
    lo: int,
    hi: int,
    policy: str = "hold",
    slots: int = 1,
    **spec: Any,
) -> Obj:
    """An MPIJob managed by the product: its bounds in our annotations, one GPU per worker."""

    def template(gpus: int) -> Obj:
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        return {
            "spec": {
                "nodeSelector": {POOL: pool},
                "tolerations": [{**ISOLATED, "operator": "Equal"}],
                "containers": [
                    {"name": "main", "image": "example.invalid/horovod:1", "resources": resources}
                ],
            }
        }

    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MPIJob",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"spot-autoscaler.io/enabled": "true", "spot-autoscaler.io/policy": policy},
            "annotations": {MIN_ANNOTATION: str(lo), MAX_ANNOTATION: str(hi)},
        },
        "spec": {
            "slotsPerWorker": slots,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template(0)},
                "Worker": {"replicas": replicas, "template": template(1)},
            },
            **spec,
        },
    }


# --- recording every version of what a watch shows --------------------------------------------
@dataclass(frozen=True)
class Seen:
    rv: int  # the object's resourceVersion: one etcd, so revisions order writes across kinds
    type: str
    obj: Obj


class History:
    """Every version a watch delivers, from a thread; `ready()` once the initial list arrived."""

    def __init__(
        self, api: ApiClient, list_fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        self.seen: list[Seen] = []
        self.error: Exception | None = None
        self.stopped = False
        self._api = api
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(list_fn, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, list_fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        try:
            for event in self._watch.stream(list_fn, *args, timeout_seconds=120, **kwargs):
                obj = event.get("object") if isinstance(event, dict) else None
                if event.get("type") not in ("ADDED", "MODIFIED", "DELETED") or obj is None:
                    raise AssertionError(f"watch: {event.get('type')} {event.get('raw_object')}")
                if not isinstance(obj, dict):  # typed (pods): as JSON, like the custom objects
                    obj = self._api.sanitize_for_serialization(obj)
                self.seen.append(Seen(int(obj["metadata"]["resourceVersion"]), event["type"], obj))
        except Exception as e:  # a broken watch would leave versions out: the test must know
            if not self.stopped:
                self.error = e

    def ready(self) -> bool:
        return bool(self.seen)

    def stop(self) -> None:
        self.stopped = True
        self._watch.stop()

    def first(self, predicate: Callable[[Seen], bool]) -> Seen | None:
        assert self.error is None, f"the watch broke: {self.error!r}"
        return next((s for s in self.seen if predicate(s)), None)


def drained_in(seen: Seen) -> frozenset[str]:
    return decode_drained((seen.obj["metadata"].get("annotations") or {}).get(DRAINED_ANNOTATION))


def replicas_in(seen: Seen) -> int:
    return int(seen.obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])


def going(pod: str) -> Callable[[Seen], bool]:
    """The first sign of the pod's end: its deletionTimestamp, or its deletion."""
    return lambda s: (
        s.obj["metadata"]["name"] == pod
        and (s.type == "DELETED" or bool(s.obj["metadata"].get("deletionTimestamp")))
    )


@contextlib.contextmanager
def histories(cluster: Cluster, job: str) -> Iterator[tuple[History, History]]:
    """(the MPIJob's versions, its worker pods' versions), both watching before anything acts."""
    jobs = History(
        cluster.api,
        cluster.custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        PLURAL,
        field_selector=f"metadata.name={job}",
    )
    pods = History(
        cluster.api,
        cluster.core.list_namespaced_pod,
        NS,
        label_selector=WORKER_SELECTOR.format(job),
    )
    try:
        wait_for(lambda: jobs.ready() and pods.ready(), SETTLE, "the watches' initial lists")
        yield jobs, pods
    finally:
        jobs.stop()
        pods.stop()


def assert_drained_before_it_went(jobs: History, pods: History, victim: str, to: int) -> None:
    """The host was hidden (drained-hosts annotation) before mpi-operator was asked to delete the
    pod (replicas lowered), and the pod went only after that (getOrCreateWorker deletes index >=
    replicas). resourceVersions come from one etcd: they order writes to different objects."""
    gone = wait_for(lambda: pods.first(going(victim)), SETTLE, f"{victim} deleted")
    lowered = wait_for(lambda: jobs.first(lambda s: replicas_in(s) <= to), SETTLE, "the patch")
    drained = jobs.first(lambda s: victim in drained_in(s))
    story = [(s.rv, s.type, replicas_in(s), sorted(drained_in(s))) for s in jobs.seen]
    assert drained is not None and lowered is not None, f"no drain or no patch seen: {story}"
    assert victim in drained_in(lowered)  # the version that lowered replicas still hides it
    assert drained.rv <= lowered.rv < gone.rv


# --- the product in-process: cache, observer, reconciler, actuator over the real API -------------
@dataclass
class Product:
    kube: Kube
    reconciler: Reconciler
    decisions: list[Decision] = field(default_factory=list)

    def until(self, done: Callable[[list[Decision]], bool], what: str) -> list[Decision]:
        """Passes (each after the cache saw a change, or 1 s) until `done(all decisions)`."""
        deadline = time.monotonic() + SETTLE
        while True:
            woken = len(self.kube.wakes)
            self.decisions += self.reconciler.tick(now())
            assert self.reconciler.errors == 0
            if done(self.decisions):
                return self.decisions
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {SETTLE}s waiting for {what}")
            with contextlib.suppress(AssertionError):
                wait_for(lambda w=woken: len(self.kube.wakes) > w, 1.0, "a change")

    def acted(self) -> list[tuple[Action, tuple[str, ...]]]:
        return [(d.action, d.pods) for d in self.decisions if d.action is not Action.NOOP]


@pytest.fixture
def product(cluster: Cluster) -> Iterator[Product]:
    real = RealApi(cluster.plane, NS)
    kube = Kube(real, parse_config(CONFIG))  # type: ignore[arg-type]
    try:
        yield Product(kube, kube.reconciler())
    finally:
        kube.close()
        real.close()


def script_output(tmp_path: Path, base_script: str, drained: str = "", slots: int = 1) -> str:
    """`overlay_hosts` over the operator's script `base_script`, with `drained` as the drain file
    (the last one kept when empty) and no cache left from before."""
    base = tmp_path / "etc-mpi-discover_hosts.sh"
    base.write_text(base_script)
    drain_file = tmp_path / "drained-hosts"
    if drained or not drain_file.exists():
        drain_file.write_text(drained)
    for stale in tmp_path.glob("last-hosts*"):
        stale.unlink()
    return overlay_hosts(base, tmp_path, slots)


# --- the tests ------------------------------------------------------------------------------------
def test_workers_run_on_kwok_gpu_nodes_and_the_operators_discovery_is_what_ours_reads(
    cluster: Cluster, product: Product, tmp_path: Path
) -> None:
    nodes = cluster.add_nodes("disc", 2, gpus=1)
    cluster.create(mpi_job("disc", "disc", replicas=2, lo=1, hi=2, slots=2))
    cluster.wait_settled("disc", 2)

    # the real scheduler bound one worker per 1-GPU node; kwok runs them
    workers = cluster.workers("disc")
    assert sorted(p.spec.node_name for p in workers) == nodes
    for i, pod in enumerate(workers):
        assert pod.metadata.name == f"disc-worker-{i}"  # workerName
        labels = pod.metadata.labels
        assert labels["training.kubeflow.org/replica-index"] == str(i)  # newWorker
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("MPIJob", "disc", True)
        scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
        assert scheduled.status == "True"
        assert pod.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
        # newWorker: hostname/subdomain make <pod>.<job>.<ns>.svc resolve (headless Service)
        assert (pod.spec.hostname, pod.spec.subdomain) == (pod.metadata.name, "disc")
        assert pod.spec.restart_policy == "Never"  # v2beta1 default for Worker (constants.go)

    # getOrCreateConfigMap + updateDiscoverHostsInConfigMap: discover_hosts.sh lists Running
    # workers without slots, sorted by name; hostfile lists every index with slots, whatever runs
    data = cluster.config("disc")
    assert data["discover_hosts.sh"] == (
        "#!/bin/sh\necho disc-worker-0.disc.mpi-e2e.svc\necho disc-worker-1.disc.mpi-e2e.svc\n"
    )
    assert data["hostfile"] == (
        "disc-worker-0.disc.mpi-e2e.svc slots=2\ndisc-worker-1.disc.mpi-e2e.svc slots=2\n"
    )
    assert data["hostfile"] == hostfile("disc", NS, 2, slots=2)  # the stand-in writes the same
    cm = cluster.core.read_namespaced_config_map("disc-config", NS)
    assert [(o.kind, o.name) for o in cm.metadata.owner_references] == [("MPIJob", "disc")]

    # newLauncherPodTemplate: the launcher mounts it at /etc/mpi, the script executable (0555):
    # what SPOT_BASE_SCRIPT=/etc/mpi/discover_hosts.sh in deploy/mpijob-example.yaml relies on
    launcher = client.BatchV1Api(cluster.api).read_namespaced_job("disc-launcher", NS)
    spec = launcher.spec.template.spec
    [volume] = [v for v in spec.volumes if v.config_map is not None]
    assert volume.config_map.name == "disc-config"
    assert {(i.key, i.mode) for i in volume.config_map.items} == {
        ("hostfile", 0o444),
        ("discover_hosts.sh", 0o555),
    }
    mounts = {m.name: m.mount_path for m in spec.containers[0].volume_mounts}
    assert mounts[volume.name] == "/etc/mpi"

    # the product reads the job: bounds from our annotations, hosts = pod names = the first DNS
    # label of each line the operator's script echoes
    [job] = [j for j in product.kube.observer(product.kube.cache()).snapshot(now()).jobs]
    assert (job.name, job.backend, job.min_workers, job.max_workers, job.running) == (
        "disc",
        "mpi-operator",
        1,
        2,
        True,
    )
    assert [(w.pod, w.host, w.index, w.node, w.pending) for w in job.workers] == [
        (p.metadata.name, p.metadata.name, i, p.spec.node_name, False)
        for i, p in enumerate(workers)
    ]
    echoed = [line.split()[1].split(".")[0] for line in data["discover_hosts.sh"].splitlines()[1:]]
    assert echoed == [w.host for w in job.workers]

    # our script over the operator's: slots added (the operator's script has none), a drained
    # host hidden by its pod name
    assert script_output(tmp_path, data["discover_hosts.sh"], slots=2) == (
        "disc-worker-0.disc.mpi-e2e.svc:2\ndisc-worker-1.disc.mpi-e2e.svc:2\n"
    )
    assert script_output(tmp_path, data["discover_hosts.sh"], "disc-worker-1\n", slots=2) == (
        "disc-worker-0.disc.mpi-e2e.svc:2\n"
    )


def test_the_launcher_job_runs_until_told_and_its_success_ends_the_job(
    cluster: Cluster, product: Product
) -> None:
    """The launcher is a batch/v1 Job (newLauncherJob) created at start-up (default
    launcherCreationPolicy AtStartup); kwok keeps its pod Running until it is annotated to finish
    (kwok_stages.yaml). Its success makes the MPIJob Succeeded (updateMPIJobStatus) and the
    product stops managing the job; the workers keep running (default cleanPodPolicy None)."""
    cluster.add_nodes("launch", 1, gpus=2)
    cluster.create(mpi_job("launch", "launch", replicas=1, lo=1, hi=2, policy="grow"))
    cluster.wait_settled("launch", 1)
    batch = client.BatchV1Api(cluster.api)
    launcher = batch.read_namespaced_job("launch-launcher", NS)
    [owner] = launcher.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == ("MPIJob", "launch", True)
    assert launcher.spec.pod_replacement_policy == "Failed"  # newLauncherJob
    pods = cluster.core.list_namespaced_pod(NS, label_selector="job-name=launch-launcher").items
    [pod] = pods
    assert pod.status.phase == "Running"
    assert pod.metadata.labels["training.kubeflow.org/job-role"] == "launcher"
    assert launcher.status.active == 1

    # the product sees a Running job with room to grow (one idle GPU), and grows it within max
    product.until(lambda ds: (Action.SCALE_OUT, ()) in product.acted(), "a scale-out")
    assert cluster.replicas("launch") == 2
    cluster.wait_settled("launch", 2)

    cluster.core.patch_namespaced_pod(
        pod.metadata.name, NS, {"metadata": {"annotations": {FINISH: "succeed"}}}
    )
    wait_for(lambda: cluster.condition("launch", "Succeeded"), SETTLE, "MPIJob Succeeded")
    conditions = {c["type"]: c["status"] for c in cluster.job("launch")["status"]["conditions"]}
    assert conditions["Running"] == "False"  # filterOutCondition on Succeeded
    snapshot = product.kube.observer(product.kube.cache()).snapshot(now())
    assert "launch" not in {j.name for j in snapshot.jobs}  # finished: nothing to scale
    assert cluster.running("launch") == ["launch-worker-0", "launch-worker-1"]  # still holding


def test_the_daemon_grows_to_max_and_a_clamp_drains_then_mpi_operator_deletes_the_top(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`spot-autoscaler run` under deploy/rbac.yaml's rules (a ServiceAccount token): idle GPUs
    raise Worker.replicas up to the max annotation; a lower max drains the highest index, then
    lowers replicas, and mpi-operator deletes that pod itself (getOrCreateWorker)."""
    cluster.add_nodes("grow", 2, gpus=2)
    cluster.create(mpi_job("grow", "grow", replicas=1, lo=1, hi=3, policy="grow"))
    cluster.wait_settled("grow", 1)
    with deployed(cluster.api, cluster.plane, NS, tmp_path, CONFIG) as proc:
        # 4 idle GPUs on our nodes (and maybe more elsewhere): max 3 bounds it
        wait_for(lambda: cluster.replicas("grow") == 3, SETTLE, "replicas raised to 3")
        cluster.wait_settled("grow", 3)
        kept = {p.metadata.name: p.metadata.uid for p in cluster.workers("grow")[:2]}
        with histories(cluster, "grow") as (jobs, pods):
            cluster.patch_job("grow", {"metadata": {"annotations": {MAX_ANNOTATION: "2"}}})
            assert_drained_before_it_went(jobs, pods, "grow-worker-2", to=2)
        cluster.wait_settled("grow", 2)
        assert {p.metadata.name: p.metadata.uid for p in cluster.workers("grow")} == kept
        assert cluster.replicas("grow") == 2
        # the host of a pod that is gone is shown again (nothing left to hide)
        wait_for(lambda: not cluster.drained("grow"), SETTLE, "the drain lifted")
        assert proc.poll() is None
    assert proc.returncode == 0, (tmp_path / "err.log").read_text()[-3000:]
    decisions = [
        (d["action"], d["from_workers"], d["to_workers"], d["reason"], d["pods"])
        for d in json_lines(tmp_path / "out.log")
        if d.get("event") == "decision" and d["action"] != "noop"
    ]
    assert decisions[0] == ("scale_out", 1, 3, "idle_capacity", [])
    assert ("drain", 3, 2, "clamp_max", ["grow-worker-2"]) in decisions
    assert ("scale_in", 3, 2, "clamp_max", ["grow-worker-2"]) in decisions
    assert decisions.index(("drain", 3, 2, "clamp_max", ["grow-worker-2"])) < decisions.index(
        ("scale_in", 3, 2, "clamp_max", ["grow-worker-2"])
    )
    assert forbidden(tmp_path / "err.log") == []  # deploy/rbac.yaml's verbs were enough
    reasons = [
        e.reason
        for e in cluster.core.list_namespaced_event(NS).items
        if e.involved_object.name == "grow" and e.reporting_component == MANAGER
    ]
    assert {"ScaleOutRequested", "HostsDrained", "ScaleInRequested"} <= set(reasons)


def test_a_notice_on_the_top_workers_node_drains_it_then_mpi_operator_deletes_it(
    cluster: Cluster, product: Product, tmp_path: Path
) -> None:
    nodes = cluster.add_nodes("top", 3, gpus=1)
    cluster.create(mpi_job("top", "top", replicas=3, lo=1, hi=3))
    cluster.wait_settled("top", 3)
    before = cluster.script("top")  # what the launcher keeps reading until the kubelet syncs
    doomed = cluster.node_of("top-worker-2")
    assert doomed in nodes
    kept = {p.metadata.name: p.metadata.uid for p in cluster.workers("top")[:2]}

    stop = threading.Event()
    # the launcher's sidecar: the annotation -> the drain file
    sidecar = sidecar_thread(
        cluster.api, JobRef(NS, "top", MPI_JOBS), tmp_path / "drained-hosts", stop
    )
    sidecar.start()
    try:
        with histories(cluster, "top") as (jobs, pods):
            cluster.taint(doomed, NTH_ITN)
            product.until(
                lambda ds: any(d.action is Action.SCALE_IN for d in ds), "drain and scale-in"
            )
            assert product.acted() == [
                (Action.DRAIN, ("top-worker-2",)),
                (Action.SCALE_IN, ("top-worker-2",)),
            ]
            assert {d.reason for d in product.decisions if d.action is Action.SCALE_IN} == {
                Reason.PREEMPTION_NOTICE
            }
            assert_drained_before_it_went(jobs, pods, "top-worker-2", to=2)
        # the launcher hid the host from Horovod while the operator's script still listed it
        wait_for(
            lambda: "top-worker-2" in (tmp_path / "drained-hosts").read_text(),
            SETTLE,
            "the sidecar's drain file",
        )
        assert "top-worker-2" in before
        assert script_output(tmp_path, before) == (
            "top-worker-0.top.mpi-e2e.svc:1\ntop-worker-1.top.mpi-e2e.svc:1\n"
        )
    finally:
        stop.set()
    cluster.wait_settled("top", 2)
    assert {p.metadata.name: p.metadata.uid for p in cluster.workers("top")} == kept
    assert cluster.replicas("top") == 2
    # its pod gone, nothing is left to hide: the annotation is cleared
    product.until(lambda ds: any(d.action is Action.UNDRAIN for d in ds), "the undrain")
    [undrain] = [d for d in product.decisions if d.action is Action.UNDRAIN]
    assert (undrain.hosts, undrain.reason) == (("top-worker-2",), Reason.HOST_GONE)
    assert cluster.drained("top") == frozenset()


def test_a_noticed_worker_in_the_middle_is_drained_and_comes_back_under_its_name(
    cluster: Cluster, product: Product
) -> None:
    """Lowering replicas would delete the healthy top worker: the middle one is only drained.
    When its node goes (pod deleted, node deleted), mpi-operator makes the pod again under the
    same name (getOrCreateWorker); once it runs on the spare node the host is shown again."""
    nodes = cluster.add_nodes("mid", 4, gpus=1)
    cluster.create(mpi_job("mid", "mid", replicas=3, lo=1, hi=3))
    cluster.wait_settled("mid", 3)
    doomed = cluster.node_of("mid-worker-1")
    old_uid = cluster.core.read_namespaced_pod("mid-worker-1", NS).metadata.uid
    cluster.taint(doomed, NTH_ITN)
    product.until(lambda ds: (Action.DRAIN, ("mid-worker-1",)) in product.acted(), "the drain")
    assert not [d for d in product.decisions if d.action is Action.SCALE_IN]
    assert cluster.drained("mid") == {"mid-worker-1"} and cluster.replicas("mid") == 3

    # the reclaim: the pod dies with its node
    cluster.core.delete_namespaced_pod("mid-worker-1", NS, grace_period_seconds=0)
    cluster.core.delete_node(doomed)

    def back() -> bool:
        pod = next((p for p in cluster.workers("mid") if p.metadata.name == "mid-worker-1"), None)
        return pod is not None and pod.metadata.uid != old_uid and pod.status.phase == "Running"

    wait_for(back, SETTLE, "mid-worker-1 made again and Running")
    (spare,) = set(nodes) - {cluster.node_of(f"mid-worker-{i}") for i in (0, 2)} - {doomed}
    assert cluster.node_of("mid-worker-1") == spare
    product.until(lambda ds: not cluster.drained("mid"), "the host shown again")
    cluster.wait_settled("mid", 3)
    assert cluster.replicas("mid") == 3
    assert not [d for d in product.decisions if d.action is Action.SCALE_IN]


def test_with_the_launcher_as_a_worker_lowering_replicas_deletes_a_healthy_worker_too(
    cluster: Cluster, product: Product
) -> None:
    """runLauncherAsWorker: worker i is labelled replica-index i + 1 (workerReplicaIndexLabel)
    but getOrCreateWorker deletes every label >= replicas: lowering 3 -> 2 deletes worker-1 as
    well as worker-2, and a later sync makes worker-1 again. The product never scales such a job
    in (`launcher_as_worker`)."""
    cluster.add_nodes("law", 3, gpus=1)
    cluster.create(mpi_job("law", "law", replicas=3, lo=1, hi=3, runLauncherAsWorker=True))
    workers = [f"law-worker-{i}" for i in range(3)]
    wait_for(
        lambda: (
            cluster.running("law") == workers
            and cluster.script("law") == discover_hosts("law", NS, workers, launcher_too=True)
        ),
        SETTLE,
        "3 workers Running, listed after the launcher (updateDiscoverHostsInConfigMap)",
    )
    assert cluster.script("law").splitlines()[1] == "echo law-launcher.law.mpi-e2e.svc"
    labels = [
        p.metadata.labels["training.kubeflow.org/replica-index"] for p in cluster.workers("law")
    ]
    assert labels == ["1", "2", "3"]
    assert cluster.config("law")["hostfile"] == hostfile("law", NS, 3, 1, launcher_too=True)
    assert cluster.config("law")["hostfile"].startswith("law-launcher.law.mpi-e2e.svc slots=1\n")

    top = Decision(
        "mpi-e2e/law",
        Action.SCALE_IN,
        Reason.PREEMPTION_NOTICE,
        "hold",
        3,
        2,
        count=1,
        pods=("law-worker-2",),
    )
    product.kube.actuator(product.kube.cache()).apply(top, now())
    assert cluster.replicas("law") == 3  # refused: launcher_as_worker

    uid = cluster.core.read_namespaced_pod("law-worker-1", NS).metadata.uid
    with histories(cluster, "law") as (_, pods):
        cluster.patch_job("law", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2}}}})
        wait_for(lambda: pods.first(going("law-worker-2")), SETTLE, "law-worker-2 deleted")
        wait_for(lambda: pods.first(going("law-worker-1")), SETTLE, "law-worker-1 deleted")

    def remade() -> bool:
        now_running = {p.metadata.name: p.metadata.uid for p in cluster.workers("law")}
        return set(now_running) == {"law-worker-0", "law-worker-1"} and (
            now_running["law-worker-1"] != uid and cluster.running("law") == workers[:2]
        )

    wait_for(remade, SETTLE, "law-worker-1 made again")


def test_a_worker_pod_that_failed_stays_dead_and_the_job_grows_around_it(
    cluster: Cluster, product: Product
) -> None:
    """A worker pod that ended is never made again while it exists (getOrCreateWorker finds it
    by name); the operator counts it in status.replicaStatuses.Worker.failed (updateMPIJobStatus)
    and leaves it out of discover_hosts.sh. The product took the gap for a scale-out in flight
    and froze the job (no growth, no clamp); now it counts the dead index and grows around it."""
    cluster.add_nodes("dead", 3, gpus=1)
    cluster.create(mpi_job("dead", "dead", replicas=3, lo=1, hi=3, policy="grow"))
    cluster.wait_settled("dead", 3)
    uid = cluster.core.read_namespaced_pod("dead-worker-1", NS).metadata.uid
    freed = cluster.node_of("dead-worker-1")
    cluster.core.patch_namespaced_pod(
        "dead-worker-1", NS, {"metadata": {"annotations": {FINISH: "fail"}}}
    )

    def counted() -> bool:
        status = cluster.job("dead")["status"]["replicaStatuses"]["Worker"]
        return bool(status == {"active": 2, "failed": 1})

    wait_for(counted, SETTLE, "the failed worker counted by mpi-operator")
    # seen once (a quiet run): the status counted it while the script still listed it; wait
    left = discover_hosts("dead", NS, ["dead-worker-0", "dead-worker-2"])
    wait_for(lambda: cluster.script("dead") == left, SETTLE, "discover_hosts.sh without it")

    # its GPU is free again (an ended pod holds nothing): one live worker more, up to max 3
    product.until(lambda ds: any(d.action is Action.SCALE_OUT for d in ds), "a scale-out")
    [out] = [d for d in product.decisions if d.action is Action.SCALE_OUT]
    assert (out.from_workers, out.to_workers) == (2, 3)
    assert cluster.replicas("dead") == 4  # 3 live + the dead index
    wait_for(
        lambda: cluster.running("dead") == ["dead-worker-0", "dead-worker-2", "dead-worker-3"],
        SETTLE,
        "dead-worker-3 Running",
    )
    assert cluster.node_of("dead-worker-3") == freed
    dead = cluster.core.read_namespaced_pod("dead-worker-1", NS)
    assert (dead.metadata.uid, dead.status.phase) == (uid, "Failed")  # never made again
    wait_for(
        lambda: (
            cluster.script("dead")
            == discover_hosts("dead", NS, ["dead-worker-0", "dead-worker-2", "dead-worker-3"])
        ),
        SETTLE,
        "the new worker listed",
    )
    # the pass after: nothing in flight, nothing more to do (at max)
    last = product.until(lambda ds: ds[-1].reason is not Reason.SCALER_IN_FLIGHT, "settled")[-1]
    assert (last.action, last.from_workers) == (Action.NOOP, 3), last
    assert [d.action for d in product.decisions].count(Action.SCALE_OUT) == 1


# --- the daemon under deploy/rbac.yaml's rules ------------------------------------------------
