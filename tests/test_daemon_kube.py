"""`spot-autoscaler run` with the real Kubernetes wiring against the HTTP API emulator."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import run_cli
from support.kube_api import KubeApiServer
from support.waiting import wait_for
from test_daemon_support import JOB, KUBE_CONFIG, metric, node, wired_daemon, worker

from autoscaler.config import parse_config

LEASE = "spot-autoscaler"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.seed(node(0), node(1), worker(0), JOB)
        server.kubeconfig(str(tmp_path / "kubeconfig"))
        (tmp_path / "config.yaml").write_text(KUBE_CONFIG)
        yield server


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def lease_holder(api: KubeApiServer) -> str | None:
    lease = api.get("leases", LEASE, "default")
    return lease["spec"].get("holderIdentity") if lease else None


def test_once_dry_run_prints_decisions_and_writes_nothing(
    api: KubeApiServer, tmp_path: Path
) -> None:
    proc = run_cli(tmp_path, "--once", "--dry-run")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    decisions = [e for e in json_lines(out) if e.get("event") == "decision"]
    assert [(d["job"], d["action"], d["to_workers"], d["dry_run"]) for d in decisions] == [
        ("default/bert", "scale_out", 4, True)
    ]
    assert all(e.get("event") != "decision" for e in json_lines(err))  # stderr: operational lines
    assert api.count(method=None) > 0
    assert [r for r in api.request_log if r.method in WRITES] == []  # no scaler, event or Lease
    assert api.objects("scaleouts") == [] and api.get("leases", LEASE, "default") is None


def test_once_acts_under_the_lease_and_lets_it_go(api: KubeApiServer, tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "--once", identity="once-1")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    [scaler] = api.objects("scaleouts")
    assert scaler["spec"]["selector"] == {"name": "bert"} and scaler["spec"]["toAdd"] == {
        "count": 3
    }
    lease = api.get("leases", LEASE, "default")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""  # released on the way out

    # another replica holds the Lease: --once must not act beside it, and says so
    api.seed(
        {
            **lease,
            "spec": {**lease["spec"], "holderIdentity": "the-leader", "leaseDurationSeconds": 60},
        }
    )
    # the caches' sync and the tries to lead share this deadline: long enough for a loaded
    # machine to sync (1 s was not, at a load of 6 on 2 cores), short enough not to wait long
    (tmp_path / "config.yaml").write_text(
        KUBE_CONFIG.replace("sync_timeout: 10s", "sync_timeout: 4s")
    )
    proc = run_cli(tmp_path, "--once", identity="once-2")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert any(e.get("event") == "not_leader" for e in json_lines(err))
    assert len(api.objects("scaleouts")) == 1 and lease_holder(api) == "the-leader"


def test_sigterm_stops_cleanly_and_releases_the_lease(api: KubeApiServer, tmp_path: Path) -> None:
    proc = run_cli(tmp_path, identity="daemon-1")
    try:
        api.wait_until(lambda: lease_holder(api) == "daemon-1", timeout=15)
        api.wait_until(lambda: len(api.objects("scaleouts")) == 1, timeout=5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert lease_holder(api) == ""
    names = [e.get("event") for e in json_lines(err)]
    assert (
        names.index("signal_received")
        < names.index("lease_released")
        < names.index("daemon_stopped")
    )
    assert any(e.get("event") == "decision" and e["action"] == "scale_out" for e in json_lines(out))


def test_ctrl_c_reaches_the_renewer_too_and_the_lease_is_still_released(
    api: KubeApiServer, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C goes to the whole foreground group, the lease renewer's process with
    the daemon: the daemon stops as on SIGTERM, and the renewer waits to be told to release."""
    proc = run_cli(tmp_path, identity="daemon-1", own_group=True)
    try:
        api.wait_until(lambda: lease_holder(api) == "daemon-1", timeout=15)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert lease_holder(api) == ""
    assert "Traceback" not in err
    assert "lease_released" in [e.get("event") for e in json_lines(err)]


def test_two_daemons_on_one_cluster_create_one_scaler(api: KubeApiServer, tmp_path: Path) -> None:
    daemons = []
    for name in ("replica-a", "replica-b"):
        cfg = parse_config(
            KUBE_CONFIG.replace("retry_period: 0.1s}", f"retry_period: 0.1s, identity: {name}}}")
        )
        daemons.append(wired_daemon(cfg, tmp_path / "kubeconfig")[0])
    for d in daemons:
        d.start()
    try:
        leader = wait_for(lambda: [d for d in daemons if d.leadership.is_leader()], timeout=10)[0]
        standby = next(d for d in daemons if d is not leader)
        api.wait_until(lambda: len(api.objects("scaleouts")) == 1, timeout=5)
        wait_for(lambda: standby.parts.synced(), what="the standby's caches")
        for d in daemons:  # both are poked by the same news; only the leader may answer it
            d.wake("test")
        wait_for(lambda: leader.loop.passes >= 2, what="a second pass of the leader")
        assert len(api.objects("scaleouts")) == 1  # the scaler in flight holds the job
        assert standby.loop.passes == 0 and standby.reconciler.errors == 0
        # Events go out on their own thread, behind the write (the ScaleOut's own, behind the pass)
        events = wait_for(lambda: api.objects("events", "default"), what="the leader's Events")
        assert {e["source"]["host"] for e in events} == {leader.parts.lock.identity}  # type: ignore[union-attr]
        assert lease_holder(api) == leader.parts.lock.identity  # type: ignore[union-attr]
    finally:
        for d in daemons:
            d.stop()


def test_api_errors_are_logged_counted_and_outlived(api: KubeApiServer, tmp_path: Path) -> None:
    text = KUBE_CONFIG.replace(
        "kubernetes: {label_selector: spot-autoscaler.io/enabled=true}",
        "kubernetes: {label_selector: spot-autoscaler.io/enabled=true, write_retries: 0,"
        " watch_backoff_max: 0.1s}",
    ).replace("sync_timeout: 10s", "sync_timeout: 10s\n  error_backoff_max: 0.2s")
    cfg = parse_config(text.replace("retry_period: 0.1s}", "retry_period: 0.1s, identity: r}"))
    api.fail_next(3, 500, path_contains="/scaleouts", method="POST")  # the API refuses to scale
    api.fail_next(2, 503, path_contains="/nodes?", method="GET")  # and the first lists fail
    d, log = wired_daemon(cfg, tmp_path / "kubeconfig")
    metrics = d.metrics
    d.start()
    try:
        api.wait_until(lambda: len(api.objects("scaleouts")) == 1, timeout=10)
        exposition = metrics.exposition().decode()
    finally:
        d.stop()
    assert metric(exposition, "spot_autoscaler_errors_total", component="actuator") == 3
    assert (metric(exposition, "spot_autoscaler_errors_total", component="watch") or 0) >= 2
    assert "backing_off" in [c.args[0] for c in log.calls if c.args]
