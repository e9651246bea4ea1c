"""What the last pass planned, reused where nothing it was planned from has changed.

A cluster of 20,000 nodes has ~150,000 workers, and a full pass looks at every one of them several
times, while between two passes a few jobs change. So `decide` asks this memo first:

- a job's plan (departures, claim, spend) is reused while the job, its effective policy, the
  nodes its workers are on and the notices on those nodes are the very same (equal) objects, and
  no time rule of the job has flipped since: the rules read the time only through the plan's
  `Moment` (core/moment.py), which records when each answer they got flips (a scaler turning
  stuck, a backoff ending, a worker settling past join_grace), so a new rule cannot be left out;
- the growth decisions (idle capacity shared between all jobs) are reused while every plan, every
  node, every job, the idle clocks and the noticed nodes are the same, and no cooldown has ended
  and no idle node settled since.

Time moving backwards forgets everything, as does a new PolicySet. Whatever is reused is what a
pass without a memo would compute: the Reconciler checks that now and then against a pass
without one (its safety net), and tests/test_memo.py on random event streams.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from autoscaler.core.model import Decision, GpuNode, Job, Reason
from autoscaler.core.moment import Moment
from autoscaler.core.notices import NodeRisk
from autoscaler.core.policy import Policy, PolicySet

P = TypeVar("P")
Growth = dict[str, Decision]


@dataclass(slots=True)
class _Kept(Generic[P]):
    """A value and what it was computed from, valid from `since` until `until` (None: always)."""

    inputs: tuple[Any, ...]
    since: datetime
    until: datetime | None
    value: P

    def valid_at(self, now: datetime) -> bool:
        return self.since <= now and (self.until is None or now < self.until)


class PassMemo:
    """Plans and growth decisions of the last pass (see the module's docstring)."""

    def __init__(self, keep: bool = True) -> None:
        self._keep = keep  # False: plan everything anew every pass (a pass without a memo)
        self._policies: PolicySet | None = None
        self._now: datetime | None = None
        self._effective: dict[str, Policy] = {}
        self._last: dict[str, _Kept[Any]] = {}  # job key -> its plan, from the last pass
        self._this: dict[str, _Kept[Any]] = {}  # ... from this pass
        self._growth: _Kept[Growth] | None = None
        # job -> (plan, growth decision) of plans that claimed no GPUs, from the last growth
        # decided anew (`unclaimed`), and those of the one being decided
        self._unclaimed: dict[str, tuple[object, Decision]] = {}
        self._unclaimed_next: dict[str, tuple[object, Decision]] = {}
        self.replanned = 0  # jobs planned anew in this pass
        self.regrown = False  # growth decided anew in this pass

    def begin(self, policies: PolicySet, now: datetime) -> None:
        """A new pass: what the last one kept, unless the policies changed or time went back."""
        if policies is not self._policies or (self._now is not None and now < self._now):
            self._effective, self._this, self._growth = {}, {}, None
            self._unclaimed = {}
        self._policies, self._now = policies, now
        self._last, self._this = self._this, {}  # jobs gone since are forgotten
        self.replanned, self.regrown = 0, False

    def effective(self, base: Policy, now: datetime) -> Policy:
        """`base` with its windows at `now`: the last pass's object while it is equal, so that
        plans made under it may be reused."""
        fresh = base.at(now)
        last = self._effective.get(base.name)
        if last is not None and (last is fresh or last == fresh):
            return last
        self._effective[base.name] = fresh
        return fresh

    def plan(
        self,
        job: Job,
        policy: Policy,
        nodes: Mapping[str, GpuNode],
        noticed: frozenset[str],
        risk: NodeRisk,
        now: datetime,
        make: Callable[[Moment], P],
    ) -> P:
        """`job`'s plan: the last pass's if made from the same inputs and still valid at `now`,
        else `make`'s at `now`, kept until the first flip of a time rule it asked about."""
        moment = Moment(now)
        if not self._keep:
            self.replanned += 1
            return make(moment)
        kept = self._last.get(job.key)
        if kept is not None and kept.valid_at(now):
            old_job, old_policy, places, old_nodes, old_risk = kept.inputs
            if (
                old_policy is policy
                and (old_job is job or old_job == job)
                and tuple(map(nodes.get, places)) == old_nodes
                and _risk_on(risk, places, noticed) == old_risk
            ):
                self._this[job.key] = kept
                return kept.value  # type: ignore[no-any-return]
        self.replanned += 1
        value = make(moment)
        places = tuple({w.node: None for w in job.workers if w.node is not None})
        inputs = (
            job,
            policy,
            places,
            tuple(map(nodes.get, places)),
            _risk_on(risk, places, noticed),
        )
        self._this[job.key] = _Kept(inputs, now, moment.next_flip, value)
        return value

    def growth(
        self,
        inputs: tuple[Hashable | Any, ...],
        now: datetime,
        make: Callable[[], tuple[Growth, datetime | None]],
    ) -> Growth:
        """The growth decisions: the last pass's if made from the same inputs and still valid.
        `inputs` = (plans, nodes, jobs, idle clocks, noticed nodes); plans compare by identity."""
        if not self._keep:
            self.regrown = True
            return make()[0]
        kept = self._growth
        if kept is not None and kept.valid_at(now) and _same_growth_inputs(kept.inputs, inputs):
            return kept.value
        self.regrown = True
        self._unclaimed_next = {}
        value, until = make()
        self._unclaimed = self._unclaimed_next  # jobs gone since are forgotten
        self._growth = _Kept(inputs, now, until, value)
        return value

    def unclaimed(self, key: str, plan: object, make: Callable[[], Decision]) -> Decision:
        """The growth decision of a plan that claims no GPUs, which reads that plan alone: the
        last one's while the plan is the very same object. At 2,000 nodes, making 2,000 such
        decisions (jobs at max) anew was most of deciding growth, every pass."""
        kept = self._unclaimed.get(key) if self._keep else None
        decision = kept[1] if kept is not None and kept[0] is plan else make()
        if decision.reason is not Reason.SCALER_STUCK:  # its message says for how long
            self._unclaimed_next[key] = (plan, decision)
        return decision


def _risk_on(
    risk: NodeRisk, places: tuple[str, ...], noticed: frozenset[str]
) -> tuple[tuple[Any, ...], ...]:
    """What the notices say of the nodes in `places` (mostly nothing)."""
    if noticed.isdisjoint(places):
        return ()
    return tuple(
        (n, risk.hard.get(n), n in risk.soft, risk.deadlines.get(n)) for n in places if n in noticed
    )


def _same_growth_inputs(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    old_plans, *old_rest = old
    new_plans, *new_rest = new
    return (
        len(old_plans) == len(new_plans)
        and all(map(operator.is_, old_plans, new_plans))
        and old_rest == new_rest
    )
