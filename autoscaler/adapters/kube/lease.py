"""A coordination.k8s.io/v1 Lease as a leader lock, with client-go's rules.

- Acquire when the Lease is missing, released (no holder), or its holder has not renewed it for
  `leaseDurationSeconds` as measured by OUR clock since we last saw it change (no clock-skew trust).
- Every write is a replace carrying the resourceVersion we read: a 409 means someone else wrote
  first, and we lost this round. A create racing another create gets 409 AlreadyExists, same thing.
- Release clears the holder so a standby takes over at its next retry, not a lease duration later.
- The holder renews with one write on the Lease it last stored, without reading it first, while
  that is valid: client-go's fast path (tools/leaderelection/leaderelection.go
  `tryAcquireOrRenew`, "1. fast path for the leader to update optimistically"). A read and a
  write per renewal, each seconds long on a saturated API server, let a leader's lease lapse
  (reaction.py at 2,000 nodes). Any failure of it falls back to the read.

Timing (retry period, renew deadline) belongs to the caller; this class only does one attempt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.client import api_client

_CONFLICT, _NOT_FOUND = 409, 404


@dataclass(frozen=True)
class LeaseRecipe:
    """How to make the daemon's LeaseLock, with a client of its own: it is pickled and made in
    the lease renewer's process (autoscaler/daemon/renewer.py), where the daemon's client cannot
    go. Credentials are read there as the daemon reads them (kubeconfig or in-cluster)."""

    kubeconfig: str | None
    namespace: str
    name: str
    identity: str
    lease_duration: timedelta
    request_timeout: float

    def __call__(self) -> LeaseLock:
        return LeaseLock(
            api_client(self.kubeconfig, identity=self.identity),  # the child's own connections
            self.namespace,
            self.name,
            self.identity,
            self.lease_duration,
            self.request_timeout,
        )


class LeaseLock:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: timedelta,
        request_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self._duration_s = max(
            1, math.ceil(lease_duration.total_seconds())
        )  # the API takes whole seconds
        self._timeout = request_timeout
        self._clock = clock
        self._observed: tuple[str | None, float] | None = (
            None  # (resourceVersion, when we saw it change)
        )
        self.holder: str | None = None  # as last read: who leads now ("" or None: nobody)
        # the Lease as we last stored it holding it, and when that write began (our clock)
        self._held: tuple[client.V1Lease, float] | None = None

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the Lease afterwards. Unexpected API errors raise."""
        if self._renew_held():
            return True
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            return self._create()
        spec = lease.spec or client.V1LeaseSpec()
        self._observe(lease.metadata.resource_version, spec.holder_identity)
        ours = spec.holder_identity == self.identity
        if not ours and spec.holder_identity and not self._expired(spec):
            return False
        now = datetime.now(UTC)
        if not ours:  # a new term: take over and count the transition
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + (
                1 if spec.holder_identity else 0
            )
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = self._duration_s
        spec.renew_time = now
        lease.spec = spec
        return self._replace(lease) is not None

    def _renew_held(self) -> bool:
        """The fast path: the Lease we hold renewed on the resourceVersion we stored, if it is
        still valid by our clock. False (nothing known) on any failure: a 409 means another
        replica wrote since, the read then says who holds it."""
        if self._held is None:
            return False
        lease, began = self._held
        if self._clock() - began >= self._duration_s:
            return False
        lease.spec.renew_time = datetime.now(UTC)
        try:
            return self._replace(lease) is not None
        except Exception:  # timeouts, 5xx: the slow path tries again at once
            return False

    def release(self) -> bool:
        """Give the Lease up if we hold it; True if it was ours and is now free."""
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return False
            raise
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return False
        lease.spec.holder_identity = ""
        lease.spec.lease_duration_seconds = 1
        lease.spec.renew_time = datetime.now(UTC)
        return self._replace(lease) is not None

    def _create(self) -> bool:
        now = datetime.now(UTC)
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=self._duration_s,
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        began = self._clock()
        try:
            created = self._api.create_namespaced_lease(
                self.namespace, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == _CONFLICT:  # another replica created it first
                return False
            raise
        self._observe(created.metadata.resource_version, self.identity)
        self._held = (created, began)
        return True

    def _replace(self, lease: client.V1Lease) -> client.V1Lease | None:
        """The stored Lease, or None when someone wrote it since we read it."""
        began = self._clock()
        try:
            stored = self._api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == _CONFLICT:  # optimistic concurrency: this round is lost
                self._held = None
                return None
            raise
        self._observe(stored.metadata.resource_version, stored.spec.holder_identity)
        if stored.spec.holder_identity == self.identity:
            self._held = (stored, began)
        return stored

    def _observe(self, resource_version: str | None, holder: str | None) -> None:
        self.holder = holder
        if holder != self.identity:
            self._held = None
        if self._observed is None or self._observed[0] != resource_version:
            self._observed = (resource_version, self._clock())

    def _expired(self, spec: client.V1LeaseSpec) -> bool:
        assert self._observed is not None
        duration = spec.lease_duration_seconds or self._duration_s
        return self._clock() >= self._observed[1] + duration
