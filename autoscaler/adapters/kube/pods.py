"""What a pod means to the autoscaler: the GPUs it holds on its node, and whose worker it is."""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kubernetes.utils.quantity import parse_quantity

from autoscaler.adapters.kube.resources import PODS, Obj, parse_time
from autoscaler.config.kubernetes import KubernetesSettings

if TYPE_CHECKING:
    from autoscaler.adapters.kube.view import CacheView

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})
# Pods in these phases hold no resources: the server-side filter of the pod watch.
NOT_TERMINATED_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"

# pod (metadata, name, labels) -> (backend, job name) if it is a job's worker
Recognise = Callable[[Obj, str, dict[str, str]], tuple[str, str] | None]
_INDEX_SUFFIX = re.compile(r"-(\d+)$")


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    node: str | None  # spec.nodeName: bound, even while Pending
    phase: str
    gpus: float  # effective request of whole-GPU resources
    gpu_memory: float  # effective request of shared-GPU memory (GiB)
    job: str | None  # `ns/name` of the elastic job this pod is a worker of
    backend: str | None  # the job's kind
    index: int
    ready_since: datetime | None  # Ready condition's transition, else the container's start
    terminating: bool = False  # metadata.deletionTimestamp set: Terminating for its grace period
    created_at: datetime | None = None  # metadata.creationTimestamp: when it was asked for


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("2", "500m", "16Gi") as a float; malformed counts as 0."""
    if value is None:
        return 0.0
    return _parsed(value) if isinstance(value, str) else _parse_or_zero(value)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> float:
    """The same few quantities come with every pod, and parse_quantity goes through Decimal: it
    was the larger part of reading a changed pod."""
    return _parse_or_zero(text)


def _parse_or_zero(value: Any) -> float:
    try:
        return float(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return 0.0


def _container_request(container: Obj, resource: str) -> float:
    # Extended resources are often given only as limits: requests then default to the limit.
    res = container.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    return quantity(requests[resource] if resource in requests else limits.get(resource))


def effective_request(spec: Obj, resource: str) -> float:
    """The scheduler's view of a pod's request: max(app containers + sidecars, the peak while init
    containers run), plus the pod overhead."""
    app = sum(_container_request(c, resource) for c in spec.get("containers") or ())
    sidecars = init_peak = 0.0
    for c in spec.get("initContainers") or ():
        amount = _container_request(c, resource)
        if c.get("restartPolicy") == "Always":  # a sidecar keeps running next to the app
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + amount)
    return max(app + sidecars, init_peak) + quantity((spec.get("overhead") or {}).get(resource))


def gpu_requests(spec: Obj, settings: KubernetesSettings) -> tuple[float, float]:
    """(whole GPUs, shared-GPU memory) a pod spec or template requests."""
    gpus = sum(effective_request(spec, r) for r in settings.gpu_resources)
    shared = settings.shared_gpu
    memory = effective_request(spec, shared.memory_resource) if shared else 0.0
    return gpus, memory


def name_index(name: str) -> int | None:
    """The replica index a worker's name ends with (`<job>-worker-<i>`), if any."""
    m = _INDEX_SUFFIX.search(name)
    return int(m.group(1)) if m else None


def _index(name: str, labels: dict[str, str]) -> int:
    if (index := name_index(name)) is not None:
        return index
    value = labels.get("replica-index", "")
    return int(value) if value.isdigit() else 0


# One float object per GPU count (a float is 24 bytes, two per pod; the counts are a handful).
_SHARED_FLOATS: dict[float, float] = {}


def pod_facts(pod: Obj, settings: KubernetesSettings, recognise: Recognise) -> PodFacts:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    labels = meta.get("labels") or {}
    gpus, memory = gpu_requests(spec, settings)
    worker = recognise(meta, name, labels)
    return PodFacts(
        namespace=namespace,
        name=name,
        node=spec.get("nodeName") or None,
        phase=str((pod.get("status") or {}).get("phase", "Pending")),
        gpus=_SHARED_FLOATS.setdefault(gpus, gpus),
        gpu_memory=_SHARED_FLOATS.setdefault(memory, memory),
        job=sys.intern(f"{namespace}/{worker[1]}") if worker else None,  # one string per job
        backend=worker[0] if worker else None,
        index=_index(name, labels),
        ready_since=_ready_since(pod.get("status") or {}),
        terminating=bool(meta.get("deletionTimestamp")),
        created_at=parse_time(meta.get("creationTimestamp")),
    )


def _ready_since(status: Obj) -> datetime | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    for c in status.get("containerStatuses") or ():
        started = parse_time(((c.get("state") or {}).get("running") or {}).get("startedAt"))
        if started is not None:
            return started
    return None


def pod_alive(cache: CacheView, namespace: str, pod: str) -> bool:
    """The pod exists and is not being deleted (no deletionTimestamp)."""
    obj = cache.get(PODS, f"{namespace}/{pod}")
    return obj is not None and not (obj.get("metadata") or {}).get("deletionTimestamp")


def pod_created(cache: CacheView, namespace: str, pod: str) -> datetime | None:
    obj = cache.get(PODS, f"{namespace}/{pod}")
    return parse_time((obj or {}).get("metadata", {}).get("creationTimestamp"))
