"""A recording HTTP -> HTTPS proxy before a real kube-apiserver: what a client sent, on the wire.

The control plane of the tests runs without an audit log, so this stands where the audit log would
be: the client (the daemon) gets a kubeconfig naming ``http://127.0.0.1:<port>`` and its own bearer
token; the proxy forwards every request unchanged (Authorization included) to the apiserver over
TLS, verified against the plane's CA, relays the answer (watches streamed line by line) and records
method, path, query, User-Agent and the answer's status. Nothing is injected or rewritten: the real
authenticator and RBAC authorizer decide, and a 403 they send is recorded as such.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .proxy import ForwardingHandler, ForwardingProxy
from .rbac import Grant, request_rights


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

    def rights(self) -> Grant | None:
        """(apiGroup, resource, verb) this request needs from RBAC; None for non-resource URLs."""
        return request_rights(self.method, self.path, self.watch)


class RecordingProxy(ForwardingProxy):
    """``with RecordingProxy(plane.server, ca_file) as proxy:`` then ``proxy.kubeconfig(path,
    token)`` for the client; ``proxy.sent`` is the record."""

    def __init__(self, upstream: str, ca_file: str | Path) -> None:
        super().__init__(upstream, _Handler, ssl.create_default_context(cafile=str(ca_file)))
        self.sent: list[Sent] = []

    def kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig naming the proxy and authenticating with `token` only."""
        return write_token_kubeconfig(path, self.url, token)

    def record(self, sent: Sent) -> None:
        with self._lock:
            self.sent.append(sent)

    def requests(self) -> list[Sent]:
        with self._lock:
            return list(self.sent)


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


class _Handler(ForwardingHandler):
    proxy: RecordingProxy

    def after(self, at: float, watch: bool, status: int, data: bytes) -> bool:
        detail = _message(data) if status >= 400 else ""
        path = urlsplit(self.path).path
        agent = self.headers.get("User-Agent") or ""
        self.proxy.record(Sent(at, agent, self.command, path, watch, status, detail))
        return False
