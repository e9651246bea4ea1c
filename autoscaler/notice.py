"""The checkpoint signal: what the daemon tells a training job when some of its hosts are doomed.

One JSON object, the same on every path it travels:
- the `spot-autoscaler.io/checkpoint-notice` annotation on the job and on its worker pods (a
  downwardAPI volume of `metadata.annotations` puts it in a file the training script can poll);
- the body of an opt-in HTTP POST to each of the job's pods (`spot-autoscaler.io/checkpoint-hook`
  on the job: "PORT" or "PORT/PATH");
- in standalone mode, a file beside the discovery file (`<hostfile>.notice`).

    {"hosts": ["worker-2"], "deadline": "2026-11-28T05:00:30Z", "reason": "preemption_notice",
     "job": "default/bert", "issued": "2026-11-28T05:00:00Z"}

This module is the only place that format is written down. It uses the standard library alone,
so a training script can import it (or copy this one file) without the daemon's dependencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

ANNOTATION = "spot-autoscaler.io/checkpoint-notice"
HOOK_ANNOTATION = "spot-autoscaler.io/checkpoint-hook"
DEFAULT_HOOK_PATH = "/spot-autoscaler/notice"
STANDALONE_SUFFIX = ".notice"  # the standalone notice file: the discovery file's path + this


@dataclass(frozen=True, slots=True)
class CheckpointNotice:
    hosts: tuple[str, ...]  # the job's hosts (pod names, or standalone host names) going away
    deadline: datetime | None  # when the first of them may die; None when the cloud gave none
    reason: str  # the decision's reason code, e.g. preemption_notice
    job: str = ""  # namespace/name, or the standalone job's name
    issued: datetime | None = None

    def encode(self) -> str:
        return json.dumps(
            {
                "hosts": sorted(self.hosts),
                "deadline": _rfc3339(self.deadline),
                "reason": self.reason,
                "job": self.job,
                "issued": _rfc3339(self.issued),
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def decode(text: str | bytes) -> CheckpointNotice:
    """A notice from its JSON; ValueError saying what is wrong for anything else."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"checkpoint notice is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("checkpoint notice is not a JSON object")
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise ValueError("checkpoint notice: 'hosts' must be a list of host names")
    return CheckpointNotice(
        hosts=tuple(hosts),
        deadline=_parse_time(raw.get("deadline"), "deadline"),
        reason=str(raw.get("reason") or ""),
        job=str(raw.get("job") or ""),
        issued=_parse_time(raw.get("issued"), "issued"),
    )


def _rfc3339(when: datetime | None) -> str | None:
    if when is None:
        return None
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_time(value: object, key: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"checkpoint notice: {key!r} must be an RFC 3339 time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"checkpoint notice: {key!r} is not an RFC 3339 time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
