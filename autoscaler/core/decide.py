"""`decide(snapshot, policies, now) -> decisions`: the whole policy, pure and deterministic.

Per job: departures first (drain, then a ScaleIn naming exactly the doomed pods), then growth from
idle capacity shared between all jobs. Every job gets at least one decision, a noop saying why not.
With a `PassMemo` a pass reuses what the last one planned where nothing it was planned from has
changed (core/memo.py); the decisions are the same as without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial

from autoscaler.core.capacity import CapacityPool, Claim, fill, grant_of
from autoscaler.core.deadline import needs_fleet, on_demand
from autoscaler.core.departures import Departures, plan_departures, scaler_block
from autoscaler.core.freshness import hold_for_view
from autoscaler.core.memo import PassMemo
from autoscaler.core.model import (
    Action,
    Decision,
    GpuNode,
    Job,
    Reason,
    ScalerKind,
    Snapshot,
    Worker,
)
from autoscaler.core.moment import Moment
from autoscaler.core.notices import NodeRisk, classify
from autoscaler.core.policy import POLICY_LABEL, Policy, PolicySet, PreemptionRules


@dataclass(frozen=True, slots=True)
class _Plan:
    """One job's pass: its effective policy, its departures, and whether it claims idle GPUs.
    Read-only once made, so a later pass may reuse it (core/memo.py)."""

    job: Job
    policy: Policy
    departures: Departures
    ceiling: int  # max workers, less a doomed host kept in discovery (it still counts)
    staying: int  # workers that stay (a doomed host kept for now does not)
    spend: float  # what the staying workers cost per hour
    blocked: Reason | None  # None: it claims idle GPUs up to `ceiling`
    holds: bool = False  # below min, waiting for its own scaler: room is kept for its refill
    note: str = ""  # says more than the blocking reason's own message

    def claim(self) -> Claim:
        """A fresh claim on idle GPUs from its staying workers up to its ceiling (a pass's
        sharing changes it; the plan itself is reused)."""
        return Claim(self.job, self.policy, self.staying, self.ceiling, self.spend)


def decide(
    snapshot: Snapshot, policies: PolicySet, now: datetime, memo: PassMemo | None = None
) -> list[Decision]:
    memo = memo if memo is not None else PassMemo(keep=False)
    memo.begin(policies, now)
    nodes = {n.name: n for n in snapshot.nodes}
    noticed = frozenset(n.node for n in snapshot.notices)
    plans = _plan_jobs(snapshot, policies, nodes, noticed, now, memo)
    growth = memo.growth(
        (tuple(plans), snapshot.nodes, snapshot.jobs, snapshot.idle_since, noticed),
        now,
        lambda: _grow(snapshot, policies, plans, now, memo),
    )
    decisions: list[Decision] = []
    for plan in plans:
        decisions.extend(plan.departures.decisions)
        if plan.departures.blocks_scale_out is None:  # else departures say what happens now
            decision = growth[plan.job.key]
            if needs_fleet(decision, plan.policy):
                staying = _staying(plan.job, plan.departures)
                decision = on_demand(
                    decision, plan.job, plan.policy, staying, plan.ceiling, nodes, now, noticed
                )
            decisions.append(decision)
    return hold_for_view(decisions, snapshot)


def decide_departures(
    snapshot: Snapshot, policies: PolicySet, now: datetime, keys: frozenset[str]
) -> list[Decision]:
    """The departures `decide` would make for the jobs `keys`, and nothing else: the notice fast
    path. A job's departures depend on that job, its policy, the notices and the nodes only, so
    the two agree (tests/test_core_invariants.py); growth waits for the full pass."""
    nodes = {n.name: n for n in snapshot.nodes}
    chosen = replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.key in keys))
    noticed = frozenset(n.node for n in snapshot.notices)
    plans = _plan_jobs(chosen, policies, nodes, noticed, now, PassMemo(keep=False))
    return hold_for_view((d for plan in plans for d in plan.departures.decisions), snapshot)


def _plan_jobs(
    snapshot: Snapshot,
    policies: PolicySet,
    nodes: Mapping[str, GpuNode],
    noticed: frozenset[str],
    now: datetime,
    memo: PassMemo,
) -> list[_Plan]:
    """Each managed job's plan, by key: the memo's where nothing it was made from changed."""
    risks: dict[PreemptionRules, NodeRisk] = {}
    plans: list[_Plan] = []
    for job in sorted(snapshot.jobs, key=lambda j: j.key):
        base = policies.for_job(job)
        if base is None:
            continue  # unmanaged: no policy selects it
        policy = memo.effective(base, now)  # each policy's windows evaluated once per pass
        if policy.preemption not in risks:
            risks[policy.preemption] = classify(snapshot.notices, policy.preemption, now)
        risk = risks[policy.preemption]

        def plan(
            moment: Moment, job: Job = job, policy: Policy = policy, risk: NodeRisk = risk
        ) -> _Plan:
            return _plan_job(job, policy, risk, nodes, moment, _pin_problem(job, policies, policy))

        plans.append(memo.plan(job, policy, nodes, noticed, risk, now, plan))
    return plans


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
    moment: Moment,
    pin_problem: str = "",
) -> _Plan:
    """One job: who leaves, whether it may grow (a claim on idle GPUs), its spend per hour. Its
    time rules read the time only through `moment`, which tells the memo when they flip."""
    if problem := _unscalable(job, policy):  # left alone: one noop says why, nothing else
        return _Plan(
            job,
            policy,
            Departures(),
            len(job.workers),
            len(job.workers),
            _spend(job, list(job.workers), nodes),
            Reason.NOT_SCALABLE,
            note=problem,
        )
    lo, hi = policy.bounds(job)
    departures = plan_departures(job, policy, risk, nodes, (lo, hi), moment)
    ceiling = hi - (departures.kept is not None)
    # a doomed host kept for Horovod's sake counts towards max, not towards min: refill it
    staying = _staying(job, departures)
    blocked = (
        departures.blocks_scale_out
        or (Reason.UNKNOWN_POLICY if pin_problem else None)
        or _growth_blocked(job, policy, moment)
    )
    holds = False
    if blocked is None and len(staying) >= ceiling:
        blocked = Reason.CLAMP_MAX
    elif blocked is not None:
        # below min and waiting only for its own scaler: others must not take its refill
        holds = len(staying) < lo and blocked not in _NOT_SOON and policy.scale_out.enabled
    spend = _spend(job, staying, nodes)
    return _Plan(job, policy, departures, ceiling, len(staying), spend, blocked, holds, pin_problem)


def _unscalable(job: Job, policy: Policy) -> str:
    """Why the job cannot be scaled as it is ("" when it can): what its kind says, or a min
    that the policy's max cannot hold (the job would be taken below its own min or above the
    policy's max, whichever way it moved)."""
    if job.unscalable:
        return job.unscalable
    most = policy.limits.max_workers
    if most is not None and job.min_workers > most:
        return (
            f"the job's min ({job.min_workers} workers) is above policy {policy.name!r}'s max "
            f"({most}): not scaled until one of them changes"
        )
    return ""


def _grow(
    snapshot: Snapshot, policies: PolicySet, plans: list[_Plan], now: datetime, memo: PassMemo
) -> tuple[dict[str, Decision], datetime | None]:
    """Each job's growth decision from idle capacity shared between the plans, and when time
    alone could change them (cooldowns ending, idle capacity settling)."""
    cluster_spend = sum(p.spend for p in plans)
    pool = _idle_capacity(snapshot, policies, cluster_spend, now)
    claims = _share(pool, plans, now)
    growth: dict[str, Decision] = {}
    for p in plans:
        if p.departures.blocks_scale_out is not None:
            continue
        key = p.job.key
        if (claim := claims.get(key)) is not None:
            growth[key] = _growth_decision(p, claim, pool, now)
        else:
            growth[key] = memo.unclaimed(key, p, partial(_growth_decision, p, None, pool, now))
    return growth, _regrow_at(pool, plans, claims, now)


def _regrow_at(
    pool: CapacityPool, plans: list[_Plan], claims: Mapping[str, Claim], now: datetime
) -> datetime | None:
    """The first moment a cooldown ends or an idle node settles past a claim's min_idle."""
    times = [
        p.job.last_scale_out_at + p.policy.scale_out.cooldown
        for p in plans
        if p.job.last_scale_out_at is not None
    ]
    min_idles = {c.policy.scale_out.min_idle for c in claims.values()}
    for idle_for in pool.idle_for.values():
        if idle_for is not None:
            times.extend(now - idle_for + m for m in min_idles)
    return min((t for t in times if t > now), default=None)


def _staying(job: Job, departures: Departures) -> list[Worker]:
    if not departures.leaving and departures.kept is None:
        return list(job.workers)
    gone = {id(w) for w in departures.leaving}
    if departures.kept is not None:
        gone.add(id(departures.kept))
    return [w for w in job.workers if id(w) not in gone]


def _idle_capacity(
    snapshot: Snapshot, policies: PolicySet, cluster_spend: float, now: datetime
) -> CapacityPool:
    """The idle GPUs, less what pending (unbound) workers and those a ScaleOut has yet to make
    will take."""
    pool = CapacityPool(
        snapshot.nodes,
        noticed=frozenset(n.node for n in snapshot.notices),
        idle_since=snapshot.idle_since,
        now=now,
        cluster_budget=policies.cluster_budget_per_hour,
        cluster_spend=cluster_spend,
    )
    for job in snapshot.jobs:
        unbound = sum(1 for w in job.workers if w.node is None)
        if job.scaler is not None and job.scaler.kind is ScalerKind.SCALE_OUT:
            unbound += job.scaler.unborn
        for _ in range(unbound):
            pool.hold_for_unbound(job.gpus_per_worker)
    return pool


def _share(pool: CapacityPool, plans: list[_Plan], now: datetime) -> dict[str, Claim]:
    """Fill the claims from the pool: refills to min first (no cooldown, no settled idle
    capacity needed), then growth to max for jobs not cooling down. The claims, by job."""
    claims = {p.job.key: p.claim() for p in plans if p.blocked is None}
    held = [p.claim() for p in plans if p.holds]
    refills = [c for c in claims.values() if c.current < c.policy.bounds(c.job)[0]] + held
    for c in refills:
        c.target, c.skip_min_idle = min(_refill_target(c), c.target), True
    fill(pool, refills)
    ceilings = {p.job.key: p.ceiling for p in plans}
    for key, claim in claims.items():
        claim.target, claim.skip_min_idle = ceilings[key], False
    fill(pool, [c for c in claims.values() if not _cooling_down(c.job, c.policy, now)])
    return claims


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


def _growth_blocked(job: Job, policy: Policy, moment: Moment) -> Reason | None:
    if (block := scaler_block(job, policy, moment)) is not None:
        return block[0]
    if not job.running:
        return Reason.JOB_NOT_RUNNING
    if not policy.scale_out.enabled:
        return Reason.SCALE_OUT_DISABLED
    failed = job.last_failed_scale_out_at
    if failed is not None and not moment.reached(failed + policy.scale_out.backoff):
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


def _growth_decision(
    plan: _Plan, claim: Claim | None, pool: CapacityPool, now: datetime
) -> Decision:
    job, policy, blocked = plan.job, plan.policy, plan.blocked
    n = len(job.workers)
    lo, _ = policy.bounds(job)
    staying = claim.current if claim is not None else n  # without doomed workers kept for now
    below = (Reason.BELOW_MIN,) if staying < lo else ()
    if claim is None:
        reason = blocked or Reason.STEADY
        message = plan.note or reason.info.message
        if reason is Reason.SCALER_STUCK and (block := scaler_block(job, policy, Moment(now))):
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
