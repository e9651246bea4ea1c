"""On-demand workers for one job: the anchor, and the pace a deadline needs.

The daemon buys no nodes. When a policy wants on-demand workers, the job is scaled out beyond idle
spot capacity (a ScaleOut with no node), its pods go Pending and the cluster's node autoscaler
provisions them (docs/deadlines.md). Spot comes first: these rules act only when idle spot
capacity gave the job nothing this pass, and the workers they add are the first to go.

Two rules (DeadlineRules.rule):
- `paced`: while on-demand alone (`max_on_demand`, within max) could still finish the rest 1.2x
  over before `deadline - margin`, wait for spot; past that point, the workers the pace needs
  now, on-demand making up what spot lacks. On-demand leaves once spot covers the need with 20%
  to spare, or the slack is back above 1.44x (so a worker is not added and removed in turn).
- `uniform_progress`: Can't Be Late's rule (Wu et al., NSDI '24) for one elastic job: behind the
  straight line from start to `deadline - margin`, run every allowed worker (on-demand filling
  in); above it, none on-demand, once ahead by `margin`'s worth of the line (the paper's
  hysteresis). The benchmark's baseline.

The anchor (`min_on_demand`) is kept under either rule while the job runs, unless spot is calm
(`calm_after`), so a spot wipe-out leaves Horovod a host of its previous set and the job goes on
without a restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from autoscaler.core.model import Action, CapacityType, Decision, GpuNode, Job, Reason, Worker
from autoscaler.core.policy import DeadlineRules, OnDemandRules, Policy

_SPARE = 1.2  # on-demand leaves only once spot alone covers the need this many times
# A growth noop for these reasons means no scaler may be created now, on-demand or not.
_NO_SCALER = frozenset(
    {
        Reason.SCALER_IN_FLIGHT,
        Reason.SCALER_STUCK,
        Reason.JOB_NOT_RUNNING,
        Reason.BACKOFF,
        Reason.SCALE_OUT_DISABLED,
        Reason.UNKNOWN_POLICY,
    }
)


@dataclass(frozen=True, slots=True)
class OnDemandNeed:
    want: int  # on-demand workers to have now (scale out below this)
    keep: int  # on-demand workers to keep (scale in above this); keep >= want
    reason: Reason  # the rule that set `want`
    message: str
    release: Reason = Reason.AHEAD_OF_DEADLINE  # why on-demand workers above `keep` leave
    alert: Reason | None = None  # deadline_infeasible / no_progress: a person must hear of it


@dataclass(frozen=True, slots=True)
class Fleet:
    """A job's staying workers by where they run: pending ones are not placed yet, so they are
    the ones a ScaleOut past idle capacity made (the node autoscaler is bringing them up)."""

    spot: tuple[Worker, ...]
    on_demand: tuple[Worker, ...]

    @classmethod
    def of(cls, workers: list[Worker], nodes: Mapping[str, GpuNode]) -> Fleet:
        spot: list[Worker] = []
        on_demand: list[Worker] = []
        for w in workers:
            node = nodes.get(w.node or "")
            placed_on_spot = node is not None and node.capacity_type is CapacityType.SPOT
            (spot if placed_on_spot else on_demand).append(w)
        return cls(tuple(spot), tuple(on_demand))


@dataclass(frozen=True, slots=True)
class _Pacing:
    """One job's deadline pass: what the rules weigh."""

    job: Job
    progress: float
    deadline: DeadlineRules
    due: datetime
    anchor: OnDemandNeed  # what the anchor alone wants
    cap: int  # on-demand workers allowed (max_on_demand, within max)
    hi: int  # max workers
    spot: int  # staying workers on spot
    now: datetime

    @property
    def every_worker(self) -> int:
        """On-demand workers that bring the job to max, within the cap."""
        return _clamp(self.hi - self.spot, self.anchor.want, self.cap)


def _wants_any(policy: Policy) -> bool:
    return policy.on_demand.min_on_demand > 0 or policy.deadline is not None


def on_demand_need(job: Job, policy: Policy, fleet: Fleet, now: datetime) -> OnDemandNeed | None:
    """What `policy` wants of on-demand workers for `job` now; None when it wants none at all."""
    rules, deadline = policy.on_demand, policy.deadline
    if not _wants_any(policy):
        return None
    lo, hi = policy.bounds(job)
    cap = hi if rules.max_on_demand is None else min(hi, rules.max_on_demand)
    anchor = _anchor(rules, cap, fleet, now)
    if deadline is None:
        return anchor
    due = deadline.due(job.started_at)
    if due is None or job.progress is None:
        return _with_alert(anchor, Reason.NO_PROGRESS, "annotation spot-autoscaler.io/progress")
    if job.progress >= 1.0:
        return anchor
    pacing = _Pacing(job, job.progress, deadline, due, anchor, cap, hi, len(fleet.spot), now)
    return _uniform_progress(pacing) if deadline.rule == "uniform_progress" else _paced(pacing)


def _anchor(rules: OnDemandRules, cap: int, fleet: Fleet, now: datetime) -> OnDemandNeed:
    """The anchor alone: `min_on_demand` workers, none while spot is calm (`calm_after`)."""
    size = min(rules.min_on_demand, cap)
    message = f"keep {size} worker(s) on on-demand"
    if size and rules.calm_after is not None:
        settled = now - rules.calm_after
        calm = sum(1 for w in fleet.spot if w.ready_since is None or w.ready_since <= settled)
        if calm >= rules.calm_spot_workers:
            size = 0
            message = f"spot is calm: {calm} spot worker(s) up {rules.calm_after} or longer"
    return OnDemandNeed(size, size, Reason.ANCHOR_ON_DEMAND, message, Reason.CONSOLIDATE_TO_SPOT)


def _with_alert(need: OnDemandNeed, alert: Reason, detail: str) -> OnDemandNeed:
    return replace(need, message=f"{alert.info.message} ({detail})", alert=alert)


def _paced(p: _Pacing) -> OnDemandNeed:
    remaining = 1.0 - p.progress
    hours = (p.due - p.deadline.margin - p.now).total_seconds() / 3600
    rate = p.job.progress_rate
    if rate is None or rate <= 0:  # nothing measured yet: the anchor, until progress moves
        return p.anchor
    if hours <= 0:
        return _infeasible(p, "past the deadline less its margin")
    needed = math.ceil(remaining / (hours * rate) - 1e-9)
    if needed > p.hi:
        return _infeasible(p, f"{needed} workers needed, max {p.hi}")
    # Spot may come back before the deadline is at risk: while on-demand alone (at most `cap`
    # workers) could still finish in the time left with room to spare, wait for it.
    slack = hours / (remaining / (min(p.hi, p.cap) * rate))
    message = f"{remaining:.0%} left in {hours:.1f} h needs {needed} worker(s), {p.spot} on spot"
    pace_keep = _clamp(math.ceil(needed * _SPARE) - p.spot, p.anchor.want, p.cap)
    if slack > _SPARE:
        keep = pace_keep if slack <= _SPARE * _SPARE else p.anchor.keep
        waiting = f"{message}; on-demand alone could finish {slack:.1f}x over: waiting for spot"
        return replace(p.anchor, keep=keep, message=waiting, release=Reason.AHEAD_OF_DEADLINE)
    want = _clamp(needed - p.spot, p.anchor.want, p.cap)
    reason = Reason.BEHIND_DEADLINE if want > p.anchor.want else p.anchor.reason
    message += f", {want} on on-demand"
    return OnDemandNeed(want, max(want, pace_keep), reason, message)


def _uniform_progress(p: _Pacing) -> OnDemandNeed:
    """Behind the line: every allowed worker. On-demand workers stay until progress is ahead of
    the line by `margin`'s worth of it (Can't Be Late's hysteresis: without it, on-demand is
    bought and let go on every other pass)."""
    start = p.job.started_at
    span = (p.due - p.deadline.margin - start).total_seconds() if start is not None else 0.0
    if start is None or span <= 0:
        return _with_alert(p.anchor, Reason.NO_PROGRESS, "the job's start is unknown")
    line = min(1.0, (p.now - start).total_seconds() / span)
    band = p.deadline.margin.total_seconds() / span
    if p.progress >= line:
        keep = p.anchor.want if p.progress >= line + band else p.every_worker
        message = f"progress {p.progress:.0%} on or above the line ({line:.0%}): spot only"
        return OnDemandNeed(p.anchor.want, keep, Reason.AHEAD_OF_DEADLINE, message)
    message = f"progress {p.progress:.0%} below the line ({line:.0%}): every worker"
    return OnDemandNeed(p.every_worker, p.every_worker, Reason.BEHIND_DEADLINE, message)


def _infeasible(p: _Pacing, why: str) -> OnDemandNeed:
    """Too late to finish in time: every allowed worker, within the on-demand cap (spend stays
    bounded), and a person is told."""
    need = OnDemandNeed(p.every_worker, p.every_worker, Reason.BEHIND_DEADLINE, "")
    return _with_alert(need, Reason.DEADLINE_INFEASIBLE, why)


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def needs_fleet(growth: Decision, policy: Policy) -> bool:
    """Whether `on_demand` may replace `growth`: not in the usual case, on every job every pass
    (the caller then need not sort out the job's fleet)."""
    return growth.action is Action.NOOP and growth.reason not in _NO_SCALER and _wants_any(policy)


def on_demand(
    growth: Decision,
    job: Job,
    policy: Policy,
    staying: list[Worker],
    ceiling: int,
    nodes: Mapping[str, GpuNode],
    now: datetime,
) -> Decision:
    """`growth` (the idle-capacity decision), or in its place, when it adds nothing, an on-demand
    ScaleOut past idle capacity, a ScaleIn of on-demand workers no longer needed, or an alert."""
    if not needs_fleet(growth, policy):
        return growth
    fleet = Fleet.of(staying, nodes)
    need = on_demand_need(job, policy, fleet, now)
    assert need is not None
    have = len(fleet.on_demand)
    tags = (need.alert,) if need.alert else ()
    room = min(ceiling - len(staying), policy.scale_out.max_step or ceiling)
    if have < need.want and room > 0:
        count = min(need.want - have, room)
        return Decision.about(
            job,
            Action.SCALE_OUT,
            need.reason,
            policy.name,
            to_workers=len(job.workers) + count,
            count=count,
            tags=tags,
            message=f"{need.message}; past idle spot capacity: the node autoscaler provisions",
            timeout=policy.scale_out.timeout,
        )
    lo, _ = policy.bounds(job)
    surplus = min(have - need.keep, len(staying) - lo)
    victims = _newest(job, fleet.on_demand, surplus) if job.scaler is None and job.running else ()
    if victims:
        return Decision.scale_in(
            job,
            need.release,
            policy.name,
            victims,
            hosts=tuple(w.host for w in staying if w.pod in victims),
            tags=tags,
            message=f"{need.message}; remove on-demand {', '.join(victims)}",
        )
    if need.alert is not None:
        return Decision.noop(
            job, need.alert, policy.name, tags=(growth.reason,), message=need.message
        )
    return replace(growth, message=f"{growth.message}; {need.message}")


def _newest(job: Job, among: tuple[Worker, ...], count: int) -> tuple[str, ...]:
    """The workers of `among` to let go: not yet placed first (nothing to lose), then the
    newest. An operator that removes the highest indices (mpi-operator) can only lose its top
    ones."""
    if count <= 0:
        return ()
    order = sorted(among, key=lambda w: (not w.pending, -w.index))
    victims = order[:count]
    if job.removes_highest_first:
        top = sorted(job.workers, key=lambda w: -w.index)[:count]
        if {w.pod for w in top} != {w.pod for w in victims}:
            return ()
    return tuple(w.pod for w in victims)
