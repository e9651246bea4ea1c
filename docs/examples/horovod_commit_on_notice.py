"""Elastic Horovod + spot-autoscaler's checkpoint signal: commit now, not at the next period.

spot-autoscaler drains a doomed host from Horovod's discovery before it dies, and Horovod then
removes it without a rollback. When that cannot happen in time (a short notice, every host
doomed at once), the host's death is a failure and Horovod restores the LAST COMMIT: with a
commit every N steps, up to N steps are lost. On a notice, commit at the next step instead.

    horovodrun -np 2 --min-np 1 --max-np 4 \
        --host-discovery-script /etc/edl/spot/discover_hosts.sh python horovod_commit_on_notice.py

SPOT_AUTOSCALER_NOTICE_FILE names the notice file (Kubernetes: the downwardAPI file of the pod's
annotations; standalone: the discovery file + ".notice"). Every rank commits on ANY notice for
the job (`for_any`): a failure anywhere rolls back everyone.
"""

from __future__ import annotations

import os

import horovod.torch as hvd
import torch

from autoscaler import notice  # stdlib only: `pip install spot-autoscaler`, or copy notice.py

COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "500"))
STEPS = int(os.environ.get("STEPS", "100000"))


def main() -> None:
    hvd.init()
    model = torch.nn.Linear(32, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    answered: set[str] = set()  # notices already committed for (their JSON)

    def new_notice() -> float:
        seen = notice.pending(for_any=True)
        return float(seen is not None and seen.encode() not in answered)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < STEPS:
            x, y = torch.randn(64, 32), torch.randn(64, 1)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            state.step += 1
            # commit is collective: every rank must agree on the step, hence the allreduce
            noticed = hvd.allreduce(torch.tensor([new_notice()]), op=hvd.Max, name="notice")
            if noticed.item() > 0 or state.step % COMMIT_EVERY == 0:
                if (seen := notice.pending(for_any=True)) is not None:
                    answered.add(seen.encode())
                state.commit()  # saves, then raises HostsUpdatedInterrupt if discovery changed

    train(state)


if __name__ == "__main__":
    main()
