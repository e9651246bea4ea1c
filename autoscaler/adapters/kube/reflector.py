"""List, then watch from the list's resourceVersion, forever: one kind in one scope, one thread.

The one list-then-watch loop: the watch cache runs one per kind and scope, the discovery sidecar
one per followed object (discovery/watch.py). Errors back off (doubling, capped) and resume the
watch where it stopped; 410 Gone means the server forgot that far back, so the reflector lists
again, as it does after an unexpected error (an odd object). Watches carry a server timeout and
a slightly longer client read timeout, so a silent connection cannot hang the thread.

A kind from an operator's CRD may not be served at all (not installed, or removed): given an
`is_served` lookup, the reflector asks API discovery first, holds nothing and counts as synced
while the kind is absent, and asks again every `rediscover` seconds, so a CRD installed later is
picked up without a restart.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import urllib3
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from structlog.typing import FilteringBoundLogger

from autoscaler.adapters.kube.resources import Obj, key_of
from autoscaler.backoff import Backoff

# The client's list call for one kind in one scope (Resource.lister); called with selectors and
# list/watch keyword arguments.
Lister = Callable[..., Any]
# (old, new) per changed object: old None = added, new None = deleted
Changes = list[tuple[Obj | None, Obj | None]]
# Called after every (re)list with what it changed (everything on the first, maybe nothing), and
# after every change a watch event or `_discover` makes.
OnChange = Callable[[Changes], None]
OnServed = Callable[[], None]  # a kind's served state was looked up (it may have changed)

_PAGE = 500
_CONNECT_TIMEOUT = 10.0
_READ_GRACE = 15.0  # client read timeout = server watch timeout + this
_RESUME_EVERY = 1.0  # at most one immediate resume of a broken watch per this many seconds
# An object held from before a break (a broken watch, a re-list) counts as current again this
# long after the view is live again: a resumed watch replays what it missed at once, but the
# view is live from the moment the server answers, before the replay has been read (`current`).
SETTLE = 1.0


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _older(candidate: Obj, stored: Obj) -> bool:
    """True if `candidate` is known to predate `stored`. resourceVersions are opaque in the API
    contract but numeric in practice; when either is not, nothing is assumed."""
    a, b = _rv(candidate), _rv(stored)
    return a.isdigit() and b.isdigit() and int(a) < int(b)


class KeyTracker:
    """The keys of one kind stored, replaced or removed since the last `take()`: lets a reader
    keep what it derives from the objects current in O(changes) instead of re-reading them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[str] = set()

    def mark(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(keys)

    def take(self) -> set[str]:
        with self._lock:
            keys, self._keys = self._keys, set()
        return keys


class Reflector:
    def __init__(
        self,
        lister: Lister,
        keep: Callable[[Obj], bool],
        transform: Callable[[Obj], Obj],
        on_change: OnChange,
        stop: threading.Event,
        log: FilteringBoundLogger,
        *,
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: float = 300.0,
        backoff: tuple[float, float] = (0.5, 30.0),  # first and most seconds between retries
        is_served: Callable[[], bool] | None = None,  # None: the kind is always served
        rediscover: float = 60.0,
        on_served: OnServed | None = None,
        track_current: bool = False,  # keep what `current` needs (one int per object)
    ) -> None:
        self._list_fn = lister
        self._keep = keep  # client-side filter: servers (and emulators) may ignore selectors
        # what of each object is worth holding, as a new dict: the caller's is left as it is
        self._transform = transform
        self._on_change = on_change
        self._stop = stop
        selectors = (("label_selector", label_selector), ("field_selector", field_selector))
        self._selectors = {k: v for k, v in selectors if v}
        self._watch_timeout = max(1, int(watch_timeout))
        self._backoff = backoff
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        # weak: a tracker lives as long as its reader, and nobody has to unregister it
        self._trackers: weakref.WeakSet[KeyTracker] = weakref.WeakSet()
        self._watch: watch.Watch | None = None
        self._opened = False  # the current watch's response arrived (see run)
        # the resourceVersion of the last event the current watch delivered: a broken stream
        # resumes there, not where it began (the server would replay what we hold, and a
        # replayed event of a pod deleted since brought it back until its deletion came again:
        # a clamp counted such ghosts and drained healthy workers on a real kube-apiserver)
        self._delivered: str | None = None
        self._resumed = 0.0  # when a broken watch was last resumed without a back-off
        self._forbidden = False  # RBAC refused the last list (see _denied)
        self._is_served = is_served
        self._rediscover = rediscover
        self._on_served = on_served
        # None until looked up
        self.served: bool | None = None if is_served is not None else True
        self.synced = threading.Event()
        # listed, or watching: False from a broken watch until the next one opens (after a 410,
        # until the re-list), while what changed meanwhile (deletions too) has not arrived
        self.live = False
        self.errors = 0
        # the newest resourceVersion this view is complete up to (list or watch, bookmarks
        # included): how fresh it is against objects from other watches (numeric in practice)
        self.seen_rv = 0
        # breaks so far (a watch that broke or expired, a failed list), the break each held
        # object was last received from the server after, and when the view was last live again
        self._breaks = 0
        self._received: dict[str, int] | None = {} if track_current else None
        self._live_since = 0.0
        self._log = log

    # --- reads (any thread) --------------------------------------------------------------------
    @property
    def fresh(self) -> bool:
        """Listed and watching: the view lags the server by no more than its stream does."""
        return self.synced.is_set() and self.live

    def current(self, key: str, now: float | None = None) -> bool:
        """Whether what the view holds of `key` (or that it holds nothing) is as current as the
        stream: the view is fresh, and the object came from the server after the last break, or
        the view has been live for SETTLE since. An object held across a break may be one whose
        change the resumed watch is still replaying (a notice withdrawn meanwhile): with
        `track_current` off, nothing held across a break counts until SETTLE has passed."""
        if not self.fresh:
            return False
        with self._lock:
            received = self._received.get(key) if self._received is not None else None
            breaks, since = self._breaks, self._live_since
        if received == breaks:
            return True
        return (time.monotonic() if now is None else now) - since >= SETTLE

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def track(self, tracker: KeyTracker) -> None:
        """Mark every key held now in `tracker`, then every key that changes from now on."""
        with self._lock:
            self._trackers.add(tracker)
            tracker.mark(self._items)

    def assume(self, obj: Obj) -> None:
        """Take in an object we just wrote, before its watch event arrives (write-through). Our
        own writes are no news: no change is reported, and the matching watch event then
        changes nothing either."""
        lean = self._transform(obj)
        if self._keep(lean):
            self._apply("MODIFIED", lean, report=False)

    def forget(self, obj: Obj) -> None:
        """Drop an object we just deleted (write-through, like `assume`)."""
        self._apply("DELETED", self._transform(obj), report=False)

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        rv: str | None = None
        backoff = Backoff(*self._backoff)
        while not self._stop.is_set():
            self._opened = False
            try:
                if rv is None:
                    if not self._discover():
                        self._stop.wait(self._rediscover)
                        continue
                    rv = self._list()
                rv = self._watch_once(rv)
                backoff.reset()
            except ApiException as exc:
                rv = self._refused(exc, rv, backoff)
            except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
                # the server ignored timeoutSeconds and went quiet: just watch again
                continue
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                # a dropped connection, an unreachable server, a cut-off body
                rv = self._cut(exc, rv, backoff)
            except Exception as exc:  # an odd object (or a bug): never end the thread, list again
                self._broke()
                rv = None
                self._failed(exc, backoff, unexpected=True)

    def _refused(self, exc: ApiException, rv: str | None, backoff: Backoff) -> str | None:
        """After the server's error answer: where to go on from (None: list again)."""
        self._broke()
        if exc.status == 410:  # expired: our resourceVersion is older than the server keeps
            self._log.info("watch_expired_relisting")
            return None
        if exc.status == 403 and self._is_served is not None:
            self._denied(exc)
            return None
        if exc.status == 404 and self._is_served is not None:  # its CRD went away?
            self.served, rv = None, None
        self._failed(exc, backoff)
        return self._delivered if rv is not None else None

    def _denied(self, exc: ApiException) -> None:
        """RBAC lets us not list or watch this kind (a chart installed without it): it holds
        nothing and is synced, as an absent kind is, so the daemon runs for the kinds it may
        read; asked again every `rediscover` seconds (the grant may come later)."""
        if not self._forbidden:
            self._log.warning(
                "kind_forbidden",
                error=f"{exc.status} {exc.reason}",
                effect="its jobs are left alone until RBAC grants list and watch on it",
            )
        self._forbidden = True
        self._not_served()
        self._set_served(False)
        self._stop.wait(self._rediscover)

    def _set_served(self, served: bool) -> None:
        changed, self.served = served != self.served, served
        if changed and self._on_served is not None:
            self._on_served()

    def _cut(self, exc: Exception, rv: str | None, backoff: Backoff) -> str | None:
        """After a broken connection: an established stream that broke (a proxy, a restarting
        apiserver) resumes at once from where it stopped, as client-go's reflector does; a
        watch that cannot be opened (or breaks again at once) backs off. Every second blind
        here delays a notice."""
        self._broke()
        rv = self._delivered if rv is not None else None
        now = time.monotonic()
        stopping = self._stop.is_set()  # stop_watch() broke it on purpose
        if self._opened and rv and not stopping and now - self._resumed > _RESUME_EVERY:
            self._resumed = now
            self._log.info("watch_broken_resuming", error=type(exc).__name__)
            return rv
        self._failed(exc, backoff)
        return rv

    def _broke(self) -> None:
        """The view may miss changes from here until it is live again (see `current`)."""
        with self._lock:
            self.live = False
            self._breaks += 1

    def _live_again(self) -> None:
        with self._lock:
            if not self.live:
                self._live_since = time.monotonic()
            self.live = True

    def stop_watch(self) -> None:
        """Unblock a watch waiting for data (the stop event must be set first)."""
        w = self._watch
        if w is not None:
            w.stop()

    def _failed(self, exc: Exception, backoff: Backoff, unexpected: bool = False) -> None:
        if self._stop.is_set():  # stop_watch() broke the connection on purpose
            return
        self.errors += 1
        delay = backoff.next_delay()
        report = self._log.error if unexpected else self._log.warning
        report("watch_failed", error=f"{type(exc).__name__}: {exc}"[:300], retry_in=delay)
        self._stop.wait(delay)

    def _discover(self) -> bool:
        """Whether the kind is served (looked up unless known); an absent kind holds nothing and
        is synced: there is nothing of it to wait for."""
        if self.served or self._is_served is None or self._forbidden:
            return True  # a forbidden kind is listed again (as discovery still serves it)
        served = self._is_served()
        changed = served != self.served
        self.served = served
        if not served:
            self._not_served()
        if changed:
            self._log.debug("kind_served" if served else "kind_not_served")
            if self._on_served is not None:
                self._on_served()
        return served

    def _not_served(self) -> None:
        """Hold nothing, and count as synced: there is nothing of it to wait for."""
        self._live_again()  # nothing of it exists to fall behind on
        with self._lock:
            old, self._items = self._items, {}
            self._touched(old)
        if old:
            self._on_change([(o, None) for o in old.values()])
        self.synced.set()

    def _list(self) -> str:
        items: dict[str, Obj] = {}
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = dict(
                self._selectors,
                limit=_PAGE,
                _preload_content=False,
                _request_timeout=(_CONNECT_TIMEOUT, 60.0),
            )
            if token:
                kwargs["_continue"] = token
            page = json.loads(self._list_fn(**kwargs).data)
            for obj in page.get("items") or ():
                lean = self._held_version(obj) or self._transform(obj)
                if self._keep(lean):
                    items[key_of(lean)] = lean
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        rv = str(meta["resourceVersion"])  # without one, nothing could be watched: apply nothing
        with self._lock:
            old, self._items = self._items, items
            if self._received is not None:  # every object as current as the list
                self._received = dict.fromkeys(items, self._breaks)
            self._touched([k for k in old.keys() | items.keys() if old.get(k) is not items.get(k)])
        # every list reports what it changed (a relist: what changed while we were not
        # watching), the first too: a reader following one object learns whether it exists
        self._on_change(_diff(old, items))
        self._seen(rv)
        self._live_again()  # as fresh as the list; the watch from its rv misses nothing
        self.synced.set()
        if self._forbidden:
            self._forbidden = False
            self._log.info("kind_granted")
            self._set_served(True)
        return rv

    def _watch_once(self, rv: str) -> str:
        """Watch until the server ends the stream; the resourceVersion to resume from."""
        w = watch.Watch(return_type="object")  # plain dicts: no model deserialisation
        self._watch = w
        self._delivered = rv

        def opened(**kwargs: Any) -> Any:
            response = self._list_fn(**kwargs)
            # the server answered: the stream is established, and it replays what we missed
            # (objects held from before a break count as current only after SETTLE: `current`)
            self._opened = True
            self._live_again()
            return response

        try:
            stream = w.stream(
                opened,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _request_timeout=(_CONNECT_TIMEOUT, self._watch_timeout + _READ_GRACE),
                **self._selectors,
            )
            for event in stream:
                kind, obj = event.get("type"), event.get("raw_object")
                if isinstance(obj, dict):
                    rv = _rv(obj) or rv
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(kind, self._transform(obj))
                    self._seen(rv)
                    self._delivered = rv
                if self._stop.is_set():  # checked after the event: a callback may have set it
                    break
        finally:
            self._watch = None
        return rv

    def _seen(self, rv: str) -> None:
        if rv.isdigit():
            self.seen_rv = max(self.seen_rv, int(rv))

    def _held_version(self, obj: Obj) -> Obj | None:
        """What we hold for `obj` if it is that very version: a relist then neither doubles the
        cache nor makes readers derive anything again for objects that did not change."""
        held = self.get(key_of(obj))
        return held if held is not None and _rv(obj) and _rv(held) == _rv(obj) else None

    def _apply(self, kind: str, obj: Obj, report: bool = True) -> None:
        """Store or remove `obj`, an object `_transform` made; `report`: it came from the
        server's stream (not our own write, which is no news)."""
        key = key_of(obj)
        keep = kind != "DELETED" and self._keep(obj)
        with self._lock:
            if report and self._received is not None:
                if keep:
                    self._received[key] = self._breaks
                else:  # holding nothing of it is as current as the view (and keeps this small)
                    self._received.pop(key, None)
            old = self._items.get(key)
            if keep:
                if old is not None and _older(obj, old):
                    return  # a late event for something we already hold a newer copy of
                self._items[key] = obj
            elif old is not None:
                del self._items[key]
            else:
                return
            self._touched((key,))
        if report:
            self._on_change([(old, obj if keep else None)])

    def _touched(self, keys: Iterable[str]) -> None:
        """Called with the lock held, so no tracker misses a change made between two reads."""
        for tracker in self._trackers:
            tracker.mark(keys)


def _same(a: Obj, b: Obj) -> bool:
    ra, rb = _rv(a), _rv(b)
    return ra == rb if ra and rb else a == b


def _diff(old: dict[str, Obj], new: dict[str, Obj]) -> Changes:
    changes: Changes = [
        (o, new.get(k)) for k, o in old.items() if k not in new or not _same(o, new[k])
    ]
    changes += [(None, n) for k, n in new.items() if k not in old]
    return changes
