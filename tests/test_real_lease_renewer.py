"""The daemon's Lease renewals in a process of their own (autoscaler/daemon/renewer.py), on the real
kube-apiserver: they hold the Lease while the daemon's interpreter is saturated, hand it over on
release, and come back when their process dies.

Each test uses a Lease of its own, in one namespace of the session's control plane.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.control_plane import ControlPlane
from support.waiting import wait_for

from autoscaler.adapters.kube.lease import LeaseRecipe
from autoscaler.config.daemon import LeaderElectionSettings
from autoscaler.daemon.renewer import RenewerProcess

pytestmark = pytest.mark.real_cluster

NS = "lease-renewer"
SETTINGS = LeaderElectionSettings(
    lease_duration=timedelta(seconds=4),
    renew_deadline=timedelta(seconds=3),
    retry_period=timedelta(seconds=0.5),
)


class Told:
    """What the renewer told the daemon: leadership changes and errors."""

    def __init__(self) -> None:
        self.changes: list[bool] = []
        self.errors = 0

    def changed(self, leader: bool) -> None:
        self.changes.append(leader)

    def failed(self) -> None:
        self.errors += 1


class Quiet:
    def __getattr__(self, _: str) -> Any:
        return lambda *a, **k: None


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    admin = control_plane.api_client()
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": NS}})
    yield NS
    client.CoreV1Api(admin).delete_namespace(NS)


def renewer(
    control_plane: ControlPlane, lease: str, identity: str, told: Told | None = None
) -> RenewerProcess:
    told = told or Told()
    recipe = LeaseRecipe(
        str(control_plane.kubeconfig_path), NS, lease, identity, SETTINGS.lease_duration, 1.5
    )
    return RenewerProcess(recipe, SETTINGS, ("json", "info"), Quiet(), told.changed, told.failed)


def holder(control_plane: ControlPlane, lease: str) -> str | None:
    api = client.CoordinationV1Api(control_plane.api_client())
    return api.read_namespaced_lease(lease, NS).spec.holder_identity


def stepping(r: RenewerProcess, stop: threading.Event) -> threading.Thread:
    """The daemon's scheduler: step() every retry period (it minds the child)."""

    def run() -> None:
        while not stop.wait(SETTINGS.retry_period.total_seconds()):
            r.step()

    r.step()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_it_leads_and_hands_over_on_release(control_plane: ControlPlane, namespace: str) -> None:
    told_a = Told()
    a, b = (
        renewer(control_plane, "hand-over", "a", told_a),
        renewer(control_plane, "hand-over", "b"),
    )
    a.step()
    wait_for(a.is_leader, 20, "a to lead")
    assert told_a.changes == [True]
    b.step()
    wait_for(lambda: holder(control_plane, "hand-over") == "a", 5, "a to hold the Lease")
    assert not b.is_leader()
    a.release()
    assert not a.is_leader()  # at once, before the child has let go
    wait_for(b.is_leader, 10, "b to take over without waiting for the Lease to run out")
    assert holder(control_plane, "hand-over") == "b"
    b.release()
    assert holder(control_plane, "hand-over") == ""


def test_it_holds_the_lease_while_the_daemons_interpreter_is_saturated(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Eight threads of pure Python for three lease durations: the renewer's process does not
    share their interpreter lock, and only the heartbeat (a few bytecodes a beat) must run."""
    r = renewer(control_plane, "saturated", "a")
    stop = threading.Event()
    stepping(r, stop)
    wait_for(r.is_leader, 20, "the renewer to lead")
    busy = threading.Event()

    def spin() -> None:
        n = 0
        while not busy.is_set():
            n += 1

    hogs = [threading.Thread(target=spin, daemon=True) for _ in range(8)]
    for h in hogs:
        h.start()
    lapses = 0
    try:
        until = time.monotonic() + 3 * SETTINGS.lease_duration.total_seconds()
        while time.monotonic() < until:
            lapses += not r.is_leader()
            time.sleep(0.05)
    finally:
        busy.set()
        for h in hogs:
            h.join()
        stop.set()
        r.release()
    assert lapses == 0


def test_a_dead_renewer_is_seen_and_started_again(
    control_plane: ControlPlane, namespace: str
) -> None:
    """(A stopped daemon, whose heartbeat stops: test_real_daemon.py's paused leader.)"""
    told = Told()
    r = renewer(control_plane, "reborn", "c", told)
    stop = threading.Event()
    stepping(r, stop)
    wait_for(r.is_leader, 20, "the renewer to lead")
    errors = told.errors
    os.kill(r._child.pid, signal.SIGKILL)
    killed = datetime.now(UTC)
    wait_for(lambda: told.errors > errors, 10, "the dead renewer to be seen")
    # the new one renews the Lease it still holds, and leadership never moved
    wait_for(lambda: renewed(control_plane, "reborn") > killed, 10, "a renewal after the death")
    wait_for(r.is_leader, 5, "leadership from the new renewer's renewals")
    assert holder(control_plane, "reborn") == "c"
    stop.set()
    r.release()


def renewed(control_plane: ControlPlane, lease: str) -> datetime:
    api = client.CoordinationV1Api(control_plane.api_client())
    return api.read_namespaced_lease(lease, NS).spec.renew_time
