"""Elastic policies replayed through the simulated cluster (et-operator semantics, autoscaler.sim):
our reconciler and core with default policies, and a reactive baseline without notices."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TextIO

from autoscaler.bench.progress import Progress
from autoscaler.bench.reactive import GreedyScaler
from autoscaler.bench.result import PolicyResult
from autoscaler.bench.world import NAMESPACE, World, merge_steps
from autoscaler.config.schema import Config, SimJob, SimulationSettings
from autoscaler.core import PolicySet
from autoscaler.logs import file_logger
from autoscaler.reconcile import Reconciler
from autoscaler.sim.cluster import SimulatedCluster
from autoscaler.sim.run import EPOCH, replay, sim_cluster


class RingProgress:
    """Feeds the simulated cluster's ring changes (a RingListener) into each job's progress."""

    def __init__(self, jobs: dict[str, Progress]) -> None:
        self.jobs = jobs

    def joined(self, job: str, pod: str, now: datetime) -> None:
        self.jobs[job].join(_seconds(now))

    def left(self, job: str, pod: str, now: datetime, graceful: bool) -> None:
        self.jobs[job].leave(_seconds(now), graceful)


class _Discard:
    """A logger that drops decision lines (when no decision log is asked for)."""

    def info(self, *_: Any, **__: Any) -> None:
        return None

    error = info


def autoscaler(
    world: World, policies: PolicySet | None = None, decisions_out: TextIO | None = None
) -> PolicyResult:
    """Our reconciler and core with `policies` (default: `Config()`'s), notified of removals."""
    config = sim_config(world, notices=True, policies=policies)
    progress = world.progress()
    cluster = sim_cluster(config, RingProgress(progress))
    logger = file_logger(decisions_out) if decisions_out is not None else _Discard()
    reconciler = Reconciler(cluster, cluster, config.policy_set, logger)
    result = _replayed("autoscaler", world, config, cluster, reconciler.tick, progress)
    result.actuation_errors = reconciler.errors
    return result


def reactive_elastic(world: World) -> PolicyResult:
    """Elastic Horovod + et-operator, a greedy scaler, no notices: every preemption is abrupt."""
    config = sim_config(world, notices=False)
    progress = world.progress()
    timeout = world.overheads.reactive_scale_out_timeout
    cluster = sim_cluster(config, RingProgress(progress), timeout)
    scaler = GreedyScaler(cluster)
    return _replayed("reactive_elastic", world, config, cluster, scaler.tick, progress)


def sim_config(world: World, notices: bool, policies: PolicySet | None = None) -> Config:
    """`policies` (default: the built-in ones) in the simulated world the parameters describe."""
    o, inst = world.overheads, world.instance
    rules = PolicySet() if policies is None else policies
    return Config(
        policy_set=rules,
        simulate=SimulationSettings(
            tick=o.tick,
            notice_lead_time=world.notices.lead_time,
            notice_miss_probability=world.notices.miss_probability if notices else 1.0,
            pod_startup=o.pod_startup,
            scale_in_grace=o.scale_in_grace,
            gpus_per_node=inst.gpus,
            instance_type=inst.name,
            spot_price_per_hour=inst.spot_price_per_hour,
            on_demand_price_per_hour=inst.on_demand_price_per_hour,
            jobs=[
                SimJob(
                    namespace=NAMESPACE,
                    name=j.spec.name,
                    min_workers=j.spec.min_workers,
                    max_workers=j.max_workers,
                    gpus_per_worker=j.spec.gpus_per_worker,
                )
                for j in world.jobs
            ],
        ),
    )


def _replayed(
    name: str,
    world: World,
    config: Config,
    cluster: SimulatedCluster,
    tick: Callable[[datetime], object],
    progress: dict[str, Progress],
) -> PolicyResult:
    run = replay(config, world.trace, world.seed, cluster, tick)
    for p in progress.values():
        p.advance(run.end)
    workers = merge_steps(list(run.accounts.workers_over_time.values()))
    return PolicyResult(
        name, run.accounts.cost_usd, list(progress.values()), workers, run.accounts.cost_over_time
    )


def _seconds(now: datetime) -> float:
    return (now - EPOCH).total_seconds()
