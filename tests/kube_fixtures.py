"""Builders for Kubernetes objects and a wired adapter (cache, observer, actuator) over the API
emulator: the official client talks real HTTP to `tests.support.kube_api.KubeApiServer`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from kubernetes.client import ApiClient
from support.kube_api import KubeApiServer
from support.real_api import RealApi

from autoscaler.adapters.kube import EventRecorder, KubeActuator, KubeCache, KubeObserver
from autoscaler.adapters.kube.kinds import WATCHLIST
from autoscaler.adapters.kube.rejects import Rejections
from autoscaler.adapters.kube.resources import MANAGER
from autoscaler.config import Config, Prices
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.policy import Policy, ScaleOutRules
from autoscaler.notices_and_prices import NoticeBoard, NoticeWake, PriceBook, WakeReason
from autoscaler.reconcile import Reconciler

Obj = dict[str, Any]
CRDS = Path(__file__).resolve().parent / "support" / "crds"
NS = "ml"
ET_API = "kai.alibabacloud.com/v1alpha1"
CCE_API = "kongming.cce.baiudbce.com/v1"
GPU = "nvidia.com/gpu"


def now() -> datetime:
    return datetime.now(UTC)


def stamp(at: datetime | None = None) -> str:
    return (at or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- object builders ---------------------------------------------------------------------------
def node(
    name: str,
    gpus: float = 8,
    *,
    labels: dict[str, str] | None = None,
    taints: list[Obj] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    annotations: dict[str, str] | None = None,
    conditions: list[Obj] | None = None,
    allocatable: dict[str, Any] | None = None,
    provider_id: str = "",
) -> Obj:
    base_labels = {
        "karpenter.sh/capacity-type": "spot",
        "node.kubernetes.io/instance-type": "p3.16xlarge",
        "topology.kubernetes.io/zone": "us-east-1a",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**base_labels, **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {
            "unschedulable": unschedulable,
            "taints": taints or [],
            **({"providerID": provider_id} if provider_id else {}),
        },
        "status": {
            "allocatable": {"cpu": "64", GPU: str(gpus), **(allocatable or {})},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastHeartbeatTime": stamp(),
                },
                *(conditions or []),
            ],
        },
    }


def container(
    gpus: float = 0, *, limits_only: bool = True, name: str = "main", **extra: Any
) -> Obj:
    resources: Obj = {"limits": {GPU: str(gpus)}} if gpus else {}
    if gpus and not limits_only:
        resources["requests"] = {GPU: str(gpus)}
    return {"name": name, "image": "trainer", "resources": resources, **extra}


def pod(
    name: str,
    node_name: str | None,
    gpus: float = 1,
    *,
    phase: str = "Running",
    namespace: str = NS,
    labels: dict[str, str] | None = None,
    owner: Obj | None = None,
    containers: list[Obj] | None = None,
    init_containers: list[Obj] | None = None,
    overhead: dict[str, str] | None = None,
) -> Obj:
    spec: Obj = {"containers": containers if containers is not None else [container(gpus)]}
    if node_name:
        spec["nodeName"] = node_name
    if init_containers:
        spec["initContainers"] = init_containers
    if overhead:
        spec["overhead"] = overhead
    meta: Obj = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase},
    }


def worker(
    job: str,
    index: int,
    node_name: str | None,
    phase: str = "Running",
    gpus: float = 1,
    namespace: str = NS,
) -> Obj:
    """An et-operator worker pod, labelled the way the operator labels them."""
    labels = {
        "group-name": "kai.alibabacloud.com",
        "training-job-name": job,
        "training-job-role": "worker",
        "replica-index": str(index),
    }
    owner = {
        "apiVersion": ET_API,
        "kind": "TrainingJob",
        "name": job,
        "uid": "u",
        "controller": True,
    }
    return pod(
        f"{job}-worker-{index}",
        node_name,
        gpus,
        phase=phase,
        namespace=namespace,
        labels=labels,
        owner=owner,
    )


def training_job(
    name: str,
    *,
    min_workers: int | None = 1,
    max_workers: int | None = 4,
    replicas: int = 2,
    gpus: float = 1,
    phase: str = "Running",
    namespace: str = NS,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    current_scaler: str = "",
    slots: int | None = None,
) -> Obj:
    template = {"spec": {"containers": [container(gpus)]}}
    worker_spec: Obj = {"replicas": replicas, "template": template}
    if min_workers is not None:
        worker_spec["minReplicas"] = min_workers
    if max_workers is not None:
        worker_spec["maxReplicas"] = max_workers
    spec: Obj = {"etReplicaSpecs": {"launcher": {"replicas": 1}, "worker": worker_spec}}
    if slots is not None:
        spec["slotsPerWorker"] = slots
    return {
        "apiVersion": ET_API,
        "kind": "TrainingJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
        # conditions, replicaStatuses and restartCount are required by et-operator's CRD
        "status": {
            "phase": phase,
            "currentScaler": current_scaler,
            "conditions": [],
            "replicaStatuses": {},
            "restartCount": 0,
        },
    }


def scaler(
    kind: str,
    name: str,
    job: str,
    *,
    outcome: str | None = None,
    at: datetime | None = None,
    pods: list[str] | None = None,
    namespace: str = NS,
) -> Obj:
    """A ScaleOut/ScaleIn; `outcome` ScaleSucceeded/ScaleFailed finishes it at `at`."""
    conditions = [{"type": "Created", "status": "True", "lastTransitionTime": stamp(at)}]
    if outcome:
        conditions.append({"type": outcome, "status": "True", "lastTransitionTime": stamp(at)})
    spec: Obj = {"selector": {"name": job}}
    if kind == "ScaleIn":
        spec["toDelete"] = {"podNames": pods or []}
    else:
        spec["toAdd"] = {"count": len(pods or []) or 1}
    meta: Obj = {"name": name, "namespace": namespace}
    if at is not None:
        meta["creationTimestamp"] = stamp(at)
    return {
        "apiVersion": ET_API,
        "kind": kind,
        "metadata": meta,
        "spec": spec,
        "status": {"conditions": conditions, "replicaStatuses": {}, "restartCount": 0},
    }


def ai_training_job(
    name: str,
    *,
    replicas: int = 2,
    min_workers: int = 1,
    max_workers: int = 4,
    phase: str = "Running",
    fault_tolerant: bool = True,
    namespace: str = NS,
) -> Obj:
    trainer = {
        "replicas": replicas,
        "minReplicas": min_workers,
        "maxReplicas": max_workers,
        "template": {"spec": {"containers": [container(1)]}},
    }
    return {
        "apiVersion": CCE_API,
        "kind": "AITrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "faultTolerant": fault_tolerant,
            "frameworkType": "horovod",
            "replicaSpecs": {"launcher": {"replicas": 1}, "trainer": trainer},
        },
        "status": {"phase": phase},
    }


def trainer(job: str, index: int, node_name: str | None, namespace: str = NS) -> Obj:
    owner = {
        "apiVersion": CCE_API,
        "kind": "AITrainingJob",
        "name": job,
        "uid": "u",
        "controller": True,
    }
    return pod(f"{job}-trainer-{index}", node_name, 1, namespace=namespace, owner=owner)


# --- a wired adapter -----------------------------------------------------------------------------
FAST = Policy(
    name="default", scale_out=ScaleOutRules(min_idle=0, cooldown=0, timeout=90, backoff=600)
)


@dataclass
class Kube:
    server: KubeApiServer
    config: Config
    board: NoticeBoard = field(default_factory=NoticeBoard)
    price_book: PriceBook = field(default_factory=PriceBook)
    rejections: Rejections = field(default_factory=Rejections)  # shared, as the wiring does
    wakes: list[str] = field(default_factory=list)  # as text; a notice wake as "notice: <text>"
    clients: list[ApiClient] = field(default_factory=list)
    caches: list[KubeCache] = field(default_factory=list)
    recorders: list[EventRecorder] = field(default_factory=list)

    @property
    def settings(self) -> KubernetesSettings:
        return self.config.kubernetes

    def _woke(self, reason: WakeReason) -> None:
        self.wakes.append(f"notice: {reason}" if isinstance(reason, NoticeWake) else reason)

    def cache(self, synced: bool = True, **kw: Any) -> KubeCache:
        """A new, started cache with its own ApiClient (as after a restart)."""
        api = self.server.api_client()
        self.clients.append(api)
        cache = KubeCache(api, self.settings, WATCHLIST, self._woke, backoff_min=0.05, **kw)
        cache.start()
        self.caches.append(cache)
        if synced:
            assert cache.wait_synced(5), "cache did not sync"
        return cache

    def observer(self, cache: KubeCache) -> KubeObserver:
        return KubeObserver(
            cache, self.settings, self.config.prices, self.board, self.price_book, self.rejections
        )

    def actuator(self, cache: KubeCache) -> KubeActuator:
        api = self.server.api_client()
        self.clients.append(api)
        recorder = EventRecorder(api)
        self.recorders.append(recorder)
        return KubeActuator(api, self.config, recorder, cache, self.rejections)

    def reconciler(self, cache: KubeCache | None = None, dry_run: bool = False) -> Reconciler:
        from autoscaler.adapters.kube import DryRunActuator

        cache = cache or self.cache()
        actuator = DryRunActuator() if dry_run else self.actuator(cache)
        return Reconciler(
            self.observer(cache), actuator, self.config.policy_set, structlog.get_logger()
        )

    def objects(self, kind: str) -> list[Obj]:
        return self.server.objects(kind, NS)

    def events(self, reason: str | None = None) -> list[Obj]:
        for recorder in self.recorders:  # Events are sent by a thread of their own
            assert recorder.flush(5), "Events not sent within 5 s"
        return [  # ours only: a real cluster's controllers write Events too
            e
            for e in self.server.objects("events")
            if e["metadata"]["namespace"] in (NS, "default")
            and reason in (None, e["reason"])
            and e.get("reportingComponent") == MANAGER
        ]

    def close(self) -> None:
        for cache in self.caches:
            cache.stop(timeout=2)
        for api in self.clients:
            api.close()


def make_config(**kubernetes: Any) -> Config:
    return Config(
        policies=[FAST],
        default_policy="default",
        prices=Prices(spot={"p3.16xlarge": 7.34}, on_demand={"p3.16xlarge": 24.48}),
        kubernetes=KubernetesSettings(**{"watch_timeout": 5, **kubernetes}),
    )


SERVERS = ("emulator", "real")
# installed once per session on the real server, as the emulator serves them from the start
SERVED_CRDS = tuple(
    CRDS / f"{name}.yaml"
    for name in (
        "kai.alibabacloud.com_trainingjobs",
        "kai.alibabacloud.com_scaleins",
        "kai.alibabacloud.com_scaleouts",
        "kongming.cce.baiudbce.com_aitrainingjobs",
    )
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`@pytest.mark.servers("emulator", "real")` runs a `kube` test on each server named."""
    marker = metafunc.definition.get_closest_marker("servers")
    if marker is not None and "kube" in metafunc.fixturenames:
        servers = [
            pytest.param(s, marks=pytest.mark.real_cluster) if s == "real" else s
            for s in marker.args or SERVERS
        ]
        metafunc.parametrize("server", servers, indirect=True)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> str:
    """Which API server `kube` runs on: the emulator unless `servers` says otherwise."""
    return str(getattr(request, "param", "emulator"))


@pytest.fixture(scope="session")
def real_api(control_plane: Any) -> Iterator[RealApi]:
    """The session's control plane through the emulator's test surface, CRDs installed."""
    api = RealApi(control_plane, NS)
    for crd in SERVED_CRDS:
        api.install_crd(crd)
    yield api
    api.close()


@pytest.fixture(name="kube")
def kube_fixture(request: pytest.FixtureRequest, server: str) -> Iterator[Kube]:
    """Emulator (or, with `servers`, the real control plane) + config;
    `@pytest.mark.parametrize("kube", [{...settings}], indirect=True)` sets kubernetes settings."""
    settings = getattr(request, "param", {})
    if server == "real":
        real: RealApi = request.getfixturevalue("real_api")
        real.reset()  # what other modules of the session left
        k = Kube(real, make_config(**settings))  # type: ignore[arg-type]
        try:
            yield k
        finally:
            k.close()
            real.reset()
        return
    with KubeApiServer() as emulator:
        k = Kube(emulator, make_config(**settings))
        try:
            yield k
        finally:
            k.close()
