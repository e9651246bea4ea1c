"""An HTTP/1.1 proxy on 127.0.0.1:<ephemeral> forwarding to a loopback API server, for tests to
stand between a client and the server (stdlib only).

`ForwardingProxy` owns the listening server and every open connection (`stop()` shuts them all);
`ForwardingHandler` forwards each request (hop-by-hop headers dropped), relays the answer and
streams a watch line by line. Subclasses see each request through three hooks: `before` (answer
it here instead), `after` (what the server answered; drop the reply) and `cut_after` (break a
watch stream); `cut_watches()` breaks every stream relayed at once.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from .http import serve

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


class ForwardingProxy:
    """Forwards to ``upstream``, http or https (verified with ``context``), each connection served
    by a subclass of ``handler``; ``with Proxy(...) as proxy:`` or ``start()``/``stop()``."""

    def __init__(
        self,
        upstream: str,
        handler: type[ForwardingHandler],
        context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError("the proxy forwards to loopback only")
        if (parts.scheme == "https") != (context is not None):
            raise ValueError("an https upstream needs a TLS context, an http one none")
        self.upstream = (parts.hostname, parts.port or (443 if context else 80))
        self.context = context
        self._handler = handler
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._watches: set[tuple[socket.socket, socket.socket | None]] = set()  # relayed now
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> Self:
        handler = type("Handler", (self._handler,), {"proxy": self})
        self._httpd = serve(_QuietServer(("127.0.0.1", 0), handler))
        return self

    def stop(self) -> None:
        """Stop listening and shut every connection still open (a watch stream ends with it)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            _shut(s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "proxy not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def connect(self, watch: bool) -> http.client.HTTPConnection:
        """A connection to the upstream; a watch waits for events as long as it takes."""
        host, port = self.upstream
        timeout = None if watch else 60
        if self.context is None:
            return http.client.HTTPConnection(host, port, timeout=timeout)
        return http.client.HTTPSConnection(host, port, context=self.context, timeout=timeout)

    def cut_watches(self) -> int:
        """Break every watch stream relayed now, both ways (as a server that drops its watches:
        the client sees its stream end without the final chunk); how many."""
        with self._lock:
            streams = list(self._watches)
        for client, upstream in streams:
            _shut(client)
            _shut(upstream)
        return len(streams)

    def watching(self, client: socket.socket, upstream: socket.socket | None, on: bool) -> None:
        with self._lock:
            (self._watches.add if on else self._watches.discard)((client, upstream))

    def track(self, sock: socket.socket | None, on: bool) -> None:
        if sock is None:
            return
        with self._lock:
            (self._open.add if on else self._open.discard)(sock)


def _shut(sock: socket.socket | None) -> None:
    """Shut a socket both ways: its peer sees the connection end at once."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a stopped daemon, a cut connection) is not news


class ForwardingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    proxy: ForwardingProxy

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.proxy.track(self.connection, True)
        try:
            self._forward()
        finally:
            self.proxy.track(self.connection, False)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------ hooks
    def before(self, watch: bool) -> bool:
        """Before forwarding; True when this hook answered the request itself."""
        return False

    def after(self, at: float, watch: bool, status: int, data: bytes) -> bool:
        """Once per forwarded request (`at`: when it arrived, time.monotonic()) with the server's
        status (0: no answer) and body (empty for a watch about to stream); True drops the reply
        instead of relaying it (a streamed watch's is never dropped)."""
        return False

    def cut_after(self) -> float | None:
        """Seconds after which to cut this request's watch stream; None: never."""
        return None

    # ------------------------------------------------------------ forwarding
    def _drop(self) -> None:
        """End the client's connection without (the rest of) a reply."""
        self.close_connection = True
        _shut(self.connection)

    def _forward(self) -> None:
        at = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        query = parse_qs(urlsplit(self.path).query)
        watch = (query.get("watch") or [""])[-1].lower() in ("1", "t", "true")
        if self.before(watch):
            return
        conn = self.proxy.connect(watch)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        status, data = 0, b""
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            status = resp.status
            if watch and status == 200:
                self.after(at, watch, status, data)
                self._stream(conn, resp)
                return
            data = resp.read()
        except OSError:
            self.after(at, watch, status, data)
            self._drop()  # the server went away: so does the reply
            return
        finally:
            if not (watch and status == 200):
                conn.close()
        if self.after(at, watch, status, data):
            self._drop()
            return
        self.send_response(status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Relay a watch line by line (events are newline-delimited JSON), re-chunked."""
        self.close_connection = True
        upstream = conn.sock
        self.proxy.track(upstream, True)
        self.proxy.watching(self.connection, upstream, True)
        timer = None
        if (cut_after := self.cut_after()) is not None:

            def cut() -> None:  # both ends: the client sees a broken stream
                _shut(self.connection)
                _shut(upstream)

            timer = threading.Timer(cut_after, cut)
            timer.daemon = True
            timer.start()
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
            if timer is not None:
                timer.cancel()
            self.proxy.watching(self.connection, upstream, False)
            self.proxy.track(upstream, False)
            _shut(upstream)
            conn.close()
