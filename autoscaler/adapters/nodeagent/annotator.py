"""Persist a node's notice as the NOTICE_ANNOTATION on its Node, once per notice.

The daemon folds the annotation into its snapshot (and rebuilds it after a restart). One Node holds
one notice, so the hardest wins: an interruption is never replaced by a later rebalance.
"""

from __future__ import annotations

import json

import structlog
from kubernetes import client

from autoscaler.adapters.kube.annotations import notice_patch
from autoscaler.adapters.kube.resources import Obj
from autoscaler.core.model import Notice

_REQUEST_TIMEOUT_S = 10


class NodeAnnotator:
    def __init__(self, api: client.ApiClient, node: str) -> None:
        self._core = client.CoreV1Api(api)
        self.node = node
        self._held: Obj | None = None  # the Node as last read or patched
        self.patches = 0
        self._log = structlog.get_logger().bind(source="node-agent", node=node)

    def report(self, notice: Notice) -> bool:
        """Merge-patch the annotation unless the Node already carries this or a harder notice
        (the same rule and patch as the daemon's, adapters/kube/annotations.notice_patch).
        True if a patch was sent. API errors propagate (the agent's loop retries with backoff)."""
        if self._held is None:  # after a restart, the Node remembers what we reported
            self._held = self._answer(
                self._core.read_node(
                    self.node, _request_timeout=_REQUEST_TIMEOUT_S, _preload_content=False
                )
            )
        patch = notice_patch(self._held, notice)
        if patch is None:
            return False
        self._held = self._answer(
            self._core.patch_node(
                self.node,
                patch,
                _content_type="application/merge-patch+json",
                _request_timeout=_REQUEST_TIMEOUT_S,
                _preload_content=False,
            )
        )
        self.patches += 1
        self._log.info(
            "notice_annotated",
            kind=notice.kind.value,
            notice_id=notice.id,
            deadline=notice.deadline.isoformat() if notice.deadline else None,
        )
        return True

    @staticmethod
    def _answer(response: object) -> Obj:
        return dict(json.loads(response.data))  # type: ignore[attr-defined]
