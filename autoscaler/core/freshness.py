"""Decide only what the view supports: while a kind's view is behind the server, hold what can
wait.

After a broken watch, until the re-list, the cache may still hold pods that are gone, notices
that were withdrawn and scalers that finished: a clamp to max would count ghosts, a surplus would
remove healthy workers, growth would go past max. So while `Snapshot.stale` names a kind, only
the departures a notice forces go out, and only for workers on noticed nodes, tagged `stale_view`
(the actuator then confirms each notice on the server, before the drain too); the rest is a
noop `stale_view` that the next pass on a synced view decides again. client-go's informers
answer the same question with HasSynced; cancelling a scaler of ours stays allowed: it only
ever prevents a removal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from autoscaler.core.model import Action, Decision, Job, Reason, Snapshot

_PASS = frozenset({Action.NOOP, Action.CANCEL})
_NOTICE_DEPARTURES = frozenset({Action.DRAIN, Action.SCALE_IN})


# what every job's decisions read; besides them, its own backend's kinds (Snapshot.stale)
_EVERY_JOB = frozenset({"Node", "Pod"})


def hold_for_view(decisions: Iterable[Decision], snapshot: Snapshot) -> list[Decision]:
    """`decisions` as the view supports them (all of them while nothing is stale)."""
    if not snapshot.stale:
        return list(decisions)
    jobs = {j.key: j for j in snapshot.jobs}
    noticed = frozenset(n.node for n in snapshot.notices)
    return [_supported(d, jobs.get(d.job), noticed, snapshot.stale) for d in decisions]


def _supported(
    decision: Decision, job: Job | None, noticed: frozenset[str], stale: frozenset[str]
) -> Decision:
    if decision.action in _PASS or job is None:
        return decision
    behind = stale & (_EVERY_JOB | {job.backend})
    if not behind:
        return decision
    on_noticed = {w.pod for w in job.workers if w.node in noticed}
    if decision.action is Action.SCALE_OUT and on_noticed and behind == {"Node"}:
        # a replacement for workers a notice dooms (the last settled host waits for it): part of
        # answering the notice, counted on pods and scalers that are current; with those behind
        # a ScaleOut could miss workers already added and go past max: it waits
        return decision
    if decision.action in _NOTICE_DEPARTURES:
        pods = tuple(p for p in decision.pods if p in on_noticed)
        if pods == decision.pods:
            return _on_stale(decision)
        if pods:
            return _on_stale(_narrowed(decision, job, pods))
    return Decision.noop(
        job,
        Reason.STALE_VIEW,
        decision.policy,
        tags=(decision.reason, *decision.tags),
        message=f"{decision.action.value} held: the view of {', '.join(sorted(behind))} is "
        "behind the server",
    )


def _on_stale(decision: Decision) -> Decision:
    """A departure let out on a stale view says so (tag `stale_view`): the notice it rests on
    may be gone on the server (a withdrawal the view has not seen), and every worker it names
    is one on a noticed node, so the actuator may confirm each node's notice on the server and
    drop the workers of those that have none (adapters/kube/confirm.py)."""
    if Reason.STALE_VIEW in decision.tags:
        return decision
    return replace(decision, tags=(*decision.tags, Reason.STALE_VIEW))


def _narrowed(decision: Decision, job: Job, pods: tuple[str, ...]) -> Decision:
    """The departure for `pods` only (those on noticed nodes)."""
    workers = [w for w in job.workers if w.pod in pods]
    hosts = tuple(dict.fromkeys(w.host for w in workers))
    nodes = tuple(sorted({w.node for w in workers if w.node}))
    leaving = len(decision.pods) - len(pods)
    return replace(
        decision,
        pods=pods,
        hosts=tuple(h for h in decision.hosts if h in hosts),
        nodes=nodes,
        count=len(pods),
        to_workers=decision.to_workers + leaving,
        message=f"{decision.message} (only workers on noticed nodes: the view is behind)",
    )
