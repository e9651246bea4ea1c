"""Connect to the API server: a kubeconfig when one is named, else the pod's in-cluster identity."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from autoscaler.backoff import Backoff
from autoscaler.fencing import check_sending, sending_now

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_POOL_SIZE = 128  # connections kept open to the API server: watches + concurrent writes


def api_client(
    kubeconfig: str | os.PathLike[str] | None = None, identity: str | None = None
) -> client.ApiClient:
    """An ApiClient of its own (the library's global default configuration is left alone).

    Without `kubeconfig`: in-cluster service account; outside a cluster, $KUBECONFIG or
    ~/.kube/config, so the same command works on a laptop. With `identity` (the Lease holder
    name), every request says `User-Agent: spot-autoscaler/<identity>`: audit logs show which
    replica wrote what.
    """
    cfg = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    # No retries inside urllib3: its default (Retry(3), kubernetes/client/rest.py passes
    # `configuration.retries` only when set) resends idempotent requests, DELETE among them
    # (urllib3 `Retry.DEFAULT_ALLOWED_METHODS`), on a dropped connection, past our fence: a
    # leader paused mid-request (SIGSTOP, a long GC) resumed and deleted a ScaleIn after another
    # replica had taken the Lease (tests/test_chaos.py). Every attempt goes through
    # retry.with_retries, which asks the fence first.
    cfg.retries = 0
    # Every watch holds a pooled connection for its whole life (a dozen kinds, per namespace
    # when scoped): the library's default pool (5 x CPUs: 10 here) left writes without a kept
    # connection, and each one then paid a new TCP + TLS handshake ("Connection pool is full,
    # discarding connection"). Idle connections beyond use are never opened, only kept.
    cfg.connection_pool_maxsize = _POOL_SIZE
    api = client.ApiClient(cfg)
    # a fenced write is asked again as its bytes leave (autoscaler.fencing.check_sending)
    api.rest_client.pool_manager.pool_classes_by_scheme = _FENCED_POOLS
    if identity:
        api.user_agent = f"spot-autoscaler/{identity}"
    return api


class _FencedSend:
    """http.client's `send` (headers, then the body), connected first: a TCP or TLS handshake
    may take long, the fence is asked after it, immediately before the bytes go."""

    sock: object
    connect: Callable[[], None]

    def send(self, data: Any) -> None:
        if self.sock is None:
            self.connect()
        check_sending()
        super().send(data)  # type: ignore[misc]


class _FencedHTTPConnection(_FencedSend, HTTPConnection):
    pass


class _FencedHTTPSConnection(_FencedSend, HTTPSConnection):
    pass


class _ServerDeadline:
    """A fenced write's total timeout also goes to the server, as `?timeout=`: kube-apiserver
    ends a request it has not done by then (k8s.io/apiserver pkg/endpoints/filters
    request_deadline.go `WithRequestDeadline`). The client abandoning it is not enough: a
    request held in a queue on the way (APF, a proxy) could still commit after our lease ran
    out, when another replica may lead (the fault suite's `write_by_non_leader`, seed 113)."""

    def urlopen(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        timeout = kwargs.get("timeout")
        total = getattr(timeout, "total", None)
        if sending_now() and isinstance(total, int | float) and total > 0:
            ms = max(1, int(total * 1000))
            url = f"{url}{'&' if '?' in url else '?'}timeout={ms}ms"
        return super().urlopen(method, url, *args, **kwargs)  # type: ignore[misc]


class _FencedHTTPPool(_ServerDeadline, HTTPConnectionPool):
    ConnectionCls = _FencedHTTPConnection


class _FencedHTTPSPool(_ServerDeadline, HTTPSConnectionPool):
    ConnectionCls = _FencedHTTPSConnection


_FENCED_POOLS = {"http": _FencedHTTPPool, "https": _FencedHTTPSPool}


def own_namespace() -> str:
    """This pod's namespace: $POD_NAMESPACE (downward API), the service account's, or default."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return _SA_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def unreachable(api: client.ApiClient, within: float) -> str | None:
    """None once the API server answers `GET /version`; else, after trying for `within` seconds,
    why not in a few words (`run --once` fails fast with it instead of retrying every watch).

    A 401 or 403 answers at once: the server is there and refuses our credentials."""
    host = api.configuration.host
    deadline = time.monotonic() + within
    backoff = Backoff(base=0.25, cap=2.0)
    while True:
        left = deadline - time.monotonic()
        try:
            client.VersionApi(api).get_code(_request_timeout=max(0.1, min(left, 5.0)))
            return None
        except ApiException as exc:
            if exc.status in (401, 403):
                return f"{host}: {exc.status} {exc.reason} (credentials refused)"
            return None  # it answered
        except Exception as exc:  # urllib3: refused, unresolvable, timed out, TLS
            match = _ERRNO.search(str(exc))
            why = match.group(1).strip() if match else type(exc).__name__
        delay = backoff.next_delay()
        if time.monotonic() + delay >= deadline:
            return f"{host}: {why}"
        time.sleep(delay)
