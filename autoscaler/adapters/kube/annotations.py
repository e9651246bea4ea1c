"""Our two annotations, written with merge patches: drained hosts on a job, a notice on a node."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import Obj, Resource, annotations_of
from autoscaler.core.model import Notice
from autoscaler.signals import (
    DRAINED_ANNOTATION,
    NOTICE_ANNOTATION,
    decode_drained,
    decode_notice,
    encode_drained,
    encode_notice,
    supersedes,
)

_CONFLICT_RETRIES = 3


def update_drained(
    objects: ObjectApi,
    resource: Resource,
    namespace: str,
    name: str,
    change: Callable[[frozenset[str]], frozenset[str]],
) -> tuple[Obj, frozenset[str], frozenset[str]] | None:
    """Read-modify-write the job's drained hosts under optimistic concurrency (resourceVersion
    precondition; a conflict reads again). Returns (job, before, after), None if unchanged."""
    conflicts = 0
    while True:
        job = objects.get(resource, namespace, name, urgent=True)
        before = decode_drained(annotations_of(job).get(DRAINED_ANNOTATION))
        after = change(before)
        if after == before:
            return None
        meta: Obj = {"annotations": {DRAINED_ANNOTATION: encode_drained(after) if after else None}}
        if rv := (job.get("metadata") or {}).get("resourceVersion"):
            meta["resourceVersion"] = rv
        try:
            patch = {"metadata": meta}
            return objects.merge_patch(resource, namespace, name, patch, urgent=True), before, after
        except ApiException as exc:
            conflicts += 1
            if exc.status != 409 or conflicts > _CONFLICT_RETRIES:
                raise


def notice_patch(node: Obj, notice: Notice) -> Obj | None:
    """The merge patch that persists `notice` on `node`; None if the node already holds it or a
    harder notice."""
    name = str((node.get("metadata") or {}).get("name", ""))
    current = annotations_of(node).get(NOTICE_ANNOTATION)
    held = decode_notice(name, current) if current else None
    if not supersedes(notice, held):
        return None
    return {"metadata": {"annotations": {NOTICE_ANNOTATION: encode_notice(notice)}}}
