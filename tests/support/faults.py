"""A fault-injecting HTTP proxy in front of an API server: the emulator, or a real kube-apiserver
over TLS (stdlib only, loopback only).

Each request through the proxy draws, from one seeded RNG, at most one fault:

- ``error``: answered 500, 503 or 429 (with Retry-After) without reaching the server;
- ``lost_reply``: forwarded (the write happened), then the client connection is shut without a
  byte of the reply, as when a connection resets after the server committed;
- ``latency``: forwarded after a pause of up to ``latency_max`` seconds;
- ``cut_watch`` (watch requests only): the stream is forwarded, then cut abruptly after a random
  0.2-``cut_after_max`` seconds.

`ServerFaults` adds the server-side kind from a timer: every watch dropped at once
(``drop_watches``), or the history lost so resuming watches get 410 Gone (``compact_410``). On
the emulator the server does both itself (`EmulatorStorms`: its own compaction). A real
kube-apiserver cannot on demand (its watch cache keeps its window in memory; etcd compaction
does not 410 a watch: docs/testing.md), so there the proxy does (`ProxyStorms`): it breaks every
stream it relays, and answers a watch resumed from a revision older than the store's at that
moment as the watch cache answers one too old: 200, then one ERROR event with a 410 Status
(``resume_410``, counted per answer).

Faults are injected only while `active` is set and at most ``budget`` times in all; `inject()`
scripts one for the next matching requests, whatever `active` says. `stop()` closes every open
connection. The seed fixes the sequence of draws; which request gets which draw still depends on
thread timing, so a run is reproducible in its rates, not request by request.

The proxy also keeps every write it forwarded (`writes`: when, who by its User-Agent, and the
resourceVersion the server committed it at, read from the reply even when the reply is lost):
on the real server that is the record `write_by_non_leader` is judged on.
"""

from __future__ import annotations

import json
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from .audit_proxy import write_token_kubeconfig
from .kube_api import KubeApiServer, write_kubeconfig
from .proxy import ForwardingHandler, ForwardingProxy

_WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass(frozen=True)
class FaultRates:
    """Per-request probabilities (their sum is the chance a request gets some fault)."""

    error: float = 0.0
    lost_reply: float = 0.0
    latency: float = 0.0
    cut_watch: float = 0.0
    latency_max: float = 0.5
    cut_after_max: float = 5.0

    @classmethod
    def total(cls, fraction: float) -> FaultRates:
        """``fraction`` of requests faulted, split 40% errors, 20% lost replies, 30% latency,
        and (of watches) the rest cut."""
        return cls(
            error=0.4 * fraction,
            lost_reply=0.2 * fraction,
            latency=0.3 * fraction,
            cut_watch=0.1 * fraction,
        )


@dataclass(frozen=True)
class Forwarded:
    """A write the proxy forwarded to the server."""

    t: float  # time.monotonic() when it left the proxy
    agent: str  # User-Agent
    method: str
    path: str  # without the query
    status: int  # the server's answer (0: none)
    rv: int | None  # the resourceVersion it was committed at (a 2xx reply's object), if any


@dataclass
class _Scripted:
    status: int
    method: str | None
    path_contains: str | None
    remaining: int
    delay: float  # seconds before the answer (the request never reaches the server)


class FaultProxy(ForwardingProxy):
    """A threaded HTTP/1.1 proxy on 127.0.0.1:<ephemeral> forwarding to ``upstream`` (https
    with ``context``: the real apiserver; the client then speaks plain HTTP to the proxy)."""

    def __init__(
        self,
        upstream: str,
        rates: FaultRates,
        seed: int = 0,
        budget: int = 100_000,
        context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(upstream, _FaultHandler, context)
        self.rates = rates
        self.budget = budget
        self.active = threading.Event()
        self.counts: Counter[str] = Counter()  # fault kind -> times injected
        self.requests = 0
        self.writes: list[Forwarded] = []
        self.token: str | None = None  # a bearer token for clients of a real server, if any
        self._expired_below = 0  # watches resuming from below this revision get 410
        self._scripted: list[_Scripted] = []
        self._rng = random.Random(seed)

    def stop(self) -> None:
        self.active.clear()
        super().stop()

    def kubeconfig(self, path: str, token: str | None = None) -> str:
        """A kubeconfig pointing at the proxy: the emulator's format, or with a bearer token
        (the real server authenticates it; TLS is the proxy's business upstream)."""
        if token is None:
            return write_kubeconfig(path, self.url, "chaos")
        return str(write_token_kubeconfig(Path(path), self.url, token))

    @property
    def injected(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def inject(
        self,
        status: int,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        times: int = 1,
        delay: float = 0.0,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status`` after ``delay`` seconds,
        without forwarding them (counted as ``scripted_<status>``)."""
        with self._lock:
            self._scripted.append(_Scripted(status, method, path_contains, times, delay))

    def expire(self, revision: int) -> None:
        """History lost up to ``revision``: a watch resumed from an older one gets 410 Gone."""
        with self._lock:
            self._expired_below = max(self._expired_below, revision)

    def expired(self, watch: bool, target: str) -> bool:
        """This request is a watch resumed from a revision the history no longer has."""
        if not watch:
            return False
        rv = (parse_qs(urlsplit(target).query).get("resourceVersion") or [""])[-1]
        with self._lock:
            if not rv.isdigit() or int(rv) == 0 or int(rv) >= self._expired_below:
                return False
            self.counts["resume_410"] += 1
            return True

    def scripted(self, method: str, target: str) -> _Scripted | None:
        with self._lock:
            for s in self._scripted:
                wanted = s.path_contains is None or s.path_contains in target
                if s.remaining > 0 and method == (s.method or method) and wanted:
                    s.remaining -= 1
                    self.counts[f"scripted_{s.status}"] += 1
                    return s
        return None

    def draw(self, watch: bool) -> tuple[str | None, float]:
        """(fault kind or None, its parameter: a status, a delay or a cut time)."""
        with self._lock:
            self.requests += 1
            if not self.active.is_set() or sum(self.counts.values()) >= self.budget:
                return None, 0.0
            r, x = self.rates, self._rng.random()
            choices = [("error", r.error), ("lost_reply", r.lost_reply), ("latency", r.latency)]
            if watch:
                choices.append(("cut_watch", r.cut_watch))
            kind = None
            for name, p in choices:
                if x < p:
                    kind = name
                    break
                x -= p
            if kind is None:
                return None, 0.0
            if kind == "error":
                param = float(self._rng.choice((500, 503, 429)))
                self.counts[f"error_{int(param)}"] += 1
            else:
                param = {
                    "latency": self._rng.uniform(0.0, r.latency_max),
                    "cut_watch": self._rng.uniform(0.2, r.cut_after_max),
                }.get(kind, 0.0)
                self.counts[kind] += 1
            return kind, param

    def forwarded(self, write: Forwarded) -> None:
        with self._lock:
            self.writes.append(write)


def _status(code: int, message: str) -> bytes:
    reason = {
        500: "InternalError",
        503: "ServiceUnavailable",
        429: "TooManyRequests",
        410: "Expired",
        504: "Timeout",
    }.get(code, "InternalError")
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


class _FaultHandler(ForwardingHandler):
    proxy: FaultProxy
    _fault: tuple[str | None, float] = (None, 0.0)  # this request's draw
    _sent = 0.0  # when it was forwarded

    def before(self, watch: bool) -> bool:
        arrived = time.monotonic()
        if (scripted := self.proxy.scripted(self.command, self.path)) is not None:
            time.sleep(scripted.delay)
            self._error(scripted.status)
            return True
        self._fault = kind, param = self.proxy.draw(watch)
        if kind == "error":
            self._error(int(param))
            return True
        if kind == "latency":
            time.sleep(param)
        if self._past_deadline(arrived):
            self._error(504)  # what kube-apiserver answers a request past its `timeout`
            return True
        if self.proxy.expired(watch, self.path):
            self._gone()
            return True
        self._sent = time.monotonic()
        return False

    def after(self, at: float, watch: bool, status: int, data: bytes) -> bool:
        if self.command in _WRITES:
            rv = None
            if 200 <= status < 300:
                try:
                    value = json.loads(data)["metadata"]["resourceVersion"]
                    rv = int(value)
                except (ValueError, KeyError, TypeError):
                    rv = None
            self.proxy.forwarded(
                Forwarded(
                    self._sent,
                    self.headers.get("User-Agent") or "",
                    self.command,
                    self.path.split("?")[0],
                    status,
                    rv,
                )
            )
        return self._fault[0] == "lost_reply"  # the write happened; the client never hears of it

    def _past_deadline(self, arrived: float) -> bool:
        """The request's `?timeout=` (Go duration in ms, as the daemon sends it) is over: the
        way here (latency, a slow test process) counts, as a queue in front of the API server's
        handler would."""
        value = (parse_qs(urlsplit(self.path).query).get("timeout") or [""])[-1]
        if not value.endswith("ms") or not value[:-2].isdigit():
            return False
        return time.monotonic() - arrived > int(value[:-2]) / 1000

    def cut_after(self) -> float | None:
        kind, param = self._fault
        return param if kind == "cut_watch" else None

    def _error(self, status: int) -> None:
        data = _status(status, f"injected by the proxy ({status})")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _gone(self) -> None:
        """What the watch cache answers a watch from a revision it no longer has (cacher.go
        `Watch` -> `newErrWatcher`): 200, one ERROR event with a 410 Status, the end."""
        rv = (parse_qs(urlsplit(self.path).query).get("resourceVersion") or [""])[-1]
        event = {
            "type": "ERROR",
            "object": json.loads(_status(410, f"too old resource version: {rv}")),
        }
        line = json.dumps(event).encode() + b"\n"
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
        self.wfile.flush()


class Storms(Protocol):
    """What a server does to every watch at once."""

    def drop(self) -> None: ...  # every watch broken

    def expire(self) -> None: ...  # every watch broken, and resuming one gets 410 Gone


class EmulatorStorms:
    """The emulator does both itself: its history compacted, its watches dropped."""

    def __init__(self, server: KubeApiServer) -> None:
        self.server = server

    def drop(self) -> None:
        self.server.drop_watches(abrupt=True)

    def expire(self) -> None:
        self.server.compact()
        self.server.drop_watches(abrupt=True)  # resuming from an old revision: 410


class ProxyStorms:
    """A real server: the proxy breaks every stream it relays, and answers resumes from before
    `revision()` (the store's current revision, asked of the server) with 410."""

    def __init__(self, proxy: FaultProxy, revision: Callable[[], int]) -> None:
        self.proxy, self.revision = proxy, revision

    def drop(self) -> None:
        self.proxy.cut_watches()

    def expire(self) -> None:
        self.proxy.expire(self.revision())
        self.proxy.cut_watches()


class ServerFaults:
    """From a timer thread, every ``every`` seconds (uniform in the range): all watches dropped
    abruptly, or (with ``compact_share``) the history lost so resumed watches get 410."""

    def __init__(
        self,
        storms: Storms,
        seed: int = 0,
        every: tuple[float, float] = (2, 6),
        compact_share: float = 0.5,
        budget: int = 1000,
    ) -> None:
        self.storms, self.every, self.compact_share = storms, every, compact_share
        self.budget = budget
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ServerFaults:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._rng.uniform(*self.every)):
            if sum(self.counts.values()) >= self.budget:
                return
            if self._rng.random() < self.compact_share:
                self.storms.expire()
                self.counts["compact_410"] += 1
            else:
                self.storms.drop()
                self.counts["drop_watches"] += 1
