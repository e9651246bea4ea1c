"""Our annotations on cluster objects: their keys and what their values look like.

Shared by everything that reads or writes them: the daemon, the node agent and the launcher's
discovery sidecar. A value that does not parse is reported, never guessed at.
"""

from __future__ import annotations

import json
from datetime import datetime

from autoscaler.core.model import Notice, NoticeKind
from autoscaler.times import parse_utc

# On a Node: the notice a cloud source or the node agent read for it (JSON), so a restarted
# daemon, and the leader when a standby read it, rebuild it from the cluster: level-triggered.
NOTICE_ANNOTATION = "spot-autoscaler.io/notice"
# On a TrainingJob/AITrainingJob: the hosts hidden from its Horovod discovery (a JSON list). The
# daemon writes it; the launcher's sidecar turns it into the drain file the discovery script reads.
DRAINED_ANNOTATION = "spot-autoscaler.io/drained-hosts"
# On the same job: the hosts the launcher runs Horovod worker processes on, i.e. the hosts in
# Horovod's current rank assignment (a JSON list). The discovery sidecar writes it; the daemon
# drops a kept host only once a replacement is in it.
ASSIGNED_ANNOTATION = "spot-autoscaler.io/assigned-hosts"
# On the same job: how much of its work is done, kept current by its training script (rank 0,
# e.g. after each checkpoint): a fraction "0.42", a percentage "42%" or "done/total" "4200/10000".
# A policy's deadline reads it (core.deadline).
PROGRESS_ANNOTATION = "spot-autoscaler.io/progress"
# On a worker pod: Karpenter's own (pkg/apis/v1/labels.go DoNotDisruptAnnotationKey), "true"
# while a policy protects the job from consolidation and drift (adapters/kube/shield.py), and
# ours beside it, saying we wrote it: only such a one is ever removed
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SHIELD_MARK = "spot-autoscaler.io/do-not-disrupt"


def encode_notice(notice: Notice) -> str:
    return json.dumps(
        {
            "kind": notice.kind.value,
            "source": notice.source,
            "id": notice.id,
            "deadline": notice.deadline.isoformat() if notice.deadline else None,
            "received_at": notice.received_at.isoformat() if notice.received_at else None,
        },
        sort_keys=True,
    )


def decode_notice(node: str, value: str) -> Notice | None:
    """The notice an annotation holds, or None if it is not one of ours (never raises)."""
    try:
        data = json.loads(value)
        return Notice(
            node=node,
            kind=NoticeKind.parse(data["kind"]),
            source=str(data.get("source", "annotation")),
            id=str(data.get("id", "")),
            deadline=_time(data.get("deadline")),
            received_at=_time(data.get("received_at")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _time(value: object) -> datetime | None:
    """A present but unreadable time makes the whole annotation unreadable."""
    parsed = parse_utc(value)
    if value and parsed is None:
        raise ValueError(f"not a time: {value!r}")
    return parsed


def encode_drained(hosts: frozenset[str] | set[str]) -> str:
    return json.dumps(sorted(hosts))


def _host_list(value: str | None) -> frozenset[str] | None:
    """A JSON list of host names; None when absent or malformed (never raises)."""
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    return frozenset(h for h in data if isinstance(h, str)) if isinstance(data, list) else None


def decode_drained(value: str | None) -> frozenset[str]:
    """Drained hosts from the annotation; a malformed value counts as none."""
    return _host_list(value) or frozenset()


encode_assigned = encode_drained


def decode_assigned(value: str | None) -> frozenset[str] | None:
    """Assigned hosts from the annotation; None = not reported (no sidecar, or malformed)."""
    return _host_list(value)


def decode_progress(value: str | None) -> float | None:
    """The fraction done, within [0, 1]; None when absent or unreadable (the core then says
    `no_progress` for a job whose policy has a deadline)."""
    if value is None:
        return None
    text = value.strip()
    try:
        if text.endswith("%"):
            fraction = float(text[:-1]) / 100
        elif "/" in text:
            done, total = text.split("/", 1)
            fraction = float(done) / float(total)
        else:
            fraction = float(text)
    except (ValueError, ZeroDivisionError):
        return None
    if fraction != fraction or fraction < 0:  # NaN, negative
        return None
    return min(1.0, fraction)
