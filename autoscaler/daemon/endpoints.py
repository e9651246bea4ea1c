"""`/metrics`, `/healthz` and `/readyz` on one port, served by a stdlib HTTP server thread."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from autoscaler.daemon.metrics import Metrics

log = structlog.get_logger()

Check = Callable[[], str | None]  # None when fine, else what is wrong (shown to the prober)


class Endpoints:
    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        live: Check,
        ready: Check,
        detail: Callable[[], str] = str,
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, metrics.exposition()),
            "/healthz": lambda: _probe(live),
            "/readyz": lambda: _probe(ready, detail()),  # detail: e.g. which backends are live
        }
        handler = type("Handler", (_Handler,), {"routes": routes})
        self._server = _Server((host, port), handler)
        self._server.daemon_threads = True
        # the poll interval bounds how long stop() waits
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="endpoints",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A prober that gave up (a scrape timeout, or this process was paused) leaves a closed
        socket behind: no traceback on stderr for that. Anything else is a bug: say so."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            return
        log.error("endpoint_failed", client=str(client_address), exc_info=exc)


def _probe(check: Check, detail: str = "") -> tuple[int, str, bytes]:
    problem = check()
    body = ("ok" if problem is None else problem) + "\n" + (detail + "\n" if detail else "")
    return (200 if problem is None else 503, "text/plain", body.encode())


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, Callable[[], tuple[int, str, bytes]]]

    def do_GET(self) -> None:
        route = self.routes.get(self.path.split("?", 1)[0])
        code, ctype, body = route() if route else (404, "text/plain", b"not found\n")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no noise
        pass
