"""A recording HTTP -> HTTPS proxy before a real kube-apiserver: what a client sent, on the wire.

The control plane of the tests runs without an audit log, so this stands where the audit log would
be: the client (the daemon) gets a kubeconfig naming ``http://127.0.0.1:<port>`` and its own bearer
token; the proxy forwards every request unchanged (Authorization included) to the apiserver over
TLS, verified against the plane's CA, relays the answer (watches streamed line by line) and records
method, path, query, User-Agent and the answer's status. Nothing is injected or rewritten: the real
authenticator and RBAC authorizer decide, and a 403 they send is recorded as such.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
}


@dataclass(frozen=True)
class Sent:
    at: float  # time.monotonic() when the request reached the proxy
    agent: str  # User-Agent: spot-autoscaler/<identity>
    method: str
    path: str
    watch: bool
    status: int  # the apiserver's answer (0: no answer)
    detail: str = ""  # an error answer's message (its Status), e.g. why a 429 or a 403

    @property
    def write(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")

    def rights(self) -> tuple[str, str, str] | None:
        """(apiGroup, resource, verb) this request needs from RBAC; None for non-resource URLs
        (/version, discovery: granted to every authenticated user by system:discovery)."""
        parts = [p for p in self.path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) > 2:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) > 3:
            group, rest = parts[1], parts[3:]
        else:
            return None
        if rest[0] == "namespaces" and len(rest) > 2:
            rest = rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        named = len(rest) > 1
        verb = {
            "GET": "get" if named else "watch" if self.watch else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }[self.method]
        return group, resource, verb


class RecordingProxy:
    """``with RecordingProxy(plane.server, ca_file) as proxy:`` then ``proxy.kubeconfig(path,
    token)`` for the client; ``proxy.sent`` is the record."""

    def __init__(self, upstream: str, ca_file: str | Path) -> None:
        parts = urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost") or parts.scheme != "https":
            raise ValueError("the recording proxy forwards to a loopback https server only")
        self.upstream = (parts.hostname, parts.port or 443)
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> RecordingProxy:
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            _shut(s)

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "proxy not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig naming the proxy and authenticating with `token` only."""
        return write_token_kubeconfig(path, self.url, token)

    def record(self, sent: Sent) -> None:
        with self._lock:
            self.sent.append(sent)

    def requests(self) -> list[Sent]:
        with self._lock:
            return list(self.sent)

    def track(self, sock: socket.socket | None, on: bool) -> None:
        if sock is None:
            return
        with self._lock:
            (self._open.add if on else self._open.discard)(sock)


def write_token_kubeconfig(
    path: Path, server: str, token: str, ca_file: str | Path | None = None
) -> Path:
    """A kubeconfig for `server` with a bearer token as its only credential."""
    cluster: dict[str, Any] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority"] = str(ca_file)
    conf = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "real", "cluster": cluster}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "token"}}],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    path.chmod(0o600)
    return path


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", ""))
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a stopped daemon) is not news


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    proxy: RecordingProxy

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.proxy.track(self.connection, True)
        try:
            self._forward()
        finally:
            self.proxy.track(self.connection, False)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        at = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        split = urlsplit(self.path)
        query = parse_qs(split.query)
        watch = (query.get("watch") or [""])[-1].lower() in ("1", "t", "true")
        agent = self.headers.get("User-Agent") or ""
        host, port = self.proxy.upstream
        conn = http.client.HTTPSConnection(
            host, port, context=self.proxy.context, timeout=None if watch else 60
        )
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        status, data = 0, b""
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            status = resp.status
            if watch and resp.status == 200:
                self.proxy.record(Sent(at, agent, self.command, split.path, watch, status))
                self._stream(conn, resp)
                return
            data = resp.read()
        except OSError:
            self.close_connection = True
            _shut(self.connection)
            return
        finally:
            if not (watch and status == 200):
                conn.close()
                detail = _message(data) if status >= 400 else ""
                self.proxy.record(Sent(at, agent, self.command, split.path, watch, status, detail))
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, conn: http.client.HTTPSConnection, resp: http.client.HTTPResponse) -> None:
        """Relay a watch line by line (events are newline-delimited JSON), re-chunked."""
        self.close_connection = True
        upstream = conn.sock
        self.proxy.track(upstream, True)
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type") or "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            while True:
                line = resp.readline()
                if not line:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (OSError, http.client.HTTPException, ValueError):
            _shut(self.connection)
        finally:
            self.proxy.track(upstream, False)
            _shut(upstream)
            conn.close()
