"""Survive faults: the real daemon (`spot-autoscaler run`) through a fault-injecting proxy.

The daemon talks to the API emulator only through `support.faults.FaultProxy` (errors, lost
replies, latency, cut watches), while `ServerFaults` drops every watch or compacts the history
(410 Gone) now and then. A stand-in et-operator (with a small scheduler) steps in a thread. Spot
notices arrive as NTH taints; at the notice's deadline the node's pods and the node are killed
(the reclaim) and a fresh node joins; some notices are false alarms (the taint goes, the node
stays). Afterwards `support.invariants.check` replays the API server's event stream.

Short (the normal test run): 8 nodes, 2 jobs, 8 notices, 10% faults, ~25 s.
Long (`make chaos`, i.e. CHAOS_LONG=1): 40 nodes, 4 jobs, 40 notices, faults cycling 5/10/20%.
CHAOS_SEED picks the seed; CHAOS_JSON=<path> appends each run's report as a JSON line.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_fixtures import NS, node, training_job
from support.et_operator import EtOperator
from support.faults import FaultProxy, FaultRates, ServerFaults
from support.invariants import NTH_ITN, RecordingServer, Report, check

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("spot-autoscaler")
LONG = os.environ.get("CHAOS_LONG") == "1"
GPUS_PER_NODE = 4

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
  leader_election:
    {{lease_namespace: default, lease_duration: 6s, renew_deadline: 4s, retry_period: 0.5s}}
"""


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
    settle: float = 6.0  # a host drained this long after its node is healthy is a violation
    hang: float = 10.0  # no reconcile pass for this long is a hang
    seed: int = 1


SHORT = Plan(nodes=8, jobs=2, notices=8, faults=(0.10,), spacing=1.2, deadline=8.0,
             min_workers=2, max_workers=10, replicas=6)
LONG_PLAN = Plan(nodes=40, jobs=4, notices=40, faults=(0.05, 0.10, 0.20), spacing=3.0,
                 deadline=10.0, min_workers=4, max_workers=30, replicas=16)


class ScheduledEtOperator(EtOperator):
    """The stand-in, with pending workers bound to a node that has a free GPU and no taint."""

    def _start_pending(self, job: str) -> None:
        for pod in self.workers(job):
            meta, status = pod["metadata"], pod.get("status") or {}
            if status.get("phase") != "Pending" or meta.get("deletionTimestamp"):
                continue
            target = self._fit()
            if target is None:
                return
            self.server.patch("Pod", meta["name"], {"spec": {"nodeName": target}, "status": {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                self.namespace)

    def _fit(self) -> str | None:
        used: dict[str, int] = {}
        for pod in self.server.objects("Pod"):
            where = (pod.get("spec") or {}).get("nodeName")
            if where and not pod["metadata"].get("deletionTimestamp"):
                used[where] = used.get(where, 0) + 1
        free = [(GPUS_PER_NODE - used.get(n["metadata"]["name"], 0), n["metadata"]["name"])
                for n in self.server.objects("Node") if not (n.get("spec") or {}).get("taints")]
        best = max(free, default=(0, ""))
        return best[1] if best[0] > 0 else None


@dataclass
class Outcome:
    plan: Plan
    report: Report
    faults: dict[str, int]
    requests: int
    crashes: int
    exit_code: int | None
    passes: int
    longest_gap: float
    error_lines: int
    tracebacks: int
    operator_errors: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def hangs(self) -> int:
        return int(self.longest_gap > self.plan.hang)

    def summary(self) -> dict[str, Any]:
        r = self.report
        fates = r.fates()
        return {
            "plan": {k: getattr(self.plan, k) for k in ("nodes", "jobs", "notices", "faults",
                                                        "deadline", "seed")},
            "seconds": round(self.seconds, 1), "requests": self.requests,
            "faults_injected": self.faults, "faults_total": sum(self.faults.values()),
            "notices": len(r.notices),
            "workers_noticed": sum(len(n.pods) for n in r.notices),
            "graceful": fates.get("removed_by_name", 0) + fates.get("drained_at_reclaim", 0),
            "fates": fates,
            "drain_p50_s": _round(r.median()), "drain_p99_s": _round(r.percentile(0.99)),
            "drain_max_s": _round(r.percentile(1.0)),
            "notices_not_fully_drained": sum(1 for n in r.notices if n.pods and
                                             n.latency is None),
            "violations": r.by_kind(),
            "violation_details": [f"{v.kind}: {v.detail}" for v in r.violations][:20],
            "stale_drained_hosts": r.stale_drained,
            "crashes": self.crashes, "exit_code": self.exit_code, "hangs": self.hangs,
            "passes": self.passes, "longest_pass_gap_s": round(self.longest_gap, 1),
            "daemon_error_lines": self.error_lines, "tracebacks": self.tracebacks,
            "operator_errors": self.operator_errors,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Passes:
    """Scrapes the daemon's reconcile count (directly, not through the proxy)."""

    def __init__(self, port: int) -> None:
        self.port, self.count = port, 0
        self.last_change = time.monotonic()
        self.longest_gap = 0.0
        self.watching = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _scrape(self) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return None
        for line in body.splitlines():
            if line.startswith("spot_autoscaler_reconcile_duration_seconds_count"):
                return int(float(line.rsplit(" ", 1)[1]))
        return None

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            count, now = self._scrape(), time.monotonic()
            if count is not None and count != self.count:
                self.count, self.last_change = count, now
            if self.watching:
                self.longest_gap = max(self.longest_gap, now - self.last_change)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_chaos(plan: Plan, tmp: Path) -> Outcome:
    rng = random.Random(plan.seed)
    world = threading.Lock()  # the operator's step and the reclaim do not interleave
    started = time.monotonic()
    with RecordingServer() as server:
        server.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS},
                     "status": {"phase": "Active"}})
        generation = [0] * plan.nodes
        server.seed(*(node(f"node-{i}-g0", GPUS_PER_NODE) for i in range(plan.nodes)))
        # new jobs (no status): the stand-in makes their workers and launcher, as et-operator
        server.seed(*(training_job(f"job-{j}", min_workers=plan.min_workers,
                                   max_workers=plan.max_workers, replicas=plan.replicas,
                                   phase="")
                      for j in range(plan.jobs)))
        operator = ScheduledEtOperator(server, NS)
        for _ in range(3):  # the workers created and running before the daemon starts
            operator.step()
        stop = threading.Event()
        operator_errors = [0]

        def step_forever() -> None:
            while not stop.wait(0.2):
                with world:
                    try:
                        operator.step()
                    except (KeyError, AssertionError):  # raced with a direct delete: next step
                        operator_errors[0] += 1

        stepper = threading.Thread(target=step_forever, daemon=True)
        stepper.start()
        proxy = FaultProxy(server.url, FaultRates.total(plan.faults[0]), seed=plan.seed).start()
        storms = ServerFaults(server, seed=plan.seed + 1, every=(3.0, 8.0))
        port = _free_port()
        (tmp / "config.yaml").write_text(CONFIG.format(ns=NS, port=port))
        proxy.kubeconfig(str(tmp / "kubeconfig"))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "POD_NAME": "chaos",
               "POD_NAMESPACE": "default"}
        stderr = (tmp / "daemon.log").open("w")
        decisions = (tmp / "decisions.jsonl").open("w")  # the daemon's decision log (stdout)
        proc = subprocess.Popen([str(CLI), "run", "--config", str(tmp / "config.yaml"),
                                 "--kubeconfig", str(tmp / "kubeconfig")], cwd=ROOT, env=env,
                                stdout=decisions, stderr=stderr, text=True)
        passes = Passes(port)
        crashes, exit_code, end = 0, None, None
        try:
            deadline = time.monotonic() + 60
            while passes.count < 1 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None, (tmp / "daemon.log").read_text()[-3000:]
            assert passes.count >= 1, "the daemon made no pass within 60 s"
            passes.watching = True
            proxy.active.set()
            storms.start()
            _timeline(plan, rng, server, world, generation, proxy)
            proxy.active.clear()
            storms.stop()
            time.sleep(plan.settle + 2.0)  # faults off: the daemon catches up
            end = time.monotonic()
            if proc.poll() is not None:
                crashes, exit_code = 1, proc.returncode
        finally:
            stop.set()
            passes.stop()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    exit_code = proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    exit_code = proc.wait()
            stderr.close()
            decisions.close()
            if keep := os.environ.get("CHAOS_KEEP"):  # the daemon's logs, for the evidence
                for f in ("daemon.log", "decisions.jsonl"):
                    dest = Path(keep) / f"seed{plan.seed}-{f}"
                    dest.write_bytes((tmp / f).read_bytes())
            proxy.stop()
            storms.stop()
        report = check(server, settle=plan.settle, end=end)
    log = (tmp / "daemon.log").read_text()
    return Outcome(plan, report, dict(proxy.counts) | dict(storms.counts), proxy.requests,
                   crashes, exit_code, passes.count, passes.longest_gap,
                   sum('"level": "error"' in line for line in log.splitlines()),
                   log.count("Traceback"), operator_errors[0], time.monotonic() - started)


def _timeline(plan: Plan, rng: random.Random, server: RecordingServer, world: threading.Lock,
              generation: list[int], proxy: FaultProxy) -> None:
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
        with world:
            free = [i for i in range(plan.nodes) if i not in doomed]
            busy = [i for i in free if any((p.get("spec") or {}).get("nodeName") ==
                                           f"node-{i}-g{generation[i]}"
                                           for p in server.objects("Pod", NS))]
            if not free:
                return
            slot = rng.choice(busy or free)
            doomed.add(slot)
            name = f"node-{slot}-g{generation[slot]}"
            server.patch("Node", name, {"spec": {"taints": [
                {"key": NTH_ITN, "value": f"evt-{k}", "effect": "NoSchedule"}]}})
        if rng.random() < plan.false_alarms:
            at(time.monotonic() + plan.deadline / 2, lambda: withdraw(slot, name))
        else:
            at(time.monotonic() + plan.deadline, lambda: reclaim(slot, name))

    def withdraw(slot: int, name: str) -> None:
        with world:
            server.patch("Node", name, {"spec": {"taints": []}})
            doomed.discard(slot)

    def reclaim(slot: int, name: str) -> None:
        with world:
            for pod in server.objects("Pod", NS):
                if (pod.get("spec") or {}).get("nodeName") == name:
                    server.reclaim_pod(pod["metadata"]["name"], NS)
            server.delete("Node", name)
        at(time.monotonic() + 1.0, lambda: replace(slot))

    def replace(slot: int) -> None:
        with world:
            generation[slot] += 1
            server.seed(node(f"node-{slot}-g{generation[slot]}", GPUS_PER_NODE))
            doomed.discard(slot)

    for k in range(plan.notices):
        at(t0 + k * plan.spacing, lambda k=k: notice(k))  # type: ignore[misc]
    while todo:
        t, _, action = heapq.heappop(todo)
        time.sleep(max(0.0, t - time.monotonic()))
        phase = int((time.monotonic() - t0) // plan.fault_period)
        proxy.rates = FaultRates.total(plan.faults[phase % len(plan.faults)])
        action()


def _record(outcome: Outcome) -> dict[str, Any]:
    summary = outcome.summary()
    print("\nchaos:", json.dumps(summary, indent=1))
    if path := os.environ.get("CHAOS_JSON"):
        with open(path, "a") as f:
            f.write(json.dumps(summary) + "\n")
    return summary


@pytest.mark.timeout(900)
def test_the_daemon_survives_faults_and_keeps_its_invariants(tmp_path: Path) -> None:
    plan = LONG_PLAN if LONG else SHORT
    seed = int(os.environ.get("CHAOS_SEED", plan.seed))
    plan = Plan(**{**plan.__dict__, "seed": seed})
    outcome = run_chaos(plan, tmp_path)
    summary = _record(outcome)
    assert summary["faults_total"] > 0 and summary["notices"] == plan.notices
    assert outcome.crashes == 0 and summary["tracebacks"] == 0, summary
    assert outcome.hangs == 0, summary
    assert outcome.report.violations == [], summary["violation_details"]


# --- the tools themselves: each invariant fires, each proxy fault does what it says ------------
def _scale_in(name: str, job: str, pods: list[str]) -> dict[str, Any]:
    return {"apiVersion": "kai.alibabacloud.com/v1alpha1", "kind": "ScaleIn",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"app.kubernetes.io/managed-by": "spot-autoscaler"}},
            "spec": {"selector": {"name": job}, "toDelete": {"podNames": pods}}}


def test_every_invariant_fires_on_a_stream_that_breaks_it() -> None:
    from kube_fixtures import worker

    server = RecordingServer()
    taint = {"spec": {"taints": [{"key": NTH_ITN, "value": "e", "effect": "NoSchedule"}]}}
    server.seed(node("a"), node("b"), training_job("j", min_workers=2, max_workers=3),
                *(worker("j", i, "a") for i in range(3)))
    server.seed(worker("j", 3, "b"))  # 4 > max 3
    server.seed(_scale_in("in-1", "j", ["j-worker-0"]), _scale_in("in-2", "j", ["j-worker-0"]))
    server.delete("Pod", "j-worker-3", NS)  # by "the operator", on a healthy node
    server.delete("Pod", "j-worker-2", NS)
    server.delete("Pod", "j-worker-1", NS)  # 1 left < min 2
    server.patch("Node", "a", taint)
    server.reclaim_pod("j-worker-0", NS)  # never drained
    server.seed(worker("j", 4, "b"))
    server.patch("TrainingJob", "j", {"metadata": {"annotations": {
        "spot-autoscaler.io/drained-hosts": '["j-worker-4"]'}}}, NS)
    server.patch("Node", "b", taint)
    server.patch("Node", "b", {"spec": {"taints": []}})  # healthy again, j-worker-4 still drained
    report = check(server, settle=1.0, end=time.monotonic() + 2.0)
    assert report.by_kind() == {"over_max": 1, "two_scalers": 1, "pod_in_two_scaleins": 1,
                                "under_min": 1, "undrained_at_reclaim": 1,
                                "drained_after_healthy": 1}
    assert [n.node for n in report.notices] == ["a", "b"]
    assert report.fates() == {"killed_undrained": 1, "survived": 1}


def test_a_graceful_notice_breaks_nothing_and_is_measured() -> None:
    from kube_fixtures import worker

    server = RecordingServer()
    server.seed(node("a"), node("b"), training_job("j", min_workers=1, max_workers=4),
                worker("j", 0, "a"), worker("j", 1, "a"), worker("j", 2, "b"))
    server.patch("Node", "a", {"spec": {"taints": [{"key": NTH_ITN, "effect": "NoSchedule"}]}})
    server.patch("TrainingJob", "j", {"metadata": {"annotations": {
        "spot-autoscaler.io/drained-hosts": '["j-worker-0", "j-worker-1"]'}}}, NS)
    server.seed(_scale_in("in-1", "j", ["j-worker-0"]))
    server.delete("Pod", "j-worker-0", NS)  # the operator, by name
    server.reclaim_pod("j-worker-1", NS)  # drained in time
    server.delete("Node", "a")
    report = check(server, settle=1.0, end=time.monotonic() + 5.0)
    assert report.violations == []
    assert report.fates() == {"removed_by_name": 1, "drained_at_reclaim": 1}
    assert report.latencies() and report.latencies()[0] >= 0
    assert report.stale_drained == 2  # the daemon has not pruned them (none runs here)


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
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "cm"}}).encode()
        request = urllib.request.Request(f"{proxy.url}/api/v1/namespaces/default/configmaps",
                                         data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises((OSError, ConnectionError)):
            urllib.request.urlopen(request, timeout=5)
        assert server.get("ConfigMap", "cm", "default") is not None  # the write happened
        proxy.active.clear()
        with urllib.request.urlopen(f"{proxy.url}/api/v1/nodes", timeout=5) as resp:
            assert resp.status == 200
        assert proxy.counts["lost_reply"] == 1 and proxy.injected == 21
