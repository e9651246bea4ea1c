"""A simulated cluster that behaves like et-operator on Kubernetes: observer and actuator in one.

Enough of the operator's contract to be honest about the core (see shared et-operator notes):
ScaleOut pods get fresh indices and are all rolled back if they do not run within the timeout;
a ScaleIn deletes exactly the named pods after the launcher lets go; one scaler per job; nodes
with a notice are tainted (the scheduler avoids them); a node that dies takes its pods with it.
With a `NodePool`, a node autoscaler (Karpenter) provisions on-demand nodes for pods nothing can
take and removes them once empty; on-demand may be scarce: slow (a delay drawn per node), capped
(`max_nodes`) and refused (a node that never joins).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from autoscaler.config.schema import OnDemandPool, SimJob
from autoscaler.core import (
    Action,
    CapacityType,
    Decision,
    GpuNode,
    Job,
    Notice,
    Reason,
    Scaler,
    ScalerKind,
    Snapshot,
    Worker,
)
from autoscaler.core.progress_rates import ProgressRates


class SimulationError(RuntimeError):
    """The core asked for something the operator contract forbids (a bug, not bad luck)."""


@dataclass
class SimNode:
    name: str
    gpus: int
    capacity: CapacityType
    price_per_hour: float
    instance_type: str
    pooled: bool = False  # made by the node pool: paid whole while it exists, removed when empty


@dataclass(frozen=True, slots=True)
class NodePool:
    """The node autoscaler's settings, and the node it makes (renamed for each claim)."""

    settings: OnDemandPool
    template: SimNode


@dataclass
class NodeClaim:
    """A node being provisioned (Karpenter's NodeClaim) for the pending pods it was made for."""

    name: str
    ready_at: datetime
    gpus: float
    pods: dict[str, float] = field(default_factory=dict)  # pod name -> GPUs it requests

    @property
    def free(self) -> float:
        return self.gpus - sum(self.pods.values())


@dataclass(frozen=True, slots=True)
class JobProgress:
    """What a job reports of its progress (the core's deadline rule reads it)."""

    started_at: datetime
    done: float  # fraction of the job done, 0..1
    # fraction of the job one worker does per hour; None: measured from the readings, as the
    # daemon does (core/progress_rates.py), with the ring's speed by size and changeovers
    rate: float | None


class ProgressSource(Protocol):
    def progress(self, job: str, now: datetime) -> JobProgress | None: ...


@dataclass
class SimPod:
    name: str
    job: str
    index: int
    gpus: float
    node: str | None = None
    ready_at: datetime | None = None  # when a bound pod turns Running
    running: bool = False
    created_at: datetime | None = None


@dataclass
class SimScaler:
    kind: ScalerKind
    name: str
    created_at: datetime
    pods: tuple[str, ...]
    deadline: datetime  # ScaleOut: timeout; ScaleIn: when the victims are deleted
    refill: bool = False  # a ScaleOut back to min: it does not start the cooldown


@dataclass
class SimJobState:
    spec: SimJob
    next_index: int = 0
    scaler: SimScaler | None = None
    last_scale_out_at: datetime | None = None
    last_failed_scale_out_at: datetime | None = None
    failed_with: int | None = None  # Running workers of the last ScaleOut, if it was rolled back
    drained: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # hosts Horovod saw die: blacklisted
    scalers_created: int = 0

    @property
    def key(self) -> str:
        return f"{self.spec.namespace}/{self.spec.name}"


@dataclass
class Loss:
    """What a node's death did to one job's workers."""

    job: str
    graceful: int  # already out of discovery: no rollback
    abrupt: int  # still in discovery: Horovod sees a failure


class RingListener(Protocol):
    """Horovod's view of a job: a worker is in its ring while its pod runs and is not drained.

    `left(graceful=True)`: hidden from discovery while alive (reset, no rollback);
    `graceful=False`: the pod died while still in discovery (Horovod sees a failure).
    """

    def joined(self, job: str, pod: str, now: datetime) -> None: ...

    def left(self, job: str, pod: str, now: datetime, graceful: bool) -> None: ...


class SimulatedCluster:
    dry_run = False

    def __init__(
        self,
        jobs: list[SimJob],
        pod_startup: timedelta,
        scale_out_timeout: timedelta,
        scale_in_grace: timedelta,
        listener: RingListener | None = None,
        pool: NodePool | None = None,
        progress: ProgressSource | None = None,
        seed: int = 0,
    ) -> None:
        self.pod_startup = pod_startup
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[str, SimPod] = {}
        self.notices: dict[str, Notice] = {}
        self.jobs = {f"{j.namespace}/{j.name}": SimJobState(j) for j in jobs}
        self.scale_out_timeout = scale_out_timeout
        self.scale_in_grace = scale_in_grace
        self.scale_outs_failed = 0
        self.listener = listener
        self.pool = pool
        self.claims: list[NodeClaim] = []
        self.claims_made = 0
        self.claims_refused = 0
        self.rng = random.Random(seed)  # the pool's delays and refusals
        self.empty_since: dict[str, datetime] = {}  # pool node -> when its last pod went
        self.progress = progress
        self.rates = ProgressRates()  # the daemon's measurement of each job's pace

    # --- the world changes -------------------------------------------------------------------
    def add_node(self, node: SimNode) -> None:
        self.nodes[node.name] = node
        self.notices.pop(node.name, None)

    def post_notice(self, notice: Notice) -> None:
        if notice.node in self.nodes:
            self.notices[notice.node] = notice

    def remove_node(self, name: str, now: datetime) -> list[Loss]:
        self.nodes.pop(name, None)
        self.notices.pop(name, None)
        losses: dict[str, Loss] = {}
        for pod in [p for p in self.pods.values() if p.node == name]:
            if pod.name not in self.pods:
                continue  # already rolled back with its ScaleOut below
            job = self.jobs[pod.job]
            loss = losses.setdefault(pod.job, Loss(pod.job, 0, 0))
            if pod.running and pod.name not in job.drained:
                loss.abrupt += 1
                job.failed.add(pod.name)
            else:
                loss.graceful += 1
            self._delete(job, pod.name, now)
            scaler = job.scaler
            if scaler and scaler.kind is ScalerKind.SCALE_OUT and pod.name in scaler.pods:
                self._fail_scale_out(job, now)
        return list(losses.values())

    def advance(self, now: datetime) -> None:
        """Provisioned nodes join, pending pods bind, bound ones start, scalers finish or time
        out, the pool provisions for pods still pending and removes nodes empty long enough."""
        self._land(now)
        for pod in self.pods.values():
            self._bind_and_start(pod, now)
        for job in self.jobs.values():
            self._settle_scaler(job, now)
        if self.pool is not None:
            self._provision(self.pool, now)
            self._consolidate(self.pool.settings.empty_node_ttl, now)

    def _bind_and_start(self, pod: SimPod, now: datetime) -> None:
        if pod.node is None:
            pod.node = self._place(pod.gpus)
            if pod.node is not None:
                pod.ready_at = now + self.pod_startup
        if pod.node is not None and not pod.running and pod.ready_at and pod.ready_at <= now:
            pod.running = True
            if self.listener and pod.name not in self.jobs[pod.job].drained:
                self.listener.joined(pod.job, pod.name, now)

    def _settle_scaler(self, job: SimJobState, now: datetime) -> None:
        """A ScaleIn deletes its pods at its deadline; a ScaleOut ends once its pods run, or fails
        at its deadline."""
        scaler = job.scaler
        if scaler is None:
            return
        if scaler.kind is ScalerKind.SCALE_IN and now >= scaler.deadline:
            for name in scaler.pods:
                self._delete(job, name, now)
            job.scaler = None
        elif scaler.kind is ScalerKind.SCALE_OUT:
            if all(self.pods[p].running for p in scaler.pods if p in self.pods):
                if not scaler.refill:
                    job.last_scale_out_at = now
                job.scaler, job.failed_with = None, None
            elif now >= scaler.deadline:
                self._fail_scale_out(job, now)

    def next_change(self) -> datetime | None:
        """The earliest time something happens on its own (a pod starts, a scaler ends, a node
        is provisioned or consolidated)."""
        times = [p.ready_at for p in self.pods.values() if p.ready_at and not p.running]
        times += [j.scaler.deadline for j in self.jobs.values() if j.scaler]
        times += [c.ready_at for c in self.claims]
        if self.pool is not None:
            ttl = self.pool.settings.empty_node_ttl
            times += [since + ttl for since in self.empty_since.values()]
        return min(times) if times else None

    # --- the node pool -------------------------------------------------------------------------
    def _land(self, now: datetime) -> None:
        """Claims still wanted whose time has come become nodes, unless refused (their pods
        then get a new claim); the others are cancelled."""
        self._drop_unwanted_claims()
        for claim in [c for c in self.claims if c.ready_at <= now]:
            assert self.pool is not None  # claims exist only with a pool
            self.claims.remove(claim)
            if self.rng.random() < self.pool.settings.refusal_probability:
                self.claims_refused += 1
            else:
                self.add_node(replace(self.pool.template, name=claim.name))

    def _drop_unwanted_claims(self) -> None:
        """A pod that was deleted (its ScaleOut rolled back) or bound elsewhere in the meantime
        no longer needs its claim; a claim no pod needs is cancelled before it is paid for."""
        pending = {p.name for p in self.pods.values() if p.node is None}
        for claim in self.claims:
            claim.pods = {name: g for name, g in claim.pods.items() if name in pending}
        self.claims = [c for c in self.claims if c.pods]

    def _provision(self, pool: NodePool, now: datetime) -> None:
        """Every pending pod without a claim joins one with room or gets a new one (one node of
        the pool's type), within the pool's node cap; a pod larger than a node never fits."""
        self._drop_unwanted_claims()
        claimed = {name for c in self.claims for name in c.pods}
        cap = pool.settings.max_nodes
        for pod in self.pods.values():
            if pod.node is not None or pod.name in claimed or pod.gpus > pool.template.gpus:
                continue
            claim = next((c for c in self.claims if c.free >= pod.gpus), None)
            if claim is None:
                pooled = sum(1 for n in self.nodes.values() if n.pooled)
                if cap is not None and pooled + len(self.claims) >= cap:
                    return
                self.claims_made += 1
                delay = self._delay(pool.settings)
                claim = NodeClaim(
                    f"on-demand-pool-{self.claims_made}", now + delay, pool.template.gpus
                )
                self.claims.append(claim)
            claim.pods[pod.name] = pod.gpus

    def _delay(self, settings: OnDemandPool) -> timedelta:
        """How long the next node takes: `provisioning_delay`, or drawn up to its max."""
        low, top = settings.provisioning_delay, settings.provisioning_delay_max
        if top is None or top == low:
            return low
        return low + (top - low) * self.rng.random()

    def _consolidate(self, ttl: timedelta, now: datetime) -> None:
        """Pool nodes with no pod since `ttl` ago are removed (Karpenter's consolidateAfter)."""
        busy = {p.node for p in self.pods.values()}
        for node in [n for n in self.nodes.values() if n.pooled]:
            if node.name in busy:
                self.empty_since.pop(node.name, None)
            elif now >= self.empty_since.setdefault(node.name, now) + ttl:
                del self.nodes[node.name]
                del self.empty_since[node.name]

    # --- observer ------------------------------------------------------------------------------
    def snapshot(self, now: datetime) -> Snapshot:
        requested: dict[str, float] = {}
        for pod in self.pods.values():
            if pod.node is not None:
                requested[pod.node] = requested.get(pod.node, 0.0) + pod.gpus
        nodes = tuple(
            GpuNode(
                name=n.name,
                gpus_allocatable=n.gpus,
                gpus_requested=requested.get(n.name, 0.0),
                capacity_type=n.capacity,
                price_per_hour=n.price_per_hour,
                instance_type=n.instance_type,
            )
            for n in self.nodes.values()
        )
        spot = frozenset(n.name for n in nodes if n.capacity_type is CapacityType.SPOT)
        jobs = tuple(self._jobs(now, spot))
        return Snapshot(nodes=nodes, notices=tuple(self.notices.values()), jobs=jobs)

    def _jobs(self, now: datetime, spot: frozenset[str]) -> list[Job]:
        out = []
        for key, state in self.jobs.items():
            spec = state.spec
            reported = self.progress.progress(key, now) if self.progress else None
            pods = sorted((p for p in self.pods.values() if p.job == key), key=lambda p: p.index)
            scaler = state.scaler
            job = Job(
                namespace=spec.namespace,
                name=spec.name,
                min_workers=spec.min_workers,
                max_workers=spec.max_workers,
                gpus_per_worker=spec.gpus_per_worker,
                reuses_names=True,  # the simulated cluster follows et-operator
                priority=spec.priority,
                labels=spec.labels,
                workers=tuple(
                    Worker(
                        p.name,
                        p.node,
                        p.name,
                        p.index,
                        pending=not p.running,
                        ready_since=p.ready_at if p.running else None,
                        created_at=p.created_at,
                    )
                    for p in pods
                ),
                scaler=Scaler(scaler.kind, scaler.name, scaler.created_at, scaler.pods)
                if scaler
                else None,
                last_scale_out_at=state.last_scale_out_at,
                last_failed_scale_out_at=state.last_failed_scale_out_at,
                failed_with=state.failed_with,
                drained_hosts=frozenset(state.drained),
                failed_hosts=frozenset(state.failed),
                started_at=reported.started_at if reported else None,
                progress=reported.done if reported else None,
                progress_rate=reported.rate if reported else None,
            )
            measured = reported is not None and reported.rate is None
            out.append(self.rates.with_rate(job, now, spot) if measured else job)
        return out

    # --- actuator ------------------------------------------------------------------------------
    def apply(self, decision: Decision, now: datetime) -> None:
        job = self.jobs.get(decision.job)
        if job is None:
            raise SimulationError(f"unknown job {decision.job}")
        if decision.action is Action.DRAIN:
            self._drain(job, decision.hosts, now)
        elif decision.action is Action.UNDRAIN:
            for host in decision.hosts:
                pod = self.pods.get(host)
                if self.listener and host in job.drained and pod is not None and pod.running:
                    self.listener.joined(job.key, host, now)
                job.drained.discard(host)
        elif decision.action in (Action.SCALE_OUT, Action.SCALE_IN):
            if job.scaler is not None:
                raise SimulationError(f"{job.key}: a second scaler while {job.scaler.name} runs")
            job.scalers_created += 1
            name = f"{job.spec.name}-{decision.action.value.replace('_', '')}-{job.scalers_created}"
            if decision.action is Action.SCALE_OUT:
                pods = tuple(self._new_pod(job, now).name for _ in range(decision.count))
                job.scaler = SimScaler(
                    ScalerKind.SCALE_OUT,
                    name,
                    now,
                    pods,
                    now + self.scale_out_timeout,
                    refill=decision.reason is Reason.BELOW_MIN,
                )
            else:
                unknown = set(decision.pods) - set(self.pods)
                if unknown:  # et-operator silently drops unknown names; a core bug here
                    raise SimulationError(
                        f"{job.key}: ScaleIn names unknown pods {sorted(unknown)}"
                    )
                # the operator rewrites the hostfile without the victims before deleting them
                self._drain(job, decision.pods, now)
                job.scaler = SimScaler(
                    ScalerKind.SCALE_IN, name, now, decision.pods, now + self.scale_in_grace
                )
        self.advance(now)

    def _new_pod(self, job: SimJobState, now: datetime) -> SimPod:
        pod = SimPod(
            f"{job.spec.name}-worker-{job.next_index}",
            job.key,
            job.next_index,
            job.spec.gpus_per_worker,
            created_at=now,
        )
        job.next_index += 1
        self.pods[pod.name] = pod
        return pod

    def _drain(self, job: SimJobState, hosts: tuple[str, ...], now: datetime) -> None:
        """Hide hosts (pod names) from the job's discovery: running ones leave the ring alive."""
        for host in hosts:
            pod = self.pods.get(host)
            if self.listener and host not in job.drained and pod is not None and pod.running:
                self.listener.left(job.key, host, now, graceful=True)
            job.drained.add(host)

    def _delete(self, job: SimJobState, name: str, now: datetime) -> None:
        """A pod goes; if it was still in the ring, Horovod sees its worker fail."""
        pod = self.pods.pop(name, None)
        if self.listener and pod is not None and pod.running and name not in job.drained:
            self.listener.left(job.key, name, now, graceful=False)
        job.drained.discard(name)

    def _fail_scale_out(self, job: SimJobState, now: datetime) -> None:
        """All-or-nothing: every pod the ScaleOut added is deleted."""
        assert job.scaler is not None
        ran = [p for p in job.scaler.pods if (pod := self.pods.get(p)) is not None and pod.running]
        job.failed_with = len(ran)
        for name in job.scaler.pods:
            self._delete(job, name, now)
        job.scaler = None
        job.last_failed_scale_out_at = now
        self.scale_outs_failed += 1

    def _place(self, gpus: float) -> str | None:
        """kube-scheduler, roughly: a node with room, not tainted by a notice, least allocated;
        on a tie an on-demand node (the preferred on-demand affinity docs/deadlines.md gives
        worker templates; the real scheduler weighs it above least-allocated, which differs only
        on nodes of several GPUs)."""
        used: dict[str, float] = {}
        for pod in self.pods.values():
            if pod.node is not None:
                used[pod.node] = used.get(pod.node, 0.0) + pod.gpus
        best = None
        for node in self.nodes.values():
            free = node.gpus - used.get(node.name, 0.0)
            if node.name in self.notices or free < gpus:
                continue
            key = (free, node.capacity is CapacityType.ON_DEMAND)
            if best is None or key > best[0]:
                best = (key, node.name)
        return best[1] if best else None
