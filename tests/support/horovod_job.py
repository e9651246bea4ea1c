"""A real elastic horovodrun on local pseudo-hosts: what the end-to-end test and the preemption
benchmark (benchmarks/preemption.py) share.

The training loop is tests/e2e/elastic_train.py; it appends JSON lines to a log that `TrainLog`
reads. Host names that resolve to an address of this machine launch locally with no ssh
(`localhost`, `127.0.0.1`, the hostname, ...): `local_hosts()` lists the distinct ones.
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
HOROVODRUN = BIN / "horovodrun"
TRAIN = Path(__file__).resolve().parents[1] / "e2e" / "elastic_train.py"
HOSTS = ["localhost", "127.0.0.1", socket.gethostname()]


def missing(hosts: int = 3) -> str | None:
    """Why a real horovodrun on `hosts` local pseudo-hosts cannot run here, or None."""
    for module in ("torch", "horovod"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (scripts/build-horovod.sh installs horovod + torch)"
    if not HOROVODRUN.exists():
        return f"horovodrun not found next to {sys.executable}"
    if len(local_hosts()) < hosts:
        return f"fewer than {hosts} distinct local host names: {local_hosts()}"
    return None


def local_hosts() -> list[str]:
    """Distinct names horovodrun launches locally: the three of HOSTS, then this machine's other
    IPv4 addresses and the other names /etc/hosts maps onto one of them."""
    import psutil  # installed with horovod

    addresses = {
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET
    }
    names = [*HOSTS, *sorted(addresses - {"127.0.0.1"})]
    with suppress(OSError):
        for line in Path("/etc/hosts").read_text().splitlines():
            fields = line.split("#")[0].split()
            if fields and fields[0] in addresses:
                names.extend(fields[1:])
    out: list[str] = []
    for name in names:
        with suppress(OSError):
            if socket.gethostbyname(name) in addresses and name not in out:
                out.append(name)
    return out


def horovodrun(np: int, discovery: str, max_np: int = 3, extra: Sequence[str] = ()) -> list[str]:
    """Elastic horovodrun of the training loop over loopback: NP ranks to start with, then 1 to
    MAX_NP as the host discovery script DISCOVERY (a command line) lists hosts."""
    return [
        str(HOROVODRUN),
        "-np",
        str(np),
        "--min-np",
        "1",
        "--max-np",
        str(max_np),
        "--network-interface",
        "lo",
        *extra,
        "--host-discovery-script",
        discovery,
        sys.executable,
        str(TRAIN),
    ]


def train_env(train_log: Path, stop: Path, **extra: str) -> dict[str, str]:
    """The processes' environment: this venv's tools first on PATH, and where the training loop
    logs and looks for its stop file (E2E_* settings of elastic_train.py in `extra`)."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "E2E_LOG": str(train_log),
        "E2E_STOP": str(stop),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def standalone_config(
    path: Path, hosts: Sequence[str], run: Path, max_workers: int, join_grace: str = "5s"
) -> Path:
    """A standalone-mode config for `spot-autoscaler run`: one slot per host, one job of 1 to
    `max_workers` workers, the discovery file `run/hosts` and notices in `run/notices`."""
    listed = ", ".join(f"{{name: '{h}', price_per_hour: 1.0}}" for h in hosts)
    path.write_text(f"""
policies: [{{name: e2e, scale_out: {{min_idle: 0s, cooldown: 0s}},
             preemption: {{join_grace: {join_grace}}}}}]
default_policy: e2e
daemon: {{mode: standalone, tick_interval: 2s, wake_coalesce: 0.01s, metrics_port: 0,
          metrics_bind_address: 127.0.0.1, config_reload_interval: 0s, log_format: json}}
standalone:
  hosts: [{listed}]
  job: {{name: toy, min_workers: 1, max_workers: {max_workers}, gpus_per_worker: 1}}
  discovery_file: {run / "hosts"}
  notice_dir: {run / "notices"}
  notice_poll: 0.1s
  join_grace: {join_grace}
""")
    return path


class TrainLog:
    """What the training loop's ranks logged: `resume`, `reset`, `step`, `rollback`, `done`."""

    def __init__(self, train_log: Path) -> None:
        self.train_log = train_log

    def events(self, kind: str | None = None, after: float = 0.0) -> list[dict[str, Any]]:
        try:
            text = self.train_log.read_text()
        except FileNotFoundError:
            return []
        # the ranks append as we read: a last line without its newline is still being written
        complete = text[: text.rfind("\n") + 1]
        events = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [e for e in events if (kind is None or e["event"] == kind) and e["t"] > after]

    def world(self, size: int, after: float) -> list[dict[str, Any]]:
        """`resume` events of a world of `size` after `after`: one per rank once it is complete."""
        return [e for e in self.events("resume", after) if e["size"] == size]

    def first_reset(self, after: float) -> float:
        """When the first rank saw the world change (its reset callback or its resume)."""
        return min(e["t"] for e in self.events(after=after) if e["event"] in ("reset", "resume"))

    def steps_around(self, reset_at: float) -> dict[str, Any]:
        steps = self.events("step")
        before = [e for e in steps if e["t"] < reset_at]
        after = [e for e in steps if e["t"] > reset_at]
        resumed = self.events("resume", reset_at - 0.001)
        return {
            "last_step_before": before[-1]["step"] if before else None,
            "resumed_at_step": min(e["step"] for e in resumed) if resumed else None,
            "first_step_after": after[0]["step"] if after else None,
            "world_before": before[-1]["size"] if before else None,
            "world_after": after[0]["size"] if after else None,
        }


@contextmanager
def started(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, stdout: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session; on exit it and every descendant we saw are ended by pid."""
    with log.open("wb") as err, (stdout or log).open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err if stdout else subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        end(proc)


def end(proc: subprocess.Popen[bytes]) -> None:
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


def worker_processes(horovod: subprocess.Popen[bytes]) -> dict[str, list[Any]]:
    """This horovodrun's worker processes (psutil.Process) by the host Horovod started them
    for, from their environment (HOROVOD_HOSTNAME)."""
    import psutil  # installed with horovod

    found: dict[str, list[Any]] = {}
    with suppress(psutil.NoSuchProcess):
        for p in psutil.Process(horovod.pid).children(recursive=True):
            with suppress(psutil.Error):
                if host := p.environ().get("HOROVOD_HOSTNAME"):
                    found.setdefault(host, []).append(p)
    return found


def operator_writes(hostfile: Path, hosts: Sequence[str]) -> float:
    """et-operator's `echo '<lines>' > hostfile` (scaleout_controller.go hostfileUpdateScript):
    truncate, then write (here line by line; echo's newline leaves a blank last line)."""
    fd = os.open(hostfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for line in [f"{h}:1\n" for h in hosts] + ["\n"]:
            os.write(fd, line.encode())
    finally:
        os.close(fd)
    return time.time()
