"""Whether this node still runs work that letting the VM go early would cut short.

Azure starts an acknowledged Scheduled Event before its NotBefore (azure.py). That is safe only
once nothing on the node needs it: every pod bound here is gone or finished, DaemonSet and static
(mirror) pods aside, which run on every node and hold no job's state. That is how the daemon's
drain ends: the doomed workers are hidden from discovery, then deleted by name, and their pods
leave the node's list once their grace period is over (a Terminating pod may still be saving a
checkpoint). A pod the daemon does not manage keeps the node undrained too; the event then
starts at its NotBefore, as without an acknowledgement. No signal narrower than the pods exists:
the daemon writes nothing on the Node when its drain is done.

Needs `list` on pods (cluster-wide: RBAC cannot scope it to one node). Without it, or on any
error, the node counts as not drained.
"""

from __future__ import annotations

import json

import structlog
from kubernetes import client

from autoscaler.adapters.kube.resources import Obj
from autoscaler.adapters.polling import describe_error

_REQUEST_TIMEOUT_S = 10
_MIRROR = "kubernetes.io/config.mirror"


class NodePods:
    def __init__(self, api: client.ApiClient, node: str) -> None:
        self._core = client.CoreV1Api(api)
        self._node = node
        self.failures = 0
        self._log = structlog.get_logger().bind(source="node-agent", node=node)

    def drained(self) -> bool:
        """True once no pod on the node holds work; False on any doubt."""
        try:
            reply = self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node}",
                _request_timeout=_REQUEST_TIMEOUT_S,
                _preload_content=False,
            )
            pods = json.loads(reply.data)["items"]
        except Exception as exc:  # an API error, a timeout, a garbled answer: not known drained
            self.failures += 1
            self._log.warning("drain_check_failed", error=describe_error(exc))
            return False
        working = [p for p in pods if holds_work(p)]
        self._log.debug("drain_checked", pods_left=len(working))
        return not working


def holds_work(pod: Obj) -> bool:
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if _MIRROR in (meta.get("annotations") or {}):
        return False
    return not any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or ())
