"""A watch-fed, in-memory copy of what the autoscaler reads from the cluster.

Nodes and pods are watched cluster-wide (idle GPUs depend on every pod on a node); jobs and
scalers only in the configured namespaces, jobs also by label selector. Every selector is applied
again client-side. Objects are trimmed as they come in to the fields the adapter reads
(kept_fields.py). Relevant changes call `wake(reason)` once the cache is synced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import structlog
from kubernetes import client

from autoscaler.adapters.kube.kept_fields import trimmer
from autoscaler.adapters.kube.nodes import INSTANCE_TYPE_LABELS, first_label, instance_id, node_gpus
from autoscaler.adapters.kube.pods import NOT_TERMINATED_SELECTOR, TERMINATED_PHASES
from autoscaler.adapters.kube.reflector import Changes, KeyTracker, Reflector
from autoscaler.adapters.kube.resources import (
    MANAGED_BY_LABEL,
    MANAGER,
    NODES,
    PDBS,
    PODS,
    Obj,
    Resource,
    key_of,
    labels_of,
)
from autoscaler.adapters.kube.served import is_served
from autoscaler.adapters.kube.view import Watchlist
from autoscaler.adapters.kube.wake_signatures import may_bring_notice, signature
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.config.selectors import LabelMatcher, label_matcher
from autoscaler.notices_and_prices import NoticeWake, Wake

log = structlog.get_logger()

_CLUSTER_WIDE = (NODES, PODS)
_OURS = f"{MANAGED_BY_LABEL}={MANAGER}"  # the only PodDisruptionBudgets we read: our own


class KubeCache:
    def __init__(
        self,
        api_client: client.ApiClient,
        settings: KubernetesSettings,
        watchlist: Watchlist,
        wake: Wake | None = None,
        *,
        backoff_min: float = 0.5,
    ) -> None:
        self._settings = settings
        self._watchlist = watchlist
        self._jobs = {w.resource: w for w in watchlist.jobs}
        self._wake = wake
        self._stop = threading.Event()
        self._threads: list[tuple[Reflector, threading.Thread]] = []
        label_matcher(settings.label_selector)  # fails early on a bad selector
        scopes: list[str | None] = list(settings.namespaces) or [None]
        backoff = (backoff_min, max(backoff_min, settings.watch_backoff_max.total_seconds()))
        self._reflectors: dict[Resource, dict[str | None, Reflector]] = {}
        self._backends_lock = threading.Lock()
        self._backends_logged: dict[str, bool] | None = None
        # nodes and pods, every kind's jobs and helper kinds (the wiring's watchlist), our budgets
        watched = (NODES, PODS, *self._jobs, *watchlist.helpers, PDBS)
        for resource in watched:
            jobs = self._jobs.get(resource)
            selector = _OURS if resource is PDBS else settings.label_selector if jobs else ""
            for scope in [None] if resource in _CLUSTER_WIDE else scopes:
                labels = label_matcher(selector) if selector else None
                keep = _keeper(resource, scope, labels, jobs.keep if jobs else None)
                self._reflectors.setdefault(resource, {})[scope] = Reflector(
                    resource.lister(api_client, scope),
                    keep,
                    _ingester(resource),
                    partial(self._changed, resource),
                    self._stop,
                    log.bind(kind=resource.kind, namespace=scope or "*"),
                    label_selector=selector,
                    field_selector=NOT_TERMINATED_SELECTOR if resource is PODS else "",
                    watch_timeout=settings.watch_timeout.total_seconds(),
                    backoff=backoff,
                    # built-in kinds are always served; an operator's CRD may not be installed
                    is_served=partial(is_served, api_client, resource) if resource.group else None,
                    rediscover=settings.discovery_interval.total_seconds(),
                    on_served=self._served_looked_up,
                    # a drain rests on a node's notice: is the copy held as current as the watch?
                    track_current=resource is NODES,
                )

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        for resource, scopes in self._reflectors.items():
            for scope, reflector in scopes.items():
                name = f"kube-{resource.plural}-{scope or 'all'}"
                thread = threading.Thread(target=reflector.run, name=name, daemon=True)
                thread.start()
                self._threads.append((reflector, thread))

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for reflector, thread in self._threads:
            # again and again: a watch whose request was not sent yet cannot be broken off
            while thread.is_alive() and time.monotonic() < deadline:
                reflector.stop_watch()
                thread.join(0.05)

    def synced(self) -> bool:
        """Every initial list is done: snapshots are complete from here on."""
        return all(r.synced.is_set() for r in self._all())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self._all())

    def behind(self) -> frozenset[Resource]:
        """The kinds some view of which is not fresh (not listed yet, or its watch broke and has
        not been opened again): their deletions may not have arrived."""
        return frozenset(
            res
            for res, scopes in self._reflectors.items()
            if not all(r.fresh for r in scopes.values())
        )

    def current(self, resource: Resource, key: str) -> bool:
        """Whether what the cache holds of `key` is as current as its watch: the view is fresh
        and the object came after the view's last break, or the view has been live again long
        enough for a resumed watch to have replayed what it missed (reflector.SETTLE). Kinds
        other than Node count every object from before a break until then."""
        reflector = self._owner(resource, key)
        return reflector is not None and reflector.current(key)

    # --- reads ---------------------------------------------------------------------------------
    def items(self, resource: Resource) -> list[Obj]:
        return [obj for r in self._reflectors[resource].values() for obj in r.items()]

    def get(self, resource: Resource, key: str) -> Obj | None:
        reflector = self._owner(resource, key)
        return reflector.get(key) if reflector else None

    def find_job(self, key: str) -> tuple[Resource, Obj] | None:
        """The job `ns/name` of whichever kind it is."""
        for resource in self._jobs:
            if (obj := self.get(resource, key)) is not None:
                return resource, obj
        return None

    def node_for_instance(self, instance: str) -> str | None:
        """The node whose spec.providerID names this cloud instance id."""
        for node in self.items(NODES):
            provider = (node.get("spec") or {}).get("providerID")
            if provider and instance_id(provider) == instance:
                return key_of(node)
        return None

    def instance_types(self) -> set[str]:
        """Instance types of the GPU nodes: what a spot price feed should fetch."""
        return {
            itype
            for node in self.items(NODES)
            if node_gpus(node, self._settings).whole > 0
            and (itype := first_label(labels_of(node), INSTANCE_TYPE_LABELS))
        }

    def track(self, resource: Resource) -> KeyTracker:
        """A tracker of the keys of `resource` that change from now on, starting with every key
        held now: for readers that keep derived state current (the observer's pod index)."""
        tracker = KeyTracker()
        for reflector in self._reflectors[resource].values():
            reflector.track(tracker)
        return tracker

    def seen_rv(self, resource: Resource) -> int:
        """The resourceVersion every view of `resource` is complete up to (0: unknown)."""
        return min((r.seen_rv for r in self._reflectors[resource].values()), default=0)

    def served(self, resource: Resource) -> bool:
        """Whether the API server serves this kind (as last looked up in discovery)."""
        return all(r.served for r in self._reflectors[resource].values())

    def backends(self) -> dict[str, bool]:
        """Each operator backend and whether it can act: every kind it needs is served."""
        backends = self._watchlist.backends.items()
        return {name: all(map(self.served, kinds)) for name, kinds in backends}

    def errors(self) -> int:
        """Failed lists/watches so far (each retried after a back-off)."""
        return sum(r.errors for r in self._all())

    # --- writes we made ourselves --------------------------------------------------------------
    def assume(self, resource: Resource, obj: Obj) -> None:
        """Hold an object we just created or patched until its watch event catches up, so the
        next snapshot already sees it (no second scaler for the same need)."""
        reflector = self._owner(resource, key_of(obj))
        if reflector is not None:
            reflector.assume(obj)

    def forget(self, resource: Resource, obj: Obj) -> None:
        """Drop an object we just deleted, before its watch event arrives."""
        reflector = self._owner(resource, key_of(obj))
        if reflector is not None:
            reflector.forget(obj)

    # --- internals -----------------------------------------------------------------------------
    def _all(self) -> list[Reflector]:
        return [r for scopes in self._reflectors.values() for r in scopes.values()]

    def _owner(self, resource: Resource, key: str) -> Reflector | None:
        scopes = self._reflectors[resource]
        if None in scopes:
            return scopes[None]
        return scopes.get(key.split("/", 1)[0]) if "/" in key else None

    def _served_looked_up(self) -> None:
        """Log which backends are live once every kind has been looked up, then on each change;
        a backend that comes up wakes the daemon (its jobs may need work)."""
        if any(r.served is None for r in self._all()):
            return
        backends = self.backends()
        with self._backends_lock:
            before, self._backends_logged = self._backends_logged, backends
        if backends == before:
            return
        log.info(
            "backends",
            live=sorted(b for b, on in backends.items() if on),
            not_served=sorted(b for b, on in backends.items() if not on),
        )
        if (
            before is not None
            and self._wake is not None
            and any(on and not before.get(b) for b, on in backends.items())
        ):
            self._wake("backend served")

    def _changed(self, resource: Resource, changes: Changes) -> None:
        if self._wake is None or not self.synced():
            return  # the initial lists are not news; the first pass reads them all
        jobs = self._jobs.get(resource)
        phase = jobs.phase if jobs else None
        for old, new in changes:
            before = signature(resource, old, self._settings, phase)
            if before != signature(resource, new, self._settings, phase):
                obj = new if new is not None else old
                assert obj is not None
                what = "deleted" if new is None else "added" if old is None else "changed"
                try:
                    why = f"{resource.kind} {key_of(obj)} {what}"
                    notice = resource is NODES and may_bring_notice(old, new)
                    self._wake(NoticeWake(why) if notice else why)
                except Exception as exc:  # the daemon's callback must not kill a watch thread
                    log.warning("wake_failed", error=f"{type(exc).__name__}: {exc}")
                return


def _ingester(resource: Resource) -> Callable[[Obj], Obj]:
    """What the cache holds of each object: trimmed (kept_fields.py), and with its kind (typed lists
    omit it on items)."""
    trim = trimmer(resource)

    def ingest(obj: Obj) -> Obj:
        lean = trim(obj)
        lean.setdefault("kind", resource.kind)
        return lean

    return ingest


def _keeper(
    resource: Resource,
    namespace: str | None,
    labels: LabelMatcher | None,
    is_job: Callable[[Obj], bool] | None,
) -> Callable[[Obj], bool]:
    """The client-side filter for one reflector; `is_job`: the kind's test of its job objects."""

    def keep(obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        if labels is not None and not labels(labels_of(obj)):
            return False
        if resource is PODS:
            return (obj.get("status") or {}).get("phase") not in TERMINATED_PHASES
        if is_job is not None:
            return is_job(obj)
        return True

    return keep
