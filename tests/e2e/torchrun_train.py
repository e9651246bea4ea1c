"""A tiny torchrun (torch.distributed.elastic) training loop for the end-to-end test: one worker
per pseudo-host, gloo on loopback (run by torchrun, not pytest).

The checkpoint signal: on a notice naming this host (autoscaler.notice.pending(), the file named
by $SPOT_AUTOSCALER_NOTICE_FILE) or on SIGTERM (torchrun forwards its own; it also SIGTERMs the
workers before a restart for a joining node), the worker sets a flag. After every step all ranks
all_reduce the flags (MAX): when any is set, rank 0 saves a checkpoint of that step (torch.save to
a temp file, then os.replace) and the flagged ranks exit cleanly; the others go on and fail at
their next collective, and torchrun restarts them in the new world. Every worker loads the
checkpoint at start, so the survivors resume from exactly the step the signal stopped.

Appends JSON lines to $E2E_LOG (one O_APPEND write each, so processes do not interleave):
`started` (imports done), `joined` (process group up), `resume` (step loaded, world size,
restart count), `step` (rank 0, after each step), `signal` (the first time this worker's flag is
set: via notice or sigterm, at which step), `seen` (any notice, whoever it names, as the helper's
poller thread saw it), `checkpoint` (rank 0, the step saved), `exit` (a flagged rank leaving
cleanly), `failed` (a collective failed: a peer left), `done` (the stop file).
$E2E_STEP_SECONDS paces the steps (default 0.05).

For benchmarks/preemption.py --framework torchrun (the defaults are the e2e's):
- $E2E_SIGNALS: what sets the flag, of `notice,sigterm` (default both; empty: nothing, and
  SIGTERM keeps its default action: the process ends, no checkpoint);
- $E2E_CKPT_EVERY: K > 0 also saves every K steps, the same way (rank 0 saves, all ranks pass
  the barrier); each `checkpoint` says why (`signal` or `periodic`) and its `save_s`;
- $E2E_LEAVE: `now` (default: a flagged rank exits 0 after the barrier) or `sigterm` (as
  docs/examples/torchrun_checkpoint_on_notice.py: it waits for its pod's SIGTERM, at most
  until the notice's deadline, 30 s without one, and exits 143).
"""

from __future__ import annotations

import json
import os
import signal
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from autoscaler import notice

LOG = os.environ["E2E_LOG"]
STOP = os.environ["E2E_STOP"]
CKPT = os.environ["E2E_CKPT"]
STEP_SECONDS = float(os.environ.get("E2E_STEP_SECONDS", "0.05"))
SIGNALS = {s for s in os.environ.get("E2E_SIGNALS", "notice,sigterm").split(",") if s}
CKPT_EVERY = int(os.environ.get("E2E_CKPT_EVERY", "0"))
LEAVE = os.environ.get("E2E_LEAVE", "now")
LEFT = 143  # 128 + SIGTERM: what a notified rank exits with under E2E_LEAVE=sigterm
HOST = notice.this_host()


def record(event: str, **fields: Any) -> None:
    line = json.dumps(
        {
            "event": event,
            "t": time.time(),
            "host": HOST,
            "pid": os.getpid(),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            **fields,
        }
    )
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Signal:
    """This worker's flag: set by a notice naming this host or by SIGTERM, whichever is first."""

    def __init__(self) -> None:
        self.via: str | None = None
        self.step = 0  # the step the loop is at, for the record
        self.terminated = False  # SIGTERM came (whatever set the flag first)
        self.deadline: float | None = None  # the notice's, when a notice set the flag

    def set(self, via: str) -> None:
        if self.via is None:
            self.via = via
            record("signal", via=via, step=self.step)

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.terminated = True
        self.set("sigterm")

    def poll(self) -> bool:
        if self.via is None and "notice" in SIGNALS and (told := notice.pending()) is not None:
            self.deadline = told.deadline.timestamp() if told.deadline else None
            self.set("notice")
        return self.via is not None

    def leave(self) -> None:
        """After the checkpoint. At once: a torch process's interpreter shutdown took seconds
        here, and its gloo sockets stay open meanwhile, holding the others in their collective."""
        if LEAVE != "sigterm":
            os._exit(0)
        until = self.deadline if self.deadline is not None else time.time() + 30
        while not self.terminated and time.time() < until:
            time.sleep(0.05)  # the others block in their next collective: no step is lost
        os._exit(LEFT)


def save(state: dict[str, Any]) -> None:
    tmp = f"{CKPT}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, CKPT)


def checkpoint(rank: int, size: int, state: dict[str, Any], why: str) -> None:
    """Rank 0 saves, then every rank passes a barrier: the checkpoint is on disk before a
    flagged rank leaves. The same for a signal and a periodic checkpoint."""
    began = time.monotonic()
    if rank == 0:
        save(state)
    dist.barrier()
    if rank == 0:
        took = round(time.monotonic() - began, 4)
        record("checkpoint", step=state["step"], size=size, why=why, save_s=took)


def main() -> None:
    flag = Signal()
    if "sigterm" in SIGNALS:
        signal.signal(signal.SIGTERM, flag.on_sigterm)
    record("started")  # the imports done: a worker's start-up, for the timings
    notice.on_notice(lambda n: record("seen", hosts=list(n.hosts)), for_any=True, poll=0.02)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    record("joined", size=size, rank=rank)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    # plain SGD with momentum by hand: torch.optim's first optimizer imports torch._dynamo,
    # 2.4 s more per worker start on this machine, paid again at every restart
    momentum = [torch.zeros_like(p) for p in model.parameters()]
    step = 0
    if os.path.exists(CKPT):
        state = torch.load(CKPT)
        model.load_state_dict(state["model"])
        momentum = state["momentum"]
        step = state["step"]
    record("resume", step=step, size=size, rank=rank)
    resumed = step  # a periodic checkpoint of it is on disk already
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    while True:
        flag.step = step
        flags = torch.tensor([float(flag.poll()), float(os.path.exists(STOP))])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        now = {"model": model.state_dict(), "momentum": momentum, "step": step}
        if flags[0] > 0:  # someone is leaving: save this step before anyone goes
            checkpoint(rank, size, now, "signal")
            if flag.via is not None:
                record("exit", step=step, rank=rank, via=flag.via)
                flag.leave()
        elif CKPT_EVERY and step != resumed and step % CKPT_EVERY == 0:
            checkpoint(rank, size, now, "periodic")
        if flags[1] > 0:
            record("done", step=step, rank=rank)
            dist.destroy_process_group()
            return
        model.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p, v in zip(model.parameters(), momentum, strict=True):
                assert p.grad is not None
                dist.all_reduce(p.grad)
                v.mul_(0.9).add_(p.grad, alpha=1.0 / size)
                p.sub_(v, alpha=0.01)
        step += 1
        if rank == 0:
            record("step", step=step, size=size)
        time.sleep(STEP_SECONDS)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a peer left: torchrun restarts this worker in the new world
        record("failed", error=f"{type(exc).__name__}: {str(exc)[:120]}")
        raise
