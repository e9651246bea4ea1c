"""The reactive baseline's controller: what et-operator users run without notices or policy."""

from __future__ import annotations

from datetime import datetime

from autoscaler.core import Action, Decision, Reason
from autoscaler.sim.cluster import SimulatedCluster


class GreedyScaler:
    """Every tick, one ScaleOut per job onto all idle GPUs, up to max; no hysteresis, no notices.

    Lost workers come back the same way (as et-operator's restartPolicy: Always would recreate
    them under a new index); nothing is ever scaled in, so preemptions are Horovod failures.
    """

    def __init__(self, cluster: SimulatedCluster) -> None:
        self.cluster = cluster

    def tick(self, now: datetime) -> None:
        snapshot = self.cluster.snapshot(now)
        free = [n.idle_gpus for n in snapshot.nodes if n.schedulable]
        for job in sorted(snapshot.jobs, key=lambda j: j.key):
            if job.scaler is not None:
                continue  # et-operator runs one scaler at a time
            room = job.max_workers - len(job.workers)
            count = 0
            for i, gpus in enumerate(free):
                fit = min(int(gpus // job.gpus_per_worker), room - count)
                count += fit
                free[i] -= fit * job.gpus_per_worker
            if count > 0:
                self.cluster.apply(
                    Decision.about(
                        job,
                        Action.SCALE_OUT,
                        Reason.IDLE_CAPACITY,
                        "reactive",
                        to_workers=len(job.workers) + count,
                        count=count,
                    ),
                    now,
                )
