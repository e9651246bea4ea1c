"""Which workers of a job leave now, in what order: drain from discovery first, then scale in.

Horovod keeps its state when a host leaves discovery while alive (no rollback); it rolls back when a
worker dies. So a doomed worker's host is hidden at once, and the ScaleIn that deletes the pod names
exactly those pods: et-operator's count-based ScaleIn would remove the highest indices instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from autoscaler.core.model import (
    Action,
    Decision,
    GpuNode,
    Job,
    Reason,
    ScalerKind,
    Worker,
)
from autoscaler.core.moment import Moment
from autoscaler.core.notices import NodeRisk
from autoscaler.core.policy import Policy, PreemptionRules


@dataclass(slots=True)
class Departures:
    decisions: list[Decision] = field(default_factory=list)
    leaving: tuple[Worker, ...] = ()
    kept: Worker | None = None  # doomed, but kept in discovery until a replacement has synced
    # set when this job must not scale out this tick, and why
    blocks_scale_out: Reason | None = None


# the node goes whatever the job does: its workers leave even below min
_NODE_GOES = (Reason.PREEMPTION_NOTICE, Reason.MAINTENANCE, Reason.KARPENTER_DISRUPTION)
# How long a ScaleIn et-operator has just taken up is left to it even with its victims gone: the
# reconcile after the pickup deletes them (grace 0) and writes status.toDeletePods only after,
# in a deferred status update (scaler.go `executeScaling`), so for that moment its own deletions
# look like victims lost before it ran. Seconds: condition times have 1 s resolution, and clocks
# of two machines differ.
_PICKUP_SETTLE = timedelta(seconds=5)


@dataclass(frozen=True, slots=True)
class _Leaving:
    """Who leaves a job now and under which reason and tags its decisions go."""

    workers: tuple[Worker, ...]
    kept: Worker | None
    reason: Reason | None  # the most urgent reason among them; None when nobody leaves
    tags: tuple[Reason, ...]
    for_notice: frozenset[str] = frozenset()  # the pods among them leaving for their node's notice


def plan_departures(
    job: Job,
    policy: Policy,
    risk: NodeRisk,
    nodes: Mapping[str, GpuNode],
    bounds: tuple[int, int],
    moment: Moment,
) -> Departures:
    leaving = _who_leaves(job, policy, risk, nodes, bounds, moment)
    out = Departures(leaving=leaving.workers, kept=leaving.kept)
    cancel = _cancel(job, policy, moment)
    if cancel is not None:
        out.decisions.append(cancel)
    out.decisions.extend(_undrains(job, policy, leaving.workers, nodes))
    if leaving.kept is not None and not leaving.workers:
        out.decisions.append(_kept_noop(job, policy, leaving))
    if not leaving.workers or leaving.reason is None:
        return out
    deadline = _deadline(leaving.workers, risk)
    drain = _drain(job, policy, leaving, deadline)
    if drain is not None:
        out.decisions.append(drain)
    out.blocks_scale_out = leaving.reason
    victims = _removable(job, leaving.workers)
    if victims:
        _scale_in_or_wait(job, policy, leaving, victims, moment, out, deadline)
    return out


def _deadline(leaving: tuple[Worker, ...], risk: NodeRisk) -> datetime | None:
    """The earliest deadline the notices on the leaving workers' nodes gave, if any did."""
    known = [risk.deadlines[w.node] for w in leaving if w.node in risk.deadlines]
    return min(known, default=None)


def _who_leaves(
    job: Job,
    policy: Policy,
    risk: NodeRisk,
    nodes: Mapping[str, GpuNode],
    bounds: tuple[int, int],
    moment: Moment,
) -> _Leaving:
    lo, hi = bounds
    why, held_at_min = _leaving_with_reasons(job, risk, nodes, lo, hi)
    tags: list[Reason] = [Reason.CLAMP_MIN] if held_at_min else []
    kept = None
    if why and policy.preemption.keep_last_host:
        kept = _last_host_to_keep(job, why, risk, policy, moment)
    # the drain/scale-in decision carries the most urgent reason among its victims
    reason = min(why.values(), key=_urgency) if why else None
    if kept is not None:
        del why[kept.pod]
        tags.append(Reason.LAST_HOST_KEPT)
    leaving = tuple(w for w in job.workers if w.pod in why)
    if len(job.workers) - len(leaving) - (kept is not None) < lo and (leaving or kept):
        tags.append(Reason.BELOW_MIN)
    for_notice = frozenset(p for p, r in why.items() if r is not Reason.CLAMP_MAX)
    return _Leaving(leaving, kept, reason, tuple(tags), for_notice)


def _kept_noop(job: Job, policy: Policy, leaving: _Leaving) -> Decision:
    kept, reason = leaving.kept, leaving.reason
    assert kept is not None and reason is not None
    return Decision.noop(
        job,
        Reason.LAST_HOST_KEPT,
        policy.name,
        pods=(kept.pod,),
        hosts=(kept.host,),
        nodes=(kept.node,) if kept.node else (),
        tags=(reason, *(t for t in leaving.tags if t is not Reason.LAST_HOST_KEPT)),
        message="the only settled host stays in discovery until a replacement has synced",
    )


def _nodes_of(workers: tuple[Worker, ...]) -> tuple[str, ...]:
    return tuple(sorted({w.node for w in workers if w.node}))


def _drain(
    job: Job, policy: Policy, leaving: _Leaving, deadline: datetime | None
) -> Decision | None:
    """Hide the leaving workers' hosts not hidden yet."""
    assert leaving.reason is not None
    draining = tuple(w for w in leaving.workers if w.host not in job.drained_hosts)
    hosts = tuple(dict.fromkeys(w.host for w in draining))  # standalone: a host holds several
    if not hosts:
        return None
    return Decision.about(
        job,
        Action.DRAIN,
        leaving.reason,
        policy.name,
        to_workers=len(job.workers) - len(leaving.workers),
        count=len(draining),
        pods=tuple(w.pod for w in draining),
        hosts=hosts,
        nodes=_nodes_of(leaving.workers),
        tags=leaving.tags,
        for_notice=tuple(w.pod for w in draining if w.pod in leaving.for_notice),
        message=f"hide {len(hosts)} host(s) from discovery before the pods go",
        deadline=deadline,
    )


def _scale_in_or_wait(
    job: Job,
    policy: Policy,
    leaving: _Leaving,
    victims: tuple[str, ...],
    moment: Moment,
    out: Departures,
    deadline: datetime | None,
) -> None:
    """A ScaleIn naming exactly `victims`, or (a scaler in flight, a stuck one) why it waits."""
    assert leaving.reason is not None
    hosts = tuple(dict.fromkeys(w.host for w in leaving.workers))
    nodes = _nodes_of(leaving.workers)
    deferred = (
        None
        if _deleted_now(job, leaving.reason)
        else _scale_in_deferred(job, policy, victims, moment)
    )
    if deferred is not None:
        out.blocks_scale_out = deferred[0]
        if deferred[1]:
            out.decisions.append(
                Decision.noop(
                    job,
                    deferred[0],
                    policy.name,
                    pods=victims,
                    hosts=hosts,
                    nodes=nodes,
                    tags=(leaving.reason, *leaving.tags),
                    message=deferred[1],
                )
            )
        return
    out.decisions.append(
        Decision.scale_in(
            job,
            leaving.reason,
            policy.name,
            victims,
            hosts=hosts,
            nodes=nodes,
            tags=leaving.tags,
            for_notice=tuple(p for p in victims if p in leaving.for_notice),
            message=f"remove exactly {', '.join(victims)}",
            deadline=deadline,
        )
    )


def _urgency(reason: Reason) -> int:
    assert reason.info.urgency is not None, f"{reason} makes no worker leave"
    return reason.info.urgency


def _removable(job: Job, leaving: tuple[Worker, ...]) -> tuple[str, ...]:
    """The leaving pods a scale-in removes. A pod already being deleted leaves by itself; naming
    it could leave a ScaleIn whose pods are all gone by the time et-operator reads it (see
    _cancel). A job whose operator removes the highest indices can lose only the leaving pods
    at the top; the others are drained and die with their nodes, unless the job's scale-in
    deletes its victims by name (its clamp victims are the top ones: _above_max)."""
    going = {w.pod for w in leaving if not w.terminating}
    if not job.removes_highest_first or job.deletes_victims:
        return tuple(w.pod for w in leaving if w.pod in going)
    top: list[str] = []
    for w in sorted((w for w in job.workers if not w.terminating), key=lambda w: -w.index):
        if w.pod not in going:
            break
        top.append(w.pod)
    return tuple(reversed(top))


def _leaving_with_reasons(
    job: Job, risk: NodeRisk, nodes: Mapping[str, GpuNode], lo: int, hi: int
) -> tuple[dict[str, Reason], bool]:
    """pod -> why it leaves, and whether min held a worker back.

    Hard notices ignore min (the node dies anyway); a rebalance drain respects it.
    """
    why: dict[str, Reason] = {}
    # one look per worker (every job, every pass): most jobs have none on a noticed node
    noticed = [(w, r) for w in job.workers if (r := risk.hard.get(w.node or "")) is not None]
    for w, reason in noticed:
        if reason in _NODE_GOES:
            why[w.pod] = reason
    # A worker already being deleted has left the count: against max, clamping it in would
    # name a healthy worker instead (one the server check then refuses, pass after pass, while
    # the pod finishes its grace period); against min, it is gone.
    live = [w for w in job.workers if not w.terminating]
    held_at_min = _rebalance(noticed, live, why, lo)
    rest = [w for w in live if w.pod not in why]
    why.update((w.pod, Reason.CLAMP_MAX) for w in _above_max(job, rest, hi, risk, nodes))
    return why, held_at_min


def _rebalance(
    noticed: list[tuple[Worker, Reason]], live: list[Worker], why: dict[str, Reason], lo: int
) -> bool:
    """Add to `why` the workers a rebalance recommendation drains early, only while the job
    stays at or above min; whether min held one back."""
    held_at_min = False
    for w, reason in noticed:
        if reason is Reason.REBALANCE:
            if len(live) - sum(x.pod in why for x in live) > lo:
                why[w.pod] = Reason.REBALANCE
            else:
                held_at_min = True
    return held_at_min


def _above_max(
    job: Job, rest: list[Worker], hi: int, risk: NodeRisk, nodes: Mapping[str, GpuNode]
) -> list[Worker]:
    """The workers of `rest` (those that would stay) that max clamps away."""
    excess = len(rest) - hi
    if excess <= 0:
        return []
    if job.removes_highest_first:  # the only ones its operator can remove
        return sorted(rest, key=lambda w: -w.index)[:excess]
    return sorted(rest, key=lambda w: _clamp_victim_order(w, risk, nodes))[:excess]


def _clamp_victim_order(w: Worker, risk: NodeRisk, nodes: Mapping[str, GpuNode]) -> tuple:
    """Shrink by pending pods first (Volcano #2074), then at-risk nodes, dear nodes, high index."""
    node = nodes.get(w.node or "")
    price = node.price_per_gpu_hour if node else None
    return (not w.pending, w.node not in risk.soft, -(price or 0.0), -w.index)


def _last_host_to_keep(
    job: Job, why: dict[str, Reason], risk: NodeRisk, policy: Policy, moment: Moment
) -> Worker | None:
    """If no settled host would stay in discovery, keep the one that lives longest.

    Horovod stops the job when no host of the previous set remains, and a replacement that joined
    moments ago has not been sent the state yet; keeping one old host until the refill has synced
    lets the job shrink and grow instead of failing or starting over. A survivor that joined no
    later than the doomed hosts holds the same state, however recent (e.g. at the job's start).

    Settled: in Horovod's rank assignment (the launcher's report) for `assigned_settle` where the
    report says since when, or just in it where it does not; without a report, ready for
    `join_grace`. The kept host is released before that once its deadline is `release_margin`
    away, if a survivor is in the assignment at all (see `_release_near_deadline`).
    """
    rules = policy.preemption
    candidates = [w for w in job.workers if w.pod in why and not w.pending]
    if not candidates:
        return None
    settling = _Settling(
        moment,
        rules,
        _oldest([w.ready_since for w in candidates]),
        _oldest([job.assigned_since.get(w.host) for w in candidates]),
    )
    if any(_settled_survivor(job, w, why, settling) for w in job.workers):
        return None
    kept = _longest_lived(candidates, why, risk)
    if _release_near_deadline(job, why, risk.deadlines.get(kept.node or ""), rules, moment):
        return None
    return kept


@dataclass(frozen=True, slots=True)
class _Settling:
    """When a survivor counts as settled: ready for `join_grace`, or in the rank assignment for
    `assigned_settle`; or, however recently, no later than the oldest doomed host (it holds the
    same state)."""

    moment: Moment
    rules: PreemptionRules
    oldest_ready: datetime | None  # of the doomed hosts; None: one of them is not known
    oldest_assigned: datetime | None

    def ready(self, since: datetime) -> bool:
        as_old = self.oldest_ready is not None and since <= self.oldest_ready
        return as_old or self.moment.reached(since + self.rules.join_grace)

    def synced(self, since: datetime) -> bool:
        as_old = self.oldest_assigned is not None and since <= self.oldest_assigned
        return as_old or self.moment.reached(since + self.rules.assigned_settle)


def _oldest(times: list[datetime | None]) -> datetime | None:
    """The oldest of `times` if all of them are known."""
    return None if None in times else min(t for t in times if t is not None)


def _longest_lived(candidates: list[Worker], why: dict[str, Reason], risk: NodeRisk) -> Worker:
    """The doomed worker to keep: one clamped away rather than noticed, else the one whose node
    dies last (an unknown deadline counts as the latest), else the lowest index."""

    def lives_longest(w: Worker) -> tuple:
        deadline = risk.deadlines.get(w.node or "")
        return (why[w.pod] is Reason.CLAMP_MAX, deadline is None, deadline, -w.index)

    return max(candidates, key=lives_longest)


def _release_near_deadline(
    job: Job,
    why: dict[str, Reason],
    deadline: datetime | None,
    rules: PreemptionRules,
    moment: Moment,
) -> bool:
    """Whether the kept host goes now, though no survivor has settled: its node dies within
    `release_margin` and a survivor is in Horovod's rank assignment (the launcher's report).

    Which costs less (../shared/reference/horovod-elastic.md): a graceful removal costs one
    reset; a host that dies in the ring costs a rollback to the last commit (after Gloo's
    timeout); losing every host that holds the state restarts the job from step 0. With the
    survivor in the assignment, the drain is never worse than keeping the host:
    - the survivor has synced (its join's reset is over): the removal is graceful, no rollback,
      where keeping the host until its node dies would roll back;
    - the survivor is still joining: the kept host waits in that reset's rendezvous, and the
      removal announced to it meanwhile is dropped (horovod/common/elastic.py `run_fn`:
      `state.on_reset()` after `reset()` empties `_host_messages`), so it stays in the ring and
      syncs the state to the survivor as if kept; its death then rolls back, starts over if it
      dies during the sync, or ends the job if it dies while the survivor's process still
      starts (Gloo aborts it; horovod/runner/elastic/registration.py `_on_workers_recorded`
      stops a job whose workers all failed), exactly as it would have kept.
    Without the survivor in the assignment the drain is never made: Horovod would then find no
    host of the previous set at its next reset (horovod/runner/elastic/driver.py
    `_update_host_assignments`: "No hosts from previous set remaining") and stop the job, where
    a death with the replacement assigned costs only a rollback or a restart. Without a report
    there is no evidence either way: `join_grace` stays the bound.
    """
    if deadline is None or not moment.reached(deadline - rules.release_margin):
        return False
    if job.assigned_hosts is None:
        return False
    return any(
        w.host in job.assigned_hosts
        for w in job.workers
        if w.pod not in why
        and not w.pending
        and not w.terminating
        and w.host not in job.drained_hosts
    )


def _settled_survivor(job: Job, w: Worker, why: dict[str, Reason], settling: _Settling) -> bool:
    """A worker that stays, runs, is shown to Horovod and is in its rank assignment."""
    if w.pod in why or w.pending or w.terminating or w.host in job.drained_hosts:
        return False
    return _in_assignment(job, w, settling)


def _in_assignment(job: Job, w: Worker, settling: _Settling) -> bool:
    """Whether Horovod has `w`'s host in its current rank assignment, so dropping the others
    keeps a host of the previous set (driver.py `_update_host_assignments`), and (where the
    report says since when) has had it there long enough, so its join's reset is over.
    The launcher's own report (its worker processes) is the evidence; without one, a host that
    has been ready long enough is assumed to have passed a reset (`_Settling`)."""
    if job.assigned_hosts is not None:
        if w.host not in job.assigned_hosts:
            return False
        since = job.assigned_since.get(w.host)
        return since is None or settling.synced(since)
    return w.ready_since is None or settling.ready(w.ready_since)


def scaler_block(job: Job, policy: Policy, moment: Moment) -> tuple[Reason, str] | None:
    """Why the job's outstanding scaler blocks new ones: in flight, or stuck past max_age."""
    scaler = job.scaler
    if scaler is None:
        return None
    created = scaler.created_at
    if created is not None and moment.passed(created + policy.scalers.max_age):
        age = moment.age(created)  # in its message: a stuck scaler's plan is made every pass
        return Reason.SCALER_STUCK, (
            f"{scaler.kind}/{scaler.name} unfinished after {int(age.total_seconds())}s: see"
            " docs/kubernetes.md#stuck-scalers (delete it once its pods are handled)"
        )
    return Reason.SCALER_IN_FLIGHT, ""


def _cancel(job: Job, policy: Policy, moment: Moment) -> Decision | None:
    """Our ScaleIn, not picked up yet, whose pods have all gone (node died, evicted, NTH or
    Karpenter got there first): et-operator keeps only named pods that still exist, and an empty
    list means ALL workers (scalein.go `setsSaleInToDelete`, worker.go `DeleteWorkerPods`), so
    it must be deleted before the operator runs it. A deleted scaler just ends
    (scaler.go `executeScaling`). One the operator took up moments ago is running now
    (`_PICKUP_SETTLE`): deleting it would erase a ScaleIn that did its work."""
    scaler = job.scaler
    if scaler is None or scaler.kind is not ScalerKind.SCALE_IN or not scaler.ours:
        return None
    live = {w.pod for w in job.workers if not w.terminating}
    if scaler.started or live & set(scaler.pods):
        return None
    picked = scaler.picked_up_at
    if picked is not None and not moment.reached(picked + _PICKUP_SETTLE):
        return None
    return Decision.about(
        job,
        Action.CANCEL,
        Reason.VICTIMS_GONE,
        policy.name,
        pods=scaler.pods,
        message=f"delete {scaler.kind}/{scaler.name}: none of its pods is left, and et-operator"
        " would delete every worker of the job",
    )


def _deleted_now(job: Job, reason: Reason) -> bool:
    """A notice's victims of a job whose scale-in deletes them by name go at once: deleting a pod
    queues nothing behind a scale in flight (there is no scaler object to order), and its SIGTERM
    is the worker's checkpoint signal, which must not wait out another worker's grace period."""
    return job.deletes_victims and reason is not Reason.CLAMP_MAX


def _scale_in_deferred(
    job: Job, policy: Policy, victims: tuple[str, ...], moment: Moment
) -> tuple[Reason, str] | None:
    """(reason, message) when the ScaleIn cannot be created now; message '' = nothing to say."""
    scaler = job.scaler
    if scaler is not None:
        block = scaler_block(job, policy, moment)
        assert block is not None
        if block[0] is Reason.SCALER_STUCK:
            return block
        if scaler.kind is ScalerKind.SCALE_IN and set(victims) <= set(scaler.pods):
            return Reason.SCALER_IN_FLIGHT, ""
        return (
            Reason.SCALER_IN_FLIGHT,
            f"scale-in waits for {scaler.kind}/{scaler.name}; hosts are drained meanwhile",
        )
    if not job.running:
        return (
            Reason.JOB_NOT_RUNNING,
            "scale-in waits until the job runs; hosts are drained meanwhile",
        )
    return None


def _removal_under_way(job: Job, by_host: Mapping[str, Worker], in_flight: set[str]) -> bool:
    """A ScaleIn in flight names a drained worker still there. Its pods leave one at a time, and
    the hosts gone are forgotten together after the last (one PATCH and Event each was four a
    notice at 2,000 nodes). Nothing can take a gone host's name meanwhile: the ScaleIn is the
    job's one scaler."""
    return any(by_host[h].pod in in_flight for h in job.drained_hosts if h in by_host)


def _undrains(
    job: Job, policy: Policy, leaving: tuple[Worker, ...], nodes: Mapping[str, GpuNode]
) -> list[Decision]:
    by_host = {w.host: w for w in job.workers}
    leaving_hosts = {w.host for w in leaving}
    in_flight = (
        set(job.scaler.pods) if job.scaler and job.scaler.kind is ScalerKind.SCALE_IN else set()
    )
    gone: list[str] = []
    healthy: list[str] = []
    for host in sorted(job.drained_hosts - leaving_hosts):
        worker = by_host.get(host)
        if worker is None:
            gone.append(host)
            continue
        node = nodes.get(worker.node or "")
        if worker.pod not in in_flight and node is not None and node.schedulable:
            healthy.append(host)
    if _removal_under_way(job, by_host, in_flight):
        gone = []
    return [
        Decision.about(
            job,
            Action.UNDRAIN,
            reason,
            policy.name,
            count=len(hosts),
            hosts=tuple(hosts),
            message=message,
        )
        for hosts, reason, message in (
            (gone, Reason.HOST_GONE, "forget drained hosts that left the job"),
            (healthy, Reason.NOTICE_WITHDRAWN, "node healthy again: show the hosts to discovery"),
        )
        if hosts
    ]
