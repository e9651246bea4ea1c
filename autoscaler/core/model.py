"""What the decision core sees and says: plain, immutable data with no behaviour that does I/O.

Adapters build these from the cluster and the clouds; the core turns a `Snapshot` into `Decision`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from autoscaler.core.pace import Pace


class CapacityType(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class _Carrying(StrEnum):
    """A string enum whose members are declared as (value, data) and carry the data."""

    _data: Any

    def __new__(cls, value: str, data: Any) -> _Carrying:
        member = str.__new__(cls, value)
        member._value_ = value
        member._data = data
        return member


class NoticeKind(_Carrying):
    """Each kind carries its hardness: a Node holds one persisted notice, and a harder one
    replaces a softer one, never the reverse (core.notices.supersedes)."""

    @property
    def hardness(self) -> int:
        return int(self._data)

    INTERRUPTION = "interruption", 2  # the node will be reclaimed: hard
    REBALANCE = "rebalance", 0  # elevated risk: soft, policy decides
    STATE_CHANGE = "state-change", 2  # stopping/terminated: already going, hard
    MAINTENANCE = "maintenance", 1  # scheduled: hard once its deadline is near
    # the node manager's own move (Karpenter's consolidation or drift): the node goes once its
    # replacement is up, unless the policy protects the job's workers (core/voluntary.py)
    DISRUPTION = "disruption", 1

    @classmethod
    def parse(cls, value: object) -> NoticeKind:
        """The kind whose value this is (a ValueError otherwise)."""
        for kind in cls:
            if kind.value == value:
                return kind
        raise ValueError(f"{value!r} is not a notice kind")


class Action(StrEnum):
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    # delete a scaler of ours before the operator runs it (it could only do harm now)
    CANCEL = "cancel_scaler"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    NOOP = "noop"


@dataclass(frozen=True, slots=True)
class ReasonInfo:
    """What the rules need to know of a reason code, kept with it: a member added without one
    fails at import, so no side table can miss it."""

    message: str = ""  # a noop's explanation in its log line
    # departures: the decision for a job's leaving workers carries its most urgent reason
    urgency: int | None = None
    # capacity: when rules block a scale-out, the first in this order explains it
    why_not: int | None = None
    alert: bool = False  # a noop a person must hear of: a Warning Event once per episode


_PLAIN = ReasonInfo()


class Reason(_Carrying):
    @property
    def info(self) -> ReasonInfo:
        info: ReasonInfo = self._data
        return info

    IDLE_CAPACITY = "idle_capacity", _PLAIN
    PREEMPTION_NOTICE = "preemption_notice", ReasonInfo(urgency=0)
    REBALANCE = "rebalance", ReasonInfo("idle capacity is on nodes at risk", urgency=3, why_not=3)
    MAINTENANCE = "maintenance", ReasonInfo(urgency=1)
    # a voluntary disruption (NoticeKind.DISRUPTION) the job's policy lets move it
    KARPENTER_DISRUPTION = "karpenter_disruption", ReasonInfo(urgency=2)
    CLAMP_MAX = "clamp_max", ReasonInfo("at max workers", urgency=4)
    CLAMP_MIN = "clamp_min", _PLAIN
    BELOW_MIN = "below_min", _PLAIN
    LAST_HOST_KEPT = "last_host_kept", _PLAIN
    COOLDOWN = "cooldown", ReasonInfo("changed recently: cooling down")
    MIN_IDLE = "min_idle", ReasonInfo("idle capacity has not been idle long enough", why_not=0)
    PRICE_CAP = "price_cap", ReasonInfo("idle capacity is above the price cap", why_not=1)
    BUDGET = "budget", ReasonInfo("another worker would exceed the budget", why_not=2)
    QUANTUM = (
        "quantum",
        ReasonInfo("not enough capacity for the next allowed worker count", why_not=4),
    )
    SCALER_IN_FLIGHT = (
        "scaler_in_flight",
        ReasonInfo("waiting for the outstanding scaler to finish"),
    )
    BACKOFF = "backoff", ReasonInfo("a recent ScaleOut failed: backing off")
    NO_CAPACITY = "no_capacity", ReasonInfo("no idle capacity fits a worker")
    JOB_NOT_RUNNING = "job_not_running", ReasonInfo("scalers run only while the job is Running")
    SCALE_OUT_DISABLED = (
        "scale_out_disabled",
        ReasonInfo("scale-out is disabled by the policy or a window"),
    )
    NOTICE_WITHDRAWN = "notice_withdrawn", _PLAIN
    HOST_GONE = "host_gone", _PLAIN
    STEADY = "steady", _PLAIN
    BLACKLIST_RISK = "blacklist_risk", _PLAIN
    # a ScaleIn of ours names only pods that are gone: et-operator would delete EVERY worker
    VICTIMS_GONE = "victims_gone", _PLAIN
    # a view of the cluster is re-listing after a broken watch: only notice departures go out
    STALE_VIEW = (
        "stale_view",
        ReasonInfo("the cluster view is catching up after a broken watch: waiting for it"),
    )
    # a scaler older than the policy's scalers.max_age
    SCALER_STUCK = "scaler_stuck", ReasonInfo(alert=True)
    # on-demand capacity (core.deadline): the anchor kept off spot, the deadline's pace
    ANCHOR_ON_DEMAND = "anchor_on_demand", _PLAIN
    BEHIND_DEADLINE = "behind_deadline", _PLAIN
    AHEAD_OF_DEADLINE = "ahead_of_deadline", _PLAIN
    CONSOLIDATE_TO_SPOT = "consolidate_to_spot", _PLAIN
    DEADLINE_INFEASIBLE = (
        "deadline_infeasible",
        ReasonInfo("the deadline cannot be met even with every allowed worker", alert=True),
    )
    NO_PROGRESS = (
        "no_progress",
        ReasonInfo("a deadline is set but the job reports no progress", alert=True),
    )
    # the job's spot-autoscaler.io/policy label names no policy: no growth on a guess
    UNKNOWN_POLICY = (
        "unknown_policy",
        ReasonInfo("the job's policy label names no policy: no scale-out", alert=True),
    )
    # the job cannot be scaled as it is (e.g. a PyTorchJob without elasticPolicy, or its min
    # above the policy's max): left alone, and a person is told why (Job.unscalable)
    NOT_SCALABLE = (
        "not_scalable",
        ReasonInfo("the job cannot be scaled as it is: left alone", alert=True),
    )


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
    # when it was asked for (the pod's creation); None: unknown. A Pending worker's age is
    # on-demand time observed but not yet over (core/deadline.py budgets for it)
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Scaler:
    kind: ScalerKind
    name: str
    created_at: datetime | None = None
    pods: tuple[str, ...] = ()
    ours: bool = False  # created by spot-autoscaler (we may delete it)
    # the operator has picked it up (a ScaleIn's victims are frozen): deleting it no longer helps
    started: bool = True
    # a ScaleOut's workers the operator has yet to make (no pod so far): their room is held, or
    # the next pass gives it to another job and this ScaleOut rolls back at its timeout
    unborn: int = 0
    # when the operator took up a ScaleIn not started yet (et-operator: its Scaling condition)
    picked_up_at: datetime | None = None


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
    # a scale-in deletes its victims by name wherever they are (PyTorchJob: the pod's SIGTERM is
    # torchrun's checkpoint signal; the operator makes a middle index again, as a replacement),
    # while other shrinking still takes the highest indices (`removes_highest_first`)
    deletes_victims: bool = False
    # why the job cannot be scaled as it is ("" when it can): it gets no decision but a
    # not_scalable noop that says this
    unscalable: str = ""
    workers: tuple[Worker, ...] = ()
    running: bool = True  # phase allows scalers (et-operator runs them only while Running)
    scaler: Scaler | None = None  # the outstanding scaler, if any
    priority: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    # last finished scale-out that grew the job: the cooldown clock (neither a forced scale-in nor
    # a refill back to min restarts it)
    last_scale_out_at: datetime | None = None
    last_failed_scale_out_at: datetime | None = None  # ScaleFailed / rollback: backoff
    # the last ScaleOut to finish failed (et-operator rolls back all of its workers when not all
    # run in time) with this many of them Running: the next asks for no more than that (at
    # least one), so a pool that gives only some of what is asked still adds them; None: it
    # did not fail
    failed_with: int | None = None
    drained_hosts: frozenset[str] = frozenset()  # hidden from this job's discovery now
    # hosts Horovod saw fail (lost while still in discovery): it blacklists them for the job's life
    failed_hosts: frozenset[str] = frozenset()
    # hosts the launcher runs Horovod worker processes on, i.e. in a rank assignment (published by
    # the discovery sidecar); None = not reported, fall back to preemption.join_grace
    assigned_hosts: frozenset[str] | None = None
    # since when each of them has been assigned, where the report says so (standalone's does;
    # the sidecar's annotation does not): a host missing here counts as assigned long ago
    assigned_since: Mapping[str, datetime] = field(default_factory=dict)
    # the index the operator gives its next new worker (et-operator: highest in
    # status.targetWorkers + 1, which counts workers that are gone); None = after the live ones
    next_index: int | None = None
    # for a deadline: when the job was created, the fraction of its work done (from the
    # annotation its training script keeps), and the fraction one worker does per hour
    # (estimated from how the fraction moved); None = unknown
    started_at: datetime | None = None
    progress: float | None = None
    progress_rate: float | None = None
    pace: Pace | None = None  # its measured speed by ring size and its changeovers (core/pace.py)

    def most_added(self, max_step: int | None) -> int | None:
        """The most workers one ScaleOut may add: the policy's `max_step`, and after a ScaleOut
        that was rolled back, what it had running (`failed_with`, at least 1)."""
        if self.failed_with is None:
            return max_step
        after = max(1, self.failed_with)
        return after if max_step is None else min(after, max_step)

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
    # the views behind the server (a watch broke, a re-list is under way): "Node", "Pod" (read by
    # every job) or a backend (its kinds); what was deleted meanwhile may still be here, so only
    # what answers notices goes out for the jobs that read them (core.freshness)
    stale: frozenset[str] = frozenset()


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
    # drain / scale_in: those of `pods` that leave for a notice on their node (the others are a
    # clamp's to max): the server check wants that notice still there, even once the view has
    # seen it withdrawn (then they stay; their places do not become a clamp's room)
    for_notice: tuple[str, ...] = ()
    message: str = ""
    # scale_out: how long the new workers may take to run before the operator rolls them back
    timeout: timedelta | None = None
    # drain / scale_in for a notice: the earliest deadline the notices gave (the checkpoint
    # signal passes it on to the training job); None when no notice said
    deadline: datetime | None = None

    @classmethod
    def about(
        cls,
        job: Job,
        action: Action,
        reason: Reason,
        policy: str,
        to_workers: int | None = None,
        **details: Any,
    ) -> Decision:
        """`action` on `job` as it is now: from its worker count to `to_workers` (by default
        unchanged); count, pods, hosts, nodes, tags, message, timeout as keywords."""
        n = len(job.workers)
        return cls(
            job.key, action, reason, policy, n, n if to_workers is None else to_workers, **details
        )

    @classmethod
    def scale_in(
        cls, job: Job, reason: Reason, policy: str, pods: tuple[str, ...], **details: Any
    ) -> Decision:
        """A ScaleIn of exactly `pods`; hosts, nodes, tags, message as keywords."""
        n = len(job.workers)
        return cls.about(
            job,
            Action.SCALE_IN,
            reason,
            policy,
            n - len(pods),
            count=len(pods),
            pods=pods,
            **details,
        )

    @classmethod
    def noop(cls, job: Job, reason: Reason, policy: str, **details: Any) -> Decision:
        """No change to `job`, and why."""
        return cls.about(job, Action.NOOP, reason, policy, **details)
