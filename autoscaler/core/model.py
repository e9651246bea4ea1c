"""What the decision core sees and says: plain, immutable data with no behaviour that does I/O.

Adapters build these from the cluster and the clouds; the core turns a `Snapshot` into `Decision`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class CapacityType(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class NoticeKind(StrEnum):
    INTERRUPTION = "interruption"  # the node will be reclaimed: hard
    REBALANCE = "rebalance"  # elevated risk: soft, policy decides
    STATE_CHANGE = "state-change"  # stopping/terminated: already going, hard
    MAINTENANCE = "maintenance"  # scheduled: hard once its deadline is near


class Action(StrEnum):
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    # delete a scaler of ours before the operator runs it (it could only do harm now)
    CANCEL = "cancel_scaler"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    NOOP = "noop"


class Reason(StrEnum):
    IDLE_CAPACITY = "idle_capacity"
    PREEMPTION_NOTICE = "preemption_notice"
    REBALANCE = "rebalance"
    MAINTENANCE = "maintenance"
    CLAMP_MAX = "clamp_max"
    CLAMP_MIN = "clamp_min"
    BELOW_MIN = "below_min"
    LAST_HOST_KEPT = "last_host_kept"
    COOLDOWN = "cooldown"
    MIN_IDLE = "min_idle"
    PRICE_CAP = "price_cap"
    BUDGET = "budget"
    QUANTUM = "quantum"
    SCALER_IN_FLIGHT = "scaler_in_flight"
    BACKOFF = "backoff"
    NO_CAPACITY = "no_capacity"
    JOB_NOT_RUNNING = "job_not_running"
    SCALE_OUT_DISABLED = "scale_out_disabled"
    NOTICE_WITHDRAWN = "notice_withdrawn"
    HOST_GONE = "host_gone"
    STEADY = "steady"
    BLACKLIST_RISK = "blacklist_risk"
    # a ScaleIn of ours names only pods that are gone: et-operator would delete EVERY worker
    VICTIMS_GONE = "victims_gone"
    SCALER_STUCK = "scaler_stuck"  # a scaler older than the policy's scalers.max_age


# Noops that need a person: applied once per episode (a Warning Event), not only logged.
ALERTS = frozenset({Reason.SCALER_STUCK})


class ScalerKind(StrEnum):
    SCALE_OUT = "ScaleOut"
    SCALE_IN = "ScaleIn"


@dataclass(frozen=True, slots=True)
class GpuNode:
    name: str
    gpus_allocatable: float
    gpus_requested: float
    capacity_type: CapacityType = CapacityType.SPOT
    price_per_hour: float | None = None  # whole node; None = unknown (a price cap then excludes it)
    schedulable: bool = True  # not cordoned, Ready, no disruption taint
    zone: str = ""
    instance_type: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    # an ACK shared-GPU node (GPU memory, not whole GPUs): only policies with
    # scale_out.shared_gpu place workers on it
    shared_gpu: bool = False

    @property
    def idle_gpus(self) -> float:
        return max(0.0, self.gpus_allocatable - self.gpus_requested)

    @property
    def price_per_gpu_hour(self) -> float | None:
        if self.price_per_hour is None or self.gpus_allocatable <= 0:
            return None
        return self.price_per_hour / self.gpus_allocatable


@dataclass(frozen=True, slots=True)
class Notice:
    node: str
    kind: NoticeKind
    source: str  # e.g. "aws-sqs", "alibaba-ecs", "k8s-taint", "simulator"
    id: str  # the source's event id: duplicates share it
    deadline: datetime | None = None  # when the node goes away, if known
    received_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Worker:
    pod: str
    node: str | None  # None while unscheduled
    host: str  # the name Horovod discovery knows it by (pod name, or node hostname standalone)
    index: int = 0
    pending: bool = False
    # when it started running; a new worker holds no training state until Horovod syncs it
    ready_since: datetime | None = None  # None: long enough ago / unknown
    # being deleted (evicted, NTH/Karpenter drain, a scaler): gone soon, whatever we decide
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class Scaler:
    kind: ScalerKind
    name: str
    created_at: datetime | None = None
    pods: tuple[str, ...] = ()
    ours: bool = False  # created by spot-autoscaler (we may delete it)
    # the operator has picked it up (a ScaleIn's victims are frozen): deleting it no longer helps
    started: bool = True


@dataclass(frozen=True, slots=True)
class Job:
    namespace: str
    name: str
    min_workers: int
    max_workers: int
    gpus_per_worker: float = 1.0
    backend: str = "et-operator"  # who scales it (an operator's name, or "standalone"): for logs
    # new workers may get the names of removed ones (et-operator and mpi-operator reuse indices):
    # a name Horovod saw fail stays blacklisted in the running job
    reuses_names: bool = False
    # its operator removes the highest indices when replicas drop (mpi-operator): a scale-in
    # cannot name a victim, so only doomed workers at the top can be scaled in
    removes_highest_first: bool = False
    workers: tuple[Worker, ...] = ()
    running: bool = True  # phase allows scalers (et-operator runs them only while Running)
    scaler: Scaler | None = None  # the outstanding scaler, if any
    priority: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    # last finished scale-out that grew the job: the cooldown clock (neither a forced scale-in nor
    # a refill back to min restarts it)
    last_scale_out_at: datetime | None = None
    last_failed_scale_out_at: datetime | None = None  # ScaleFailed / rollback: backoff
    drained_hosts: frozenset[str] = frozenset()  # hidden from this job's discovery now
    # hosts Horovod saw fail (lost while still in discovery): it blacklists them for the job's life
    failed_hosts: frozenset[str] = frozenset()
    # hosts the launcher runs Horovod worker processes on, i.e. in a rank assignment (published by
    # the discovery sidecar); None = not reported, fall back to preemption.join_grace
    assigned_hosts: frozenset[str] | None = None
    # the index the operator gives its next new worker (et-operator: highest in
    # status.targetWorkers + 1, which counts workers that are gone); None = after the live ones
    next_index: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def next_pod_names(self, count: int) -> tuple[str, ...]:
        """The names et-operator gives a ScaleOut's pods: fresh indices after the highest in use."""
        start = self.next_index
        if start is None:
            start = max((w.index for w in self.workers), default=-1) + 1
        return tuple(f"{self.name}-worker-{i}" for i in range(start, start + count))


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[GpuNode, ...] = ()
    notices: tuple[Notice, ...] = ()
    jobs: tuple[Job, ...] = ()
    # When each node's current idle GPUs were first seen idle (see core.idle.track_idle).
    idle_since: Mapping[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    job: str
    action: Action
    reason: Reason
    policy: str
    from_workers: int
    to_workers: int
    count: int = 0
    pods: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    # noticed nodes of departing workers, or where each new worker fits (a node once per worker)
    nodes: tuple[str, ...] = ()
    tags: tuple[Reason, ...] = ()  # secondary reasons, e.g. below_min on a preemption scale-in
    message: str = ""
    # scale_out: how long the new workers may take to run before the operator rolls them back
    timeout: timedelta | None = None

    @classmethod
    def noop(cls, job: Job, reason: Reason, policy: str, **details: Any) -> Decision:
        """No change to `job`, and why (pods, hosts, nodes, tags, message as keywords)."""
        n = len(job.workers)
        return cls(job.key, Action.NOOP, reason, policy, n, n, **details)
