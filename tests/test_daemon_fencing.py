"""Fenced leadership: a replica writes only while its own lease is valid, paused or not.

The operator's report: two replicas; the leader was paused (SIGSTOP) in the middle of a pass and
resumed after the other took the Lease; the resumed one sent the drain patch it had prepared.
Here the same happens to real `spot-autoscaler run` processes against the API emulator, and the
emulator's record of who (User-Agent) sent what shows the resumed replica wrote nothing.
"""

from __future__ import annotations

import copy
import json
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes.client.exceptions import ApiException
from support.cli import run_cli, stop_cli
from support.kube_api import KubeApiServer
from support.waiting import wait_for
from test_daemon_support import JOB, KUBE_CONFIG, node, worker

from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.kinds.et_operator import TRAINING_JOBS
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import NODES
from autoscaler.config import parse_config
from autoscaler.config.daemon import LeaderElectionSettings
from autoscaler.daemon.leader import LeaderElector
from autoscaler.fencing import Fence, NotLeader, Stale

LEASE = "spot-autoscaler"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
INTERRUPTION_TAINT = "aws-node-termination-handler/spot-itn"
# KUBE_CONFIG's election timing
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 2.0, 1.5, 0.1


# --- who sent what: the emulator's request record, plus User-Agent and arrival time ----------
@dataclass(frozen=True)
class Sent:
    at: float  # time.monotonic() when the request reached the server
    agent: str
    method: str
    path: str

    @property
    def lease(self) -> bool:
        return "/leases" in self.path

    def write_by(self, identity: str) -> bool:
        return (
            self.method in WRITES and not self.lease and self.agent == f"spot-autoscaler/{identity}"
        )


class AuditedApi(KubeApiServer):
    """The emulator, recording each request's User-Agent; it can hold one chosen request (a
    replica's pass stays in the middle of a decision until the test lets the answer go), then
    answer it with an error instead of serving it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[Sent] = []
        self._hold: Callable[[Sent], bool] | None = None
        self._answer = 0  # the status a held request gets after its release; 0: served
        self.holding = threading.Event()
        self.release = threading.Event()

    def hold(self, match: Callable[[Sent], bool], answer: int = 0) -> None:
        self.holding.clear()
        self.release.clear()
        self._hold, self._answer = match, answer

    def _serve(self, h: Any) -> None:
        record = Sent(
            time.monotonic(), h.headers.get("User-Agent") or "", h.command, urlsplit(h.path).path
        )
        with self._lock:
            self.sent.append(record)
        if self._hold is not None and self._hold(record):
            self._hold = None
            self.holding.set()
            self.release.wait(30)
            if self._answer:
                self.fail_next(1, self._answer, path_contains=record.path, method=record.method)
        super()._serve(h)


def lease_holder(api: KubeApiServer) -> str | None:
    lease = api.get("leases", LEASE, "default")
    return lease["spec"].get("holderIdentity") if lease else None


class Replica:
    """A `spot-autoscaler run` process; its stdout and stderr go to files the test can read."""

    def __init__(self, tmp_path: Path, identity: str) -> None:
        self.identity = identity
        self.agent = f"spot-autoscaler/{identity}"
        self.log = tmp_path / f"{identity}.log"
        self._out = self.log.open("w")
        self.proc = run_cli(tmp_path, identity=identity, stdout=self._out, stderr=subprocess.STDOUT)

    def events(self) -> list[dict[str, Any]]:
        return [
            json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")
        ]

    def stop(self) -> None:
        stop_cli(self.proc)
        self._out.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[AuditedApi]:
    with AuditedApi() as server:
        server.seed(node(0), node(1), worker(0), worker(1, on="node-1"), TWO_WORKERS)
        server.kubeconfig(str(tmp_path / "kubeconfig"))
        (tmp_path / "config.yaml").write_text(KUBE_CONFIG)
        yield server


# bert with a worker on each node: one of them can be drained (the last one never is)
TWO_WORKERS = copy.deepcopy(JOB)
TWO_WORKERS["spec"]["etReplicaSpecs"]["worker"]["replicas"] = 2
TWO_WORKERS["status"]["currentWorkers"] = ["bert-worker-0", "bert-worker-1"]
TAKEOVERS: list[float] = []


def test_a_paused_and_resumed_leader_writes_nothing_once_the_other_holds_the_lease(
    api: AuditedApi, tmp_path: Path
) -> None:
    replicas = {name: Replica(tmp_path, name) for name in ("replica-a", "replica-b")}
    try:
        leader_id = wait_for(
            lambda: lease_holder(api) if lease_holder(api) in replicas else None,
            timeout=15,
            what="a leader",
        )
        leader = replicas[leader_id]
        standby = next(r for r in replicas.values() if r is not leader)
        api.wait_until(lambda: len(api.objects("scaleouts")) == 1, timeout=10)
        assert any(s.write_by(leader.identity) for s in api.sent)  # its writes are attributed
        assert not any(s.write_by(standby.identity) for s in api.sent)

        # The leader's next pass patches the job (its drain): hold that request, then answer
        # it 503, so that the leader, once resumed, would send it again.
        api.hold(
            lambda s: (
                s.agent == leader.agent
                and s.method == "PATCH"
                and s.path.endswith("/trainingjobs/bert")
            ),
            answer=503,
        )
        api.patch(
            "nodes",
            "node-0",
            {
                "spec": {
                    "taints": [
                        {"key": INTERRUPTION_TAINT, "value": "itn-1", "effect": "NoSchedule"}
                    ]
                }
            },
        )
        assert api.holding.wait(10), "the leader never started its drain"
        leader.proc.send_signal(signal.SIGSTOP)  # paused mid-decision, its lease still valid
        paused = time.monotonic()
        api.release.set()  # the answer waits in its socket until the process runs again

        wait_for(
            lambda: lease_holder(api) == standby.identity,
            timeout=10,
            what="the standby to take the Lease",
        )
        took_over = time.monotonic()
        TAKEOVERS.append(took_over - paused)
        # the new leader drains the host (the node would die before the old leader woke up)
        wait_for(
            lambda: any(
                s.write_by(standby.identity)
                and "/trainingjobs/bert" in s.path
                and s.method == "PATCH"
                for s in api.sent
            ),
            timeout=10,
            what="the new leader's drain patch",
        )

        leader.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        # its held pass goes on: the drain's retry must be refused before it is sent
        wait_for(
            lambda: (
                any(s.write_by(leader.identity) and s.at > resumed for s in api.sent)
                or any("NotLeader" in json.dumps(e) for e in leader.events())
            ),
            timeout=10,
            what="the resumed replica to try its write",
        )
        # and it re-reads the Lease (a step) and steps down
        wait_for(
            lambda: any(s.agent == leader.agent and s.lease and s.at > resumed for s in api.sent),
            timeout=10,
            what="the resumed replica's step",
        )
        wait_for(
            lambda: any(e.get("event") == "leader_lost" for e in leader.events()),
            timeout=10,
            what="the resumed replica to step down",
        )
        assert lease_holder(api) == standby.identity  # held by the other all along

        # Stamped once the other held the Lease: a write sent by the resumed process. A write the
        # leader sent just before its SIGSTOP (the checkpoint signal's pod annotations run on a
        # pool beside the drain) may be stamped by this busy in-process server a little after
        # `paused`, under a lease still valid then: not what this test is about.
        stale = [s for s in api.sent if s.write_by(leader.identity) and s.at > took_over]
        assert stale == [], f"the resumed replica wrote while {standby.identity} led: {stale}"
        assert any(e.get("event") == "leader_elected" for e in standby.events())
    finally:
        for r in replicas.values():
            r.stop()
    # the standby may take over once the Lease expired by its clock: a lease duration after the
    # last renewal it saw, itself up to a retry period before the pause, plus its own retry
    assert LEASE_DURATION - 2 * RETRY_PERIOD <= TAKEOVERS[-1] <= LEASE_DURATION + 1.0
    print(
        f"takeover after pause: {TAKEOVERS[-1]:.3f}s "
        f"(median so far {statistics.median(TAKEOVERS):.3f}s)"
    )


# --- the fence itself, on a fake clock ---------------------------------------------------------
class FakeLock:
    identity = "me"
    holder: str | None = "me"

    def __init__(self) -> None:
        self.answer = True

    def try_acquire_or_renew(self) -> bool:
        return self.answer

    def release(self) -> bool:
        return True


class Quiet:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


def test_the_fence_closes_when_the_last_renewal_is_older_than_the_renew_deadline(
    api: AuditedApi,
) -> None:
    now = [100.0]
    settings = LeaderElectionSettings(
        lease_duration=timedelta(seconds=15),
        renew_deadline=timedelta(seconds=10),
        retry_period=timedelta(seconds=2),
    )
    elector = LeaderElector(
        FakeLock(), settings, Quiet(), lambda _: None, lambda: None, clock=lambda: now[0]
    )
    fence = Fence(write_timeout=5.0)
    with pytest.raises(NotLeader):  # closed until bound
        fence.check("anything")
    fence.bind(elector.is_leader)
    with pytest.raises(NotLeader):  # bound, never renewed
        fence.check("anything")
    elector.step()
    fence.check("a write 0 s after the renewal")
    now[0] += 9.999
    fence.check("a write just inside the renew deadline")
    assert fence.timeout(30.0) == 5.0 and fence.timeout(2.0) == 2.0

    # paused: no step() ran, the clock moved on; the scheduler's first job is a pass, not a step
    now[0] += 0.001
    client = api.api_client()
    objects = ObjectApi(client, retries=3, fence=fence)
    recorder = EventRecorder(client, host="me", fence=fence)
    api.clear_requests()
    with pytest.raises(NotLeader):
        objects.merge_patch(TRAINING_JOBS, "default", "bert", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(NotLeader):
        objects.merge_patch(NODES, "", "node-0", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(NotLeader):
        objects.create(TRAINING_JOBS, "default", {"metadata": {"name": "x"}})
    with pytest.raises(NotLeader):
        objects.delete(TRAINING_JOBS, "default", "bert", "1")
    recorder.record(node(0), "Test", "not sent", now=datetime.now(UTC))
    assert recorder.flush(5)
    assert objects.get(NODES, "", "node-0")["metadata"]["name"] == "node-0"  # reads still go
    assert [r.method for r in api.request_log] == ["GET"]

    # resumed: a step renews (nobody else took it), and writes go out again
    elector.step()
    objects.merge_patch(NODES, "", "node-0", {"metadata": {"labels": {"a": "b"}}})
    assert api.get("nodes", "node-0")["metadata"]["labels"]["a"] == "b"


class Logged:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def warning(self, event: str, **kw: object) -> None:
        self.lines.append((event, kw))

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


class SlowLock(FakeLock):
    """Each attempt takes `took` seconds of the test's clock and loses its round (a 409)."""

    def __init__(self, now: list[float], took: float) -> None:
        super().__init__()
        self.now, self.took = now, took

    def try_acquire_or_renew(self) -> bool:
        self.now[0] += self.took
        return False


def test_a_renewal_after_the_fence_closed_is_logged_as_a_lapse() -> None:
    """No step sees the lapse (the fence closes between two steps): the late renewal says it."""
    now, logged = [100.0], Logged()
    settings = LeaderElectionSettings(
        lease_duration=timedelta(seconds=15),
        renew_deadline=timedelta(seconds=10),
        retry_period=timedelta(seconds=2),
    )
    elector = LeaderElector(
        FakeLock(), settings, logged, lambda _: None, lambda: None, clock=lambda: now[0]
    )
    elector.step()
    now[0] += 9.0
    elector.step()  # in time: nothing to say
    assert logged.lines == []
    now[0] += 14.0  # the next step starts 14 s after the last renewal: closed for 4 s
    elector.step()
    lapse = logged.lines[:]
    assert lapse == [
        (
            "lease_lapsed",
            {
                "identity": "me",
                "writes_refused_s": 4.0,
                "renewal_took_s": 0.0,
                "since_last_renewal_s": 14.0,
            },
        )
    ]
    # a step that takes longer than the retry period says how it ended
    slow = LeaderElector(
        SlowLock(now, 3.0), settings, logged, lambda _: None, lambda: None, clock=lambda: now[0]
    )
    slow.step()
    assert logged.lines[len(lapse) :] == [
        ("lease_step_slow", {"took_s": 3.0, "outcome": "not taken", "holder": "me"})
    ]


def test_a_fence_is_checked_before_each_retry(api: AuditedApi) -> None:
    """Server trouble and a lapse during the back-off: the retry is not sent."""
    allowed = [True]
    fence = Fence(write_timeout=0.5)
    fence.bind(lambda: allowed[0])
    objects = ObjectApi(api.api_client(), retries=3, fence=fence)
    api.fail_next(1, 500, path_contains="/nodes/node-0", method="PATCH")
    original_check = fence.check
    calls = []

    def check(what: str) -> None:
        calls.append(what)
        if len(calls) == 2:  # the lease lapsed during the first attempt's back-off
            allowed[0] = False
        original_check(what)

    fence.check = check  # type: ignore[method-assign]
    with pytest.raises(NotLeader):
        objects.merge_patch(NODES, "", "node-0", {"metadata": {"labels": {"a": "b"}}})
    assert api.count("PATCH") == 1 and len(calls) == 2


@pytest.mark.parametrize("write", ["patch", "event"])
def test_a_write_is_asked_again_as_its_bytes_leave(
    api: AuditedApi, tmp_path: Path, write: str
) -> None:
    """A thread stopped between its check and its send (SIGSTOP, a long pause) resumes on a
    lease another replica may hold by then: the connection asks the fence again immediately
    before the request's bytes go, and nothing reaches the server."""
    from autoscaler.adapters.kube.client import api_client

    answers = iter([True, False])  # valid at the check, lapsed when the bytes would leave
    fence = Fence()
    fence.bind(lambda: next(answers))
    client = api_client(tmp_path / "kubeconfig")
    api.clear_requests()
    if write == "patch":
        objects = ObjectApi(client, retries=0, fence=fence)
        with pytest.raises(NotLeader):
            objects.merge_patch(NODES, "", "node-0", {"metadata": {"labels": {"a": "b"}}})
    else:
        recorder = EventRecorder(client, fence=fence)
        recorder.record(api.get("nodes", "node-0"), "Test", "a message", datetime.now(UTC))
        assert recorder.flush(5)
    assert [r.method for r in api.request_log] == []


def test_a_fenced_write_tells_the_server_its_deadline(api: AuditedApi, tmp_path: Path) -> None:
    """The write's total timeout goes to the server as `?timeout=`: kube-apiserver ends a
    request not done by then, so one our client abandoned cannot commit after the lease ran
    out. Reads carry none."""
    from autoscaler.adapters.kube.client import api_client

    fence = Fence(write_timeout=0.5)
    fence.bind(lambda: True)
    objects = ObjectApi(api_client(tmp_path / "kubeconfig"), retries=0, fence=fence)
    api.clear_requests()
    objects.merge_patch(NODES, "", "node-0", {"metadata": {"labels": {"a": "b"}}})
    objects.get(NODES, "", "node-0")
    [patch] = api.requests("PATCH")
    assert patch.query["timeout"].endswith("ms") and 0 < int(patch.query["timeout"][:-2]) <= 500
    assert "timeout" not in api.requests("GET")[0].query


def test_wiring_bounds_writes_by_the_lease_margin_and_names_the_replica(tmp_path: Path) -> None:
    from test_daemon_support import wired_daemon

    with KubeApiServer() as server:
        server.kubeconfig(str(tmp_path / "kubeconfig"))
        cfg = parse_config(
            KUBE_CONFIG.replace("retry_period: 0.1s}", "retry_period: 0.1s, identity: w-1}")
        )
        d, _ = wired_daemon(cfg, tmp_path / "kubeconfig")
        fence = d.parts.fence
        assert fence is not None and fence.write_timeout == pytest.approx(0.5)
        assert not fence.allows()  # not elected yet
        d.leadership.step()  # starts the renewer process, which takes the free Lease
        wait_for(fence.allows, 20, "the renewer to take the Lease")
        d.leadership.release()
        assert not fence.allows()
        assert lease_holder(server) == ""  # given up at once, for a standby to take
    dry, _ = wired_daemon_dry(cfg, tmp_path / "kubeconfig")
    assert dry.parts.fence is not None and dry.parts.fence.allows()  # dry run: never fenced
    off = parse_config(
        KUBE_CONFIG.replace("retry_period: 0.1s}", "retry_period: 0.1s, enabled: false}")
    )
    d_off, _ = wired_daemon(off, tmp_path / "kubeconfig")
    assert d_off.parts.fence is not None and d_off.parts.fence.allows()  # no election: alone


def wired_daemon_dry(cfg: Any, kubeconfig: Path) -> Any:
    from test_daemon_support import CapturingLogger

    from autoscaler.daemon.loop import WakeSignal
    from autoscaler.daemon.metrics import Metrics
    from autoscaler.daemon.service import Daemon
    from autoscaler.daemon.wiring import build_parts

    wake, metrics, log = WakeSignal(), Metrics(), CapturingLogger()
    parts = build_parts(cfg, wake, log, metrics.error, kubeconfig=kubeconfig, dry_run=True)
    return Daemon(cfg, parts, wake, log, log, metrics=metrics), log


def test_the_user_agent_names_the_replica(tmp_path: Path) -> None:
    from autoscaler.adapters.kube.client import api_client

    with AuditedApi() as server:
        server.kubeconfig(str(tmp_path / "kubeconfig"))
        client = api_client(tmp_path / "kubeconfig", identity="pod-7")
        try:
            ObjectApi(client, retries=0).get(NODES, "", "nope")
        except ApiException as exc:
            assert exc.status == 404
        assert [s.agent for s in server.sent] == ["spot-autoscaler/pod-7"]


def test_a_write_resting_on_a_check_goes_out_only_while_the_check_holds() -> None:
    """Fence.until: a write (and each retry) of this thread after the deadline is not sent, and
    one sent before it carries a timeout that ends by then; other threads are not affected."""
    fence = Fence.open()
    with fence.until(time.monotonic() + 10, "a notice"):
        fence.check("create scaleins")  # in time
        assert 0 < fence.timeout(30) <= 10
        seen: list[float] = []
        other = threading.Thread(target=lambda: seen.append(fence.timeout(30)))
        other.start()
        other.join()
        assert seen == [30]  # another thread's writes keep their own timeout
    with (
        fence.until(time.monotonic() - 0.001, "a notice"),
        pytest.raises(Stale, match="a notice was checked too long ago"),
    ):
        fence.check("create scaleins")
    fence.check("create scaleins")  # outside the blocks: as before
    assert fence.timeout(30) == 30
