"""torchrun + spot-autoscaler's checkpoint signal: save at the next step, then leave (non-zero).

A torchrun job cannot lose a worker without restarting all of them from the last checkpoint. With
the signal, the last checkpoint is the step the notice arrived at: nothing is lost.

    torchrun --nnodes=1:4 --nproc-per-node=1 --max-restarts=100 \
        --rdzv-backend=c10d --rdzv-endpoint=$RDZV_HOST:29400 --rdzv-conf=last_call_timeout=5 \
        torchrun_checkpoint_on_notice.py

Where the notice comes from (docs/checkpoint-signal.md):
- SPOT_AUTOSCALER_NOTICE_FILE: in Kubernetes the downwardAPI file of the pod's annotations
  (e.g. /etc/podinfo/annotations); in standalone mode the discovery file + ".notice";
- CHECKPOINT_HOOK_PORT: optionally, the port of the job's spot-autoscaler.io/checkpoint-hook
  annotation: the daemon POSTs the notice there;
- SIGTERM: torchrun forwards the one it gets when the pod is deleted (and sends one before it
  restarts the workers for a joining node).
A notice counts when it names this host: $SPOT_AUTOSCALER_HOST, else $HOSTNAME (the pod name).
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from autoscaler import notice  # stdlib only: `pip install spot-autoscaler`, or copy notice.py

CKPT = os.environ.get("CKPT", "/checkpoints/model.pt")
STEPS = int(os.environ.get("STEPS", "100000"))
# Never 0 when leaving on a notice: an elastic PyTorchJob is Succeeded as soon as ANY worker pod
# succeeds (training-operator v1.9.3 pytorchjob_controller.go `UpdateJobStatus`), and an agent
# whose workers all exited 0 waits in torchrun's exit barrier, then exits 0 (docs/pytorch.md).
LEFT = 143  # 128 + SIGTERM
terminated = False


def on_sigterm(signum: int, frame: object) -> None:
    global terminated
    terminated = True  # only a flag: the step in flight finishes, the next boundary saves


def leave(deadline: float) -> None:
    """After the checkpoint: go now if the pod is being deleted (SIGTERM came), else wait for
    that SIGTERM (spot-autoscaler deletes the doomed pod right after it drains it) until the
    notice's deadline. The others block in their next collective meanwhile: no step is lost."""
    while not terminated and time.monotonic() < deadline:
        time.sleep(0.1)
    # at once: an interpreter shutdown can take seconds, its sockets open meanwhile
    os._exit(LEFT)


def main() -> None:
    global leaving
    signal.signal(signal.SIGTERM, on_sigterm)
    if (port := os.environ.get("CHECKPOINT_HOOK_PORT")) and os.environ.get("LOCAL_RANK") == "0":
        notice.serve(int(port))  # one listener per pod
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if os.path.exists(CKPT):  # every worker, at every (re)start
        state = torch.load(CKPT, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    while step < STEPS:
        # the signal: one cheap check per step; all ranks agree on one step through the MAX
        told = notice.pending()
        leaving = terminated or told is not None
        flag = torch.tensor([float(leaving)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            if rank == 0:  # DDP: the state is the same everywhere; save it once, atomically
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "step": step}, f"{CKPT}.tmp")
                os.replace(f"{CKPT}.tmp", CKPT)
            dist.barrier()  # on disk before anyone leaves
            if leaving:  # the others fail at their next collective and restart from this step
                left = (told.deadline.timestamp() - time.time()) if told and told.deadline else 30
                leave(time.monotonic() + max(left, 0.0))
        x, y = torch.randn(64, 32), torch.randn(64, 1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        step += 1
    if rank == 0:
        print(f"done at step {step} with {world} workers")


if __name__ == "__main__":
    main()
