"""The API server's side of the leader fence (deploy/leader-fence.yaml): its refusal is NotLeader.

A replica that passed its own fence and then stalled before its bytes left (autoscaler.fencing)
reaches a server whose Lease names another holder by then; the admission policy refuses the
write with 403 and a message carrying `FENCE_MARK`. That is not an API failure to retry or count:
it is the fence working, and the write was not made.
"""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

# the start of the policy's messageExpression (deploy/leader-fence.yaml, the chart's copy)
FENCE_MARK = "spot-autoscaler leader fence"


def refusal(exc: Exception) -> str | None:
    """The fence's message when `exc` is the server's leader fence refusing a write, else None."""
    if not isinstance(exc, ApiException) or exc.status != 403:
        return None
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body or ""
    try:
        message = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        message = body
    return message if FENCE_MARK in message else None
