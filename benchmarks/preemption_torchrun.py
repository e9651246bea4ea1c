"""preemption.py --framework torchrun: what the checkpoint signal saves a real torchrun job.

Per noticed preemption of one of the job's hosts, with the signal and without it.

A real elastic torchrun job (torch CPU, gloo, c10d rendezvous over a TCPStore of its own on
loopback) trains tests/e2e/torchrun_train.py on 3 pseudo-hosts (node-a, node-b, node-c: one
torchrun agent each, $SPOT_AUTOSCALER_HOST naming it), run by tests/support/torchrun_job.py's
Operator: one agent per host listed in a hosts file. Every mode runs the same loop: one
all_reduce of the flags per step, and a checkpoint every K steps (`--checkpoint-every`, 100),
saved the same way whatever asks for it (rank 0 torch.save to a temp file, os.replace, then
every rank passes a barrier; each `checkpoint` event carries its `save_s`). A seeded victim
gets a notice `lead` s before its node dies (every process of it SIGKILLed); no replacement
comes. Three ways:

- spot-autoscaler: the real `spot-autoscaler run` in standalone mode owns the hosts file (the
  Operator follows it) and reads the notice from its notice directory; it writes the checkpoint
  signal (`<hosts file>.notice`, autoscaler.notice) and drains the host. The training processes
  hear it at their next step (E2E_SIGNALS=notice,sigterm): rank 0 saves that step; the notified
  rank then waits for its pod's SIGTERM, at most until the notice's deadline, and exits 143
  (E2E_LEAVE=sigterm, as docs/examples/torchrun_checkpoint_on_notice.py). The Operator SIGTERMs
  the drained host's agent 1 s after the host left the file (POD_DELETE_S: the pod deleted after
  the drain), SIGKILLs it `--grace` s later (the pod's terminationGracePeriodSeconds, 30 s: the
  Kubernetes default), and the node dies at the lead.
- periodic: no signal (E2E_SIGNALS empty: no notice file, no SIGTERM handler); the hosts file
  never changes; the node dies at the lead. Only the periodic checkpoints save anything.
- evict-1s: a node termination handler deletes the victim's pod 1 s after the notice: SIGTERM to
  its agent, which torchrun forwards to the worker (E2E_SIGNALS=sigterm: the flag, a save at the
  next step, exit 143); SIGKILL `--grace` s later; the node dies at the lead. No notice file.

The node's death kills what is left of the victim (its agent, the agent's descendants, its
workers). When nothing of it runs any more and the survivors have trained `--settle-steps` steps
again, the death can change nothing: the run then ends without waiting for it (`death.noop`).
Otherwise the run waits for it, then for the survivors' recovery (at most `--recover` s).

The step clock: each step sleeps `--step-seconds` (0.05 s) after its compute and all_reduces; the
rate it really makes on the machine (rank 0's `step` events, steps/s) is measured in every run,
before the notice (3 workers) and after the recovery (2); a lost step is that much redone work.
The notice comes `--warm` s after the job trained on its 3 hosts, plus a seeded fraction of one
checkpoint interval at the measured rate, so the node dies at a uniformly drawn point of a
checkpoint interval (the same victim and fraction for every mode of one run index and lead).

Per preemption (from rank 0's `step`, `resume`, `started`, `checkpoint` events; measure()):
- steps lost: for each gap in rank 0's steps that holds a restart, the last step done before it
  minus the step the new world resumed from (the steps the survivors redo), summed;
- stall s: those gaps' lengths (last step before to first step after: no step completed), summed;
- restarts: torchrun worker-group restarts after the notice: worker starts on a surviving host
  (the most of any survivor); `restart_count_used`: of them, the ones that consumed one of
  --max-restarts (TORCHELASTIC_RESTART_COUNT);
- and: notice to checkpoint, what set the victim's flag, notice to the survivors' resume, save_s.

    .venv/bin/python benchmarks/preemption.py --framework torchrun --leads 30 --runs 1  # ~3 min
    .venv/bin/python benchmarks/preemption.py --framework torchrun --json t.json    # ~20 min

`--json FILE`: every run and the aggregate per mode and lead (median, min and max over the runs),
rewritten after every run. Runs and their logs stay under `--keep DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autoscaler.notice import STANDALONE_SUFFIX  # noqa: E402
from benchmarks.preemption import Paused, nap, spread, unpaused  # noqa: E402
from tests.support.horovod_job import standalone_config, started  # noqa: E402
from tests.support.torchrun_job import (  # noqa: E402
    BIN,
    HOSTS,
    Operator,
    Store,
    TorchLog,
    missing,
    torch_version,
    torchrun,
    train_env,
    write_notice,
)

MODES = ("spot-autoscaler", "periodic", "evict-1s")
SIGNALS = {"spot-autoscaler": "notice,sigterm", "periodic": "", "evict-1s": "sigterm"}
EVICT_AFTER_S = 1.0  # the node handler's pod deletion after the notice
POD_DELETE_S = 1.0  # the drained host's pod deleted after the drain: its agent's SIGTERM
SIZE = len(HOSTS)
FIGURES = ("steps_lost", "stall_s", "restarts")


@dataclass(frozen=True)
class Settings:
    checkpoint_every: int = 100
    step_seconds: float = 0.05
    grace: float = 30.0
    warm: float = 5.0
    settle_steps: int = 20
    recover: float = 120.0
    ready_timeout: float = 300.0
    join_grace: str = "30s"  # the daemon's (policy and standalone): its default


# --------------------------------------------------------------------------- measuring
def rate(steps: list[dict[str, Any]], size: int, since: float, until: float) -> float | None:
    """Steps per second rank 0 made with `size` workers between `since` and `until`."""
    mine = [s for s in steps if s["size"] == size and since <= s["t"] <= until]
    if len(mine) < 2 or mine[-1]["t"] <= mine[0]["t"]:
        return None
    return round((mine[-1]["step"] - mine[0]["step"]) / (mine[-1]["t"] - mine[0]["t"]), 2)


def gaps(events: list[dict[str, Any]], after: float) -> list[dict[str, Any]]:
    """Every gap in rank 0's steps that holds a restart (a rank-0 `resume`) after `after`: the
    last step before it, the step the last world formed in it resumed from, the first step
    after it (None: the job never stepped again)."""
    steps = sorted((e for e in events if e["event"] == "step"), key=lambda e: e["t"])
    by_gap: dict[int, list[dict[str, Any]]] = {}
    for r in events:
        if r["event"] != "resume" or r["rank"] != 0 or r["t"] <= after:
            continue
        before = sum(1 for s in steps if s["t"] < r["t"])
        if before:
            by_gap.setdefault(before - 1, []).append(r)
    out = []
    for i, worlds in sorted(by_gap.items()):
        last, resumed = steps[i], max(worlds, key=lambda e: e["t"])
        first = steps[i + 1] if i + 1 < len(steps) else None
        out.append(
            {
                "t": last["t"],
                "last_step_before": last["step"],
                "resumed_at_step": resumed["step"],
                "steps_lost": max(0, last["step"] - resumed["step"]),
                "stall_s": None if first is None else round(first["t"] - last["t"], 3),
                "world": [last["size"], resumed["size"]],
                "worlds_formed": len(worlds),
                "resumed_t": resumed["t"],
                "first_step_t": None if first is None else first["t"],
            }
        )
    return out


def restarts(events: list[dict[str, Any]], victim: str, after: float) -> tuple[int, int]:
    """Worker-group restarts after `after` (worker starts on a surviving host, the most of any
    survivor), and how many of them used one of --max-restarts (TORCHELASTIC_RESTART_COUNT)."""
    survivors = [e for e in events if e["host"] != victim]
    starts: dict[str, int] = {}
    for e in survivors:
        if e["event"] == "started" and e["t"] > after:
            starts[e["host"]] = starts.get(e["host"], 0) + 1
    count = [e["restart"] for e in survivors if e["event"] == "resume"]
    before = [e["restart"] for e in survivors if e["event"] == "resume" and e["t"] <= after]
    used = max(count, default=0) - max(before, default=0)
    return max(starts.values(), default=0), used


def measure(
    events: list[dict[str, Any]], victim: str, ready: float, notice: float, end: float
) -> dict[str, Any]:
    """One preemption's figures from the train log's events (tests/e2e/torchrun_train.py). A
    job that never stepped again after a restart (or never restarted) did not recover: no
    steps-lost or stall figure (None; a 0 would read as a graceful run)."""
    steps = [e for e in events if e["event"] == "step"]
    found = gaps(events, notice)
    recovered = bool(found) and all(g["stall_s"] is not None for g in found)
    group_restarts, used = restarts(events, victim, notice)
    before = rate(steps, SIZE, ready, notice)
    lost = sum(g["steps_lost"] for g in found) if recovered else None
    saves = [e for e in events if e["event"] == "checkpoint"]
    signalled = [c for c in saves if c["t"] > notice and c.get("why") == "signal"]
    flag = [e for e in events if e["event"] == "signal" and e["host"] == victim and e["t"] > notice]
    return {
        "recovered": recovered,
        "steps_lost": lost,
        "stall_s": round(sum(g["stall_s"] for g in found), 3) if recovered else None,
        "restarts": group_restarts,
        "restart_count_used": used,
        "lost_s": round(lost / before, 2) if lost is not None and before else None,
        "steps_per_s": {
            "before": before,
            "after": rate(steps, SIZE - 1, found[-1]["resumed_t"], end) if recovered else None,
        },
        "notice_to_resumed_s": _since(found[-1]["resumed_t"] if found else None, notice),
        "notice_to_first_step_s": _since(found[-1]["first_step_t"] if recovered else None, notice),
        "signal_checkpoint": {
            "after_s": _since(signalled[0]["t"], notice),
            "step": signalled[0]["step"],
        }
        if signalled
        else None,
        "victim_flag": {"via": flag[0]["via"], "after_s": _since(flag[0]["t"], notice)}
        if flag
        else None,
        "save_s": _median([c.get("save_s") for c in saves]),
        "checkpoints": {
            why: sum(1 for c in saves if c.get("why", "signal") == why)
            for why in ("periodic", "signal")
        },
        "gaps": [{k: v for k, v in g.items() if not k.endswith("_t")} for g in found],
    }


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else round(t - start, 3)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode and lead: median, min and max over the runs of each figure (a run that did not
    recover has no steps-lost or stall figure: counted in `recovered`, not in the spread)."""
    cells: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in runs:
        cells.setdefault((r["mode"], r["lead_s"]), []).append(r)
    out = []
    for (mode, lead), mine in sorted(cells.items(), key=lambda c: (c[0][1], MODES.index(c[0][0]))):
        out.append(
            {
                "mode": mode,
                "lead_s": lead,
                "runs": len(mine),
                "recovered": sum(r["recovered"] for r in mine),
                "zero_steps_lost": sum(r["steps_lost"] == 0 for r in mine),
                **{k: spread([r[k] for r in mine]) for k in (*FIGURES, "lost_s")},
                "steps_per_s_before": spread([r["steps_per_s"]["before"] for r in mine]),
                "save_s": spread([r["save_s"] for r in mine]),
            }
        )
    return out


def fmt(s: dict[str, float | None], digits: int = 1) -> str:
    if s["median"] is None:
        return "-"
    lo, mid, hi = (f"{s[k]:.{digits}f}" for k in ("min", "median", "max"))
    return mid if lo == hi else f"{mid} ({lo}-{hi})"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| lead | mode | steps lost | stall s | restarts | 0 lost | recovered | steps/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['lead_s']:g} s | {r['mode']} | {fmt(r['steps_lost'], 0)} | "
            f"{fmt(r['stall_s'])} | {fmt(r['restarts'], 0)} | {r['zero_steps_lost']}/{r['runs']} "
            f"| {r['recovered']}/{r['runs']} | {fmt(r['steps_per_s_before'])} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- one run
class Job:
    """The store, the daemon (spot-autoscaler mode), the Operator and their files in `tmp`."""

    def __init__(self, tmp: Path, mode: str, lead: float, settings: Settings) -> None:
        self.tmp, self.mode, self.lead, self.settings = tmp, mode, lead, settings
        self.log = TorchLog(tmp / "train.log")
        self.hosts = tmp / "hosts"
        self.notices = tmp / "notices"
        self.notice_file = tmp / f"hosts{STANDALONE_SUFFIX}"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.operator: Operator | None = None

    def env(self) -> dict[str, str]:
        return train_env(
            self.tmp,
            self.notice_file if self.mode == "spot-autoscaler" else None,
            E2E_SIGNALS=SIGNALS[self.mode],
            E2E_CKPT_EVERY=str(self.settings.checkpoint_every),
            E2E_LEAVE="sigterm",
            E2E_STEP_SECONDS=str(self.settings.step_seconds),
        )

    def start(self, stack: ExitStack) -> float:
        """Everything up; the wall time at which the job trained on its 3 hosts."""
        env = self.env()
        store = Store(self.tmp / "store.log", env)
        stack.callback(store.close)
        if self.mode == "spot-autoscaler":
            config = standalone_config(
                self.tmp / "config.yaml", HOSTS, self.tmp, SIZE, self.settings.join_grace
            )
            cmd = [str(BIN / "spot-autoscaler"), "run", "--config", str(config)]
            out = self.tmp / "decisions.jsonl"
            self.daemon = stack.enter_context(started(cmd, self.tmp / "daemon.log", env, out))
            self.wait(lambda: _listed(self.hosts) == HOSTS, 60, "the daemon's hosts file")
        else:  # the operator's pods, one per host, for good
            self.hosts.write_text("".join(f"{h}:1\n" for h in HOSTS))
        self.operator = operator = Operator(
            self.hosts,
            torchrun(store.port, SIZE),
            env,
            self.tmp,
            sigterm_delay=POD_DELETE_S if self.mode == "spot-autoscaler" else 0.0,
            kill_after=self.settings.grace,
        )
        stack.callback(lambda: operator.close(self.log.pids()))
        operator.start()
        n = self.settings.settle_steps
        return self.wait(
            lambda: self.log.complete_world(SIZE, 0) and len(self.log.steps(SIZE, 0)) >= n,
            self.settings.ready_timeout,
            f"the job to train on its {SIZE} hosts",
        )

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> float:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.daemon is not None and self.daemon.poll() is not None:
                raise RuntimeError(f"the daemon exited ({self.daemon.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what} in {self.tmp}")
            nap(0.05)
        return time.time()

    def recovered(self, notice: float) -> bool:
        """The survivors formed their world after `notice` and trained settle_steps in it."""
        world = self.log.complete_world(SIZE - 1, notice)
        if not world:
            return False
        since = min(e["t"] for e in world)
        return len(self.log.steps(SIZE - 1, since)) >= self.settings.settle_steps

    def stop(self) -> dict[str, int | None]:
        """The stop file: every rank agrees through the flags and the agents finish."""
        assert self.operator is not None
        running = list(self.operator.agents)
        (self.tmp / "stop").touch()
        self.operator.wait_exits(60)
        return {
            h: self.operator.agent_exits(h)[-1].returncode if self.operator.agent_exits(h) else None
            for h in running
        }


def _listed(path: Path) -> list[str]:
    try:
        return [line.split(":")[0] for line in path.read_text().split()]
    except FileNotFoundError:
        return []


def preempt(job: Job, victim: str, notice: float) -> dict[str, Any]:
    """From the notice at `notice` to the survivors' recovery (or `recover` s after the node's
    death without one): the pod deletion (evict-1s), the death at the lead."""
    assert job.operator is not None
    operator, settings = job.operator, job.settings
    death = notice + job.lead
    evict = notice + EVICT_AFTER_S if job.mode == "evict-1s" else None
    killed: int | None = None
    while True:
        now = time.time()
        if evict is not None and now >= evict:
            operator.delete_pod(victim)
            evict = None
        if killed is None and now >= death:
            killed = operator.node_dies(victim, job.log.pids_of(victim))
        back = job.recovered(notice)
        left = operator.left_of(victim, job.log.pids_of(victim))
        if back and (killed is not None or (evict is None and not left)):
            break
        if now > death + settings.recover:
            break  # never recovered: died or hung
        nap(0.1)
    return {"recovered_in_run": back, "death": {"noop": not killed, "killed": killed or 0}}


def run_once(
    tmp: Path, mode: str, lead: float, victim: str, phase: float, settings: Settings
) -> dict[str, Any]:
    """One job, one noticed preemption of `victim`, in one mode; the measured run."""
    job = Job(tmp, mode, lead, settings)
    began = time.monotonic()
    with ExitStack() as stack:
        ready = job.start(stack)
        setup_s = time.monotonic() - began
        job.wait(lambda: time.time() >= ready + settings.warm, settings.warm + 5, "warm")
        steps_per_s = rate(job.log.events("step"), SIZE, ready, time.time()) or 1.0
        at = time.time() + phase * settings.checkpoint_every / steps_per_s
        job.wait(lambda: time.time() >= at, at - time.time() + 5, "the notice")
        notice = time.time()
        if mode == "spot-autoscaler":
            deadline = datetime.fromtimestamp(notice + lead, UTC)
            write_notice(job.notices, victim, deadline, "preempted")
        outcome = preempt(job, victim, notice)
        end = time.time()
        exit_codes = job.stop() if outcome["recovered_in_run"] else {}
    assert job.operator is not None
    result = measure(job.log.events(), victim, ready, notice, end)
    return {
        "mode": mode,
        "lead_s": lead,
        "victim": victim,
        **result,
        **outcome,
        "victim_agent": _agent_times(job.operator, victim, notice),
        "notice_to_notice_file_s": _since(_mtime(job.notice_file), notice),
        "exit_codes": exit_codes,
        "setup_s": round(setup_s, 1),
        "wall_s": round(time.monotonic() - began, 1),
    }


def _agent_times(operator: Operator, host: str, notice: float) -> dict[str, Any]:
    """What the Operator did to the victim's agent, seconds after the notice."""
    out: dict[str, Any] = {}
    for e in operator.events:
        if e["host"] == host and e["t"] > notice and e["event"] not in out:
            out[e["event"]] = _since(e["t"], notice)
            if "code" in e:
                out["exit_code"] = e["code"]
    return out


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------- the series
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="preemption.py --framework torchrun", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--runs", type=int, default=3, help="of each mode and lead")
    ap.add_argument("--leads", default="30,120", help="notice lead times, s, comma separated")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--checkpoint-every", type=int, default=Settings.checkpoint_every)
    ap.add_argument("--step-seconds", type=float, default=Settings.step_seconds)
    ap.add_argument(
        "--grace", type=float, default=Settings.grace, help="terminationGracePeriodSeconds"
    )
    ap.add_argument("--warm", type=float, default=Settings.warm)
    ap.add_argument("--settle-steps", type=int, default=Settings.settle_steps)
    ap.add_argument("--recover", type=float, default=Settings.recover)
    ap.add_argument("--join-grace", default=Settings.join_grace, help="the daemon's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="every run and the aggregate, rewritten each run")
    ap.add_argument("--keep", type=Path, help="keep each run's files (logs) under this directory")
    args = ap.parse_args(argv)
    args.leads = [float(x) for x in args.leads.split(",")]
    args.modes = args.modes.split(",")
    if bad := {*args.modes} - {*MODES}:
        ap.error(f"unknown modes: {sorted(bad)}")
    return args


def plan(seed: int, run: int, lead: float) -> tuple[str, float]:
    """The victim (per run index) and where in a checkpoint interval the notice falls (per run
    index and lead): the same for every mode."""
    return random.Random(f"{seed}:{run}").choice(HOSTS), random.Random(
        f"{seed}:{run}:{lead:g}"
    ).random()


class Results:
    def __init__(self, args: argparse.Namespace, settings: Settings) -> None:
        self.args, self.settings = args, settings
        self.runs: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.began = time.monotonic()
        self.loads = [os.getloadavg()[0]]
        self.torch = torch_version()

    def add(self, r: dict[str, Any]) -> None:
        self.runs.append(r)
        self.loads.append(os.getloadavg()[0])
        self.write()

    def write(self) -> None:
        if self.args.json:
            report = {
                "command": " ".join(sys.argv),
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "torch": self.torch,
                },
                "load_average_1min": {"min": min(self.loads), "max": max(self.loads)},
                "settings": asdict(self.settings),
                "wall_s": round(time.monotonic() - self.began, 1),
                "aggregate": aggregate(self.runs),
                "not_run": self.failed,
                "runs": self.runs,
            }
            self.args.json.write_text(json.dumps(report, indent=2) + "\n")

    def text(self) -> str:
        wall = (time.monotonic() - self.began) / 60
        return (
            f"{table(aggregate(self.runs))}\n\n{len(self.runs)} runs ({len(self.failed)} more "
            f"not run) in {wall:.1f} min on {os.cpu_count()} cores, torch {self.torch}; 1-min "
            f"load average {min(self.loads):.1f} to {max(self.loads):.1f} (after each run)"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if why := missing():
        print(f"preemption --framework torchrun: {why}", file=sys.stderr)
        return 2
    settings = Settings(
        checkpoint_every=args.checkpoint_every,
        step_seconds=args.step_seconds,
        grace=args.grace,
        warm=args.warm,
        settle_steps=args.settle_steps,
        recover=args.recover,
        join_grace=args.join_grace,
    )
    results = Results(args, settings)
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            top = tempfile.mkdtemp(prefix="preemption-torchrun-", dir=args.keep)
        else:
            top = stack.enter_context(tempfile.TemporaryDirectory(prefix="preemption-torchrun-"))
        for lead, i, mode in product(args.leads, range(args.runs), args.modes):
            victim, phase = plan(args.seed, i, lead)
            what = f"run {i}: lead {lead:g} s {mode} (victim {victim})"
            once = partial(
                run_once, mode=mode, lead=lead, victim=victim, phase=phase, settings=settings
            )
            try:
                r = unpaused(what, top, once)
            except (RuntimeError, Paused) as e:  # never trained on its hosts, or stopped
                results.failed.append({"run": i, "mode": mode, "lead_s": lead, "error": str(e)})
                _say(f"{what}: not run: {e}")
                continue
            r["run"] = i
            results.add(r)
            _say(
                f"{what}: steps lost {r['steps_lost']}, stall {r['stall_s']} s, restarts "
                f"{r['restarts']}, {r['steps_per_s']['before']} steps/s ({r['wall_s']} s)"
            )
    print(results.text())
    return 0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
