"""Evictions of an elastic job's workers go through the daemon: one PodDisruptionBudget per job.

NTH (with taintNode), Karpenter, `kubectl drain` and cluster-autoscaler evict pods through the
eviction API, which honours PodDisruptionBudgets; they taint or cordon the node first and evict a
second later, long before Horovod could drop the host gracefully. A budget that allows no
voluntary disruption of the job's workers makes those evictions wait (they retry) while the
daemon, seeing the taint or cordon as a notice, drains the host from discovery and has
et-operator delete the pod by name: a DELETE, which no budget blocks (worker.go
`DeleteWorkerPods`). The drain then finishes by itself.

Only our budgets are touched (label managed-by=spot-autoscaler, named `<job>-spot-guard`); each
is owned by its job, so the garbage collector removes it with the job.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import (
    MANAGED_BY_LABEL,
    MANAGER,
    PDBS,
    Obj,
    key_of,
    labels_of,
)

log = structlog.get_logger()

SUFFIX = "-spot-guard"


def guard_name(job: str) -> str:
    return f"{job[: 63 - len(SUFFIX)]}{SUFFIX}"


def desired_guard(job: Obj, workers: dict[str, str]) -> Obj:
    """The budget over `job`'s workers (`workers`: their labels, from the job's kind)."""
    meta = job["metadata"]
    return {
        "apiVersion": PDBS.api_version,
        "kind": PDBS.kind,
        "metadata": {
            "name": guard_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {MANAGED_BY_LABEL: MANAGER},
            "ownerReferences": [
                {
                    "apiVersion": job.get("apiVersion", ""),
                    "kind": job.get("kind", ""),
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                }
            ],
        },
        "spec": {
            "selector": {"matchLabels": workers},
            "maxUnavailable": 0,
            # a worker that is not Ready holds no training state: let it be evicted (k8s >= 1.27)
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


class EvictionGuard:
    """Keeps one budget per guarded job and none for other jobs, level-triggered."""

    def __init__(self, objects: ObjectApi, cache: KubeCache) -> None:
        self._objects = objects
        self._cache = cache
        # refused with 409 in this sweep: not retried until the sweep is done (a budget of our
        # name that someone else made would otherwise be tried again and again)
        self._conflicts: set[str] = set()
        self._verified: dict[str, tuple[Obj, Obj]] = {}  # budget key -> (job, budget) found right
        self._scanned: tuple[int, frozenset[str]] | None = None  # what _stale last found clean

    def keep(self, jobs: Iterable[tuple[Obj, dict[str, str]]], writes: int) -> bool:
        """`jobs`: each guarded job with its workers' labels. At most `writes` API writes (at
        start-up thousands of budgets are missing, and a pass must not hold a notice's drain
        behind them); True when nothing was left for a later call."""
        if not self._cache.served(PDBS):
            return True
        missing: list[tuple[Obj, Obj | None]] = []
        verified: dict[str, tuple[Obj, Obj]] = {}
        for job, workers in jobs:
            meta = job["metadata"]
            key = f"{meta['namespace']}/{guard_name(meta['name'])}"
            held = self._cache.get(PDBS, key)
            last = self._verified.get(key)
            if held is not None and last is not None and last[0] is job and last[1] is held:
                verified[key] = last  # neither object changed since it was found right
                continue
            want = desired_guard(job, workers)
            if held is not None and _essentials(held.get("spec") or {}) == _essentials(
                want["spec"]
            ):
                verified[key] = (job, held)
            elif key not in self._conflicts:
                missing.append((want, held))
        self._verified = verified
        stale = self._stale(frozenset(verified) | {key_of(w) for w, _ in missing})
        for want, held in missing[:writes]:
            self._write(want, held)
        for held in stale[: max(0, writes - len(missing))]:
            self._delete(held)
        done = len(missing) + len(stale) <= writes
        if done:
            self._conflicts.clear()
        return done

    def _stale(self, wanted: frozenset[str]) -> list[Obj]:
        """Our budgets for jobs no longer guarded. Looked for again only when the budgets or the
        guarded jobs changed in number or name (thousands of budgets, every pass)."""
        held = self._cache.items(PDBS)
        if self._scanned == (len(held), wanted):
            return []
        stale = [
            b
            for b in held
            if labels_of(b).get(MANAGED_BY_LABEL) == MANAGER and key_of(b) not in wanted
        ]
        self._scanned = None if stale else (len(held), wanted)
        return stale

    def _write(self, want: Obj, held: Obj | None) -> None:
        meta = want["metadata"]
        try:
            if held is None:
                done = self._objects.create(PDBS, meta["namespace"], want)
            else:
                done = self._objects.merge_patch(
                    PDBS, meta["namespace"], meta["name"], {"spec": want["spec"]}
                )
        except ApiException as exc:
            if exc.status != 409:  # 409: made by an earlier pass whose event has not come yet
                raise
            self._conflicts.add(key_of(want))
            return
        self._cache.assume(PDBS, done)
        log.info(
            "eviction_guard_written",
            job=meta["ownerReferences"][0]["name"],
            namespace=meta["namespace"],
            budget=meta["name"],
        )

    def _delete(self, held: Obj) -> None:
        meta = held["metadata"]
        try:
            self._objects.delete(
                PDBS, meta["namespace"], meta["name"], str(meta.get("resourceVersion", ""))
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            return
        self._cache.forget(PDBS, held)
        log.info("eviction_guard_removed", namespace=meta["namespace"], budget=meta["name"])


def _essentials(spec: Obj) -> Obj:
    """What must match: a server older than 1.27 drops unhealthyPodEvictionPolicy."""
    return {k: spec.get(k) for k in ("selector", "maxUnavailable")}
