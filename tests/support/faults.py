"""A fault-injecting HTTP proxy in front of the API emulator (stdlib only, loopback only).

Each request through the proxy draws, from one seeded RNG, at most one fault:

- ``error``: answered 500, 503 or 429 (with Retry-After) without reaching the server;
- ``lost_reply``: forwarded (the write happened), then the client connection is shut without a
  byte of the reply, as when a connection resets after the server committed;
- ``latency``: forwarded after a pause of up to ``latency_max`` seconds;
- ``cut_watch`` (watch requests only): the stream is forwarded, then cut abruptly after a random
  0.2-``cut_after_max`` seconds.

`ServerFaults` adds the server-side kind from a timer: every watch dropped at once
(``drop_watches``), or the event history compacted so resuming watches get 410 Gone.

Faults are injected only while `active` is set and at most ``budget`` times in all; `stop()`
closes every open connection. The seed fixes the sequence of draws; which request gets which draw
still depends on thread timing, so a run is reproducible in its rates, not request by request.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

from .kube_api import KubeApiServer, write_kubeconfig
from .proxy import ForwardingHandler, ForwardingProxy


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


class FaultProxy(ForwardingProxy):
    """A threaded HTTP/1.1 proxy on 127.0.0.1:<ephemeral> forwarding to ``upstream``."""

    def __init__(
        self, upstream: str, rates: FaultRates, seed: int = 0, budget: int = 100_000
    ) -> None:
        super().__init__(upstream, _FaultHandler)
        self.rates = rates
        self.budget = budget
        self.active = threading.Event()
        self.counts: Counter[str] = Counter()  # fault kind -> times injected
        self.requests = 0
        self._rng = random.Random(seed)

    def stop(self) -> None:
        self.active.clear()
        super().stop()

    def kubeconfig(self, path: str) -> str:
        """A kubeconfig pointing at the proxy (the emulator's format, another server)."""
        return write_kubeconfig(path, self.url, "chaos")

    @property
    def injected(self) -> int:
        with self._lock:
            return sum(self.counts.values())

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


class _FaultHandler(ForwardingHandler):
    proxy: FaultProxy
    _fault: tuple[str | None, float] = (None, 0.0)  # this request's draw

    def before(self, watch: bool) -> bool:
        self._fault = kind, param = self.proxy.draw(watch)
        if kind == "error":
            self._error(int(param))
            return True
        if kind == "latency":
            time.sleep(param)
        return False

    def after(self, at: float, watch: bool, status: int, data: bytes) -> bool:
        return self._fault[0] == "lost_reply"  # the write happened; the client never hears of it

    def cut_after(self) -> float | None:
        kind, param = self._fault
        return param if kind == "cut_watch" else None

    def _error(self, status: int) -> None:
        reason = {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}[status]
        data = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"injected by the proxy ({status})",
                "reason": reason,
                "code": status,
            }
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ServerFaults:
    """From a timer thread, every ``every`` seconds (uniform in the range): all watches dropped
    abruptly, or (with ``compact_share``) the history compacted so resumed watches get 410."""

    def __init__(
        self,
        server: KubeApiServer,
        seed: int = 0,
        every: tuple[float, float] = (2, 6),
        compact_share: float = 0.5,
        budget: int = 1000,
    ) -> None:
        self.server, self.every, self.compact_share = server, every, compact_share
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
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._rng.uniform(*self.every)):
            if sum(self.counts.values()) >= self.budget:
                return
            if self._rng.random() < self.compact_share:
                self.server.compact()
                self.server.drop_watches(abrupt=True)  # resuming from an old revision: 410
                self.counts["compact_410"] += 1
            else:
                self.server.drop_watches(abrupt=True)
                self.counts["drop_watches"] += 1
