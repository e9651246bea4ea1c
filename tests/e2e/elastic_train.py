"""A tiny elastic Horovod training loop for the end-to-end test and the preemption benchmark
(run by horovodrun, not pytest).

Commits every $E2E_COMMIT_EVERY steps (default 1), sleeps $E2E_STEP_SECONDS (default 0.05) after
each step, and appends JSON lines to $E2E_LOG (one O_APPEND write each, so ranks do not
interleave): `resume` when a rank (re)starts training after a reset or its first sync, with the
step it resumes from and the world size; `reset` from the reset callback; `step` from rank 0
after each step (once its commit, if any, returned: a host update interrupts the commit after
saving, so that step is resumed from, not logged); `rollback` if Horovod restores the last commit
(only after a failure, never after a graceful removal). Stops when $E2E_STOP exists (all ranks
agree via an allreduce). With $E2E_COMMIT_ON_NOTICE=1 every rank also commits at the step after
any checkpoint signal of the job appears ($SPOT_AUTOSCALER_NOTICE_FILE; `notice_commit` logged),
as docs/examples/horovod_commit_on_notice.py does.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import horovod.torch as hvd
import torch

from autoscaler import notice

LOG = os.environ["E2E_LOG"]
STOP = os.environ["E2E_STOP"]
STEP_SECONDS = float(os.environ.get("E2E_STEP_SECONDS", "0.05"))
COMMIT_EVERY = int(os.environ.get("E2E_COMMIT_EVERY", "1"))
# `host=seconds`: a worker on that host starts this much later (a slow import or CUDA start-up)
SLOW_HOST, _, SLOW_SECONDS = os.environ.get("E2E_SLOW_START", "").partition("=")
COMMIT_ON_NOTICE = os.environ.get("E2E_COMMIT_ON_NOTICE") == "1"


def record(event: str, **fields: Any) -> None:
    line = json.dumps(
        {
            "event": event,
            "t": time.time(),
            "host": os.environ.get("HOROVOD_HOSTNAME"),
            "pid": os.getpid(),
            **fields,
        }
    )
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class RecordedState(hvd.elastic.TorchState):
    def restore(self) -> None:  # Horovod calls it only after a HorovodInternalError
        record("rollback", step=self.step, rank=hvd.rank())
        super().restore()


def main() -> None:
    if SLOW_HOST and os.environ.get("HOROVOD_HOSTNAME") == SLOW_HOST:
        time.sleep(float(SLOW_SECONDS))
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = RecordedState(model=model, optimizer=optimizer, step=0)
    state.register_reset_callbacks(
        [lambda: record("reset", step=state.step, size=hvd.size(), rank=hvd.rank())]
    )
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    answered: set[str] = set()  # the notices committed for (their JSON)

    def new_notice() -> str | None:
        seen = notice.pending(for_any=True) if COMMIT_ON_NOTICE else None
        return None if seen is None or seen.encode() in answered else seen.encode()

    @hvd.elastic.run
    def train(state: RecordedState) -> None:
        record("resume", step=state.step, size=hvd.size(), rank=hvd.rank())
        while True:
            stop = hvd.allreduce(torch.tensor([float(os.path.exists(STOP))]), name="stop")
            if stop.item() > 0:
                return
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            state.step += 1
            fresh = new_notice()
            # commit is collective: every rank must agree on the step, hence the allreduce
            noticed = (
                COMMIT_ON_NOTICE
                and hvd.allreduce(
                    torch.tensor([float(fresh is not None)]), op=hvd.Max, name="notice"
                ).item()
                > 0
            )
            if noticed:  # a rank that has not read the file yet takes it as answered too
                answered.add(fresh or new_notice() or "")
                record("notice_commit", step=state.step, rank=hvd.rank())
            if noticed or state.step % COMMIT_EVERY == 0:
                state.commit()  # a host update raises HostsUpdatedInterrupt here, after saving
            if hvd.rank() == 0:
                record("step", step=state.step, size=hvd.size())
            time.sleep(STEP_SECONDS)

    train(state)
    record("done", step=state.step, rank=hvd.rank())


if __name__ == "__main__":
    main()
