"""Which nodes are going away (hard) and which are only at risk (soft), under a policy."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from autoscaler.core.model import Notice, NoticeKind, Reason
from autoscaler.core.policy import PreemptionRules

_ALWAYS_HARD = {NoticeKind.INTERRUPTION, NoticeKind.STATE_CHANGE}


@dataclass(frozen=True, slots=True)
class NodeRisk:
    """Per noticed node: leave it now (`hard`) or only place nothing new there."""

    hard: dict[str, Reason]  # node -> why its workers leave now
    soft: frozenset[str]  # nodes that get no new workers
    deadlines: dict[str, datetime]  # earliest known deadline per node

    @property
    def noticed(self) -> frozenset[str]:
        return frozenset(self.hard) | self.soft


def classify(notices: Iterable[Notice], rules: PreemptionRules, now: datetime) -> NodeRisk:
    """Fold notices per node; duplicates (same node, any id) collapse, the hardest kind wins."""
    hard: dict[str, Reason] = {}
    soft: set[str] = set()
    deadlines: dict[str, datetime] = {}
    for notice in notices:
        if notice.deadline is not None:
            known = deadlines.get(notice.node)
            deadlines[notice.node] = (
                notice.deadline if known is None else min(known, notice.deadline)
            )
        reason = _hard_reason(notice, rules, now)
        if reason is None:
            soft.add(notice.node)
        elif hard.get(notice.node) != Reason.PREEMPTION_NOTICE:
            hard[notice.node] = reason
    return NodeRisk(hard=hard, soft=frozenset(soft - set(hard)), deadlines=deadlines)


def _hard_reason(notice: Notice, rules: PreemptionRules, now: datetime) -> Reason | None:
    if notice.kind in _ALWAYS_HARD:
        return Reason.PREEMPTION_NOTICE
    if notice.kind is NoticeKind.MAINTENANCE:
        near = notice.deadline is None or notice.deadline - now <= rules.maintenance_horizon
        return Reason.MAINTENANCE if near else None
    if notice.kind is NoticeKind.DISRUPTION:  # protect: no new workers there, the old stay
        return Reason.KARPENTER_DISRUPTION if rules.voluntary == "drain" else None
    return Reason.REBALANCE if rules.rebalance == "drain" else None


def hardest(notices: list[Notice]) -> Notice | None:
    return max(notices, key=lambda n: n.kind.hardness, default=None)


def supersedes(new: Notice, held: Notice | None) -> bool:
    """Whether `new` should replace the notice a Node holds: not the same one, not softer."""
    if held is None:
        return True
    same = (held.source, held.id) == (new.source, new.id)
    return not same and new.kind.hardness >= held.kind.hardness
