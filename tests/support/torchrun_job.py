"""A real elastic torchrun job on local pseudo-hosts, run the way an operator would run it from
the daemon's standalone discovery file.

- the c10d rendezvous store lives in a process of its own (`TCPStore(..., is_master=True,
  multi_tenant=True)`), and every agent runs with `--rdzv-conf is_host=false`: on loopback every
  agent would qualify as the store's host, and the one that did would take the job down with it
  when it leaves (docs: ../shared/reference/pytorch-elastic.md, section 2);
- `Operator` follows the discovery file: one torchrun agent per listed host (its pseudo-host name
  in $SPOT_AUTOSCALER_HOST), started when the host appears, SIGTERMed when it leaves;
- the training loop is tests/e2e/torchrun_train.py; `TorchLog` reads its JSON lines;
- `train_env` and `write_notice`: the job's environment and a cloud notice in the daemon's
  notice directory, for tests/test_e2e_torchrun.py and benchmarks/preemption_torchrun.py.

Processes are ended by pid (each agent, its workers from the log, the store), never by name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

BIN = Path(sys.executable).parent
TORCHRUN = BIN / "torchrun"
TRAIN = Path(__file__).resolve().parents[1] / "e2e" / "torchrun_train.py"
HOSTS = ["node-a", "node-b", "node-c"]

# rendezvous settings for a test on one machine: a departed node counts as dead after 5 s
# without heartbeats (default 15 s), a round closes 1 s after min nodes joined (default 30 s).
# Not fewer attempts: a node writes its heartbeat only once the last is `interval` old and checks
# every `interval` (dynamic_rendezvous.py _should_keep_alive), so heartbeats come about 2
# intervals apart; with 2 attempts a loaded machine saw live nodes declared dead, and a joining
# node then formed a world of its own
RDZV_CONF = (
    "is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5,"
    "join_timeout=120,close_timeout=10"
)

STORE_CODE = """
import sys
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False,
                 timeout=timedelta(seconds=300))
print(store.port, flush=True)
sys.stdin.read()  # until the test closes our stdin (or ends us)
"""


def missing() -> str | None:
    """Why a real torchrun cannot run here, or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (`make horovod` installs it: scripts/build-horovod.sh)"
    if not TORCHRUN.exists():
        return f"torchrun not found next to {sys.executable}"
    return None


def torch_version() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip()


def train_env(tmp: Path, notice_file: Path | None, **extra: str) -> dict[str, str]:
    """The environment of the agents and their workers: the train log, stop file and checkpoint
    under `tmp`, the checkpoint signal's notice file (None: no notice file at all), `extra`
    (E2E_* knobs of tests/e2e/torchrun_train.py)."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
        "E2E_LOG": str(tmp / "train.log"),
        "E2E_STOP": str(tmp / "stop"),
        "E2E_CKPT": str(tmp / "checkpoint.pt"),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "LOGLEVEL": "INFO",  # torchrun's own log: rendezvous rounds, restarts
        # torch's agents share the rendezvous store with their workers by default: a node
        # joining a later round then waited for a master address no one re-published, and
        # survivors met stale gloo addresses (reference section 2, [M] on 2.15); set it to
        # 0 in the environment to try without
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": os.environ.get(
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"
        ),
        **extra,
    }
    env.pop("SPOT_AUTOSCALER_NOTICE_FILE", None)
    if notice_file is not None:
        env["SPOT_AUTOSCALER_NOTICE_FILE"] = str(notice_file)
    return env


def write_notice(notices: Path, host: str, deadline: datetime | None, why: str) -> float:
    """A cloud notice for `host` in the daemon's notice directory (standalone.notice_dir),
    written whole (a dot file renamed: the directory skips dot files); when it was written."""
    notices.mkdir(exist_ok=True)
    body = {"kind": "interruption", "id": why}
    if deadline is not None:
        body["deadline"] = deadline.isoformat()
    tmp = notices / f".{host}.tmp"
    tmp.write_text(json.dumps(body))
    os.replace(tmp, notices / f"{host}.json")
    return time.time()


class Store:
    """The rendezvous TCPStore in a process of its own; `port` once it listens."""

    def __init__(self, log: Path, env: Mapping[str, str]) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STORE_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=dict(env),
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()  # torch imports: a few seconds
        if not line.isdigit():
            self.close()
            raise RuntimeError(f"the store did not start: {line!r}, see {log}")
        self.port = int(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            with suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def torchrun(port: int, max_nodes: int, extra: tuple[str, ...] = ()) -> list[str]:
    """One elastic agent of 1 to MAX_NODES nodes, one worker each, c10d over the store at
    127.0.0.1:PORT; restarts for departures without end (each uses one)."""
    return [
        str(TORCHRUN),
        f"--nnodes=1:{max_nodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=e2e",
        f"--rdzv-conf={RDZV_CONF}",
        "--max-restarts=100",
        "--monitor-interval=0.1",
        "--local-addr=127.0.0.1",
        *extra,
        str(TRAIN),
    ]


@dataclass
class Agent:
    host: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float
    delisted: float | None = None  # when its host left the discovery file
    terminated: float | None = None  # when we SIGTERMed it
    killed: float | None = None  # when we SIGKILLed it (still there `kill_after` s later)
    exited: float | None = None
    returncode: int | None = None


@dataclass
class Operator:
    """Plays the operator: one agent per host listed in `hosts_file`, SIGTERM to the agent of a
    host that leaves it (`sigterm_delay` seconds later: the time a real operator takes to delete
    the pod) and SIGKILL `kill_after` seconds after that (the kubelet's grace period), a new
    agent for a host that appears (polled every 10 ms).

    The SIGKILL is needed: an agent whose worker exited 0 (the doomed rank, after the
    checkpoint) waits in torchrun's exit barrier for the others (up to 300 s), blocked in a C++
    store wait, so the SIGTERM's Python handler cannot run before that returns."""

    hosts_file: Path
    command: list[str]
    env: Mapping[str, str]
    logs: Path
    sigterm_delay: float = 0.0
    kill_after: float = 5.0
    agents: dict[str, Agent] = field(default_factory=dict)  # running, by host
    deleted: set[str] = field(default_factory=set)  # hosts whose pod is gone for good
    gone: list[Agent] = field(default_factory=list)  # ended, in order
    events: list[dict[str, Any]] = field(default_factory=list)
    frozen: bool = False  # True: no more agents are started (the job is finishing)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)
        self._thread.start()

    def listed(self) -> list[str]:
        try:
            lines = self.hosts_file.read_text().split()
        except FileNotFoundError:
            return []
        return [line.split(":")[0] for line in lines]

    def agent_exits(self, host: str) -> list[Agent]:
        with self._lock:
            return [a for a in self.gone if a.host == host]

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.follow()

    def follow(self) -> None:
        listed = self.listed()
        with self._lock:
            for host in [] if self.frozen else listed:
                if host not in self.agents and host not in self.deleted:
                    self._start(host)
            for host, agent in list(self.agents.items()):
                if host not in listed and agent.delisted is None:
                    agent.delisted = time.time()
                    self.events.append({"event": "delisted", "host": host, "t": agent.delisted})
                elif host in self.deleted and agent.delisted is None:  # delete_pod: now
                    agent.delisted = time.time() - self.sigterm_delay
                due = (
                    agent.delisted is not None
                    and time.time() >= agent.delisted + self.sigterm_delay
                )
                if due and agent.terminated is None:
                    agent.proc.send_signal(signal.SIGTERM)
                    agent.terminated = time.time()
                    self.events.append({"event": "sigterm", "host": host, "t": agent.terminated})
                elif (
                    agent.terminated is not None
                    and agent.killed is None
                    and time.time() >= agent.terminated + self.kill_after
                ):
                    agent.proc.kill()
                    agent.killed = time.time()
                    self.events.append({"event": "sigkill", "host": host, "t": agent.killed})
                code = agent.proc.poll()
                if code is not None:
                    agent.exited, agent.returncode = time.time(), code
                    agent.log.close()
                    del self.agents[host]
                    self.gone.append(agent)
                    self.events.append(
                        {"event": "agent_exit", "host": host, "code": code, "t": agent.exited}
                    )

    def _start(self, host: str) -> None:
        n = sum(1 for a in self.gone if a.host == host)
        log = (self.logs / f"agent-{host}-{n}.log").open("wb")
        env = {**self.env, "SPOT_AUTOSCALER_HOST": host}
        proc = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.agents[host] = Agent(host, proc, log, time.time())
        self.events.append({"event": "agent_start", "host": host, "t": time.time()})

    def delete_pod(self, host: str) -> None:
        """The host's pod is deleted (a node handler's eviction): SIGTERM to its agent at the
        next poll (10 ms), SIGKILL `kill_after` s later; no agent there again."""
        with self._lock:
            self.deleted.add(host)
            self.events.append({"event": "delete_pod", "host": host, "t": time.time()})

    def node_dies(self, host: str, worker_pids: list[int]) -> int:
        """The host's node dies: SIGKILL its agent, the agent's descendants and the given
        workers of this host (those still alive); no agent there again. How many died."""
        import psutil  # installed with torch's and horovod's dependencies

        with self._lock:
            self.deleted.add(host)
            agent = self.agents.get(host)
            procs = []
            if agent is not None and agent.proc.poll() is None:
                with suppress(psutil.Error):
                    procs = psutil.Process(agent.proc.pid).children(recursive=True)
            pids = {p.pid for p in procs} | {p for p in worker_pids if _is_our_worker(p)}
            if agent is not None and agent.proc.poll() is None:
                agent.proc.kill()
                agent.killed = time.time()
                agent.delisted = agent.delisted or agent.killed  # no SIGTERM after this
                agent.terminated = agent.terminated or agent.killed
                pids.add(agent.proc.pid)
            for pid in pids - ({agent.proc.pid} if agent else set()):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.events.append(
                {"event": "node_died", "host": host, "killed": len(pids), "t": time.time()}
            )
            return len(pids)

    def left_of(self, host: str, worker_pids: list[int]) -> list[int]:
        """What still runs of the host: its agent's pid, the given workers still alive."""
        with self._lock:
            agent = self.agents.get(host)
            alive = [agent.proc.pid] if agent and agent.proc.poll() is None else []
        return alive + [p for p in worker_pids if _is_our_worker(p)]

    def wait_exits(self, timeout: float) -> None:
        """Start no more agents; wait for the running ones to end by themselves (the job
        finished)."""
        self.frozen = True
        deadline = time.monotonic() + timeout
        while self.agents and time.monotonic() < deadline:
            self.follow()
            time.sleep(0.01)

    def close(self, worker_pids: list[int]) -> None:
        """Stop following; end every agent still running (SIGTERM, then SIGKILL), then any of
        their workers still alive (workers run in sessions of their own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            running = list(self.agents.values())
        for agent in running:
            if agent.proc.poll() is None:
                agent.proc.send_signal(signal.SIGTERM)
        for agent in running:
            try:
                agent.proc.wait(40)  # torchrun gives its workers up to 30 s after a SIGTERM
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait(5)
            agent.log.close()
        for pid in worker_pids:
            if _is_our_worker(pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _is_our_worker(pid: int) -> bool:
    try:
        return TRAIN.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class TorchLog:
    """What the workers logged (tests/e2e/torchrun_train.py). The file only grows: each call
    reads what was appended since the last one (a benchmark polls it every 0.1 s)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read = 0  # bytes parsed so far
        self._events: list[dict[str, Any]] = []

    def events(self, kind: str | None = None, after: float = 0.0) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._read)
                new = f.read()
        except FileNotFoundError:
            new = b""
        complete = new[: new.rfind(b"\n") + 1]  # a last line without its newline is unfinished
        self._events += [json.loads(line) for line in complete.splitlines() if line.strip()]
        self._read += len(complete)
        return [e for e in self._events if (kind is None or e["event"] == kind) and e["t"] > after]

    def world(self, size: int, after: float) -> list[dict[str, Any]]:
        """`resume` events of a world of `size` after `after`, one per rank once complete."""
        return [e for e in self.events("resume", after) if e["size"] == size]

    def steps(self, size: int, after: float) -> list[dict[str, Any]]:
        return [e for e in self.events("step", after) if e["size"] == size]

    def complete_world(self, size: int, after: float) -> list[dict[str, Any]]:
        """The first world of `size` resumed after `after`, once all its ranks resumed."""
        ranks = {e["rank"]: e for e in self.world(size, after)}
        return list(ranks.values()) if len(ranks) == size else []

    def pids_of(self, host: str) -> list[int]:
        """The worker processes that ran on `host`."""
        return sorted({e["pid"] for e in self.events() if e["host"] == host})

    def pids(self) -> list[int]:
        return sorted({e["pid"] for e in self.events()})


def wait(
    predicate: Callable[[], Any], timeout: float, what: str, diagnose: Callable[[], str]
) -> float:
    """Poll every 5 ms; the wall time at which `predicate` first held; AssertionError (with the
    diagnostics) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{diagnose()}")
        time.sleep(0.005)
    return time.time()


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(missing)"
    return f"--- {path.name} (tail)\n" + "\n".join(text.splitlines()[-lines:])
