"""What a drain saves in real Horovod: preemptions with a notice, against et-operator alone.

A real elastic `horovodrun` (torch CPU + Gloo) trains tests/e2e/elastic_train.py on 3 local
pseudo-hosts (names of this machine: localhost, 127.0.0.1, the hostname, its other addresses and
/etc/hosts aliases; tests/support/horovod_job.py), committing every 10 steps of ~0.1 s. A seeded
schedule preempts hosts: each preemption posts a notice for its victims, whose nodes die `lead`
seconds later (their worker processes are SIGKILLed), and brings replacement hosts. The same
schedule and seed run three ways:

- spot-autoscaler: the real `spot-autoscaler run` in standalone mode owns the discovery file
  (horovodrun runs the shipped owned_hosts.sh over it). A notice is a file in its notice
  directory (with the deadline); a host that is not there (a replacement not yet up, a dead
  node) has one too, so the daemon places no worker on it; a replacement comes up by removing
  its file. The daemon drains the victims and adds the replacements itself. Its config is
  tests/support/horovod_job.py standalone_config: the e2e test's (a 2 s tick, notices read every
  0.1 s, no scale-out cooldown or min_idle) but join_grace at its default, 30 s.
- et-operator: nothing reacts to the notice. When the victims die, their pods leave Running and
  et-operator rewrites the hostfile in place (worker.go handleWorkersFailed; `echo '<lines>' >
  hostfile`, scaleout_controller.go hostfileUpdateScript) without them and, its restartPolicy
  Always recreating each lost worker as a new pod, with the replacements. Its own delay: none
  (OPERATOR_DELAY_S): its TrainingJob controller is woken by the watch on the pods it owns
  (trainingjob_controller.go SetupWithManager: Owns(&corev1.Pod{})); the 5 s of main.go
  jobPollInterval only paces requeues; the exec's own latency is not modelled. The pod is taken
  as gone when its processes die, which is kind: a dead node's pods stay Running in the API
  until Kubernetes gives up on the node. horovodrun runs et-operator's own discovery script
  (resource.go getDiscoverHostContent: `while read line; do echo $line; done < hostfile`).
- evict-1s: a node handler evicts the victims' pods 1 s after the notice (NTH, or Karpenter
  without our eviction guard): their processes die then, and et-operator rewrites the hostfile
  as above.

Every mode runs horovodrun with `--blacklist-cooldown-range 1 2`: a failed host's name may come
back later as a new node (on Kubernetes a new pod has a new name; here the names are few).

Schedules: `one-host` (N preemptions of one host, one replacement each), `two-hosts` (one of two
hosts at once, two replacements), `every-host` (one of every host of the job, one replacement).
The replacements come up when the victims die, in every mode alike, except every-host's, which is
up from the notice on (else nothing could take the state over); `--early-replacements` brings
them all up at the notice. The first notice comes `warm` s after the job trains on all its hosts;
each next one `settle` s after the job trained again on as many hosts as the schedule leaves it,
never before the last victims died (a job that has not by `recover` s after that has died or
hung: the run ends there); the run ends `settle` s after the last recovery.

Per preemption: steps rolled back (per reset, the last step logged before it minus the step it
resumed from), seconds without progress (per reset, the last step before it to the first step
after it, summed; none if the job never trained again), resets (each world re-formed: one rank-0
`resume`), each classed graceful, join (a new worker took part), failure (a rank restored the
last commit) or failure+join. Per run: survived (horovodrun still running at the end, every
preemption recovered, exit 0 on the stop file) and progress per second (the step reached at the
end minus the step at the start, over the time) relative to a run without preemptions
(et-operator's setup, no schedule, `baseline_s` long) of the same run index.

    .venv/bin/python benchmarks/preemption.py --quick --json preemption.json   # ~5 min
    .venv/bin/python benchmarks/preemption.py --json preemption.json   # 3 runs of all: hours

`--framework torchrun` measures a real torchrun job instead (benchmarks/preemption_torchrun.py:
its own modes, leads and options); `--framework horovod`, the default, is this module.

A run the machine stopped (one of its waits of at most 0.1 s took over 3 s: SIGSTOP on a shared
machine) has no valid timing: it is abandoned at once and run again, 3 attempts at most.

`--json FILE` writes one row per mode, lead time and schedule (medians over the runs; the stall
is the median per preemption; survived only if every run survived), `--details FILE` every run,
preemption and reset; both are rewritten after every run. Runs and their logs stay under
`--keep DIR`. Three runs by default (`--runs`), one with `--quick` (lead 5 s, one-host x1).
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autoscaler.adapters.discovery.scripts import OWNED_SCRIPT, script_path  # noqa: E402
from autoscaler.notice import STANDALONE_SUFFIX  # noqa: E402
from tests.support.horovod_job import (  # noqa: E402
    BIN,
    TrainLog,
    horovodrun,
    local_hosts,
    missing,
    operator_writes,
    standalone_config,
    started,
    train_env,
    worker_processes,
)

FRAMEWORKS = ("horovod", "torchrun")  # torchrun: benchmarks/preemption_torchrun.py
MODES = ("spot-autoscaler", "et-operator", "evict-1s")
SCHEDULES = ("one-host", "two-hosts", "every-host")
REPLACEMENTS = {"one-host": 1, "two-hosts": 2, "every-host": 1}
EVICT_AFTER_S = 1.0
# et-operator's own delay from a pod leaving Running to the hostfile rewrite: its controller is
# woken by the pod's watch event (see the module docstring); the exec's latency is not modelled.
OPERATOR_DELAY_S = 0.0
ET_OPERATOR_DISCOVERY = "#!/bin/bash\nwhile read line\ndo\necho $line\ndone < {hostfile}\n"
COOLDOWN = ("--blacklist-cooldown-range", "1", "2")
# A wait of a run's loops (0.1 s at most) that took this long: the machine stopped the run's
# processes (SIGSTOP on a shared machine), and every wall-clock figure of the run with them.
PAUSED_AFTER_S = 3.0
ATTEMPTS = 3  # of a run the machine stopped


class Paused(RuntimeError):
    """The run's processes were stopped for a while: its timings mean nothing."""


def nap(seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
    """time.sleep, raising Paused when it took far longer (see PAUSED_AFTER_S)."""
    start = clock()
    time.sleep(seconds)
    if (took := clock() - start) > PAUSED_AFTER_S:
        raise Paused(f"a {seconds:.2f} s wait took {took:.1f} s: the run was stopped")


@dataclass(frozen=True)
class Preemption:
    victims: tuple[str, ...]
    replacements: tuple[str, ...]
    early: bool  # the replacements are there from the notice on (else from the victims' death)


@dataclass(frozen=True)
class Settings:
    hosts: int = 3
    preemptions: int = 3
    commit_every: int = 10
    step_seconds: float = 0.1
    warm: float = 5.0
    settle: float = 5.0
    recover: float = 120.0
    baseline_s: float = 60.0
    ready_timeout: float = 300.0
    join_grace: str = "30s"  # the daemon's (policy and standalone): its default
    # spot-autoscaler's runs read its checkpoint signal (<discovery file>.notice) and commit at
    # the next step (elastic_train.py E2E_COMMIT_ON_NOTICE)
    commit_on_notice: bool = False


def schedule(
    kind: str, pool: Sequence[str], size: int, n: int, seed: int, early: bool = False
) -> list[Preemption]:
    """The preemptions of one schedule: victims drawn (seeded) from the job's hosts as the
    schedule leaves them, replacements taken from the hosts free longest (dead nodes come back
    last, as new nodes). every-host's replacement is there from the notice on (else nothing
    could take the state over); the others' when the victims die, unless `early`."""
    rng = random.Random(f"{seed}:{kind}")
    job, free = list(pool[:size]), list(pool[size:])
    out = []
    for _ in range(n if kind == "one-host" else 1):
        if kind == "one-host":
            victims = [rng.choice(job)]
        elif kind == "two-hosts":
            victims = rng.sample(job, 2)
        else:
            victims = list(job)
        replacements, free = free[: REPLACEMENTS[kind]], free[REPLACEMENTS[kind] :]
        job = [h for h in job if h not in victims] + replacements
        free += victims
        out.append(Preemption(tuple(victims), tuple(replacements), early or kind == "every-host"))
    return out


# --------------------------------------------------------------------------- one run
@dataclass
class Job:
    """One horovodrun and the files around it, in one mode."""

    tmp: Path
    mode: str
    settings: Settings
    pool: list[str]
    log: TrainLog = field(init=False)
    horovod: subprocess.Popen[bytes] | None = None
    listed: list[str] = field(default_factory=list)  # et-operator's hostfile, as it wrote it

    def __post_init__(self) -> None:
        self.log = TrainLog(self.tmp / "train.log")
        self.notices = self.tmp / "notices"
        self.hostfile = self.tmp / "hostfile"

    def env(self) -> dict[str, str]:
        signal = self.settings.commit_on_notice and self.mode == "spot-autoscaler"
        return train_env(
            self.log.train_log,
            self.tmp / "stop",
            E2E_COMMIT_EVERY=str(self.settings.commit_every),
            E2E_STEP_SECONDS=str(self.settings.step_seconds),
            **(
                {
                    "E2E_COMMIT_ON_NOTICE": "1",
                    "SPOT_AUTOSCALER_NOTICE_FILE": str(self.tmp / f"hosts{STANDALONE_SUFFIX}"),
                }
                if signal
                else {}
            ),
        )

    @contextmanager
    def running(self) -> Iterator[float]:
        """Start the discovery side and horovodrun; yields when all hosts train (wall time)."""
        size, env = self.settings.hosts, self.env()
        with ExitStack() as stack:
            if self.mode == "spot-autoscaler":
                discovery = self._start_daemon(stack, env)
            else:
                script = self.tmp / "discover_hosts.sh"
                script.write_text(ET_OPERATOR_DISCOVERY.format(hostfile=self.hostfile))
                script.chmod(0o755)
                self.listed = self.pool[:size]
                operator_writes(self.hostfile, self.listed)
                discovery = str(script)
            cmd = horovodrun(size, discovery, max_np=size, extra=COOLDOWN)
            self.horovod = stack.enter_context(started(cmd, self.tmp / "horovodrun.log", env))
            yield self._wait(
                lambda: len(self.log.world(size, 0)) >= size and len(self.log.events("step")) >= 10,
                self.settings.ready_timeout,
                "the job to train on all its hosts",
            )

    def _start_daemon(self, stack: ExitStack, env: dict[str, str]) -> str:
        size = self.settings.hosts
        self.notices.mkdir()
        for host in self.pool[size:]:
            self.notice(host, "unavailable")
        config = standalone_config(
            self.tmp / "config.yaml", self.pool, self.tmp, size, self.settings.join_grace
        )
        daemon = [str(BIN / "spot-autoscaler"), "run", "--config", str(config)]
        out = self.tmp / "decisions.jsonl"
        stack.enter_context(started(daemon, self.tmp / "daemon.log", env, stdout=out))
        owned = self.tmp / "hosts"
        self._wait(lambda: _hosts_in(owned) == set(self.pool[:size]), 60, "the daemon's file")
        return f"{script_path(OWNED_SCRIPT)} {owned}"

    def _wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> float:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.horovod is not None and self.horovod.poll() is not None:
                raise RuntimeError(f"horovodrun exited ({self.horovod.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what} in {self.tmp}")
            nap(0.05)
        return time.time()

    def alive(self) -> bool:
        return self.horovod is not None and self.horovod.poll() is None

    def exit_code(self) -> int | None:
        return None if self.horovod is None else self.horovod.poll()

    def sleep_until(self, when: float) -> None:
        while self.alive() and time.time() < when:
            nap(min(0.02, max(0.0, when - time.time())))

    def trains_on(self, size: int, after: float, timeout: float) -> float | None:
        """When rank 0 first logged a step with `size` ranks after `after` (waiting until then
        and at most `timeout` s after it), or None."""
        self.sleep_until(after)
        deadline = after + timeout
        while self.alive() and time.time() < deadline:
            for s in self.log.events("step", after):
                if s["size"] == size:
                    return float(s["t"])
            nap(0.1)
        return None

    # --- what the world does to the job
    def notice(self, host: str, why: str, deadline: float | None = None) -> None:
        body: dict[str, str] = {"kind": "interruption", "id": why}
        if deadline is not None:
            body["deadline"] = datetime.fromtimestamp(deadline, UTC).isoformat()
        tmp = self.notices / f".{host}.tmp"
        tmp.write_text(json.dumps(body))
        tmp.rename(self.notices / f"{host}.json")

    def available(self, host: str) -> None:
        (self.notices / f"{host}.json").unlink(missing_ok=True)

    def kill(self, hosts: Sequence[str]) -> int:
        """The nodes die: SIGKILL every worker process Horovod started for these hosts."""
        assert self.horovod is not None
        killed = 0
        for host, procs in worker_processes(self.horovod).items():
            for p in procs if host in hosts else ():
                with suppress(Exception):  # gone already (psutil.NoSuchProcess)
                    p.kill()
                    killed += 1
        return killed

    def operator_replaces(self, p: Preemption) -> None:
        """et-operator: the victims' pods left Running, the recreated ones run on the
        replacements; it rewrites the hostfile in place."""
        self.listed = [h for h in self.listed if h not in p.victims] + list(p.replacements)
        operator_writes(self.hostfile, self.listed)

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ask the ranks to stop (they agree through an allreduce); horovodrun's exit code."""
        assert self.horovod is not None
        (self.tmp / "stop").touch()
        try:
            return self.horovod.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def _hosts_in(path: Path) -> set[str]:
    try:
        return {line.split(":")[0] for line in path.read_text().split()}
    except FileNotFoundError:
        return set()


def sizes_after(plan: list[Preemption], size: int) -> list[int]:
    """The job's hosts once each preemption's replacements run."""
    out, n = [], size
    for p in plan:
        n = min(size, n - len(p.victims) + len(p.replacements))
        out.append(n)
    return out


def run_once(
    tmp: Path, mode: str, plan: list[Preemption], lead: float, settings: Settings, pool: list[str]
) -> dict[str, Any]:
    """One horovodrun through the schedule in one mode; the measured run.

    Preemption i's notice comes `warm` s after the job trains on all its hosts, then each next
    one `settle` s after the job trained again on as many hosts as the schedule leaves it (at
    most `recover` s after the victims died); the run ends `settle` s after the last recovery.
    """
    job = Job(tmp, mode, settings, pool)
    started_at = time.monotonic()
    done: list[tuple[float, str, list[str]]] = []
    notices: list[float] = []
    recovered: list[float | None] = []
    with job.running() as ready:
        setup_s = time.monotonic() - started_at
        at = ready + settings.warm

        def act(when: float, what: str, p: Preemption) -> None:
            job.sleep_until(when)
            if not job.alive():
                return
            if what == "notice":
                for host in p.victims:
                    job.notice(host, "preempted", deadline=when + lead)
            elif what == "available":
                for host in p.replacements:
                    job.available(host)
            elif what == "kill":
                job.kill(p.victims)
            else:
                job.operator_replaces(p)
            done.append((round(time.time() - ready, 3), what, list(p.victims)))

        for p, size in zip(plan, sizes_after(plan, settings.hosts), strict=True):
            job.sleep_until(at)
            if not job.alive():
                break
            notices.append(at)
            gone = at + (min(EVICT_AFTER_S, lead) if mode == "evict-1s" else lead)
            if mode == "spot-autoscaler":
                act(at, "notice", p)
                if p.early:  # the daemon may place workers there from now on
                    act(at, "available", p)
            act(gone, "kill", p)
            if mode != "spot-autoscaler":  # the victims' pods are gone, new ones run
                act(gone + OPERATOR_DELAY_S, "operator", p)
            elif not p.early:
                act(gone, "available", p)
            back = job.trains_on(size, after=max(gone, at + lead), timeout=settings.recover)
            recovered.append(back)
            if back is None:  # died, or hung: no point in preempting it again
                break
            at = back + settings.settle
        end = at if job.alive() and None not in recovered else time.time()
        job.sleep_until(end)
        alive_at_end = job.alive()
        # a hung job does not stop on the stop file: ended (killed) when the context exits
        exit_code = job.stop() if alive_at_end and None not in recovered else job.exit_code()
    result = measure(job.log, ready, notices, recovered, end)
    return {
        "mode": mode,
        "lead_s": lead,
        "survived": bool(alive_at_end and exit_code == 0 and None not in recovered)
        and len(recovered) == len(plan),
        "hung": alive_at_end and None in recovered,
        "exit_code": exit_code,
        "setup_s": round(setup_s, 1),
        "wall_s": round(time.monotonic() - started_at, 1),
        "actions": done,
        **result,
    }


# --------------------------------------------------------------------------- measuring
def resets(log: TrainLog, after: float) -> list[dict[str, Any]]:
    """Every reset after `after`: the world re-formed (one rank-0 `resume` each), with the last
    step logged before it, the step it resumed from, the first step after it, and its kind:
    `failure` (a rank restored the last commit), `join` (a new worker process took part: the
    others waited for it to start), both, or `graceful` (hosts left, nothing lost); for a
    failure, how long after the last step the last surviving rank saw it (`detected_s`)."""
    events = log.events()
    steps = [e for e in events if e["event"] == "step"]
    out = []
    for r in (e for e in events if e["event"] == "resume" and e["rank"] == 0 and e["t"] > after):
        before = [s for s in steps if s["t"] < r["t"]]
        later = [s for s in steps if s["t"] > r["t"]]
        if not before:
            continue
        last, first = before[-1], (later[0] if later else None)
        seen = {e["pid"] for e in events if e["t"] <= last["t"]}
        burst = [e for e in events if last["t"] < e["t"] <= (first or r)["t"]]
        rollbacks = [e["t"] for e in burst if e["event"] == "rollback"]
        failed = bool(rollbacks)
        joined = any(e["event"] == "resume" and e["pid"] not in seen for e in burst)
        kind = "+".join(k for k, v in (("failure", failed), ("join", joined)) if v) or "graceful"
        out.append(
            {
                "t": r["t"],
                "kind": kind,
                "last_step_before": last["step"],
                "resumed_at_step": r["step"],
                "rolled_back_steps": max(0, last["step"] - r["step"]),
                "stall_s": round(first["t"] - last["t"], 3) if first else None,
                "world": [last["size"], r["size"]],
                # a failure: when the last surviving rank saw it (the others' collective errors
                # at once or after the Gloo timeout)
                "detected_s": round(max(rollbacks) - last["t"], 3) if rollbacks else None,
            }
        )
    return out


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def progress_at(steps: list[dict[str, Any]], t: float) -> int:
    """The step the job had reached at `t` (its last logged step: after a rollback, lower)."""
    before = [s["step"] for s in steps if s["t"] <= t]
    return before[-1] if before else 0


def measure(
    log: TrainLog, ready: float, notices: list[float], recovered: list[float | None], end: float
) -> dict[str, Any]:
    """Per preemption (from its notice to the next one) and for the run. A preemption the job
    did not recover from has no stall and no rolled-back figure (None): it never ended, and
    it lost every step (a 0 would read as a graceful run in the medians)."""
    all_resets = resets(log, ready)
    steps = log.events("step")
    bounds = [*notices, end]
    per = []
    for i, start in enumerate(notices):
        mine = [r for r in all_resets if start <= r["t"] < bounds[i + 1]]
        stalls = [r["stall_s"] for r in mine]
        per.append(
            {
                "rolled_back_steps": None
                if recovered[i] is None
                else sum(r["rolled_back_steps"] for r in mine),
                # never recovered (the job died or hung): no end to the stall
                "stall_s": None
                if recovered[i] is None or None in stalls
                else round(sum(stalls), 3),
                "resets": len(mine),
                "reset_kinds": [r["kind"] for r in mine],
                "recovered_s": None if recovered[i] is None else round(recovered[i] - start, 2),
            }
        )
    seconds = end - ready
    return {
        "preemptions": per,
        "rolled_back_steps": None
        if None in recovered
        else sum(p["rolled_back_steps"] for p in per),
        "resets": sum(p["resets"] for p in per),
        "stall_s_median": _median([p["stall_s"] for p in per]),
        "steps_per_s": round((progress_at(steps, end) - progress_at(steps, ready)) / seconds, 3),
        "reset_log": [r for r in all_resets if r["t"] >= notices[0]],
    }


def baseline(tmp: Path, settings: Settings, pool: list[str]) -> dict[str, Any]:
    """The same job with no preemption (et-operator's setup): its progress per second."""
    job = Job(tmp, "et-operator", settings, pool)
    started_at = time.monotonic()
    with job.running() as ready:
        while job.alive() and time.time() < ready + settings.baseline_s:
            nap(0.05)
        exit_code = job.stop()
    steps = job.log.events("step")
    end = ready + settings.baseline_s
    return {
        "steps_per_s": round(
            (progress_at(steps, end) - progress_at(steps, ready)) / settings.baseline_s, 3
        ),
        "exit_code": exit_code,
        "wall_s": round(time.monotonic() - started_at, 1),
    }


# --------------------------------------------------------------------------- the matrix
def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return {"min": None, "median": None, "max": None}
    return {"min": min(known), "median": statistics.median(known), "max": max(known)}


def summarize(runs: list[dict[str, Any]], baselines: dict[int, float]) -> dict[str, Any]:
    """One mode, lead time and schedule over its runs."""
    per_preemption = [p["stall_s"] for r in runs for p in r["preemptions"]]

    relative = [  # a job that died or hung has no rate to compare
        r["steps_per_s"] / baselines[r["run"]]
        if r["survived"] and baselines.get(r["run"])
        else None
        for r in runs
    ]
    return {
        "rolled_back_steps": spread([r["rolled_back_steps"] for r in runs]),
        "stall_s": spread([r["stall_s_median"] for r in runs]),
        "stall_s_per_preemption": _median(per_preemption),
        "resets": spread([r["resets"] for r in runs]),
        "survived": sum(r["survived"] for r in runs),
        "relative_steps_per_s": spread([round(v, 3) if v else v for v in relative]),
        "runs": len(runs),
    }


def row(mode: str, lead: float, kind: str, n: int, summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's row: medians over the runs; survived only if every run survived."""
    return {
        "mode": mode,
        "lead_s": lead,
        "schedule": kind,
        "preemptions": n,
        "rolled_back_steps": summary["rolled_back_steps"]["median"],
        "stall_s": summary["stall_s_per_preemption"],
        "resets": summary["resets"]["median"],
        "survived": summary["survived"] == summary["runs"],
    }


def reset_costs(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """What one Horovod reset stalls the job, by kind, over every reset of every run, and how
    long after its last step a failure was seen by every survivor (`failure seen`)."""
    by_kind: dict[str, list[float]] = {}
    for r in runs:
        for reset in r["reset_log"]:
            if reset["stall_s"] is not None:
                by_kind.setdefault(reset["kind"], []).append(reset["stall_s"])
            if reset.get("detected_s") is not None:
                by_kind.setdefault("failure seen", []).append(reset["detected_s"])
    return {k: {**spread(v), "count": len(v)} for k, v in sorted(by_kind.items())}


def fmt(s: dict[str, float | None], digits: int = 1) -> str:
    if s["median"] is None:
        return "-"
    lo, mid, hi = (f"{s[k]:.{digits}f}" for k in ("min", "median", "max"))
    return mid if lo == hi else f"{mid} ({lo}-{hi})"


def table(summaries: list[tuple[str, float, str, int, dict[str, Any]]]) -> str:
    lines = [
        "| schedule | lead | mode | rolled back steps | stall s / preemption | resets | "
        "survived | steps/s vs none |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, lead, kind, n, s in summaries:
        lines.append(
            f"| {kind} x{n} | {lead:g} s | {mode} | {fmt(s['rolled_back_steps'], 0)} | "
            f"{fmt(s['stall_s'])} | {fmt(s['resets'], 0)} | {s['survived']}/{s['runs']} | "
            f"{fmt(s['relative_steps_per_s'], 2)} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="horovod",
        help="torchrun: benchmarks/preemption_torchrun.py (see --framework torchrun --help)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="one run: lead 5 s, one-host x1 (≤ 10 min)"
    )
    ap.add_argument("--runs", type=int, help="of each mode, lead and schedule (default 3)")
    ap.add_argument("--leads", help="seconds, comma separated (default 0,5,30,120)")
    ap.add_argument("--schedules", help=f"comma separated of {','.join(SCHEDULES)}")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--preemptions", type=int, help="of the one-host schedule (default 3)")
    ap.add_argument("--hosts", type=int, default=3, help="the job's hosts")
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument(
        "--commit-on-notice",
        action="store_true",
        help="spot-autoscaler's job also commits at the step after its checkpoint signal",
    )
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--recover", type=float, default=120.0, help="s to wait for a recovery")
    ap.add_argument("--baseline-s", type=float, help="the run without preemptions (s)")
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="no run without preemptions (no relative rate): a smoke run of the rows only",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--join-grace", default="30s", help="the daemon's join_grace (its default)")
    ap.add_argument(
        "--early-replacements",
        action="store_true",
        help="one-host and two-hosts replacements are there from the notice on (not at death)",
    )
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--details", type=Path, help="write every run, preemption and reset here")
    ap.add_argument("--keep", type=Path, help="keep each run's files (logs) under this directory")
    args = ap.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.leads = [
        float(x) for x in (args.leads or ("5" if args.quick else "0,5,30,120")).split(",")
    ]
    args.schedules = (args.schedules or ("one-host" if args.quick else ",".join(SCHEDULES))).split(
        ","
    )
    args.modes = args.modes.split(",")
    if bad := ({*args.modes} - {*MODES}) | ({*args.schedules} - {*SCHEDULES}):
        ap.error(f"unknown: {sorted(bad)}")
    return args


class Results:
    """The runs so far, and the files and table made of them (rewritten after every run, so an
    interrupted benchmark leaves what it measured)."""

    def __init__(self, args: argparse.Namespace, settings: Settings, pool: list[str]) -> None:
        self.args, self.settings, self.pool = args, settings, pool
        self.runs: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
        self.baselines: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []  # runs that never started training
        self.began = time.monotonic()
        self.loads: list[float] = [os.getloadavg()[0]]

    def add(self, r: dict[str, Any]) -> None:
        self.runs.setdefault((r["mode"], r["lead_s"], r["schedule"]), []).append(r)
        self.loads.append(os.getloadavg()[0])
        self.write()

    def summaries(self) -> list[tuple[str, float, str, int, dict[str, Any]]]:
        rates = {b["run"]: b["steps_per_s"] for b in self.baselines}
        out = [
            (mode, lead, kind, len(v[0]["plan"]), summarize(v, rates))
            for (mode, lead, kind), v in self.runs.items()
        ]
        return sorted(out, key=lambda s: (SCHEDULES.index(s[2]), s[1], MODES.index(s[0])))

    def all_runs(self) -> list[dict[str, Any]]:
        return [r for v in self.runs.values() for r in v]

    def text(self) -> str:
        costs = reset_costs(self.all_runs())
        lines = [table(self.summaries()), "", "one Horovod reset stalls the job (s):"]
        lines += [f"  {k}: {fmt(c, 2)} (n={c['count']})" for k, c in costs.items()]
        wall = (time.monotonic() - self.began) / 60
        lines.append(
            f"\n{len(self.all_runs())} runs + {len(self.baselines)} baselines "
            f"({len(self.failed)} more never trained) in {wall:.1f} min "
            f"on {os.cpu_count()} cores; 1-min load average {min(self.loads):.1f} to "
            f"{max(self.loads):.1f} (sampled after each run)"
        )
        return "\n".join(lines)

    def write(self) -> None:
        args = self.args
        if args.json:
            rows = [row(*s) for s in self.summaries()]
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        if args.details:
            details = {
                "command": " ".join(sys.argv),
                "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
                "load_average_1min": {"min": min(self.loads), "max": max(self.loads)},
                "settings": self.settings.__dict__,
                "hosts": self.pool,
                "wall_s": round(time.monotonic() - self.began, 1),
                "baselines": self.baselines,
                "not_run": self.failed,
                "reset_costs": reset_costs(self.all_runs()),
                "summaries": [
                    {"mode": m, "lead_s": lead, "schedule": k, "preemptions": n, **s}
                    for m, lead, k, n, s in self.summaries()
                ],
                "runs": self.all_runs(),
            }
            args.details.write_text(json.dumps(details, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--framework", choices=FRAMEWORKS, default="horovod")
    framework, rest = first.parse_known_args(argv)
    if framework.framework == "torchrun":  # its own options: --framework torchrun --help
        from benchmarks.preemption_torchrun import main as torchrun

        return torchrun(rest)
    args = parse(rest)
    settings = Settings(
        hosts=args.hosts,
        preemptions=args.preemptions or (1 if args.quick else 3),
        commit_every=args.commit_every,
        step_seconds=args.step_seconds,
        recover=args.recover,
        baseline_s=args.baseline_s or (30.0 if args.quick else 60.0),
        join_grace=args.join_grace,
        commit_on_notice=args.commit_on_notice,
    )
    pool = local_hosts()
    needed = settings.hosts + max(REPLACEMENTS[k] for k in args.schedules)
    if why := missing(settings.hosts) or (
        f"needs {needed} local host names, has {pool}" if len(pool) < needed else None
    ):
        print(f"preemption: {why}", file=sys.stderr)
        return 2
    results = Results(args, settings, pool)
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            top = tempfile.mkdtemp(prefix="preemption-", dir=args.keep)
        else:
            top = stack.enter_context(tempfile.TemporaryDirectory(prefix="preemption-"))
        for i in range(0 if args.no_baseline else args.runs):  # each run index's rate first
            try:
                b = unpaused(
                    f"run {i}: baseline", top, partial(baseline, settings=settings, pool=pool)
                )
                results.baselines.append({"run": i, **b})
                _say(f"run {i}: baseline {b['steps_per_s']} steps/s ({b['wall_s']} s)")
            except RuntimeError as e:  # no rate to compare this run index's runs with
                results.failed.append({"run": i, "mode": "baseline", "error": str(e)})
        # lead by lead, so that each lead's cells are whole as early as can be
        for lead, i, kind in product(args.leads, range(args.runs), args.schedules):
            plan = schedule(
                kind,
                pool,
                settings.hosts,
                settings.preemptions,
                args.seed + i,
                args.early_replacements,
            )
            for mode in args.modes:
                what = f"run {i}: {kind} lead {lead:g} s {mode}"
                once = partial(
                    run_once, mode=mode, plan=plan, lead=lead, settings=settings, pool=pool
                )
                try:
                    r = unpaused(what, top, once)
                except RuntimeError as e:  # never trained on all its hosts, or stopped: no run
                    results.failed.append({"run": i, "mode": mode, "error": str(e)})
                    _say(f"{what}: not run: {e}")
                    continue
                r.update(run=i, schedule=kind, plan=[p.__dict__ for p in plan])
                results.add(r)
                _say(
                    f"{what}: rolled back "
                    f"{r['rolled_back_steps']}, stall {r['stall_s_median']} s, resets "
                    f"{r['resets']}, survived {r['survived']} ({r['wall_s']} s)"
                )
    print(results.text())
    return 0


T = TypeVar("T")


def unpaused(what: str, top: str, run: Callable[[Path], T]) -> T:
    """`run` in a new directory under `top`, again while the machine stopped it (Paused), at most
    ATTEMPTS times."""
    for _ in range(ATTEMPTS - 1):
        try:
            return run(Path(tempfile.mkdtemp(dir=top)))
        except Paused as e:
            _say(f"{what}: {e}; once more")
    return run(Path(tempfile.mkdtemp(dir=top)))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
