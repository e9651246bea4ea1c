"""`decide(snapshot, policies, now) -> decisions`: the whole policy, pure and deterministic.

Per job: departures first (drain, then a ScaleIn naming exactly the doomed pods), then growth from
idle capacity shared between all jobs. Every job gets at least one decision, a noop saying why not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from autoscaler.core.capacity import CapacityPool, Claim, fill, grant_of
from autoscaler.core.deadline import on_demand
from autoscaler.core.departures import Departures, plan_departures, scaler_block
from autoscaler.core.model import (
    Action,
    Decision,
    GpuNode,
    Job,
    Reason,
    Snapshot,
    Worker,
)
from autoscaler.core.notices import NodeRisk, classify
from autoscaler.core.policy import POLICY_LABEL, Policy, PolicySet, PreemptionRules


@dataclass(slots=True)
class _Plan:
    """One job's pass: its effective policy, its departures, and its claim on idle GPUs."""

    job: Job
    policy: Policy
    departures: Departures
    ceiling: int  # max workers, less a doomed host kept in discovery (it still counts)
    claim: Claim | None = None
    blocked: Reason | None = None
    note: str = ""  # says more than the blocking reason's own message


def decide(snapshot: Snapshot, policies: PolicySet, now: datetime) -> list[Decision]:
    nodes = {n.name: n for n in snapshot.nodes}
    plans, held, cluster_spend = _plan_jobs(snapshot, policies, nodes, now)
    pool = _idle_capacity(snapshot, policies, cluster_spend, now)
    _share(pool, plans, held, now)
    decisions: list[Decision] = []
    for plan in plans:
        decisions.extend(plan.departures.decisions)
        if plan.departures.blocks_scale_out is None:  # else departures say what happens now
            growth = _growth_decision(plan, pool, now)
            staying = _staying(plan.job, plan.departures)
            decisions.append(
                on_demand(growth, plan.job, plan.policy, staying, plan.ceiling, nodes, now)
            )
    return decisions


def decide_departures(
    snapshot: Snapshot, policies: PolicySet, now: datetime, keys: frozenset[str]
) -> list[Decision]:
    """The departures `decide` would make for the jobs `keys`, and nothing else: the notice fast
    path. A job's departures depend on that job, its policy, the notices and the nodes only, so
    the two agree (tests/test_core_invariants.py); growth waits for the full pass."""
    nodes = {n.name: n for n in snapshot.nodes}
    chosen = replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.key in keys))
    plans, _, _ = _plan_jobs(chosen, policies, nodes, now)
    return [d for plan in plans for d in plan.departures.decisions]


def _plan_jobs(
    snapshot: Snapshot, policies: PolicySet, nodes: Mapping[str, GpuNode], now: datetime
) -> tuple[list[_Plan], list[Claim], float]:
    """Each managed job's plan, by key; the claims held for refills that wait for the job's own
    scaler (room kept, no decision); what the running workers cost per hour in all."""
    risks: dict[PreemptionRules, NodeRisk] = {}
    effective: dict[str, Policy] = {}  # each policy's windows evaluated once per pass
    plans: list[_Plan] = []
    held: list[Claim] = []
    cluster_spend = 0.0
    for job in sorted(snapshot.jobs, key=lambda j: j.key):
        base = policies.for_job(job)
        if base is None:
            continue  # unmanaged: no policy selects it
        if base.name not in effective:
            effective[base.name] = base.at(now)
        policy = effective[base.name]
        if policy.preemption not in risks:
            risks[policy.preemption] = classify(snapshot.notices, policy.preemption, now)
        plan, hold, spend = _plan_job(
            job, policy, risks[policy.preemption], nodes, now, _pin_problem(job, policies, policy)
        )
        plans.append(plan)
        held.extend(hold)
        cluster_spend += spend
    return plans, held, cluster_spend


def _pin_problem(job: Job, policies: PolicySet, fallback: Policy) -> str:
    """Why a job pinned to a policy that does not exist may not grow ("" when it is not)."""
    pinned = policies.unknown_pin(job)
    if pinned is None:
        return ""
    names = ", ".join(p.name for p in policies.policies)
    return (
        f"label {POLICY_LABEL}={pinned!r} names no policy (there are: {names}); no scale-out "
        f"until it does; notices still drain it under {fallback.name!r}"
    )


def _plan_job(
    job: Job,
    policy: Policy,
    risk: NodeRisk,
    nodes: Mapping[str, GpuNode],
    now: datetime,
    pin_problem: str = "",
) -> tuple[_Plan, list[Claim], float]:
    """One job: who leaves, whether it may grow (a claim on idle GPUs), its spend per hour."""
    lo, hi = policy.bounds(job)
    departures = plan_departures(job, policy, risk, nodes, (lo, hi), now)
    plan = _Plan(job, policy, departures, hi - (departures.kept is not None), note=pin_problem)
    # a doomed host kept for Horovod's sake counts towards max, not towards min: refill it
    staying = _staying(job, departures)
    spend = _spend(job, staying, nodes)
    plan.blocked = (
        departures.blocks_scale_out
        or (Reason.UNKNOWN_POLICY if pin_problem else None)
        or _growth_blocked(job, policy, now)
    )
    held: list[Claim] = []
    if plan.blocked is None and len(staying) < plan.ceiling:
        plan.claim = Claim(job, policy, len(staying), plan.ceiling, spend)
    elif plan.blocked is None:
        plan.blocked = Reason.CLAMP_MAX
    elif len(staying) < lo and plan.blocked not in _NOT_SOON and policy.scale_out.enabled:
        # below min and waiting only for its own scaler: others must not take its refill
        held.append(Claim(job, policy, len(staying), plan.ceiling, spend))
    return plan, held, spend


def _staying(job: Job, departures: Departures) -> list[Worker]:
    return [w for w in job.workers if w not in departures.leaving and w is not departures.kept]


def _idle_capacity(
    snapshot: Snapshot, policies: PolicySet, cluster_spend: float, now: datetime
) -> CapacityPool:
    """The idle GPUs, less what pending (unbound) workers will take."""
    pool = CapacityPool(
        snapshot.nodes,
        noticed=frozenset(n.node for n in snapshot.notices),
        idle_since=snapshot.idle_since,
        now=now,
        cluster_budget=policies.cluster_budget_per_hour,
        cluster_spend=cluster_spend,
    )
    for job in snapshot.jobs:
        for w in job.workers:
            if w.node is None:
                pool.hold_for_unbound(job.gpus_per_worker)
    return pool


def _share(pool: CapacityPool, plans: list[_Plan], held: list[Claim], now: datetime) -> None:
    """Fill the claims from the pool: refills to min first (no cooldown, no settled idle
    capacity needed), then growth to max for jobs not cooling down."""
    claims = [p.claim for p in plans if p.claim is not None]
    refills = [c for c in claims if c.current < c.policy.bounds(c.job)[0]] + held
    for c in refills:
        c.target, c.skip_min_idle = min(_refill_target(c), c.target), True
    fill(pool, refills)
    ceilings = {p.job.key: p.ceiling for p in plans}
    for c in claims:
        c.target, c.skip_min_idle = ceilings[c.job.key], False
    fill(pool, [c for c in claims if not _cooling_down(c.job, c.policy, now)])


# Growth blocks that do not lift within a scaler's lifetime: no room is held for these.
_NOT_SOON = frozenset(
    {
        Reason.JOB_NOT_RUNNING,
        Reason.SCALE_OUT_DISABLED,
        Reason.BACKOFF,
        Reason.SCALER_STUCK,
        Reason.UNKNOWN_POLICY,
    }
)


def _growth_blocked(job: Job, policy: Policy, now: datetime) -> Reason | None:
    if (block := scaler_block(job, policy, now)) is not None:
        return block[0]
    if not job.running:
        return Reason.JOB_NOT_RUNNING
    if not policy.scale_out.enabled:
        return Reason.SCALE_OUT_DISABLED
    failed = job.last_failed_scale_out_at
    if failed is not None and now - failed < policy.scale_out.backoff:
        return Reason.BACKOFF
    return None


def _cooling_down(job: Job, policy: Policy, now: datetime) -> bool:
    last = job.last_scale_out_at
    return last is not None and now - last < policy.scale_out.cooldown


def _refill_target(claim: Claim) -> int:
    """The smallest count the quantum allows at or above min (never above max)."""
    lo, hi = claim.policy.bounds(claim.job)
    quantum = claim.policy.scale_out.quantum
    target = lo if quantum.allows(lo) else quantum.next_above(lo)
    return min(target, hi)


def _spend(job: Job, workers: list[Worker], nodes: Mapping[str, GpuNode]) -> float:
    total = 0.0
    for w in workers:
        node = nodes.get(w.node or "")
        price = node.price_per_gpu_hour if node else None
        total += job.gpus_per_worker * (price or 0.0)
    return total


def _growth_decision(plan: _Plan, pool: CapacityPool, now: datetime) -> Decision:
    job, policy, claim, blocked = plan.job, plan.policy, plan.claim, plan.blocked
    n = len(job.workers)
    lo, _ = policy.bounds(job)
    staying = claim.current if claim is not None else n  # without doomed workers kept for now
    below = (Reason.BELOW_MIN,) if staying < lo else ()
    if claim is None:
        reason = blocked or Reason.STEADY
        message = plan.note or reason.info.message
        if reason is Reason.SCALER_STUCK and (block := scaler_block(job, policy, now)):
            message = block[1]
        return Decision.noop(job, reason, policy.name, tags=below, message=message)
    grant = grant_of(claim, pool, at_max=claim.target == plan.ceiling)
    if grant.count == 0:
        why_not = grant.why_not or Reason.NO_CAPACITY
        if _cooling_down(job, policy, now) and not below:
            why_not = Reason.COOLDOWN
        return Decision.noop(
            job,
            why_not,
            policy.name,
            tags=below + grant.tags,
            message=why_not.info.message,
        )
    message = f"{grant.count} worker(s) of {job.gpus_per_worker:g} GPU fit on idle capacity"
    tags = grant.tags
    reused = _blacklisted_names(job, grant.count)
    if reused:
        tags += (Reason.BLACKLIST_RISK,)
        message += (
            f"; {', '.join(reused)} failed before and Horovod blacklists it for the job's life"
            " unless horovodrun has --blacklist-cooldown-range"
        )
    return Decision.about(
        job,
        Action.SCALE_OUT,
        Reason.BELOW_MIN if below else Reason.IDLE_CAPACITY,
        policy.name,
        to_workers=n + grant.count,
        count=grant.count,
        nodes=tuple(sorted(grant.nodes)),
        tags=tags,
        message=message,  # one entry per worker
        timeout=policy.scale_out.timeout,
    )


def _blacklisted_names(job: Job, count: int) -> tuple[str, ...]:
    """New pod names that Horovod already saw fail (operators that reuse indices after a
    scale-in give a new worker a removed one's name)."""
    if not job.reuses_names or not job.failed_hosts:
        return ()
    return tuple(name for name in job.next_pod_names(count) if name in job.failed_hosts)
