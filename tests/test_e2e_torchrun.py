"""End to end: a real elastic torchrun (torch.distributed.elastic, c10d rendezvous, gloo on
loopback, CPU) on three pseudo-hosts, driven by the real `spot-autoscaler run` in standalone mode.

The test plays the operator (support/torchrun_job.Operator): one torchrun agent per host in the
daemon's discovery file, SIGTERM to the agent of a host that leaves it, a new agent for a host
that appears. The training loop (tests/e2e/torchrun_train.py) listens for the checkpoint signal
with autoscaler.notice: the daemon's `<discovery file>.notice`, and SIGTERM.

1. node-c starts noticed: the daemon lists node-a and node-b, two agents train.
2. Scale-out: node-c's notice is withdrawn, the daemon lists it, its agent joins; the agents
   restart their workers (SIGTERM: the flag, a checkpoint) and three resume from it.
3. A notice for node-b: the daemon names it in the notice file, then takes it out of discovery;
   the training process hears it, rank 0 saves at the next step, node-b's worker leaves cleanly,
   its agent is SIGTERMed; the survivors restart and resume from exactly that step.

Timings, steps and the signal's latency are printed (run with -s) and written as JSON to the
test's tmp dir (and to $E2E_TORCHRUN_JSON when set).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.horovod_job import standalone_config
from support.torchrun_job import (
    BIN,
    HOSTS,
    Operator,
    Store,
    TorchLog,
    missing,
    tail,
    torch_version,
    torchrun,
    train_env,
    wait,
    write_notice,
)

from autoscaler.notice import STANDALONE_SUFFIX, decode

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
    pytest.mark.timeout(240),
]

SIGNAL_TARGET_S = 1.0  # issue 33: the signal reaches the training process within 1 s


class Run:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hosts = tmp / "hosts"
        self.notice_file = tmp / f"hosts{STANDALONE_SUFFIX}"
        self.notices = tmp / "notices"
        self.stop = tmp / "stop"
        self.ckpt = tmp / "checkpoint.pt"
        self.log = TorchLog(tmp / "train.log")
        self.daemon_log = tmp / "daemon.log"
        self.decisions_log = tmp / "decisions.jsonl"
        self.operator: Operator | None = None

    def env(self) -> dict[str, str]:
        return train_env(self.tmp, self.notice_file)

    def notice(self, host: str, deadline: datetime) -> float:
        return write_notice(self.notices, host, deadline, f"e2e-{host}")

    def noticed(self) -> list[str]:
        try:
            return list(decode(self.notice_file.read_text()).hosts)
        except (FileNotFoundError, ValueError):
            return []

    def decisions(self) -> list[dict[str, Any]]:
        try:
            text = self.decisions_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def diagnostics(self) -> str:
        parts = [f"listed: {self.operator.listed() if self.operator else None}"]
        parts.append(f"notice file: {self.noticed()}")
        if self.operator is not None:
            parts.append(f"operator: {self.operator.events[-12:]}")
        parts.append(tail(self.log.path, 25))
        parts += [tail(p, 25) for p in sorted(self.tmp.glob("agent-*.log"))]
        parts += [tail(self.daemon_log, 10), tail(self.tmp / "store.log", 5)]
        return "\n".join(parts)

    def wait(self, predicate: Any, timeout: float, what: str) -> float:
        return wait(predicate, timeout, what, self.diagnostics)

    def complete_world(self, size: int, after: float) -> list[dict[str, Any]]:
        return self.log.complete_world(size, after)

    def around(self, change: float, size_before: int, size_after: int) -> dict[str, Any]:
        """Steps and checkpoints around a membership change at `change`."""
        world = self.complete_world(size_after, change)
        resumed_at = min(e["t"] for e in world)
        before = [s for s in self.log.steps(size_before, change - 120) if s["t"] < resumed_at]
        ckpts = [c for c in self.log.events("checkpoint", change) if c["t"] < resumed_at]
        after = self.log.steps(size_after, resumed_at)
        return {
            "last_step_before": max(s["step"] for s in before),
            "checkpoint_step": ckpts[-1]["step"] if ckpts else None,
            "checkpoint_t": ckpts[-1]["t"] if ckpts else None,
            "resumed_at_steps": sorted({e["step"] for e in world}),
            "first_step_after": after[0]["step"] if after else None,
            "resumed_t": max(e["t"] for e in world),
            "restart_counts": sorted({e["restart"] for e in world}),
        }


def test_torchrun_scales_out_and_checkpoints_on_a_notice_losing_no_step(tmp_path: Path) -> None:
    run = Run(tmp_path)
    env = run.env()
    config = standalone_config(tmp_path / "config.yaml", HOSTS, tmp_path, 3, join_grace="2s")
    start = datetime.now(UTC)
    run.notice("node-c", start + timedelta(hours=1))  # node-c is not up yet
    report: dict[str, Any] = {"torch": torch_version(), "hosts": HOSTS}

    store = Store(tmp_path / "store.log", env)
    daemon_cmd = [str(BIN / "spot-autoscaler"), "run", "--config", str(config)]
    with run.daemon_log.open("wb") as err, run.decisions_log.open("wb") as out:
        daemon = subprocess.Popen(
            daemon_cmd, stdout=out, stderr=err, env=env, start_new_session=True
        )
    # the agent of a host that left discovery is SIGTERMed 1 s later, as a pod deleted after
    # the drain: with no delay the SIGTERM (10 ms after the discovery file, forwarded by torchrun
    # in ms) and the notice file (7 ms before it, read at the next step) race; here the notice
    # must be what the training process hears first (the SIGTERM path is the scale-out's)
    operator = run.operator = Operator(
        run.hosts, torchrun(store.port, 3), env, tmp_path, sigterm_delay=1.0
    )
    try:
        run.wait(lambda: operator.listed() == ["node-a", "node-b"], 20, "the daemon's a and b")
        operator.start()
        t0 = time.time()
        run.wait(
            lambda: run.complete_world(2, 0) and len(run.log.steps(2, 0)) >= 10,
            120,
            "two workers training",
        )
        report["start_to_two_training_s"] = round(time.time() - t0, 3)

        # --- scale-out: node-c's notice goes, the daemon lists it, its agent joins -------------
        withdrawn = time.time()
        (run.notices / "node-c.json").unlink()
        listed = run.wait(lambda: "node-c" in operator.listed(), 10, "node-c listed")
        run.wait(lambda: run.complete_world(3, withdrawn), 90, "three workers resumed")
        run.wait(lambda: len(run.log.steps(3, withdrawn)) >= 5, 30, "steps of three")
        grown = run.around(withdrawn, 2, 3)
        report["scale_out"] = {
            "withdrawal_to_listed_s": round(listed - withdrawn, 3),
            "withdrawal_to_checkpoint_s": _since(grown["checkpoint_t"], withdrawn),
            "withdrawal_to_resumed_s": round(grown["resumed_t"] - withdrawn, 3),
            **{k: v for k, v in grown.items() if not k.endswith("_t")},
        }

        # --- a notice for node-b: signal, checkpoint at the next step, b leaves, resume --------
        victim = "node-b"
        noticed = run.notice(victim, datetime.now(UTC) + timedelta(seconds=30))
        run.wait(lambda: run.noticed() == [victim], 5, "the notice file to name the victim")
        notice_file_at = run.notice_file.stat().st_mtime
        run.wait(lambda: victim not in operator.listed(), 5, "the victim to leave discovery")
        discovery_at = run.hosts.stat().st_mtime
        run.wait(lambda: run.log.events("checkpoint", noticed), 10, "the checkpoint")
        run.wait(lambda: operator.agent_exits(victim), 30, "the victim's agent to exit")
        run.wait(lambda: run.complete_world(2, noticed), 90, "the survivors resumed")
        run.wait(
            lambda: len(run.log.steps(2, run.complete_world(2, noticed)[0]["t"])) >= 5,
            30,
            "steps of the survivors",
        )
        shrunk = run.around(noticed, 3, 2)
        failed = [e["t"] for e in run.log.events("failed", noticed) if e["host"] != victim]
        victim_signal = [e for e in run.log.events("signal", noticed) if e["host"] == victim]
        seen = run.log.events("seen", noticed)
        exits = [e for e in run.log.events("exit", noticed) if e["host"] == victim]
        (agent,) = operator.agent_exits(victim)
        report["notice"] = {
            "victim": victim,
            "notice_to_notice_file_s": round(notice_file_at - noticed, 3),
            "notice_to_discovery_changed_s": round(discovery_at - noticed, 3),
            "notice_to_signal_seen_s": _since(min((e["t"] for e in seen), default=None), noticed),
            "signal_seen_by_host_s": {
                h: _since(min(e["t"] for e in seen if e["host"] == h), noticed)
                for h in sorted({e["host"] for e in seen})
            },
            "victim_flag": {
                "via": victim_signal[0]["via"] if victim_signal else None,
                "after_s": _since(victim_signal[0]["t"] if victim_signal else None, noticed),
                "at_step": victim_signal[0]["step"] if victim_signal else None,
            },
            "notice_to_checkpoint_s": _since(shrunk["checkpoint_t"], noticed),
            "victim_worker_exit": exits[0]["via"] if exits else None,
            "victim_agent_exit_code": agent.returncode,
            "notice_to_victim_agent_sigterm_s": _since(agent.terminated, noticed),
            "notice_to_victim_agent_exit_s": _since(agent.exited, noticed),
            "victim_agent_killed": agent.killed is not None,
            "notice_to_survivors_failed_s": _since(min(failed, default=None), noticed),
            "notice_to_resumed_s": round(shrunk["resumed_t"] - noticed, 3),
            **{k: v for k, v in shrunk.items() if not k.endswith("_t")},
        }

        # --- stop: every rank agrees through the flags, the agents finish ----------------------
        running = list(operator.agents)
        run.stop.touch()
        operator.wait_exits(60)
        report["final_agent_exit_codes"] = {
            h: operator.agent_exits(h)[-1].returncode if operator.agent_exits(h) else None
            for h in running
        }
    finally:
        operator.close(run.log.pids())
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(5)
        store.close()
        report["decisions"] = [
            {k: d.get(k) for k in ("ts", "action", "reason", "hosts", "to_workers")}
            for d in run.decisions()
            if d.get("action") not in (None, "noop")
        ]
        report["operator"] = operator.events
        _write(report, tmp_path)  # also what a failed run got to

    grown, shrunk = report["scale_out"], report["notice"]
    # a scale-out: the joining restart saves on its SIGTERM, three resume from it
    assert grown["resumed_at_steps"] == [grown["checkpoint_step"]], run.diagnostics()
    assert grown["last_step_before"] == grown["checkpoint_step"], "steps lost on the scale-out"
    # the notice: the signal within the target, the checkpoint at the next step, 0 steps lost
    assert shrunk["notice_to_signal_seen_s"] <= SIGNAL_TARGET_S, shrunk
    assert shrunk["victim_flag"]["via"] == "notice", "the SIGTERM came first: no test of the file"
    assert shrunk["victim_flag"]["after_s"] <= SIGNAL_TARGET_S, shrunk
    assert shrunk["notice_to_notice_file_s"] <= shrunk["notice_to_discovery_changed_s"]
    assert shrunk["checkpoint_step"] - shrunk["victim_flag"]["at_step"] <= 1, shrunk
    assert shrunk["resumed_at_steps"] == [shrunk["checkpoint_step"]], run.diagnostics()
    assert shrunk["last_step_before"] == shrunk["checkpoint_step"], "steps lost on the notice"
    assert shrunk["victim_worker_exit"] is not None, "the victim's worker did not leave cleanly"
    actions = [(d["action"], d["reason"]) for d in report["decisions"]]
    assert ("drain", "preemption_notice") in actions, actions
    assert set(report["final_agent_exit_codes"].values()) == {0}, run.diagnostics()


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else round(t - start, 3)


def _write(report: dict[str, Any], tmp: Path) -> None:
    text = json.dumps(report, indent=2, default=str) + "\n"
    out = tmp / "e2e-torchrun.json"
    out.write_text(text)
    if extra := os.environ.get("E2E_TORCHRUN_JSON"):
        Path(extra).write_text(text)
    brief = {k: report[k] for k in ("torch", "scale_out", "notice") if k in report}
    print(f"\n{json.dumps(brief, indent=2)}\ntimings written to {out}")
