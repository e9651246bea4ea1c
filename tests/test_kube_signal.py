"""The checkpoint signal's pod annotations at shutdown: those not begun are dropped and counted in
one line before the Lease goes, those under way finish, and no warning is logged per pod (a
2,000-node benchmark run ended with 1,226 `checkpoint_signal_failed`, NotLeader, after the
release)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import structlog
from kube_fixtures import NS, training_job, worker
from support.kube_api import KubeApiServer
from support.waiting import wait_for

from autoscaler.adapters.kube.client import api_client
from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.kinds import et_operator
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.signal import CheckpointSignal
from autoscaler.core.model import Action, Decision, Reason
from autoscaler.fencing import Fence
from autoscaler.notice import ANNOTATION

PODS = 12


def test_closing_drops_the_signals_not_begun_in_one_line_and_lets_those_under_way_finish(
    tmp_path: Path,
) -> None:
    with KubeApiServer() as server:
        server.seed(
            training_job("bert", replicas=PODS), *(worker("bert", i, "n") for i in range(PODS))
        )
        api = api_client(server.kubeconfig(str(tmp_path / "kubeconfig")))
        # each pod's PATCH asks the fence first: held there, the pool's threads stay busy
        entered, go = threading.Semaphore(0), threading.Event()

        def held() -> bool:
            entered.release()
            return go.wait(10)

        fence = Fence()
        fence.bind(held)
        objects = ObjectApi(api, retries=0, fence=fence)
        signal = CheckpointSignal(objects, EventRecorder(api, host="t", fence=Fence.open()))
        job = server.get("trainingjobs", "bert", NS)
        assert job is not None
        drain = Decision(
            "ml/bert",
            Action.DRAIN,
            Reason.PREEMPTION_NOTICE,
            "default",
            PODS,
            PODS - 1,
            count=1,
            pods=("bert-worker-0",),
            hosts=("bert-worker-0",),
        )
        with structlog.testing.capture_logs() as logs:
            signal.tell_pods(et_operator.KIND, job, drain, datetime.now(UTC))
            # the list ran, then every thread of the pool took one pod and waits at the fence
            under_way = sum(entered.acquire(timeout=10) for _ in range(4))
            signal.close()
            go.set()
            wait_for(
                lambda: len(annotated(server)) == under_way, 10, "the signals under way to land"
            )
        assert under_way == 4  # the pool's size: the others were queued
        dropped = [e for e in logs if e["event"] == "checkpoint_signals_dropped"]
        assert [e["pods"] for e in dropped] == [PODS - under_way]
        assert not [e for e in logs if e["event"] == "checkpoint_signal_failed"]


def annotated(server: KubeApiServer) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in server.objects("pods", NS)
        if ANNOTATION in (p["metadata"].get("annotations") or {})
    ]


def test_closing_the_events_sends_for_a_while_then_drops_the_rest_in_one_line(
    tmp_path: Path,
) -> None:
    """Events queued behind a slow server at shutdown: one line with their count, not one
    NotLeader line each after the Lease went (278-661 at the end of each 2,000-node run)."""
    with KubeApiServer() as server:
        server.seed(training_job("bert"))
        api = api_client(server.kubeconfig(str(tmp_path / "kubeconfig")))
        entered, go = threading.Semaphore(0), threading.Event()

        def held() -> bool:  # the sender's first Event waits at the fence: the rest queue
            entered.release()
            return go.wait(10)

        fence = Fence()
        fence.bind(held)
        recorder = EventRecorder(api, host="t", fence=fence)
        job = server.get("trainingjobs", "bert", NS)
        assert job is not None
        with structlog.testing.capture_logs() as logs:
            for i in range(6):
                recorder.record(job, "HostsDrained", f"drain {i}", datetime.now(UTC))
            assert entered.acquire(timeout=10)
            recorder.close(0.2)
            go.set()
            assert recorder.flush(10)  # the one under way lands; nothing else is left
        dropped = [e for e in logs if e["event"] == "events_dropped"]
        assert [e["events"] for e in dropped] == [5]
        sent = [e for e in server.objects("events", NS) if e["reason"] == "HostsDrained"]
        assert [e["message"] for e in sent] == ["drain 0"]
