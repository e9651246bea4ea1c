"""End to end with a real elastic horovodrun, driven by the real standalone daemon.

Three local pseudo-hosts (`localhost`, `127.0.0.1`, the machine's hostname) with one slot each
run a tiny torch loop (tests/e2e/elastic_train.py) under `horovodrun --min-np 1 --max-np 3`, whose
discovery script is our owned-mode `owned_hosts.sh` over the file `spot-autoscaler run` owns.
A notice file for one host must make the world shrink gracefully (no rollback) within 3 s;
withdrawing it must bring the host back. Timings and the steps around each reset are printed
(run with -s) and written to a JSON file under the test's tmp dir.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from autoscaler.adapters.discovery.scripts import OWNED_SCRIPT, script_path

BIN = Path(sys.executable).parent
HOROVODRUN = BIN / "horovodrun"
TRAIN = Path(__file__).parent / "e2e" / "elastic_train.py"
HOSTS = ["localhost", "127.0.0.1", socket.gethostname()]


def _missing() -> str | None:
    for module in ("torch", "horovod"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (scripts/build-horovod.sh installs horovod + torch)"
    if not HOROVODRUN.exists():
        return f"horovodrun not found next to {sys.executable}"
    if len(set(HOSTS)) < 3:
        return f"the machine's hostname {HOSTS[2]!r} is not a third distinct local host name"
    return None


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
    pytest.mark.timeout(180),
]


class Run:
    """The files of one run and what happened in them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hosts = tmp / "hosts"
        self.notices = tmp / "notices"
        self.train_log = tmp / "train.log"
        self.stop = tmp / "stop"
        names = ("daemon.log", "decisions.jsonl", "horovodrun.log")
        self.logs = {name: tmp / name for name in names}

    def listed(self) -> set[str]:
        try:
            return {line.split(":")[0] for line in self.hosts.read_text().split()}
        except FileNotFoundError:
            return set()

    def events(self, kind: str | None = None, after: float = 0.0) -> list[dict[str, Any]]:
        try:
            lines = self.train_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if (kind is None or e["event"] == kind) and e["t"] > after]

    def world(self, size: int, after: float) -> list[dict[str, Any]]:
        """`resume` events of a world of `size` after `after`: one per rank once it is complete."""
        return [e for e in self.events("resume", after) if e["size"] == size]

    def first_reset(self, after: float) -> float:
        """When the first rank saw the world change (its reset callback or its resume)."""
        return min(e["t"] for e in self.events(after=after) if e["event"] in ("reset", "resume"))

    def decisions(self) -> list[dict[str, Any]]:
        text = self.logs["decisions.jsonl"].read_text()
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def diagnostics(self) -> str:
        parts = [f"hosts file: {sorted(self.listed())}"]
        for path in (self.train_log, *self.logs.values()):
            text = path.read_text() if path.exists() else "(missing)"
            parts.append(f"--- {path.name} (tail)\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> float:
        """Poll every 5 ms; the wall time at which `predicate` first held."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}\n{self.diagnostics()}")
            time.sleep(0.005)
        return time.time()


def write_config(run: Run) -> Path:
    hosts = ", ".join(f"{{name: '{h}', price_per_hour: 1.0}}" for h in HOSTS)
    config = run.tmp / "config.yaml"
    config.write_text(f"""
policies: [{{name: e2e, scale_out: {{min_idle: 0s, cooldown: 0s}}, preemption: {{join_grace: 5s}}}}]
default_policy: e2e
daemon: {{mode: standalone, tick_interval: 2s, wake_coalesce: 0.01s, metrics_port: 0,
          metrics_bind_address: 127.0.0.1, config_reload_interval: 0s, log_format: json}}
standalone:
  hosts: [{hosts}]
  job: {{name: toy, min_workers: 1, max_workers: 3, gpus_per_worker: 1}}
  discovery_file: {run.hosts}
  notice_dir: {run.notices}
  notice_poll: 0.1s
  join_grace: 5s
""")
    return config


@contextmanager
def started(cmd: list[str], log: Path, env: dict[str, str] | None = None,
            stdout: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session; on exit it and every descendant we saw are ended by pid."""
    with log.open("wb") as err, (stdout or log).open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err if stdout else subprocess.STDOUT,
                                env=env, start_new_session=True)
    try:
        yield proc
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    import psutil  # installed with horovod

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # horovodrun then stops its workers itself
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    # Horovod starts each worker in a session of its own (setsid): end stragglers by pid.
    for p in family:
        with suppress(psutil.NoSuchProcess):
            p.kill()


def steps_around(run: Run, reset_at: float) -> dict[str, Any]:
    steps = run.events("step")
    before = [e for e in steps if e["t"] < reset_at]
    after = [e for e in steps if e["t"] > reset_at]
    resumed = [e for e in run.events("resume", reset_at - 0.001)]
    return {
        "last_step_before": before[-1]["step"] if before else None,
        "resumed_at_step": min(e["step"] for e in resumed) if resumed else None,
        "first_step_after": after[0]["step"] if after else None,
        "world_before": before[-1]["size"] if before else None,
        "world_after": after[0]["size"] if after else None,
    }


def test_a_notice_shrinks_horovod_gracefully_and_the_host_rejoins(tmp_path: Path) -> None:
    run = Run(tmp_path)
    config = write_config(run)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "E2E_LOG": str(run.train_log), "E2E_STOP": str(run.stop), "PYTHONUNBUFFERED": "1"}
    daemon_cmd = [str(BIN / "spot-autoscaler"), "run", "--config", str(config)]
    discovery = f"{script_path(OWNED_SCRIPT)} {run.hosts}"
    horovod_cmd = [
        str(HOROVODRUN), "-np", "3", "--min-np", "1", "--max-np", "3", "--network-interface", "lo",
        "--host-discovery-script", discovery, sys.executable, str(TRAIN),
    ]
    report: dict[str, Any] = {"hosts": HOSTS}
    with started(daemon_cmd, run.logs["daemon.log"], env, stdout=run.logs["decisions.jsonl"]):
        run.wait(lambda: run.listed() == set(HOSTS), 15, "the daemon to list all three hosts")
        with started(horovod_cmd, run.logs["horovodrun.log"], env) as horovod:
            run.wait(lambda: len(run.world(3, 0)) == 3 and len(run.events("step")) >= 20, 90,
                     "three ranks training")
            rank0 = next(e["host"] for e in run.world(3, 0) if e["rank"] == 0)
            victim = next(h for h in HOSTS if h != rank0)  # rank 0 may leave too; keep it simple

            # --- a notice: the victim leaves discovery first, Horovod shrinks without rollback
            noticed = time.time()
            (run.notices / f"{victim}.json").write_text('{"kind": "interruption", "id": "e2e-1"}')
            run.wait(lambda: victim not in run.listed(), 5, "the victim to leave the file")
            file_changed = run.hosts.stat().st_mtime
            run.wait(lambda: len(run.world(2, noticed)) == 2, 10, "the world to shrink to 2")
            shrunk = run.first_reset(after=noticed)
            run.wait(lambda: run.events("step", shrunk), 10, "a step after the shrink")
            report["shrink"] = {
                "victim": victim,
                "notice_to_discovery_file_changed_s": round(file_changed - noticed, 3),
                "notice_to_world_size_changed_s": round(shrunk - noticed, 3),
                **steps_around(run, shrunk),
            }

            # --- the notice is withdrawn: the host is idle capacity again and rejoins
            withdrawn = time.time()
            (run.notices / f"{victim}.json").unlink()
            run.wait(lambda: victim in run.listed(), 5, "the victim to return to the file")
            file_back = run.hosts.stat().st_mtime
            run.wait(lambda: len(run.world(3, withdrawn)) == 3, 45, "the world to grow back to 3")
            grown = run.first_reset(after=withdrawn)
            rejoined = min(e["t"] for e in run.world(3, withdrawn))
            run.wait(lambda: run.events("step", rejoined), 10, "a step after the growth")
            report["growth"] = {
                "host": victim,
                "withdrawal_to_discovery_file_changed_s": round(file_back - withdrawn, 3),
                "withdrawal_to_reset_s": round(grown - withdrawn, 3),
                "withdrawal_to_world_size_changed_s": round(rejoined - withdrawn, 3),
                **steps_around(run, grown),
            }

            run.stop.touch()
            report["horovodrun_exit_code"] = horovod.wait(30)
    report["rollbacks"] = run.events("rollback")
    report["decisions"] = [
        {k: d[k] for k in ("ts", "action", "reason", "hosts", "nodes", "pods", "to_workers")}
        for d in run.decisions() if d["action"] != "noop"
    ]
    out = tmp_path / "e2e-timings.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    _print(report, out)

    shrink, growth = report["shrink"], report["growth"]
    assert shrink["notice_to_world_size_changed_s"] < 3.0, run.diagnostics()
    assert (shrink["world_before"], shrink["world_after"]) == (3, 2)
    assert shrink["resumed_at_step"] >= shrink["last_step_before"], "rolled back on a drain"
    assert (growth["world_before"], growth["world_after"]) == (2, 3)
    assert growth["resumed_at_step"] >= growth["last_step_before"]
    assert report["rollbacks"] == [], "Horovod restored a commit: a worker failed"
    actions = [(d["action"], d["reason"]) for d in report["decisions"]]
    assert actions[1:] == [
        ("drain", "preemption_notice"), ("scale_in", "preemption_notice"),
        ("scale_out", "idle_capacity"),
    ], actions
    assert report["horovodrun_exit_code"] == 0, run.diagnostics()


def _print(report: dict[str, Any], path: Path) -> None:
    s, g = report["shrink"], report["growth"]
    ms = {k: f"{v * 1000:.0f} ms" for k, v in (*s.items(), *g.items()) if k.endswith("_s")}
    print(f"\nnotice -> discovery-file-changed: {ms['notice_to_discovery_file_changed_s']}")
    print(f"notice -> world-size-changed: {ms['notice_to_world_size_changed_s']}"
          f" (world {s['world_before']} -> {s['world_after']}, {s['victim']} left)")
    print(f"  steps: last before reset {s['last_step_before']}, resumed at {s['resumed_at_step']},"
          f" first after {s['first_step_after']}")
    print(f"withdrawal -> discovery-file-changed: {ms['withdrawal_to_discovery_file_changed_s']}")
    print(f"withdrawal -> world-size-changed: {ms['withdrawal_to_world_size_changed_s']}"
          f" (reset after {ms['withdrawal_to_reset_s']}; world"
          f" {g['world_before']} -> {g['world_after']})")
    print(f"  steps: last before reset {g['last_step_before']}, resumed at {g['resumed_at_step']},"
          f" first after {g['first_step_after']}")
    print(f"timings written to {path}")
