"""Persist a node's notice as the NOTICE_ANNOTATION on its Node, once per notice.

The daemon folds the annotation into its snapshot (and rebuilds it after a restart). One Node holds
one notice, so the hardest wins: an interruption is never replaced by a later rebalance.
"""

from __future__ import annotations

from typing import Any

import structlog
from kubernetes import client

from autoscaler.core.model import Notice
from autoscaler.signals import NOTICE_ANNOTATION, decode_notice, encode_notice, supersedes

_REQUEST_TIMEOUT_S = 10
class NodeAnnotator:
    def __init__(self, api: client.ApiClient, node: str) -> None:
        self._core = client.CoreV1Api(api)
        self.node = node
        self._current: Notice | None = None
        self._loaded = False
        self.patches = 0
        self._log = structlog.get_logger().bind(source="node-agent", node=node)

    def report(self, notice: Notice) -> bool:
        """Merge-patch the annotation unless the Node already carries this or a harder notice.
        True if a patch was sent. API errors propagate (the agent's loop retries with backoff)."""
        if not self._loaded:  # after a restart, the Node remembers what we reported
            self._current = self._read()
            self._loaded = True
        if not supersedes(notice, self._current):
            return False
        annotations = {NOTICE_ANNOTATION: encode_notice(notice)}
        body: dict[str, Any] = {"metadata": {"annotations": annotations}}
        self._core.patch_node(
            self.node, body, _content_type="application/merge-patch+json",
            _request_timeout=_REQUEST_TIMEOUT_S,
        )
        self._current = notice
        self.patches += 1
        self._log.info(
            "notice_annotated", kind=notice.kind.value, notice_id=notice.id,
            deadline=notice.deadline.isoformat() if notice.deadline else None,
        )
        return True

    def _read(self) -> Notice | None:
        node = self._core.read_node(self.node, _request_timeout=_REQUEST_TIMEOUT_S)
        value = (node.metadata.annotations or {}).get(NOTICE_ANNOTATION)
        return decode_notice(self.node, value) if value else None
