"""The daemon's parts one by one, with fakes of the protocols and a hand-driven clock."""

from __future__ import annotations

import os
import platform
import signal
import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest
from structlog.testing import CapturingLogger
from support.waiting import wait_for
from test_daemon_support import metric

from autoscaler import __version__
from autoscaler.config import ConfigError, parse_config
from autoscaler.config.daemon import DaemonSettings, LeaderElectionSettings
from autoscaler.core import (
    Action,
    CapacityType,
    Decision,
    GpuNode,
    Job,
    Notice,
    NoticeKind,
    Reason,
    Worker,
)
from autoscaler.daemon.instrument import GuardedActuator, NoticeTracker, NotLeader
from autoscaler.daemon.leader import LeaderElector
from autoscaler.daemon.loop import WakeSignal
from autoscaler.daemon.metrics import Metrics
from autoscaler.daemon.persist import PersistingBoard
from autoscaler.daemon.supervise import Supervisor
from autoscaler.daemon.wiring import identity
from autoscaler.shutdown import stop_on_signals, wait_until_stopped

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeLock:
    """A LeaderLock whose answers the test scripts: True, False (lost the race) or an exception."""

    identity = "me"

    def __init__(self) -> None:
        self.answer: bool | Exception = True
        self.holder: str | None = None
        self.released = 0

    def try_acquire_or_renew(self) -> bool:
        if isinstance(self.answer, Exception):
            raise self.answer
        self.holder = "me" if self.answer else "other"
        return self.answer

    def release(self) -> bool:
        self.released += 1
        return True


def elector(lock: FakeLock, clock: Clock, changes: list[bool], errors: list[int]) -> LeaderElector:
    settings = LeaderElectionSettings(lease_duration=15, renew_deadline=10, retry_period=2)
    return LeaderElector(
        lock, settings, CapturingLogger(), changes.append, lambda: errors.append(1), clock
    )


def test_leadership_lapses_by_the_renew_deadline_even_if_no_call_returns() -> None:
    lock, clock, changes, errors = FakeLock(), Clock(), [], []
    e = elector(lock, clock, changes, errors)
    assert not e.is_leader()
    e.step()
    assert e.is_leader() and changes == [True]
    clock.t += 9.9
    assert e.is_leader()
    clock.t += 0.2  # 10.1 s since the last successful renewal, no step ran (a hung call)
    assert not e.is_leader()
    e.step()  # a renewal that works again restores it: we still held the Lease
    assert e.is_leader()


def test_failed_or_lost_renewals_step_down() -> None:
    lock, clock, changes, errors = FakeLock(), Clock(), [], []
    e = elector(lock, clock, changes, errors)
    e.step()
    lock.answer = ConnectionError("api down")
    for _ in range(5):
        clock.t += 2
        e.step()
    assert not e.is_leader() and changes == [True, False] and len(errors) == 5
    lock.answer = False  # someone else holds it now (a 409, or not expired)
    clock.t += 2
    e.step()
    assert not e.is_leader() and changes == [True, False]


def test_seeing_another_holder_steps_down_at_once_not_at_the_deadline() -> None:
    # e.g. this replica was paused (SIGSTOP) past the lease duration and another took over
    lock, clock, changes, errors = FakeLock(), Clock(), [], []
    e = elector(lock, clock, changes, errors)
    e.step()
    lock.answer = False
    clock.t += 1  # well within our own renew deadline
    e.step()
    assert not e.is_leader() and changes == [True, False]


def test_release_gives_the_lease_up_once_and_for_good() -> None:
    lock, clock, changes, errors = FakeLock(), Clock(), [], []
    e = elector(lock, clock, changes, errors)
    e.step()
    e.release()
    assert not e.is_leader() and lock.released == 1 and changes == [True, False]
    e.step()  # a scheduled step that was already on its way must not take it back
    assert not e.is_leader()
    e.release()
    assert lock.released == 1


def test_wake_signal_batches_reasons() -> None:
    wake = WakeSignal()
    assert not wake.wait(0)
    for i in range(3):
        wake(f"r{i}")
    assert wake.wait(0)
    assert wake.take() == {"r0", "r1", "r2"}
    assert not wake.wait(0) and wake.take() == set()


def test_a_failing_source_is_restarted_and_counted() -> None:
    runs: list[int] = []
    done = threading.Event()

    class Flaky:
        def run(self, stop: threading.Event) -> None:
            runs.append(1)
            if len(runs) < 3:
                raise RuntimeError("queue unreachable")
            done.set()
            stop.wait()

    errors: list[str] = []
    sup = Supervisor([("flaky", Flaky())], CapturingLogger(), errors.append, backoff_max=0.01)
    sup.start()
    try:
        wait_for(done.is_set, what="the third run")
    finally:
        sup.stop(timeout=2)
    assert errors == ["flaky", "flaky"] and len(runs) == 3


def test_the_board_persists_new_notices_and_survives_a_failed_write() -> None:
    written: list[tuple[str, str]] = []
    errors: list[int] = []

    def persist(node: str, notice: Notice) -> bool:
        if node == "bad":
            raise ConnectionError("api down")
        written.append((node, notice.id))
        return True

    board = PersistingBoard(persist, CapturingLogger(), lambda: errors.append(1))
    notice = Notice("n1", NoticeKind.INTERRUPTION, "aws-sqs", "e-1", received_at=NOW)
    assert board.post(notice) and not board.post(notice)  # a redelivery is not persisted again
    assert board.post(Notice("bad", NoticeKind.INTERRUPTION, "aws-sqs", "e-2", received_at=NOW))
    board.close()  # writes run on a background thread: wait for the queued ones
    assert written == [("n1", "e-1")] and errors == [1]
    assert {n.id for n in board.active(NOW)} == {"e-1", "e-2"}  # in memory it acts all the same


def test_actions_need_the_lease_and_notice_reactions_are_timed_once() -> None:
    metrics = Metrics()
    tracker = NoticeTracker(metrics)
    leader = [True]
    applied: list[Decision] = []

    class Inner:
        dry_run = False

        def apply(self, decision: Decision, now: datetime) -> None:
            applied.append(decision)

    guarded = GuardedActuator(Inner(), lambda: leader[0], metrics, tracker)
    received = datetime.now(UTC) - timedelta(seconds=3)
    notice = Notice("n1", NoticeKind.INTERRUPTION, "aws-sqs", "e-1", received_at=received)
    tracker.seen([notice], {"n1"})
    tracker.seen([notice], {"n1"})  # seen again next pass: still one notice
    drain = Decision("ns/job", Action.DRAIN, Reason.PREEMPTION_NOTICE, "p", 2, 1, 1, nodes=("n1",))
    guarded.apply(drain, NOW)
    guarded.apply(drain, NOW)  # the scale-in after the drain: the notice is answered already
    text = metrics.exposition().decode()
    assert metric(text, "spot_autoscaler_notices_total", source="aws-sqs", kind="interruption") == 1
    assert metric(text, "spot_autoscaler_reaction_latency_seconds_count") == 1
    assert 3 <= (metric(text, "spot_autoscaler_reaction_latency_seconds_sum") or 0) < 10
    leader[0] = False
    with pytest.raises(NotLeader):
        guarded.apply(drain, NOW)
    assert len(applied) == 2


def test_worker_series_of_finished_jobs_disappear() -> None:
    metrics = Metrics()
    running, pending = Worker("w0", "n1", "w0"), Worker("w1", None, "w1", 1, pending=True)
    metrics.set_workers([Job("ns", "a", 1, 4, workers=(running, pending)), Job("ns", "b", 1, 4)])
    metrics.set_workers([Job("ns", "a", 1, 4, workers=(running,))])
    text = metrics.exposition().decode()
    assert metric(text, "spot_autoscaler_workers", training_job="ns/a") == 1
    assert metric(text, "spot_autoscaler_workers_max", training_job="ns/a") == 4
    for gauge in ("workers", "workers_min", "workers_max"):
        assert metric(text, f"spot_autoscaler_{gauge}", training_job="ns/b") is None


def test_notices_whose_workers_go_first_are_lost_and_waiting_ones_age() -> None:
    now = [NOW]
    metrics = Metrics()
    tracker = NoticeTracker(metrics, clock=lambda: now[0])

    def notice(node: str, at_s: int) -> Notice:
        return Notice(
            node,
            NoticeKind.INTERRUPTION,
            "aws-sqs",
            f"e-{node}",
            received_at=NOW + timedelta(seconds=at_s),
        )

    evicted, withdrawn, idle = notice("n1", 0), notice("n2", 5), notice("n3", 0)
    tracker.seen([evicted, withdrawn, idle], busy_nodes={"n1", "n2"})  # n3: nothing to drain
    now[0] = NOW + timedelta(seconds=30)
    assert tracker.oldest_open_age() == 30
    tracker.seen([evicted, idle], busy_nodes={"n2"})  # n1's workers gone first; n2's withdrawn
    text = metrics.exposition().decode()
    assert (
        metric(text, "spot_autoscaler_notices_lost_total", source="aws-sqs", kind="interruption")
        == 1
    )
    assert metric(text, "spot_autoscaler_notice_unanswered_age_seconds") == 0
    assert metric(text, "spot_autoscaler_notices_total", source="aws-sqs", kind="interruption") == 3


def test_a_partial_view_leaves_withdrawn_notices_to_the_next_whole_one() -> None:
    """The fast path's snapshot holds only the jobs on noticed nodes: a withdrawn notice's node
    has none there, which must not count the notice as lost."""
    metrics = Metrics()
    tracker = NoticeTracker(metrics)
    lost = "spot_autoscaler_notices_lost_total"
    withdrawn = Notice("n1", NoticeKind.INTERRUPTION, "aws-sqs", "e-1", received_at=NOW)
    tracker.seen([withdrawn], {"n1"})
    tracker.seen([], set(), whole=False)
    assert metric(metrics.exposition().decode(), lost, source="aws-sqs", kind="interruption") in (
        None,
        0,
    )
    assert tracker.tracking  # still open: the whole view judges it
    tracker.seen([], set())  # the whole view: its workers are gone too, so it was lost
    assert metric(metrics.exposition().decode(), lost, source="aws-sqs", kind="interruption") == 1


def test_gpus_and_cost_by_capacity_type_and_the_build() -> None:
    metrics = Metrics()
    metrics.set_nodes(
        [
            GpuNode("s1", 8, 6, CapacityType.SPOT, price_per_hour=7.2),
            GpuNode("s2", 8, 2, CapacityType.SPOT),  # no known price: its GPUs count, no cost
            GpuNode("o1", 4, 4, CapacityType.ON_DEMAND, price_per_hour=36.0),
        ]
    )
    text = metrics.exposition().decode()
    assert metric(text, "spot_autoscaler_gpus_requested", capacity_type="spot") == 8
    assert metric(text, "spot_autoscaler_gpus_requested", capacity_type="on-demand") == 4
    cost = "spot_autoscaler_gpu_nodes_cost_dollars_per_second"
    assert metric(text, cost, capacity_type="spot") == pytest.approx(0.002)
    assert metric(text, cost, capacity_type="on-demand") == pytest.approx(0.01)
    build = {"version": __version__, "python": platform.python_version()}
    assert metric(text, "spot_autoscaler_build_info", **build) == 1


def test_daemon_settings_defaults_and_checks() -> None:
    s = DaemonSettings()
    assert (s.tick_interval, s.metrics_port, s.mode, s.log_format) == (
        timedelta(seconds=15),
        9090,
        "kubernetes",
        "auto",
    )
    le = s.leader_election
    assert (le.enabled, le.lease_duration, le.renew_deadline, le.retry_period) == (
        True,
        timedelta(seconds=15),
        timedelta(seconds=10),
        timedelta(seconds=2),
    )
    assert DaemonSettings(tick_interval=90).effective_liveness_timeout == timedelta(minutes=3)
    with pytest.raises(ConfigError, match="lease_duration > renew_deadline > retry_period"):
        parse_config("daemon: {leader_election: {lease_duration: 10s, renew_deadline: 10s}}")
    with pytest.raises(ConfigError, match="daemon.tick_interval"):
        parse_config("daemon: {tick_interval: 0s}")
    with pytest.raises(ConfigError, match="daemon.mode"):
        parse_config("daemon: {mode: swarm}")


def test_identity_prefers_config_then_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "spot-autoscaler-7d9f-x2")
    assert identity("explicit") == "explicit"
    assert identity(None) == "spot-autoscaler-7d9f-x2"
    monkeypatch.delenv("POD_NAME")
    assert identity(None) == f"{socket.gethostname()}-{os.getpid()}"


def test_metrics_expose_rejected_objects_and_live_backends() -> None:
    from autoscaler.daemon.metrics import Metrics

    metrics = Metrics()
    metrics.count_rejected(lambda: {("TrainingJob", "AttributeError"): 2})
    live = {"et-operator": True, "cce": True}
    metrics.track_backends(lambda: live)
    live["cce"] = False  # read at scrape time: a CRD removed shows without a pass
    text = metrics.exposition().decode()
    assert 'objects_rejected_total{kind="TrainingJob",reason="AttributeError"} 2.0' in text
    assert 'backend_live{backend="et-operator"} 1.0' in text
    assert 'backend_live{backend="cce"} 0.0' in text


def test_a_prober_that_hung_up_leaves_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """Seen in the fault suite: a paused replica, resumed, answered scrapes whose client had
    given up; the stdlib server printed a BrokenPipe traceback for each."""
    import struct

    from autoscaler.daemon.endpoints import Endpoints

    hung_up, answered = threading.Event(), threading.Event()

    def slow_check() -> None:  # the probe is answered only after the client is gone
        hung_up.wait(5)
        answered.set()

    endpoints = Endpoints("127.0.0.1", 0, Metrics(), slow_check, lambda: None)
    endpoints.start()
    try:
        sock = socket.create_connection(("127.0.0.1", endpoints.port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # linger 0: a reset, so the server's write fails
        hung_up.set()
        wait_for(answered.is_set, what="the probe to be answered")
        # the next request is served (the server thread is fine) once the failed one is done
        with socket.create_connection(("127.0.0.1", endpoints.port)) as again:
            again.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
            assert again.recv(64).startswith(b"HTTP/1.0 200")
    finally:
        endpoints.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_the_one_back_off_doubles_to_its_cap_honours_a_hint_and_resets() -> None:
    from autoscaler.backoff import Backoff

    b = Backoff(0.5, 3.0)
    assert [b.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert b.failures == 5
    assert b.next_delay(hint=10) == 3.0 and b.next_delay(hint=1) == 1  # Retry-After, capped
    b.reset()
    assert b.next_delay() == 0.5
    jittered = Backoff(1.0, 8.0, jitter=True)
    for n in range(5):
        ceiling = min(8.0, 2.0**n)
        assert ceiling / 2 <= jittered.next_delay() <= ceiling


def test_a_signal_handler_only_sets_the_stop_and_the_waiter_logs_it() -> None:
    """Logging from the handler could wait forever on the log stream's lock, held by the line
    the main thread was writing when the signal came (shutdown.SignalStop)."""
    logger = CapturingLogger()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop = stop_on_signals(logger)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(stop.is_set, what="the handler")
        assert logger.calls == []  # nothing written from inside the handler
        wait_until_stopped(stop)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert [(c.method_name, c.args, c.kwargs) for c in logger.calls] == [
        ("info", ("signal_received",), {"signal": "SIGTERM"})
    ]
