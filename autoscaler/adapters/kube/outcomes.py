"""How the actuators word what they did, or why they did not."""

from __future__ import annotations

from typing import Any

import structlog

from autoscaler.core.model import Decision

log = structlog.get_logger()


def summary(decision: Decision) -> str:
    """`3->5, reason idle_capacity (+tags)`: the tail of every Event message."""
    tags = f" (+{', '.join(t.value for t in decision.tags)})" if decision.tags else ""
    return f"{decision.from_workers}->{decision.to_workers}, reason {decision.reason.value}{tags}"


def refuse(decision: Decision, why: str, **fields: Any) -> None:
    """Skip a decision the cluster no longer allows (defence in depth: the core checks too)."""
    log.warning("scale_refused", job=decision.job, action=decision.action.value, why=why, **fields)


def already_done(decision: Decision, name: str) -> None:
    log.info("scale_already_done", job=decision.job, action=decision.action.value, scaler=name)
