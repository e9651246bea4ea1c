"""Clusters run et-operator or CCE, rarely both: the daemon watches only the kinds the API server
serves (API discovery), says which backends are live, and picks up a CRD installed later."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import structlog.testing
from support.cli import run_cli
from support.kube_api import KubeApiServer
from support.waiting import wait_for
from test_daemon_kube import json_lines
from test_daemon_support import JOB, KUBE_CONFIG, http_get, metric, node, wired_daemon, worker

from autoscaler.config import parse_config
from autoscaler.daemon.service import Daemon

# the CRDs are looked up again every 0.2 s here (60 s by default)
FAST_DISCOVERY = KUBE_CONFIG.replace(
    "kubernetes: {label_selector: spot-autoscaler.io/enabled=true}",
    "kubernetes: {discovery_interval: 0.2s}",
)
CCE_JOB = {
    "apiVersion": "kongming.cce.baiudbce.com/v1",
    "kind": "AITrainingJob",
    "metadata": {"name": "ernie", "namespace": "default"},
    "spec": {"faultTolerant": True, "replicaSpecs": {"trainer": {"replicas": 1}}},
    "status": {"phase": "Running"},
}


@contextlib.contextmanager
def ready_daemon(api: KubeApiServer, tmp_path: Path, what: str) -> Iterator[tuple[Daemon, int]]:
    """The wired daemon running against `api` (CRDs looked up every 0.2 s), once ready; its
    endpoints' port."""
    kubeconfig = Path(api.kubeconfig(str(tmp_path / "kubeconfig")))
    daemon, _ = wired_daemon(parse_config(FAST_DISCOVERY), kubeconfig)
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run_until, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: daemon.endpoints is not None and daemon.parts.synced(), timeout=10, what=what
        )
        assert daemon.endpoints is not None
        yield daemon, daemon.endpoints.port
    finally:
        stop.set()
        thread.join(10)


def test_once_acts_on_a_cluster_without_the_cce_crd(tmp_path: Path) -> None:
    # before: `run --once` waited for an AITrainingJob watch that could never sync, exit 1
    with KubeApiServer() as api:
        api.unserve("AITrainingJob")
        api.seed(node(0), node(1), worker(0), JOB)
        api.kubeconfig(str(tmp_path / "kubeconfig"))
        (tmp_path / "config.yaml").write_text(
            KUBE_CONFIG.replace("sync_timeout: 10s", "sync_timeout: 3s")
        )
        proc = run_cli(tmp_path, "--once")
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert len(api.objects("scaleouts")) == 1
        [line] = [e for e in json_lines(err) if e.get("event") == "backends"]
        assert (line["live"], line["not_served"]) == (
            ["et-operator"],
            ["cce", "mpi-operator", "training-operator"],
        )


def test_readyz_and_metrics_say_which_backends_live_and_a_later_crd_is_picked_up(
    tmp_path: Path,
) -> None:
    with KubeApiServer() as api:
        api.unserve("AITrainingJob")
        api.unserve("ScaleIn")  # et-operator half installed: it cannot act either
        api.seed(node(0), worker(0), JOB)
        with ready_daemon(api, tmp_path, "ready without the CRDs") as (daemon, port):
            code, body = http_get(port, "/readyz")
            not_served = (
                "cce=not-served et-operator=not-served mpi-operator=not-served"
                " training-operator=not-served"
            )
            assert code == 200 and f"backends: {not_served}" in body
            _, text = http_get(port, "/metrics")
            assert metric(text, "spot_autoscaler_backend_live", backend="et-operator") == 0.0
            api.serve("ScaleIn")
            api.serve("AITrainingJob")
            api.seed(CCE_JOB)
            wait_for(
                lambda: "cce=live et-operator=live" in http_get(port, "/readyz")[1],
                timeout=10,
                what="both backends live after their CRDs are installed",
            )

            def jobs() -> set[str]:
                return {j.key for j in daemon.parts.observer.snapshot(datetime.now(UTC)).jobs}

            wait_for(lambda: "default/ernie" in jobs(), timeout=10, what="the CCE job seen")


def test_a_kind_rbac_forbids_is_left_alone_and_taken_up_when_granted(tmp_path: Path) -> None:
    """A chart installed without one kind's grants, its CRD installed: the daemon is ready for
    the others and says the kind is forbidden, once (before: it backed off on the 403 forever
    and never became ready); granted later, the kind goes live without a restart."""
    with KubeApiServer() as api, structlog.testing.capture_logs() as logs:
        api.seed(node(0), worker(0), JOB, CCE_JOB)
        api.fail_next(1_000_000, 403, path_contains="/aitrainingjobs", method="GET")
        with ready_daemon(api, tmp_path, "ready without the forbidden kind") as (_, port):
            code, body = http_get(port, "/readyz")
            assert code == 200 and "cce=not-served et-operator=live" in body
            wait_for(lambda: api.count("GET", "/aitrainingjobs") >= 3, what="asked again")
            forbidden = [e for e in logs if e.get("event") == "kind_forbidden"]
            assert len(forbidden) == 1 and forbidden[0]["error"].startswith("403")
            api.clear_faults()  # the grant
            wait_for(
                lambda: "cce=live" in http_get(port, "/readyz")[1],
                timeout=10,
                what="the kind live once granted",
            )
