"""Survive faults: the real daemon (`spot-autoscaler run`) through a fault-injecting proxy.

On two servers (`support.chaos_world`): the real kube-apiserver of the test control plane
(`[real]`: kwok nodes, workers bound by the real scheduler, the daemon as a ServiceAccount under
deploy/rbac.yaml, the proxy speaking TLS upstream) and the API emulator (`[emulator]`). The daemon
talks to the server only through `support.faults.FaultProxy` (errors, lost replies, latency, cut
watches), while `ServerFaults` drops every watch or loses the history (410 Gone on resume) now and
then: the emulator itself, or on kube-apiserver the proxy. A stand-in et-operator steps in a
thread. Spot notices arrive as NTH taints; at the notice's deadline the node's pods and the node
are killed (the reclaim) and a fresh node joins; some notices are false alarms (the taint goes,
the node stays). Afterwards `support.invariants.check` replays the server's event stream (the
emulator's own record; kube-apiserver's watches, `support.watch_record`).

Two replicas of the daemon run with leader election, as a Deployment would; now and then the
leader is killed (SIGKILL; a new replica replaces it, as a new pod would) or paused (SIGSTOP past
the lease, then SIGCONT): the server's record of who wrote what shows no write by a replica the
Lease does not name, and the takeover time is measured.

Short (the normal test run): 8 nodes, 2 jobs, 8 notices, 10% faults, one pause, ~35 s a server.
Long (`make chaos`, i.e. CHAOS_LONG=1): 40 nodes, 4 jobs, 40 notices, faults cycling 5/10/20%,
two kills and two pauses of the leader.
CHAOS_SEED picks the seed; CHAOS_JSON=<path> appends each run's report as a JSON line;
CHAOS_KEEP=<dir> keeps the replicas' logs and the server's record (`seed<n>-<server>-record.jsonl`).
"""

from __future__ import annotations

import heapq
import http.client
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kube_fixtures import NS, Kube, node, now, training_job, worker
from kubernetes.client import ApiClient, Configuration, CoreV1Api
from kubernetes.client.exceptions import ApiException
from support.chaos_world import EmulatorWorld, RealWorld, World
from support.cli import CLI, ROOT, stop_cli
from support.faults import FaultProxy, FaultRates, Forwarded
from support.invariants import (
    NTH_ITN,
    Notice,
    RecordingServer,
    Report,
    check,
    decision_line,
    percentile,
)
from support.real_api import SEEDED_LABEL, RealApi
from support.real_daemon import grant_deploy_rbac
from support.waiting import wait_for
from support.watch_record import WatchRecorder

from autoscaler.adapters.kube import EventRecorder, KubeActuator
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import NODES
from autoscaler.core import Action, Decision, decide
from autoscaler.fencing import Fence, NotLeader

LONG = os.environ.get("CHAOS_LONG") == "1"

CONFIG = """
policies: [{{name: default, scale_out: {{min_idle: 0s, cooldown: 0s}}}}]
kubernetes: {{namespaces: [{ns}], watch_backoff_max: 1s}}
daemon:
  tick_interval: 2s
  wake_coalesce: 0.05s
  error_backoff_max: 1s
  metrics_port: {port}
  metrics_bind_address: 127.0.0.1
  log_format: json
  log_level: {level}
  leader_election:
    lease_namespace: {lease_ns}
    lease_duration: {lease}s
    renew_deadline: 3s
    retry_period: 0.25s
"""
LEASE_SECONDS = 4.0
# where the suite runs (support/chaos_world.py); the real one needs the control plane's binaries
SERVERS = ["emulator", pytest.param("real", marks=pytest.mark.real_cluster)]


@dataclass
class Plan:
    nodes: int
    jobs: int
    notices: int
    faults: tuple[float, ...]  # fault fractions, cycled every `fault_period` seconds
    spacing: float  # seconds between notices
    deadline: float  # notice -> reclaim
    min_workers: int
    max_workers: int
    replicas: int
    false_alarms: float = 0.25  # share of notices withdrawn (the node stays)
    fault_period: float = 30.0
    disruptions: tuple[str, ...] = ()  # "kill" / "pause" of the leader, spread over the run
    settle: float = 6.0  # a host drained this long after its node is healthy is a violation
    hang: float = 10.0  # no reconcile pass for this long is a hang
    step: float = 0.2  # seconds between the stand-in et-operator's reconciles
    seed: int = 1
    server: str = "emulator"  # or "real": kube-apiserver of the real control plane


SHORT = Plan(
    nodes=8,
    jobs=2,
    notices=8,
    faults=(0.10,),
    spacing=1.2,
    deadline=8.0,
    min_workers=2,
    max_workers=10,
    replicas=6,
    disruptions=("pause",),
)
LONG_PLAN = Plan(
    nodes=40,
    jobs=4,
    notices=40,
    faults=(0.05, 0.10, 0.20),
    spacing=3.0,
    deadline=10.0,
    min_workers=4,
    max_workers=30,
    replicas=16,
    disruptions=("kill", "pause", "kill", "pause"),
)


@dataclass
class Outcome:
    plan: Plan
    report: Report
    faults: dict[str, int]
    requests: int
    crashes: int
    exit_codes: dict[str, int | None]  # of crashed replicas, or non-zero ones at the stop
    passes: int
    longest_gap: float
    error_lines: int
    tracebacks: int
    operator_errors: int
    seconds: float
    takeovers: list[Takeover] = field(default_factory=list)
    decision_lines: list[str] = field(default_factory=list)  # every replica's, for evidence

    def steady(self, notice: Notice, latency: float | None) -> bool:
        """Not open during a leader's loss: from the kill or pause until a second after the other
        replica took the Lease nobody acts, by design (docs/reliability.md). `latency`: of what
        is measured (the drain, or the ScaleIn: one drained before the pause may wait out the
        takeover for its ScaleIn; until 2026-11-26 the drain's end judged both)."""
        done = notice.t + (latency or 0.0)
        return not any(
            done >= t.at and notice.t <= t.at + (t.seconds or 30.0) + 1.0 for t in self.takeovers
        )

    @property
    def hangs(self) -> int:
        return int(self.longest_gap > self.plan.hang)

    def summary(self) -> dict[str, Any]:
        r = self.report
        fates = r.fates()
        return {
            "plan": {
                k: getattr(self.plan, k)
                for k in ("server", "nodes", "jobs", "notices", "faults", "deadline", "seed")
            },
            "seconds": round(self.seconds, 1),
            "requests": self.requests,
            "faults_injected": self.faults,
            "faults_total": sum(self.faults.values()),
            "notices": len(r.notices),
            "workers_noticed": sum(len(n.pods) for n in r.notices),
            "graceful": fates.get("removed_by_name", 0) + fates.get("drained_at_reclaim", 0),
            "fates": fates,
            "drain_p50_s": _round(r.median()),
            "drain_p99_s": _round(r.percentile(0.99)),
            "drain_max_s": _round(r.percentile(1.0)),
            # notice -> every noticed worker named by a ScaleIn (after the server confirmed it)
            "scale_in_p50_s": _round(percentile(r.scale_in_latencies(), 0.5)),
            "scale_in_p99_s": _round(percentile(r.scale_in_latencies(), 0.99)),
            # ... for notices whose jobs had no scaler of ours in flight (not queued behind one)
            "scale_in_p99_unqueued_s": _round(
                percentile(
                    [
                        n.scale_in_latency
                        for n in r.notices
                        if n.scale_in_latency is not None
                        and self.steady(n, n.scale_in_latency)
                        and not n.queued
                    ],
                    0.99,
                )
            ),
            "scale_in_p99_steady_s": _round(
                percentile(
                    [
                        n.scale_in_latency
                        for n in r.notices
                        if n.scale_in_latency is not None and self.steady(n, n.scale_in_latency)
                    ],
                    0.99,
                )
            ),
            "drain_p99_steady_s": _round(
                percentile(
                    [
                        n.latency
                        for n in r.notices
                        if n.latency is not None and self.steady(n, n.latency)
                    ],
                    0.99,
                )
            ),
            "takeovers": [{"what": t.what, "s": _round(t.seconds)} for t in self.takeovers],
            "slowest_drains": [  # to find them in the daemon's log (CHAOS_KEEP)
                {"node": n.node, "s": _round(n.latency), "at": _utc(n.wall)}
                for n in sorted(r.notices, key=lambda n: -(n.latency or 0))[:3]
                if n.latency
            ],
            # every notice, for a p99 over many runs (a run's 8-40 notices make its p99 its max)
            "per_notice": [
                {
                    "drain_s": _round(n.latency),
                    "scale_in_s": _round(n.scale_in_latency),
                    "steady_drain": self.steady(n, n.latency),
                    "steady_scale_in": self.steady(n, n.scale_in_latency),
                    "queued": n.queued,
                }
                for n in r.notices
            ],
            "notices_not_fully_drained": sum(1 for n in r.notices if n.timed and n.latency is None),
            "workers_kept_as_last_host": sum(len(n.kept) for n in r.notices),
            "violations": r.by_kind(),
            "violation_details": [f"{v.kind}: {v.detail}" for v in r.violations][:20],
            # the decision line behind each removal or drain of a healthy worker
            "violation_decisions": [
                f"{v.kind}: {decision_line(v, self.decision_lines)}"
                for v in r.violations
                if v.action
            ][:20],
            "raced_withdrawals": r.raced,
            "stale_drained_hosts": r.stale_drained,
            "crashes": self.crashes,
            "exit_codes": self.exit_codes,
            "hangs": self.hangs,
            "passes": self.passes,
            "longest_pass_gap_s": round(self.longest_gap, 1),
            "daemon_error_lines": self.error_lines,
            "tracebacks": self.tracebacks,
            "operator_errors": self.operator_errors,
        }


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replicas:
    """The daemon's replicas, `spot-autoscaler run` processes with leader election, as a
    Deployment runs them: a killed replica is replaced by a new one with a new identity (a new
    pod). Each writes its stderr log and decision log (stdout) to files of its own."""

    def __init__(
        self,
        tmp: Path,
        kubeconfig: Callable[[str, str], str],
        namespace: str,
        lease_namespace: str,
    ) -> None:
        self.tmp, self.kubeconfig = tmp, kubeconfig  # (path, replica) -> the replica's kubeconfig
        self.namespace, self.lease_namespace = namespace, lease_namespace
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.ports: dict[str, int] = {}
        self.killed: set[str] = set()  # exits we caused
        self._files: list[Any] = []
        self._serial = 0

    def start(self) -> str:
        identity = f"chaos-{self._serial}"
        self._serial += 1
        port = self.ports[identity] = _free_port()
        config = self.tmp / f"{identity}.yaml"
        config.write_text(
            CONFIG.format(
                ns=self.namespace,
                lease_ns=self.lease_namespace,
                port=port,
                lease=int(LEASE_SECONDS),
                level=os.environ.get("CHAOS_LOG_LEVEL", "info"),
            )
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "POD_NAME": identity,
            "POD_NAMESPACE": self.lease_namespace,
        }
        stdout = (self.tmp / f"{identity}-decisions.jsonl").open("w")
        stderr = (self.tmp / f"{identity}-daemon.log").open("w")
        self._files += [stdout, stderr]
        self.procs[identity] = subprocess.Popen(
            [
                str(CLI),
                "run",
                "--config",
                str(config),
                "--kubeconfig",
                self.kubeconfig(str(self.tmp / f"{identity}.kubeconfig"), identity),
            ],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
        return identity

    def signal(self, identity: str, sig: signal.Signals) -> None:
        proc = self.procs[identity]
        if sig is signal.SIGKILL:
            self.killed.add(identity)
            proc.kill()
            proc.wait()
        else:
            proc.send_signal(sig)

    def crashes(self) -> dict[str, int | None]:
        """Replicas that exited without being killed: identity -> exit code."""
        return {
            i: p.returncode
            for i, p in self.procs.items()
            if p.poll() is not None and i not in self.killed
        }

    def stop(self) -> dict[str, int | None]:
        """Stop every live replica (`stop_cli`); exit codes."""
        codes = {}
        for identity, proc in self.procs.items():
            codes[identity] = stop_cli(proc, timeout=20)
        for f in self._files:
            f.close()
        return codes

    def logs(self, kind: str) -> list[Path]:
        return sorted(self.tmp.glob(f"chaos-*-{kind}"))


class Passes:
    """Scrapes the replicas' reconcile counts (directly, not through the proxy): passes made by
    any replica; the longest time no replica made one."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self.counts: dict[str, int] = {}
        self.last_change = time.monotonic()
        self.longest_gap = 0.0
        self.watching = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    @staticmethod
    def _scrape(port: int) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                body = r.read().decode()
        except OSError:
            return None
        for line in body.splitlines():
            if line.startswith("spot_autoscaler_reconcile_duration_seconds_count"):
                return int(float(line.rsplit(" ", 1)[1]))
        return None

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            for identity, port in list(self.replicas.ports.items()):
                if self.replicas.procs[identity].poll() is not None:
                    continue
                count = self._scrape(port)
                if count is not None and count != self.counts.get(identity, 0):
                    self.counts[identity], self.last_change = count, now
            if self.watching:
                self.longest_gap = max(self.longest_gap, now - self.last_change)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class Takeover:
    what: str  # kill / pause
    at: float  # monotonic time of the signal
    seconds: float | None  # until another replica held the Lease (None: none did)


def _disrupt(
    plan: Plan,
    world: World,
    replicas: Replicas,
    stop: threading.Event,
    takeovers: list[Takeover],
) -> None:
    """Kill or pause the leader at even intervals over the notices' timeline."""
    span = plan.notices * plan.spacing + plan.deadline
    t0 = time.monotonic()
    for k, what in enumerate(plan.disruptions):
        if stop.wait(
            max(0.0, t0 + span * (k + 1) / (len(plan.disruptions) + 1) - time.monotonic())
        ):
            return
        leader = world.lease_holder()
        if leader not in replicas.procs or replicas.procs[leader].poll() is not None:
            continue
        at = time.monotonic()
        replicas.signal(leader, signal.SIGKILL if what == "kill" else signal.SIGSTOP)
        if what == "kill":
            replicas.start()  # the Deployment's replacement pod
        took: float | None = None
        while not stop.is_set() and time.monotonic() - at < 30:
            if world.lease_holder() not in (leader, None):
                took = time.monotonic() - at
                break
            time.sleep(0.02)
        takeovers.append(Takeover(what, at, took))
        if what == "pause":  # resumed after the other took over: it must write nothing
            stop.wait(max(0.0, at + LEASE_SECONDS * 2 - time.monotonic()))
            replicas.signal(leader, signal.SIGCONT)


def run_chaos(plan: Plan, tmp: Path, world: World) -> Outcome:
    rng = random.Random(plan.seed)
    lock = threading.Lock()  # the operator's step and the reclaim do not interleave
    started = time.monotonic()
    ns = world.namespace
    generation = [0] * plan.nodes
    # new jobs (no status): the stand-in makes their workers and launcher, as et-operator
    jobs = [
        training_job(
            f"job-{j}",
            min_workers=plan.min_workers,
            max_workers=plan.max_workers,
            replicas=plan.replicas,
            phase="",
            namespace=ns,
        )
        for j in range(plan.jobs)
    ]
    world.start([world.node_name(i, 0) for i in range(plan.nodes)], jobs)
    stop = threading.Event()
    operator_errors = [0]

    def step_forever() -> None:
        while not stop.wait(plan.step):
            with lock:
                try:
                    world.step()
                except (KeyError, AssertionError, ApiException):  # raced the reclaim: next step
                    operator_errors[0] += 1

    with lock:
        world.step()
    stepper = threading.Thread(target=step_forever, daemon=True)
    stepper.start()
    # the workers created and running before the daemon starts
    world.wait_running([j["metadata"]["name"] for j in jobs], 90)
    proxy, storms = world.proxy, world.storms
    proxy.rates = FaultRates.total(plan.faults[0])
    replicas = Replicas(tmp, world.kubeconfig, ns, world.lease_namespace)
    for _ in range(2):
        replicas.start()
    passes = Passes(replicas)
    takeovers: list[Takeover] = []
    disrupter = threading.Thread(
        target=_disrupt, daemon=True, args=(plan, world, replicas, stop, takeovers)
    )
    crashes: dict[str, int | None] = {}
    end = None
    try:
        deadline = time.monotonic() + 60
        while passes.count < 1 and not replicas.crashes() and time.monotonic() < deadline:
            time.sleep(0.1)
        logs = replicas.logs("daemon.log")
        assert not replicas.crashes(), [p.read_text()[-3000:] for p in logs]
        assert passes.count >= 1, "no replica made a pass within 60 s"
        passes.watching = True
        proxy.active.set()
        storms.start()
        disrupter.start()
        _timeline(plan, rng, world, lock, generation)
        proxy.active.clear()
        storms.stop()
        disrupter.join(timeout=60)
        time.sleep(plan.settle + 2.0)  # faults off: the daemon catches up
        end = time.monotonic()
        crashes = replicas.crashes()
    finally:
        stop.set()
        passes.stop()
        codes = replicas.stop()
        stepper.join(timeout=15)
        if keep := os.environ.get("CHAOS_KEEP"):  # the daemons' logs, for the evidence
            Path(keep).mkdir(parents=True, exist_ok=True)
            for f in replicas.logs("daemon.log") + replicas.logs("decisions.jsonl"):
                (Path(keep) / f"seed{plan.seed}-{f.name}").write_bytes(f.read_bytes())
        proxy.stop()
        storms.stop()
    world.caught_up()
    report = check(world.record, settle=plan.settle, end=end)
    if keep := os.environ.get("CHAOS_KEEP"):  # the server's record, for the evidence
        _keep_record(world, Path(keep) / f"seed{plan.seed}-{plan.server}-record.jsonl")
    log = "".join(p.read_text() for p in replicas.logs("daemon.log"))
    return Outcome(
        plan,
        report,
        dict(proxy.counts) | dict(storms.counts),
        proxy.requests,
        len(crashes),
        crashes or {i: c for i, c in codes.items() if c and i not in replicas.killed},
        passes.count,
        passes.longest_gap,
        sum('"level": "error"' in line for line in log.splitlines()),
        log.count("Traceback"),
        operator_errors[0],
        time.monotonic() - started,
        takeovers,
        [line for f in replicas.logs("decisions.jsonl") for line in f.read_text().splitlines()],
    )


def _keep_record(world: World, path: Path) -> None:
    """One line per event of the record the invariants replayed: when (UTC, as the daemon logs
    it), what, and what the invariants read of it (a pod's uid and node, a node's notice, a
    job's drained hosts, a scaler's pods)."""
    events, _, writes = world.record.record()
    with path.open("w") as f:
        for e in events:
            meta, spec = e.obj["metadata"], e.obj.get("spec") or {}
            line: dict[str, Any] = {"at": _utc(e.wall), "rv": meta.get("resourceVersion")}
            line |= {"type": e.type, "kind": e.kind, "name": meta["name"]}
            if e.kind == "Pod":
                line |= {"uid": meta["uid"], "node": spec.get("nodeName")}
                line["phase"] = (e.obj.get("status") or {}).get("phase")
            elif e.kind == "Node":
                line["notice"] = any(t.get("key") == NTH_ITN for t in spec.get("taints") or ())
            elif e.kind == "TrainingJob":
                line["drained"] = (meta.get("annotations") or {}).get(
                    "spot-autoscaler.io/drained-hosts"
                )
            else:
                line["spec"] = spec
            f.write(json.dumps(line) + "\n")
        wall = time.time() - time.monotonic()  # a write's monotonic time as the logs' UTC
        for w in writes:
            line = {"at": _utc(w.t + wall), "write": w.method, "path": w.path, "by": w.identity}
            f.write(json.dumps(line | {"holder": w.holder}) + "\n")


def _timeline(
    plan: Plan,
    rng: random.Random,
    world: World,
    lock: threading.Lock,
    generation: list[int],
) -> None:
    """Notices every `spacing` s; each reclaimed at its deadline or withdrawn (false alarm)."""
    t0 = time.monotonic()
    todo: list[tuple[float, int, Callable[[], None]]] = []
    seq = 0

    def at(t: float, action: Callable[[], None]) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(todo, (t, seq, action))

    doomed: set[int] = set()

    def notice(k: int) -> None:
        with lock:
            free = [i for i in range(plan.nodes) if i not in doomed]
            placed = {(p.get("spec") or {}).get("nodeName") for p in world.pods()}
            busy = [i for i in free if world.node_name(i, generation[i]) in placed]
            if not free:
                return
            slot = rng.choice(busy or free)
            doomed.add(slot)
            name = world.node_name(slot, generation[slot])
            world.notice(name, f"evt-{k}")
        if rng.random() < plan.false_alarms:
            at(time.monotonic() + plan.deadline / 2, lambda: withdraw(slot, name))
        else:
            at(time.monotonic() + plan.deadline, lambda: reclaim(slot, name))

    def withdraw(slot: int, name: str) -> None:
        with lock:
            world.withdraw(name)
            doomed.discard(slot)

    def reclaim(slot: int, name: str) -> None:
        with lock:
            world.reclaim(name)
        at(time.monotonic() + 1.0, lambda: replace(slot))

    def replace(slot: int) -> None:
        with lock:
            generation[slot] += 1
            world.add_node(world.node_name(slot, generation[slot]))
            doomed.discard(slot)

    for k in range(plan.notices):
        at(t0 + k * plan.spacing, lambda k=k: notice(k))  # type: ignore[misc]
    while todo:
        t, _, action = heapq.heappop(todo)
        time.sleep(max(0.0, t - time.monotonic()))
        phase = int((time.monotonic() - t0) // plan.fault_period)
        world.proxy.rates = FaultRates.total(plan.faults[phase % len(plan.faults)])
        action()


def _world(plan: Plan, request: pytest.FixtureRequest) -> World:
    rates = FaultRates.total(plan.faults[0])
    if plan.server == "real":
        return RealWorld(request.getfixturevalue("control_plane"), rates, plan.seed)
    return EmulatorWorld(NS, rates, plan.seed)


def _record(outcome: Outcome) -> dict[str, Any]:
    summary = outcome.summary()
    print("\nchaos:", json.dumps(summary, indent=1))
    if path := os.environ.get("CHAOS_JSON"):
        with open(path, "a") as f:
            f.write(json.dumps(summary) + "\n")
    return summary


@pytest.mark.timeout(900)
@pytest.mark.parametrize("server", SERVERS)
def test_the_daemon_survives_faults_and_keeps_its_invariants(
    tmp_path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    plan = LONG_PLAN if LONG else SHORT
    seed = int(os.environ.get("CHAOS_SEED", plan.seed))
    plan = Plan(**{**plan.__dict__, "seed": seed, "server": server})
    world = _world(plan, request)
    try:
        outcome = run_chaos(plan, tmp_path, world)
    finally:
        world.close()
    summary = _record(outcome)
    assert summary["faults_total"] > 0 and summary["notices"] == plan.notices
    assert outcome.crashes == 0 and summary["tracebacks"] == 0, summary
    assert not outcome.exit_codes, summary  # every replica stopped cleanly on SIGTERM
    assert [t.what for t in outcome.takeovers] == list(plan.disruptions), summary
    assert all(t.seconds is not None for t in outcome.takeovers), summary
    assert outcome.hangs == 0, summary
    assert outcome.report.violations == [], summary["violation_details"]


# --- the tools themselves: each invariant fires, each proxy fault does what it says ------------
def _scale_in(name: str, job: str, pods: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": "ScaleIn",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "spot-autoscaler"},
        },
        "spec": {"selector": {"name": job}, "toDelete": {"podNames": pods}},
    }


def test_every_invariant_fires_on_a_stream_that_breaks_it() -> None:

    server = RecordingServer()
    taint = {"spec": {"taints": [{"key": NTH_ITN, "value": "e", "effect": "NoSchedule"}]}}
    server.seed(
        node("a"),
        node("b"),
        training_job("j", min_workers=2, max_workers=3),
        *(worker("j", i, "a") for i in range(3)),
    )
    server.seed(worker("j", 3, "b"))  # 4 > max 3
    server.seed(_scale_in("in-1", "j", ["j-worker-0"]), _scale_in("in-2", "j", ["j-worker-0"]))
    server.delete("Pod", "j-worker-3", NS)  # by "the operator", on a healthy node
    server.delete("Pod", "j-worker-2", NS)
    server.delete("Pod", "j-worker-1", NS)  # 1 left < min 2
    server.seed(worker("j", 4, "b"))  # so j-worker-0 is not the job's last host
    server.patch("Node", "a", taint)
    server.reclaim_pod("j-worker-0", NS)  # never drained
    server.patch(
        "TrainingJob",
        "j",
        {"metadata": {"annotations": {"spot-autoscaler.io/drained-hosts": '["j-worker-4"]'}}},
        NS,
    )
    server.patch("Node", "b", taint)
    server.patch("Node", "b", {"spec": {"taints": []}})  # healthy again, j-worker-4 still drained
    server.seed(worker("j", 5, "b"))  # a healthy worker on a healthy node, within max
    healthy_since = time.monotonic()
    server.patch(
        "TrainingJob",
        "j",
        {"metadata": {"annotations": {"spot-autoscaler.io/drained-hosts": '["j-worker-4"]'}}},
        NS,
    )
    while time.monotonic() - healthy_since <= 0.3:  # past the race tolerance below
        time.sleep(0.05)
    server.patch(
        "TrainingJob",
        "j",
        {"metadata": {"annotations": {"spot-autoscaler.io/drained-hosts": '["j-worker-5"]'}}},
        NS,
    )
    server.seed(_scale_in("in-3", "j", ["j-worker-5"]))
    # join_grace 0: j-worker-4, Running on healthy b, counts as settled at once
    report = check(server, settle=1.0, end=time.monotonic() + 2.0, race=0.3, join_grace=0.0)
    assert report.by_kind() == {
        "removed_healthy": 1,  # in-3: j-worker-5 on healthy b, 2 workers <= max 3
        "drained_without_notice": 2,  # j-worker-4 before b's notice, j-worker-5 after it went
        "over_max": 1,
        "two_scalers": 2,  # in-1 and in-2, then in-3 beside them
        "pod_in_two_scaleins": 1,
        "under_min": 1,
        "undrained_at_reclaim": 1,
        "drained_after_healthy": 1,
    }
    assert [n.node for n in report.notices] == ["a", "b"]
    assert report.fates() == {"killed_undrained": 1, "survived": 1}


def test_a_replacement_named_as_a_drained_host_gone_since_is_judged_from_its_arrival() -> None:
    """et-operator names a new worker as one gone since (seed 27, long: worker-39 drained and
    removed, a new worker-39 on a healthy node 7 s later, undrained 0.7 s after it came). The
    drained host's settle time counts from the new pod's arrival, not from the old one's drain;
    a replacement hidden for longer than `settle` is still flagged."""
    server = RecordingServer()
    server.seed(node("a"), node("b"), training_job("j", min_workers=1, max_workers=3))
    server.seed(worker("j", 0, "a"), worker("j", 1, "b"))
    server.patch("Node", "a", {"spec": {"taints": [{"key": NTH_ITN, "effect": "NoSchedule"}]}})
    drained = {"spot-autoscaler.io/drained-hosts": '["j-worker-0"]'}
    server.patch("TrainingJob", "j", {"metadata": {"annotations": drained}}, NS)
    server.delete("Pod", "j-worker-0", NS)
    server.patch("Node", "a", {"spec": {"taints": []}})
    since_drain = time.monotonic()
    while time.monotonic() - since_drain <= 0.5:  # past `settle` below, counted from the drain
        time.sleep(0.05)
    server.seed(worker("j", 0, "a"))  # the same name, a new pod, on healthy a
    came = time.monotonic()
    assert check(server, settle=0.4, end=came + 0.2, race=0.1).by_kind() == {}
    report = check(server, settle=0.4, end=came + 0.6, race=0.1)
    assert report.by_kind() == {"drained_after_healthy": 1}  # hidden longer than settle


def test_a_write_by_a_replica_the_lease_does_not_name_is_a_violation() -> None:
    with RecordingServer() as server:
        server.seed(
            node("a"),
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "spot-autoscaler", "namespace": "default"},
                "spec": {"holderIdentity": "r-1", "leaseDurationSeconds": 6},
            },
        )
        for identity in ("r-1", "r-2"):
            api = server.api_client()
            api.user_agent = f"spot-autoscaler/{identity}"
            CoreV1Api(api).patch_node("a", {"metadata": {"labels": {"by": identity}}})
            api.close()
        report = check(server, settle=1.0)
    assert [(v.kind, v.detail) for v in report.violations] == [
        ("write_by_non_leader", "PATCH /api/v1/nodes/a by r-2 while r-1 held the Lease")
    ]


def test_the_emulators_leader_fence_refuses_a_replica_the_lease_does_not_name() -> None:
    """The `[emulator]` runs' double of deploy/leader-fence.yaml, pinned as
    tests/test_real_leader_fence.py pins the policy on kube-apiserver: through the daemon's own
    write path with its client-side fence open (a replica resumed past its check), only the
    holder's write lands; the other's is NotLeader, changes nothing and is no write on record."""
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "spot-autoscaler", "namespace": "default"},
        "spec": {"holderIdentity": "r-1", "leaseDurationSeconds": 6},
    }
    with RecordingServer(leader_fence=True) as server:
        server.seed(node("a"), lease)
        outcomes = {}
        for identity in ("r-2", "r-1"):
            api = server.api_client()
            api.user_agent = f"spot-autoscaler/{identity}"
            objects = ObjectApi(api, retries=0, fence=Fence.open())
            try:
                objects.merge_patch(NODES, "", "a", {"metadata": {"labels": {"by": identity}}})
                outcomes[identity] = "landed"
            except NotLeader as exc:
                outcomes[identity] = str(exc)
            api.close()
        labels = server.get("Node", "a")["metadata"].get("labels") or {}
        report = check(server, settle=1.0)
    assert outcomes["r-1"] == "landed" and labels.get("by") == "r-1"
    assert (
        "spot-autoscaler leader fence: pod r-2 does not hold Lease spot-autoscaler"
        in (outcomes["r-2"])
    )
    assert server.fence_refusals == 1 and report.violations == []


def test_a_graceful_notice_breaks_nothing_and_is_measured() -> None:

    server = _on_a_and_b(("a", "a", "b"))
    _notice_and_drain(server, "a", "j", ["j-worker-0", "j-worker-1"])
    server.seed(_scale_in("in-1", "j", ["j-worker-0"]))
    server.delete("Pod", "j-worker-0", NS)  # the operator, by name
    server.reclaim_pod("j-worker-1", NS)  # drained in time
    server.delete("Node", "a")
    report = check(server, settle=1.0, end=time.monotonic() + 5.0)
    assert report.violations == []
    assert report.fates() == {"removed_by_name": 1, "drained_at_reclaim": 1}
    assert report.latencies() and report.latencies()[0] >= 0
    assert report.stale_drained == 2  # the daemon has not pruned them (none runs here)


def test_a_withdrawn_notice_is_not_timed_by_the_next_notices_scale_in() -> None:
    """A notice on a, withdrawn before any ScaleIn (a false alarm), then a second notice on a:
    the second one's ScaleIn times the second notice only (the first has no ScaleIn time; it
    was counted 55 s late in seed 12's long run)."""
    server = _on_a_and_b(("a", "b"))
    _notice_and_drain(server, "a", "j", ["j-worker-0"])
    server.patch("Node", "a", {"spec": {"taints": []}})  # withdrawn
    _notice_and_drain(server, "a", "j", ["j-worker-0"])
    server.seed(_scale_in("in-1", "j", ["j-worker-0"]))
    report = check(server, settle=60.0, end=time.monotonic() + 1.0)
    first, second = report.notices
    assert first.scale_in_latency is None and second.scale_in_latency is not None
    assert len(report.scale_in_latencies()) == 1


def _on_a_and_b(placement: tuple[str, ...]) -> RecordingServer:
    """Nodes a and b, job j (1-4 workers), its worker i on placement[i]."""
    server = RecordingServer()
    server.seed(
        node("a"),
        node("b"),
        training_job("j", min_workers=1, max_workers=4),
        *(worker("j", i, on) for i, on in enumerate(placement)),
    )
    return server


def _notice_and_drain(server: RecordingServer, node: str, job: str, hosts: list[str]) -> None:
    """NTH's taint on `node`, then the daemon's drain of `hosts` from `job`."""
    server.patch("Node", node, {"spec": {"taints": [{"key": NTH_ITN, "effect": "NoSchedule"}]}})
    drained = json.dumps(hosts)
    server.patch(
        "TrainingJob",
        job,
        {"metadata": {"annotations": {"spot-autoscaler.io/drained-hosts": drained}}},
        NS,
    )


def test_a_last_host_kept_and_killed_by_the_reclaim_is_no_violation() -> None:
    """Every worker of j is on the noticed node: the daemon keeps its last host in discovery
    until a replacement runs (core/departures.py _last_host_to_keep). The reclaim came first:
    the kept host dies undrained, by design; the other, drained, dies drained."""

    server = RecordingServer()
    server.seed(
        node("a"),
        training_job("j", min_workers=1, max_workers=4),
        worker("j", 0, "a"),
        worker("j", 1, "a"),
    )
    _notice_and_drain(server, "a", "j", ["j-worker-0"])
    server.reclaim_pod("j-worker-0", NS)
    server.reclaim_pod("j-worker-1", NS)
    report = check(server, settle=1.0, end=time.monotonic() + 2.0)
    assert report.violations == []
    assert report.fates() == {"drained_at_reclaim": 1, "kept_at_reclaim": 1}


@pytest.mark.parametrize("named", ["before", "just_after"])
def test_a_scale_in_for_a_notice_withdrawn_before_the_operator_ran_it_is_no_violation(
    named: str,
) -> None:
    """Our ScaleIn named j-worker-1 while its node had a notice (or less than `race` after it
    went: the daemon's server check read it before); the notice went (a false alarm) before
    et-operator deleted the pod, leaving j below min: the removal was the notice's (a ScaleIn
    cannot be taken back). The same deletion with no ScaleIn under a notice is a violation."""

    server = RecordingServer()
    server.seed(
        node("a"),
        node("b"),
        training_job("j", min_workers=3, max_workers=4),
        worker("j", 0, "a"),
        worker("j", 1, "b"),
        worker("j", 2, "b"),
    )
    _notice_and_drain(server, "b", "j", ["j-worker-1"])
    if named == "before":
        server.seed(_scale_in("in-1", "j", ["j-worker-1"]))
    server.patch("Node", "b", {"spec": {"taints": []}})  # withdrawn
    if named == "just_after":
        server.seed(_scale_in("in-1", "j", ["j-worker-1"]))
    server.delete("Pod", "j-worker-1", NS)  # the operator runs the ScaleIn: 2 left, min 3
    server.delete("Pod", "j-worker-2", NS)  # for no notice: 1 left
    report = check(server, settle=1.0, end=time.monotonic() + 2.0, race=1.0)
    assert [(v.kind, v.detail.split(" on ")[0]) for v in report.violations] == [
        ("under_min", "j: j-worker-2")
    ]


def test_the_proxy_answers_errors_and_loses_replies_after_the_write() -> None:
    import urllib.error

    with RecordingServer() as server, FaultProxy(server.url, FaultRates(error=1.0)) as proxy:
        proxy.active.set()
        codes = set()
        for _ in range(20):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{proxy.url}/api/v1/nodes", timeout=5)
            codes.add(err.value.code)
        assert codes <= {500, 503, 429} and len(codes) > 1
        assert server.count(path_contains="/nodes") == 0  # never forwarded
        proxy.rates = FaultRates(lost_reply=1.0)
        body = json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
        ).encode()
        request = urllib.request.Request(
            f"{proxy.url}/api/v1/namespaces/default/configmaps",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises((OSError, ConnectionError)):
            urllib.request.urlopen(request, timeout=5)
        assert server.get("ConfigMap", "cm", "default") is not None  # the write happened
        proxy.active.clear()
        with urllib.request.urlopen(f"{proxy.url}/api/v1/nodes", timeout=5) as resp:
            assert resp.status == 200
        assert proxy.counts["lost_reply"] == 1 and proxy.injected == 21


def test_the_proxy_drops_a_write_held_past_its_timeout_as_the_api_server_would() -> None:
    """A write that says `?timeout=` (every fenced write of the daemon does) and spends longer
    than that on the way (here a latency fault, seeded: 0.38 s) is answered 504 and never
    forwarded, as kube-apiserver ends a request past its deadline; within it, it goes."""
    import urllib.error

    def post(name: str, timeout: str) -> urllib.request.Request:
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
        return urllib.request.Request(
            f"{proxy.url}/api/v1/namespaces/default/configmaps?timeout={timeout}",
            data=body.encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )

    with RecordingServer() as server, FaultProxy(server.url, FaultRates(latency=1.0)) as proxy:
        proxy.active.set()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(post("late", "100ms"), timeout=5)
        assert err.value.code == 504 and server.get("ConfigMap", "late", "default") is None
        with urllib.request.urlopen(post("in-time", "10000ms"), timeout=5) as resp:
            assert resp.status == 201
        assert server.get("ConfigMap", "in-time", "default") is not None


# --- the drain's time fence (adapters/kube/actuator.py `_checked_drain`) -------------------------
# A drain rests on a notice read at one moment (the cache's current copy, or the server's GET); it
# must land within CONFIRMED_FOR (1 s) of that read, as a ScaleIn must. The faults that hold a
# write past it: errors slow to come back (a loaded server), whose retries outlast the second.
BOTH = pytest.mark.servers("emulator", "real")
SLOW_503S = {"method": "PATCH", "path_contains": "/trainingjobs/bert", "times": 3, "delay": 0.4}


def _fault_proxy(kube: Kube) -> FaultProxy:
    """A fault proxy before `kube`'s server: the emulator, or the real one over TLS (the
    actuator then authenticates as a ServiceAccount bound to deploy/rbac.yaml's rules)."""
    if isinstance(kube.server, RealApi):
        plane = kube.server.plane
        context = ssl.create_default_context(cafile=str(plane.dir / "pki" / "ca.crt"))
        proxy = FaultProxy(plane.server, FaultRates(), context=context)
        proxy.token = grant_deploy_rbac(kube.server._api, plane, NS, "chaos-drain-test")
        return proxy
    return FaultProxy(kube.server.url, FaultRates())


def _drain_through(kube: Kube, proxy: FaultProxy) -> tuple[KubeActuator, Decision]:
    """bert's workers 0 and 1 on node a (an NTH notice), 2 on b; the drain the core decides;
    an actuator whose writes go through `proxy` (its cache reads the server directly)."""
    taint = {"key": NTH_ITN, "value": "evt-1", "effect": "NoSchedule"}
    kube.server.seed(
        node("a", taints=[taint]),
        node("b"),
        training_job("bert", max_workers=4),
        *(worker("bert", i, where) for i, where in enumerate("aab")),
    )
    cache = kube.cache()
    snap = kube.observer(cache).snapshot(now())
    [drain] = [d for d in decide(snap, kube.config.policy_set, now()) if d.action is Action.DRAIN]
    config = Configuration()
    config.host = proxy.url
    if proxy.token:  # the whole header value: see ControlPlane.client_for_token
        config.api_key = {"BearerToken": f"Bearer {proxy.token}"}
    api = ApiClient(config)
    kube.clients.append(api)
    recorder = EventRecorder(api)
    kube.recorders.append(recorder)
    return KubeActuator(api, kube.config, recorder, cache, kube.rejections), drain


def _job_patches(proxy: FaultProxy) -> list[Forwarded]:
    return [w for w in proxy.writes if w.method == "PATCH" and "/trainingjobs/bert" in w.path]


def _drained_hosts(kube: Kube) -> list[str]:
    job = kube.server.get("TrainingJob", "bert", NS)
    value = (job["metadata"].get("annotations") or {}).get("spot-autoscaler.io/drained-hosts")
    return sorted(json.loads(value)) if value else []


@BOTH
def test_a_drain_held_past_its_check_is_checked_again_and_sent_at_once(kube: Kube) -> None:
    """Three slow 503s (0.4 s each) keep the drain's PATCH from landing within 1 s of its check:
    it is not sent on that check; the notice, checked again, still holds, and the drain goes
    out in the same apply, once."""
    with _fault_proxy(kube) as proxy:
        actuator, drain = _drain_through(kube, proxy)
        proxy.inject(503, **SLOW_503S)  # type: ignore[arg-type]
        started = time.monotonic()
        actuator.apply(drain, now())
        took = time.monotonic() - started
        assert proxy.counts["scripted_503"] == 3
        assert [w.status for w in _job_patches(proxy)] == [200]
    assert _drained_hosts(kube) == ["bert-worker-0", "bert-worker-1"]
    assert 1.0 <= took < 2.0


@BOTH
def test_a_drain_held_past_its_check_never_lands_after_its_notice_went(kube: Kube) -> None:
    """The same slow 503s; while the drain waits out its retries the notice is withdrawn. Past
    the 1 s its check holds for, the retry is not sent; checked again, the node has no notice in
    the current view: nothing is drained (before the fence, the fourth try drained both)."""
    with _fault_proxy(kube) as proxy:
        actuator, drain = _drain_through(kube, proxy)
        proxy.inject(503, **SLOW_503S)  # type: ignore[arg-type]

        def withdraw() -> None:
            wait_for(lambda: proxy.counts["scripted_503"] >= 1, 5, "the first 503")
            kube.server.patch("Node", "a", {"spec": {"taints": []}})

        withdrawer = threading.Thread(target=withdraw)
        withdrawer.start()
        actuator.apply(drain, now())
        withdrawer.join()
        assert proxy.counts["scripted_503"] == 3
        assert _job_patches(proxy) == []  # the job was never written
    assert _drained_hosts(kube) == []


# --- the harness on the real server: the proxy over TLS, its storms, the record from watches ----
def _through(
    proxy: FaultProxy, path: str, token: str | None, **extra: str
) -> urllib.request.Request:
    headers = {"Accept": "application/json", **extra}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return urllib.request.Request(f"{proxy.url}{path}", headers=headers)


@pytest.mark.parametrize("server", SERVERS)
def test_the_proxy_breaks_every_watch_and_answers_a_resume_from_before_the_loss_with_410(
    server: str, request: pytest.FixtureRequest
) -> None:
    """What `ProxyStorms` does where the server cannot: a watch relayed (over TLS to the real
    server, the client's token passed on) is broken by `cut_watches`; after `expire`, a watch
    resumed from an older revision gets what the watch cache answers one too old (200, one ERROR
    event with a 410 Status), a newer one is relayed."""
    if server == "real":
        real: RealApi = request.getfixturevalue("real_api")
        plane = real.plane
        token: str | None = grant_deploy_rbac(real._api, plane, NS, "chaos-proxy-test")
        context = ssl.create_default_context(cafile=str(plane.dir / "pki" / "ca.crt"))
        proxy = FaultProxy(plane.server, FaultRates(), context=context)
        revision: Callable[[], int] = lambda: real.resource_version  # noqa: E731
        emulator = None
    else:
        emulator = RecordingServer().start()
        token, proxy = None, FaultProxy(emulator.url, FaultRates())
        revision = lambda: emulator.resource_version  # type: ignore[union-attr]  # noqa: E731
    try:
        with proxy:
            with urllib.request.urlopen(_through(proxy, "/api/v1/nodes", token), timeout=10) as r:
                old = json.loads(r.read())["metadata"]["resourceVersion"]
            stream = urllib.request.urlopen(
                _through(proxy, f"/api/v1/nodes?watch=true&resourceVersion={old}", token),
                timeout=30,
            )
            wait_for(lambda: proxy.cut_watches() == 1, 10, "the watch relayed")
            with pytest.raises((OSError, http.client.HTTPException)):
                while stream.read(65536):  # the cut: no final chunk
                    pass
            stream.close()
            # a write moves the store past `old`; then the history is lost up to now
            node_name = "chaos-proxy-probe"
            if emulator is not None:
                emulator.seed(node(node_name))
            else:
                real.seed(node(node_name))
            proxy.expire(revision())
            path = f"/api/v1/nodes?watch=true&resourceVersion={old}"
            with urllib.request.urlopen(_through(proxy, path, token), timeout=10) as r:
                assert r.status == 200
                [event] = [json.loads(line) for line in r.read().splitlines() if line.strip()]
            assert event["type"] == "ERROR" and event["object"]["code"] == 410
            assert event["object"]["reason"] == "Expired"
            now_rv = revision()
            path = f"/api/v1/nodes?watch=true&resourceVersion={now_rv}&timeoutSeconds=1"
            with urllib.request.urlopen(_through(proxy, path, token), timeout=10) as r:
                lines = [json.loads(line) for line in r.read().splitlines() if line.strip()]
            assert all(e["type"] != "ERROR" for e in lines)
            assert proxy.counts == {"resume_410": 1}
    finally:
        if emulator is not None:
            emulator.stop()
        else:
            real.reset()


@pytest.mark.real_cluster
def test_the_real_servers_own_watches_record_what_breaks_an_invariant(real_api: RealApi) -> None:
    """The checker replays a real server's record (`WatchRecorder`: its watches, in revision
    order; the proxy's writes with the revision each was committed at): a job above max, a drain
    of a host whose node has no notice, a write by a replica the Lease does not name; and a
    notice's drain, timed."""
    real, plane = real_api, real_api.plane
    real.reset()
    token = grant_deploy_rbac(real._api, plane, NS, "chaos-record-test")
    context = ssl.create_default_context(cafile=str(plane.dir / "pki" / "ca.crt"))
    admin = plane.api_client()
    try:
        with FaultProxy(plane.server, FaultRates(), context=context) as proxy:
            recorder = WatchRecorder(
                admin, NS, f"{SEEDED_LABEL}=true", ("spot-autoscaler", NS), proxy
            ).start()
            real.seed(
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": "spot-autoscaler", "namespace": NS},
                    "spec": {"holderIdentity": "r-1", "leaseDurationSeconds": 6},
                },
                node("a"),
                node("b"),
                training_job("j", min_workers=1, max_workers=2),
                worker("j", 0, "a"),
                worker("j", 1, "b"),
            )
            real.seed(worker("j", 2, "b"))  # 3 > max 2
            real.delete("Pod", "j-worker-2", NS)
            taint = {"key": NTH_ITN, "value": "e", "effect": "NoSchedule"}
            real.patch("Node", "a", {"spec": {"taints": [taint]}})
            drained = {"spot-autoscaler.io/drained-hosts": '["j-worker-0"]'}
            real.patch("TrainingJob", "j", {"metadata": {"annotations": drained}}, NS)
            drained = {"spot-autoscaler.io/drained-hosts": '["j-worker-0", "j-worker-1"]'}
            real.patch("TrainingJob", "j", {"metadata": {"annotations": drained}}, NS)  # b: none
            for identity in ("r-1", "r-2"):
                patch = urllib.request.Request(
                    f"{proxy.url}/api/v1/nodes/b",
                    data=json.dumps({"metadata": {"labels": {"by": identity}}}).encode(),
                    method="PATCH",
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/merge-patch+json",
                        "User-Agent": f"spot-autoscaler/{identity}",
                    },
                )
                urllib.request.urlopen(patch, timeout=10).close()
            recorder.wait_caught_up()
            recorder.stop()
            report = check(recorder, settle=60.0)
    finally:
        admin.close()
        real.reset()
    assert report.by_kind() == {
        "over_max": 1,  # j-worker-2
        "drained_without_notice": 1,  # j-worker-1 on b
        "write_by_non_leader": 1,  # r-2's PATCH while r-1 held the Lease
    }, [v.detail for v in report.violations]
    [notice] = report.notices
    assert notice.node == "a" and notice.latency is not None and notice.latency >= 0
