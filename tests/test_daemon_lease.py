"""Leader election on a real coordination.k8s.io/v1 Lease served by the API emulator."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from support.kube_api import KubeApiServer
from support.waiting import wait_for
from test_daemon_support import Recorder, World, config, daemon, http_get, metric

from autoscaler.adapters.kube.lease import LeaseLock
from autoscaler.daemon.loop import WakeSignal
from autoscaler.daemon.service import Daemon, Parts

LEASE = "spot-autoscaler"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


def lock(api: KubeApiServer, identity: str) -> LeaseLock:
    return LeaseLock(
        api.api_client(), "default", LEASE, identity, timedelta(seconds=1), request_timeout=2
    )


def holder(api: KubeApiServer) -> str | None:
    lease = api.get("leases", LEASE, "default")
    return lease["spec"].get("holderIdentity") if lease else None


class Partitionable:
    """A LeaderLock whose network can be cut: the replica lives on but cannot reach the API."""

    def __init__(self, inner: LeaseLock) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.cut = False

    @property
    def holder(self) -> str | None:
        return self.inner.holder

    def try_acquire_or_renew(self) -> bool:
        if self.cut:
            raise ConnectionError("network partition")
        return self.inner.try_acquire_or_renew()

    def release(self) -> bool:
        if self.cut:
            raise ConnectionError("network partition")
        return self.inner.release()


class Pair:
    """Two replicas over one world and one API server, and a watch on their leadership."""

    def __init__(self, api: KubeApiServer) -> None:
        self.world = World()
        self.locks = {name: Partitionable(lock(api, name)) for name in ("replica-a", "replica-b")}
        self.recorders = {name: Recorder(self.world) for name in self.locks}
        self.daemons: dict[str, Daemon] = {}
        for name in self.locks:
            parts = Parts(
                observer=self.world,
                actuator=self.recorders[name],
                lock=lambda lk=self.locks[name]: lk,
            )
            self.daemons[name], _ = daemon(config(), parts, WakeSignal())
        self.both_led = False
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_leaders, daemon=True)

    def _watch_leaders(self) -> None:
        while not self._stop.wait(0.002):
            if all(d.leadership.is_leader() for d in self.daemons.values()):
                self.both_led = True

    def start(self) -> None:
        self._watch.start()
        for d in self.daemons.values():
            d.start()

    def stop(self) -> None:
        self._stop.set()
        for d in self.daemons.values():
            d.stop()

    def leader(self) -> str | None:
        leaders = [n for n, d in self.daemons.items() if d.leadership.is_leader()]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None


@pytest.fixture
def pair(api: KubeApiServer) -> Iterator[Pair]:
    p = Pair(api)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def test_the_lock_acquires_renews_and_resolves_races(api: KubeApiServer) -> None:
    a, b = lock(api, "a"), lock(api, "b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert b.holder == "a"
    rv = api.get("leases", LEASE, "default")["metadata"]["resourceVersion"]
    assert a.try_acquire_or_renew()  # renewal: a new resourceVersion, same holder, no transition
    lease = api.get("leases", LEASE, "default")
    assert lease["metadata"]["resourceVersion"] != rv and lease["spec"]["leaseTransitions"] == 0

    # optimistic concurrency: a write between our read and our replace makes ours a 409 and a loss
    # (the first 409 is the holder's fast path, which falls back to the read)
    api.fail_next(2, 409, path_contains=f"leases/{LEASE}", method="PUT")
    assert not a.try_acquire_or_renew()
    assert a.try_acquire_or_renew()
    # someone else's API trouble is raised, not mistaken for an answer
    api.fail_next(1, 500, path_contains=f"leases/{LEASE}", method="GET")
    with pytest.raises(Exception, match="500"):
        b.try_acquire_or_renew()

    assert a.release() and holder(api) == ""
    assert b.try_acquire_or_renew()  # free at once after a release, no lease duration to wait
    assert api.get("leases", LEASE, "default")["spec"]["leaseTransitions"] == 0
    assert not a.release()  # not ours to release


def test_the_holder_renews_with_one_write_and_reads_after_a_conflict(api: KubeApiServer) -> None:
    """client-go's fast path: on a busy server a renewal is one round trip, not two."""
    now = [0.0]
    a = LeaseLock(
        api.api_client(), "default", LEASE, "a", timedelta(seconds=1), clock=lambda: now[0]
    )

    def renewal() -> list[str]:
        since = len(api.request_log)
        assert a.try_acquire_or_renew()
        return [r.method for r in api.request_log[since:] if f"leases/{LEASE}" in r.path]

    assert a.try_acquire_or_renew()
    assert renewal() == ["PUT"]
    # someone else changed the Lease: the stored version is stale, the fast write a 409; the
    # read then finds it still ours, and the renewal on it lands
    api.patch("leases", LEASE, {"metadata": {"labels": {"edited": "yes"}}}, "default")
    assert renewal() == ["PUT", "GET", "PUT"]
    # past its duration by our clock, what we stored is no lease to renew blind: read first
    now[0] += 1.5
    assert renewal() == ["GET", "PUT"]
    # another holder since: the fast write is refused, and the read says who leads
    api.patch("leases", LEASE, {"spec": {"holderIdentity": "b"}}, "default")
    assert not a.try_acquire_or_renew() and a.holder == "b"


def test_two_replicas_only_the_leader_acts(pair: Pair, api: KubeApiServer) -> None:
    leader = wait_for(pair.leader, what="a leader")
    standby = next(n for n in pair.daemons if n != leader)
    wait_for(lambda: pair.recorders[leader].applied, what="the leader's first scale-out")
    assert holder(api) == leader

    pair.world.notice("node-0")
    for d in pair.daemons.values():
        d.wake("notice")
    wait_for(lambda: "scale_in" in pair.recorders[leader].actions(), what="the leader's scale-in")
    assert pair.recorders[standby].applied == []
    assert pair.daemons[standby].loop.passes == 0  # the standby keeps its caches, does not tick
    assert (
        metric(
            http_get(pair.daemons[leader].endpoints.port, "/metrics")[1], "spot_autoscaler_leader"
        )
        == 1
    )
    assert (
        metric(
            http_get(pair.daemons[standby].endpoints.port, "/metrics")[1], "spot_autoscaler_leader"
        )
        == 0
    )
    assert not pair.both_led


def test_when_the_leader_goes_silent_the_standby_takes_over(pair: Pair, api: KubeApiServer) -> None:
    leader = wait_for(pair.leader, what="a leader")
    standby = next(n for n in pair.daemons if n != leader)
    wait_for(lambda: pair.recorders[leader].applied, what="the leader's first scale-out")

    pair.locks[leader].cut = True  # its renewals now fail: the Lease is not renewed
    cut = time.monotonic()
    wait_for(
        lambda: not pair.daemons[leader].leadership.is_leader(), what="the old leader to step down"
    )
    stepped_down = time.monotonic() - cut
    wait_for(lambda: holder(api) == standby, timeout=5, what="the standby to take the Lease")
    took_over = time.monotonic() - cut
    # it stops acting (renew deadline 0.6 s) before the other may start (lease duration 1 s)
    assert stepped_down < took_over
    assert not pair.both_led

    pair.world.notice("node-1", "n-2")
    for d in pair.daemons.values():
        d.wake("notice")
    wait_for(lambda: "scale_in" in pair.recorders[standby].actions(), what="the new leader to act")
    assert "scale_in" not in pair.recorders[leader].actions()
    text = http_get(pair.daemons[leader].endpoints.port, "/metrics")[1]
    assert (metric(text, "spot_autoscaler_errors_total", component="lease") or 0) >= 1
    assert metric(text, "spot_autoscaler_leader") == 0


def test_a_stopping_leader_hands_over_without_waiting_for_expiry(
    pair: Pair, api: KubeApiServer
) -> None:
    leader = wait_for(pair.leader, what="a leader")
    standby = next(n for n in pair.daemons if n != leader)
    pair.daemons[leader].stop()
    stopped = time.monotonic()
    assert holder(api) in ("", standby)  # released on shutdown (the standby may already be in)
    wait_for(lambda: holder(api) == standby, what="the standby to take the released Lease")
    assert time.monotonic() - stopped < 0.9  # a retry period or two, well inside the 1 s lease
    assert not pair.both_led
