"""A small HTTP endpoint for CloudMonitor's URL callback: POST, one JSON event per request.

CloudMonitor retries a callback that fails or answers non-2xx (up to three times, 5 s timeout), so
anything we read but do not act on (another event, an instance not in the cluster) still gets 200;
only a request we cannot read gets 4xx. With a token configured, the callback URL must carry it as
`?token=`: otherwise anyone who reaches the port could fake reclaims and scale jobs in.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from autoscaler.adapters.alibaba.client import shared_client
from autoscaler.adapters.alibaba.cloudmonitor import BadEvent, parse_event
from autoscaler.adapters.alibaba.interruptions import InterruptionReporter
from autoscaler.adapters.cloud_sources import Clock, NodeIndex, utcnow
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config
from autoscaler.notices_and_prices import NoticeBoard, Wake

_MAX_BODY = 64 * 1024  # an event is a few hundred bytes


class CloudMonitorWebhook:
    """`start()` serves in a background thread; `run(stop)` serves until `stop` is set."""

    def __init__(
        self,
        board: NoticeBoard,
        wake: Wake,
        nodes: NodeIndex,
        *,
        host: str = "0.0.0.0",
        port: int = 8089,
        path: str = "/cloudmonitor",
        token: str | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self._address = (host, port)
        self._path = path
        self._token = token
        self._clock = clock
        self._reporter = InterruptionReporter(board, wake, nodes, via="webhook")
        self.counts: Counter[str] = self._reporter.counts
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"webhook": self})
        self._server = ThreadingHTTPServer(self._address, handler)
        self._server.daemon_threads = True
        threading.Thread(  # a short poll interval keeps stop() quick
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="cloudmonitor-webhook",
            daemon=True,
        ).start()
        self._reporter.log.info(
            "webhook_listening", host=self._address[0], port=self.port, path=self._path
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            stop.wait()
        finally:
            self.stop()

    def handle(self, target: str, body: bytes) -> int:
        """The HTTP status for one POST to `target` (path and query) with `body`."""
        url = urlsplit(target)
        if url.path != self._path:
            return 404
        if self._token is not None:
            given = parse_qs(url.query).get("token", [""])[0]
            if not hmac.compare_digest(given.encode(), self._token.encode()):
                self.counts["forbidden"] += 1
                self._reporter.log.warning("webhook_forbidden")
                return 403
        self.counts["received"] += 1
        try:
            event = parse_event(json.loads(body))
        except (ValueError, BadEvent) as exc:  # JSONDecodeError is a ValueError
            self.counts["unparsable"] += 1
            self._reporter.log.warning("event_unparsable", error=str(exc)[:200])
            return 400
        if event is None:
            self.counts["ignored"] += 1
            return 200
        now = self._clock()
        self._reporter.report(event.instance_id, event.time or now, now)
        return 200


class _Handler(BaseHTTPRequestHandler):
    webhook: CloudMonitorWebhook
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self._reply(413 if length > _MAX_BODY else 400)
            return
        self._reply(self.webhook.handle(self.path, self.rfile.read(length)))

    def _reply(self, status: int) -> None:
        payload = json.dumps({"ok": status == 200}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Silence the stderr access log: it would print the query, token included."""


def build(config: Config, ctx: SourceContext) -> CloudMonitorWebhook:
    """The `alibaba-webhook` source (adapters/sources.py)."""
    _, nodes = shared_client(config, ctx)
    hook = config.alibaba.webhook
    return CloudMonitorWebhook(
        ctx.board,
        ctx.wake,
        nodes,
        host=hook.host,
        port=hook.port,
        path=hook.path,
        token=_token(hook.token_env),
    )


def _token(env: str | None) -> str | None:
    if env is None:
        return None
    token = os.environ.get(env)
    if not token:  # fail closed: a configured but missing token must not open the endpoint
        raise ValueError(f"alibaba.webhook.token_env: ${env} is not set")
    return token
