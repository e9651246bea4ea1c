"""Our two annotations, written with merge patches: drained hosts on a job, a notice on a node."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import Obj, Resource, annotations_of
from autoscaler.annotations import (
    DRAINED_ANNOTATION,
    NOTICE_ANNOTATION,
    decode_drained,
    decode_notice,
    encode_drained,
    encode_notice,
)
from autoscaler.core.model import Notice
from autoscaler.core.notices import supersedes

_CONFLICT_RETRIES = 3


def update_drained(
    objects: ObjectApi,
    resource: Resource,
    held: Obj,
    change: Callable[[frozenset[str]], frozenset[str]],
    extra: Callable[[frozenset[str]], dict[str, str | None]] | None = None,
) -> tuple[Obj, frozenset[str], frozenset[str]] | None:
    """Read-modify-write the job's drained hosts under optimistic concurrency: the patch carries
    the resourceVersion it was computed from, so a change made since (by anyone, or by our own
    write whose reply was lost) makes the server answer 409 and we read again. The first try
    starts from `held`, the watch cache's copy: one round trip while the cache is current, which
    is what a drain racing a node's death needs. `extra(after)`: more annotations for the same
    patch (the checkpoint signal). Returns (job, before, after), None if unchanged."""
    ident = held.get("metadata") or {}
    namespace, name = str(ident.get("namespace") or ""), str(ident.get("name") or "")
    job, conflicts = held, 0
    while True:
        before = decode_drained(annotations_of(job).get(DRAINED_ANNOTATION))
        after = change(before)
        if after == before:
            return None
        annotations = {DRAINED_ANNOTATION: encode_drained(after) if after else None}
        meta: Obj = {"annotations": annotations | (extra(after) if extra else {})}
        if rv := (job.get("metadata") or {}).get("resourceVersion"):
            meta["resourceVersion"] = rv
        try:
            patch = {"metadata": meta}
            return objects.merge_patch(resource, namespace, name, patch, urgent=True), before, after
        except ApiException as exc:
            conflicts += 1
            if exc.status != 409 or conflicts > _CONFLICT_RETRIES:
                raise
        job = objects.get(resource, namespace, name, urgent=True)


def notice_patch(node: Obj, notice: Notice) -> Obj | None:
    """The merge patch that persists `notice` on `node`; None if the node already holds it or a
    harder notice."""
    name = str((node.get("metadata") or {}).get("name", ""))
    current = annotations_of(node).get(NOTICE_ANNOTATION)
    held = decode_notice(name, current) if current else None
    if not supersedes(notice, held):
        return None
    return {"metadata": {"annotations": {NOTICE_ANNOTATION: encode_notice(notice)}}}
