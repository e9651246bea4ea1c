"""HTTP servers on 127.0.0.1 for tests: the emulator, the proxies, protocol fakes (IMDS, the
Alibaba API)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

S = TypeVar("S", bound=ThreadingHTTPServer)


def serve(server: S) -> S:
    """`server` serving from a daemon thread, a thread per connection (none waited for at exit);
    `shutdown()` then `server_close()` end it."""
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on an ephemeral port in a thread; yields `127.0.0.1:PORT`."""
    server = serve(ThreadingHTTPServer(("127.0.0.1", 0), handler))
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
