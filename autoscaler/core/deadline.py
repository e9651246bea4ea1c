"""On-demand workers for one job: the anchor, and what a deadline needs.

The daemon buys no nodes. When a policy wants on-demand workers, the job is scaled out beyond idle
spot capacity (a ScaleOut with no node), its pods go Pending and the cluster's node autoscaler
provisions them (docs/deadlines.md). Spot comes first: these rules act only when idle spot
capacity gave the job nothing this pass, and the workers they add are the first to go.

Both deadline rules pace on the job's committed progress (its annotation, after rollbacks and
restarts) against Uniform Progress's line (Can't Be Late, Wu et al., NSDI '24): the straight line
in work from the job's start to `deadline - margin`. Both re-check on every pass:
- the Safety Net: once the time left is below what on-demand alone (the cap's workers, at a lower
  bound of their speed: core/pace.py) needs for the rest plus two changeovers d̂, every allowed
  worker (under `paced`, only the on-demand workers whose lower bound alone finishes one d̂
  before the end: _net_fill); those stay until the slack is back above 2 d̂. While the job runs
  on fewer workers than the cap, the slack shrinks by itself; the net sees that on the next pass.
  d̂ holds the slowest recent start, and while on-demand is scarce what it waited for on-demand:
  the oldest on-demand worker still Pending (its age, from the snapshot) and the longest recent
  wait of one off spot, started or gone unstarted (a timed-out ScaleOut: core/progress_rates.py).
- `uniform_progress` (the baseline, the paper's rule for one elastic job): behind the line, every
  allowed worker (on-demand filling in next to spot); they stay until progress is ahead of the
  line by two changeovers, ep(t + 2 d̂) (the paper's hysteresis).
- `paced`: the same line, but behind it only the on-demand workers whose lower-bound speed, next
  to the spot workers there are, catches up with it; they stay while progress is below
  ep(t + 2 d̂), and above it only what keeps the job near the line (while on-demand is scarce,
  what `uniform_progress` keeps: one let go costs d̂ to get back). Until the job's speed has
  been measured nothing is provable and `paced` acts as `uniform_progress`. The throughput model
  is used only to buy fewer workers than the baseline would, never to buy later: in every state
  `paced` wants and keeps no more on-demand workers than `uniform_progress` would. (It can still
  cost more over a whole trace: UP's larger fill builds a lead that pays when spot is short near
  the end; docs/deadlines.md.)

The anchor (`min_on_demand`) is kept while the job runs unless spot is calm (`calm_after`), so a
spot wipe-out leaves Horovod a host of its previous set and the job goes on without a restart;
with a deadline (`anchor: at_risk`) only while the deadline's slack is below one whole-job
restart: otherwise the restart it saves costs less than the anchor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from autoscaler.core.model import Action, CapacityType, Decision, GpuNode, Job, Reason, Worker
from autoscaler.core.pace import Pace
from autoscaler.core.policy import DeadlineRules, OnDemandRules, Policy

_OD = CapacityType.ON_DEMAND
# paced: behind the line, the gap is closed over this many changeovers d̂; above ep(t + 2 d̂),
# on-demand is cut to what paces this share of the line's slope (the job drifts back down)
_SLOWER = 0.8
_CATCH_UP = 6.0
_STALLED_HOURS = 1.0  # workers ran this long without the progress moving: more would not help
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
    """A job's staying workers by where they run (pending ones are not placed yet, so they are
    the ones a ScaleOut past idle capacity made: the node autoscaler is bringing them up), and
    how many more workers idle spot capacity could take now."""

    spot: tuple[Worker, ...]
    on_demand: tuple[Worker, ...]
    spot_room: int = 0

    @classmethod
    def of(
        cls,
        job: Job,
        workers: list[Worker],
        nodes: Mapping[str, GpuNode],
        noticed: frozenset[str] = frozenset(),
    ) -> Fleet:
        spot: list[Worker] = []
        on_demand: list[Worker] = []
        for w in workers:
            node = nodes.get(w.node or "")
            placed_on_spot = node is not None and node.capacity_type is CapacityType.SPOT
            (spot if placed_on_spot else on_demand).append(w)
        room = sum(
            int(n.idle_gpus // job.gpus_per_worker)
            for n in nodes.values()
            if n.capacity_type is CapacityType.SPOT and n.schedulable and n.name not in noticed
        )
        return cls(tuple(spot), tuple(on_demand), room)


@dataclass(frozen=True, slots=True)
class _Pacing:
    """One job's deadline pass: what the rules weigh. Times in hours, work in fractions."""

    job: Job
    progress: float
    deadline: DeadlineRules
    start: datetime
    end: datetime  # the deadline less its margin: where the line reaches 1
    rules: OnDemandRules
    cap: int  # on-demand workers allowed (max_on_demand, within max)
    hi: int  # max workers
    fleet: Fleet
    now: datetime
    pace: Pace

    @property
    def spot(self) -> int:
        return len(self.fleet.spot)

    @property
    def hours(self) -> float:
        return (self.end - self.now).total_seconds() / 3600

    @property
    def left(self) -> float:
        return 1.0 - self.progress

    @property
    def pending(self) -> float:
        """Seconds since the oldest on-demand worker still Pending was asked for (0: none). It
        has not started yet: on-demand takes at least this long now, measured or not."""
        return max(
            (
                (self.now - w.created_at).total_seconds()
                for w in self.fleet.on_demand
                if w.pending and w.created_at is not None
            ),
            default=0.0,
        )

    @property
    def changeover(self) -> float:
        """d̂, hours: the measured changeover, or longer while on-demand is scarce (a worker
        Pending now, or a recent one that went without starting)."""
        return self.pace.changeover_hours(self._floor, self.pending)

    @property
    def _floor(self) -> float:
        return self.deadline.changeover.total_seconds() / 3600

    def scarcity(self) -> str:
        """What raised d̂ above the starts measured, if on-demand scarcity did ("" if not)."""
        d = self.changeover
        if d <= replace(self.pace, on_demand_wait=0.0).changeover_hours(self._floor):
            return ""
        if self.pending >= self.pace.on_demand_wait:
            why = f"an on-demand worker Pending {self.pending / 60:.0f} min"
        else:
            why = f"a recent on-demand worker waited {self.pace.on_demand_wait / 60:.0f} min"
        return f"; d̂ {d:.2f} h raised by scarce on-demand: {why}"

    def line(self, later: float = 0.0) -> float:
        """Uniform Progress's expected progress `later` hours from now, ep(t + later)."""
        span = (self.end - self.start).total_seconds()
        at = (self.now + timedelta(hours=later) - self.start).total_seconds()
        return min(1.0, at / span) if span > 0 else 1.0

    @property
    def slope(self) -> float:
        """The line's slope: fraction of the job per hour."""
        return 1.0 / max(1e-9, (self.end - self.start).total_seconds() / 3600)

    @property
    def size(self) -> int:
        """The ring if spot vanished now: the on-demand cap."""
        return min(self.hi, self.cap)

    def lower(self, workers: int) -> float:
        return self.pace.lower(workers, self.deadline.scaling)

    @property
    def slack(self) -> float | None:
        """Time left less what on-demand alone needs (lower-bound speed) and 2 d̂; None until a
        speed has been measured."""
        speed = self.lower(self.size)
        if speed <= 0:
            return None
        return self.hours - self.left / speed - 2 * self.changeover

    def every_worker(self, floor: int, spot: int | None = None) -> int:
        """On-demand workers that bring the job to max next to `spot` (default: its spot
        workers), within the cap."""
        return _clamp(self.hi - (self.spot if spot is None else spot), floor, self.cap)

    def workers_for(self, speed: float, floor: int) -> int:
        """The fewest on-demand workers (at least `floor`) whose estimated speed next to the
        spot workers reaches `speed`; every allowed worker if none do."""
        most = self.every_worker(floor)
        for extra in range(floor, most):
            if self.pace.estimate(self.spot + extra, self.deadline.scaling) >= speed:
                return extra
        return most


def _wants_any(policy: Policy) -> bool:
    return policy.on_demand.min_on_demand > 0 or policy.deadline is not None


def on_demand_need(job: Job, policy: Policy, fleet: Fleet, now: datetime) -> OnDemandNeed | None:
    """What `policy` wants of on-demand workers for `job` now; None when it wants none at all."""
    rules, deadline = policy.on_demand, policy.deadline
    if not _wants_any(policy):
        return None
    _, hi = policy.bounds(job)
    cap = hi if rules.max_on_demand is None else min(hi, rules.max_on_demand)
    anchor = _anchor(rules, cap, fleet, now)
    if deadline is None:
        return anchor
    due = deadline.due(job.started_at)
    if due is None or job.started_at is None or job.progress is None:
        return _with_alert(anchor, Reason.NO_PROGRESS, "annotation spot-autoscaler.io/progress")
    if job.progress >= 1.0:
        return anchor
    end = due - deadline.margin
    pace = job.pace or Pace()
    p = _Pacing(job, job.progress, deadline, job.started_at, end, rules, cap, hi, fleet, now, pace)
    return _infeasible(p, anchor) or _deadline(p, _anchor_at_risk(p, anchor))


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


def _infeasible(p: _Pacing, anchor: OnDemandNeed) -> OnDemandNeed | None:
    """Bad input, said with its shortfall: past the deadline, progress that never moves, or more
    work left than every allowed worker can do (even at the upper bound of their speed)."""
    every = p.every_worker(anchor.want)
    behind = OnDemandNeed(every, every, Reason.BEHIND_DEADLINE, "")
    if p.hours <= 0:
        return _with_alert(behind, Reason.DEADLINE_INFEASIBLE, "past the deadline less its margin")
    if p.pace.stalled_hours >= _STALLED_HOURS:  # more workers would not help: spend no more
        why = f"progress {p.progress:.0%} has not moved in {p.pace.stalled_hours:.1f} h of work"
        return _with_alert(anchor, Reason.DEADLINE_INFEASIBLE, f"{why}: on-demand held back")
    best = p.pace.upper(p.size)
    if best is not None and best > 0 and p.left / best > p.hours:
        who = f"max_on_demand {p.cap}" if p.cap < p.hi else f"max {p.hi}"
        short = p.left / best - p.hours
        why = (
            f"{p.left:.0%} left needs at least {p.left / best:.1f} h at {p.size} workers "
            f"({who}), {p.hours:.1f} h left: short by {short:.1f} h"
        )
        return _with_alert(behind, Reason.DEADLINE_INFEASIBLE, why)
    return None


def _deadline(p: _Pacing, anchor: OnDemandNeed) -> OnDemandNeed:
    """The Safety Net, the line and the anchor together: the most any of them wants."""
    d = p.changeover
    every = p.every_worker(anchor.want)
    slack = p.slack
    net_want = every if slack is not None and slack < 0 else anchor.want
    net_keep = every if slack is not None and slack < 2 * d else anchor.keep
    up_want, up_keep = _uniform(p, every, anchor)
    if p.deadline.rule == "uniform_progress" or slack is None:
        line_want, line_keep = up_want, up_keep
    else:
        line_want, line_keep = _paced(p, anchor)
        # never hold more than uniform_progress would here: above ep(t + 2 d̂) its on-demand
        # leaves for idle spot that takes its place, paced's 80% pace must not keep it. While
        # on-demand is scarce (d̂ raised by it), hold what uniform_progress holds: a worker let
        # go now costs d̂ or more to get back, if it comes at all (the scarcity stress,
        # docs/deadlines.md: paced let go of on-demand that took 25 min and missed)
        line_keep = up_keep if p.scarcity() else min(line_keep, up_keep)
        if net_want > anchor.want:
            net_want = _net_fill(p, every, anchor.want)
    want = max(net_want, line_want)
    keep = max(want, net_keep, line_keep)
    return OnDemandNeed(
        want,
        keep,
        Reason.BEHIND_DEADLINE if want > anchor.want else anchor.reason,
        _explain(p, slack, d, anchor),
        anchor.release if keep == anchor.keep else Reason.AHEAD_OF_DEADLINE,
    )


def _net_fill(p: _Pacing, every: int, floor: int) -> int:
    """`paced`'s Safety Net: the fewest on-demand workers (at least `floor`, at most `every`)
    whose lower-bound speed alone, spot aside, finishes the rest one changeover d̂ before the end.
    The net fires at 2 d̂ of slack at the cap's speed; the switch it makes spends one of them
    (Can't Be Late §3.3: the second covers a spot start, and the net then runs on-demand to the
    end). Near the end that is fewer than the cap, and more each pass the job falls short: a ramp
    instead of a jump to the cap, cheaper per unit of work as scaling is sub-linear; the workers
    bought stay while the slack is below 2 d̂, as under uniform_progress."""
    time = p.hours - p.changeover
    if time <= 0:
        return every
    for n in range(floor, every):
        if p.lower(n) >= p.left / time:
            return n
    return every


def _uniform(p: _Pacing, every: int, anchor: OnDemandNeed) -> tuple[int, int]:
    """Uniform Progress (want, keep): behind the line, every allowed worker; they stay until
    progress is ahead of ep(t + 2 d̂), and then leave only for spot workers that take their
    place (the paper's on-demand never goes idle: it is left for spot)."""
    want = every if p.progress < p.line() else anchor.want
    if p.progress < p.line(2 * p.changeover):
        return want, every
    return want, p.every_worker(anchor.keep, spot=p.spot + p.fleet.spot_room)


def _paced(p: _Pacing, anchor: OnDemandNeed) -> tuple[int, int]:
    """`paced` (want, keep): behind the line, the on-demand workers whose estimated speed next to
    the spot workers holds the line and closes the gap over _CATCH_UP changeovers; in the band
    up to ep(t + 2 d̂), what holds the line with a changeover's catch-up to spare (a worker just
    bought is not let go at once); above it, what paces a little below the line."""
    d = p.changeover
    line, top, slope = p.line(), p.line(2 * d), p.slope
    catch_up = max(0.0, line - p.progress) / (_CATCH_UP * d)
    on_line = p.workers_for(slope + catch_up, anchor.want)
    want = on_line if p.progress < line else anchor.want
    steady = p.workers_for(slope * (1 + 1 / _CATCH_UP), anchor.keep)
    slower = p.workers_for(slope * _SLOWER, anchor.keep)
    return want, max(want, steady if p.progress < top else slower)


def _anchor_at_risk(p: _Pacing, anchor: OnDemandNeed) -> OnDemandNeed:
    """With `anchor: at_risk`, the anchor only while the deadline's slack (the time left until
    the deadline itself less what on-demand alone needs, at its lower-bound speed) is below a
    whole-job restart (which includes starting again on on-demand), or nothing is measured yet,
    and asked for only while a worker runs on spot (one already there stays); the message says
    which."""
    if not anchor.want or p.rules.anchor == "always":
        return anchor
    restart = p.deadline.restart.total_seconds() / 3600
    speed = p.lower(p.size)
    if p.pace.restart_loss and speed > 0:
        restart = max(restart, p.pace.restart_loss / speed + p.changeover)
    to_due = p.hours + p.deadline.margin.total_seconds() / 3600  # the deadline itself
    slack = None if speed <= 0 else to_due - p.left / speed
    if slack is None or slack < restart:
        why = "no speed measured yet" if slack is None else f"slack {slack:.1f} h"
        message = f"{anchor.message}: {why} < a whole-job restart ({restart:.1f} h)"
        if not p.fleet.spot:
            # a spot wipe-out takes nothing from a job with no worker on spot: ask once one
            # runs (the anchor asked first, at a job's start with no spot, held back the
            # line's own on-demand fill a whole provisioning: Bamboo g4dn at 2x, 1.07x UP)
            return replace(anchor, want=0, message=f"{message}, once a worker runs on spot")
        return replace(anchor, message=message)
    message = f"no anchor: slack {slack:.1f} h covers a whole-job restart ({restart:.1f} h)"
    return replace(anchor, want=0, keep=0, message=message)


def _explain(p: _Pacing, slack: float | None, d: float, anchor: OnDemandNeed) -> str:
    if slack is None:
        net = "no speed measured yet"
    else:
        alone = p.left / max(p.lower(p.size), 1e-9)
        net = (
            f"{p.hours:.1f} h left, {alone:.1f} h at {p.size} on-demand (lower bound) "
            f"+ 2 x {d:.2f} h changeover: slack {slack:.1f} h"
        )
    on_demand = f"{len(p.fleet.on_demand)} on on-demand"
    # Pending ones count: a ScaleOut past idle capacity made them, the node autoscaler brings
    # them up (asking again for them would overshoot)
    if pending := sum(1 for w in p.fleet.on_demand if w.pending):
        on_demand += f" ({pending} Pending: provisioning)"
    return (
        f"{p.deadline.rule}: progress {p.progress:.1%}, line {p.line():.1%} "
        f"(+2 d̂ {p.line(2 * d):.1%}); {net}{p.scarcity()}; {p.spot} on spot, {on_demand}; "
        f"{anchor.message}"
    )


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
    noticed: frozenset[str] = frozenset(),
) -> Decision:
    """`growth` (the idle-capacity decision), or in its place, when it adds nothing, an on-demand
    ScaleOut past idle capacity, a ScaleIn of on-demand workers no longer needed, or an alert."""
    if not needs_fleet(growth, policy):
        return growth
    fleet = Fleet.of(job, staying, nodes, noticed)
    need = on_demand_need(job, policy, fleet, now)
    assert need is not None
    tags = (need.alert,) if need.alert else ()
    changed = _add_on_demand(job, policy, need, fleet, staying, ceiling, nodes, tags)
    if changed is None:
        changed = _release_on_demand(job, policy, need, fleet, staying, tags)
    if changed is not None:
        return changed
    if need.alert is not None:
        return Decision.noop(
            job, need.alert, policy.name, tags=(growth.reason,), message=need.message
        )
    return replace(growth, message=f"{growth.message}; {need.message}")


def _add_on_demand(
    job: Job,
    policy: Policy,
    need: OnDemandNeed,
    fleet: Fleet,
    staying: list[Worker],
    ceiling: int,
    nodes: Mapping[str, GpuNode],
    tags: tuple[Reason, ...],
) -> Decision | None:
    """A ScaleOut toward `need.want` on-demand workers, or a budget NoOp when the budget allows
    none; None when no more are wanted or there is no room."""
    have = len(fleet.on_demand)
    room = min(ceiling - len(staying), job.most_added(policy.scale_out.max_step) or ceiling)
    if have >= need.want or room <= 0:
        return None
    afford, budget = _affordable(job, policy, staying, nodes)
    if afford <= 0:
        message = f"{need.message}; on-demand held back: {budget}"
        return Decision.noop(job, Reason.BUDGET, policy.name, tags=tags, message=message)
    count = min(need.want - have, room, afford)
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


def _release_on_demand(
    job: Job,
    policy: Policy,
    need: OnDemandNeed,
    fleet: Fleet,
    staying: list[Worker],
    tags: tuple[Reason, ...],
) -> Decision | None:
    """A ScaleIn of the on-demand workers above `need.keep` (within the job's lower bound);
    None when none can go."""
    lo, _ = policy.bounds(job)
    surplus = min(len(fleet.on_demand) - need.keep, len(staying) - lo)
    victims = _newest(job, fleet.on_demand, surplus) if job.scaler is None and job.running else ()
    if not victims:
        return None
    return Decision.scale_in(
        job,
        need.release,
        policy.name,
        victims,
        hosts=tuple(w.host for w in staying if w.pod in victims),
        tags=tags,
        message=f"{need.message}; remove on-demand {', '.join(victims)}",
    )


def _affordable(
    job: Job, policy: Policy, staying: list[Worker], nodes: Mapping[str, GpuNode]
) -> tuple[int, str]:
    """How many on-demand workers the policy's `cost.budget_per_hour` still allows next to the
    staying ones (placed ones at their node's price, pending ones at on-demand's: the highest
    known price of an on-demand GPU), and why not more. Unknown prices count as above the
    budget, as for idle capacity."""
    budget = policy.cost.budget_per_hour
    if budget is None:
        return len(staying) + job.max_workers, ""
    prices = [n.price_per_gpu_hour for n in nodes.values() if n.capacity_type is _OD]
    known = [p for p in prices if p is not None]
    if not known:
        return 0, f"budget_per_hour ${budget:g}, on-demand price unknown"
    worker = max(known) * job.gpus_per_worker
    spend = 0.0
    for w in staying:
        node = nodes.get(w.node or "")
        price = node.price_per_gpu_hour if node is not None else max(known)
        spend += (price or 0.0) * job.gpus_per_worker
    afford = math.floor((budget - spend) / worker + 1e-9) if worker > 0 else len(staying)
    return afford, f"budget_per_hour ${budget:g}, spend ${spend:.2f}/h, ${worker:.2f}/h a worker"


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
