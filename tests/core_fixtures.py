"""Plain-data builders for core tests: nodes, jobs, workers, notices, one fixed `now`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.core import (
    Action,
    CapacityType,
    Decision,
    GpuNode,
    Job,
    Notice,
    NoticeKind,
    PolicySet,
    Snapshot,
    Worker,
    decide,
)
from autoscaler.core.policy import Policy

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday
LONG_AGO = NOW - timedelta(hours=1)


def node(
    name: str,
    gpus: float = 8,
    used: float = 0,
    price: float | None = 8.0,
    capacity: CapacityType = CapacityType.SPOT,
    schedulable: bool = True,
) -> GpuNode:
    return GpuNode(
        name, gpus, used, capacity_type=capacity, price_per_hour=price, schedulable=schedulable
    )


def workers(job: str, placement: list[str], start: int = 0, pending: int = 0) -> tuple[Worker, ...]:
    """One worker per entry of `placement` (a node name each); the last `pending` are Pending."""
    out = []
    for offset, where in enumerate(placement):
        i = start + offset
        out.append(
            Worker(
                f"{job}-worker-{i}",
                where,
                f"{job}-worker-{i}",
                i,
                pending=offset >= len(placement) - pending,
            )
        )
    return tuple(out)


def job(
    name: str = "bert",
    lo: int = 1,
    hi: int = 8,
    gpw: float = 1,
    placement: list[str] | None = None,
    **kw,
) -> Job:
    return Job("ml", name, lo, hi, gpw, workers=workers(name, placement or []), **kw)


def notice(
    node_name: str,
    kind: NoticeKind = NoticeKind.INTERRUPTION,
    nid: str = "e1",
    deadline: datetime | None = None,
) -> Notice:
    return Notice(node_name, kind, "test", nid, deadline=deadline, received_at=NOW)


def snapshot(
    nodes: list[GpuNode],
    jobs: list[Job],
    notices: list[Notice] = (),
    idle_since: datetime | None = LONG_AGO,
) -> Snapshot:
    since = {n.name: idle_since for n in nodes} if idle_since else {}
    return Snapshot(nodes=tuple(nodes), notices=tuple(notices), jobs=tuple(jobs), idle_since=since)


def policies(**policy_fields) -> PolicySet:
    """A single default policy; keyword fields override (as dicts, validated like YAML)."""
    return PolicySet.model_validate({"policies": [{"name": "default", **policy_fields}]})


def run(snap: Snapshot, ps: PolicySet | None = None, now: datetime = NOW) -> list[Decision]:
    return decide(snap, ps or policies(), now)


def only(decisions: list[Decision], action: Action) -> list[Decision]:
    return [d for d in decisions if d.action is action]


__all__ = [
    "LONG_AGO",
    "NOW",
    "Policy",
    "job",
    "node",
    "notice",
    "only",
    "policies",
    "run",
    "snapshot",
    "workers",
]
