"""Elastic policies replayed through the simulated cluster (et-operator semantics, autoscaler.sim):
our reconciler and core with the given (or default) policies, and a reactive baseline without
notices. With a deadline, our core paces to it under the policies' own deadline rule and
on-demand settings (or a rule the caller names), and Can't Be Late's uniform-progress rule runs
as a baseline; both get on-demand nodes from a simulated node autoscaler."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TextIO

from autoscaler.bench.progress import Progress
from autoscaler.bench.reactive import GreedyScaler
from autoscaler.bench.result import PolicyResult, Rule, Setup
from autoscaler.bench.world import NAMESPACE, World, merge_steps
from autoscaler.config.schema import Config, SimJob, SimulationSettings
from autoscaler.core import PolicySet
from autoscaler.core.model import Job
from autoscaler.core.policy import DeadlineRules
from autoscaler.logs import file_logger
from autoscaler.reconcile import Reconciler
from autoscaler.sim.cluster import JobProgress, SimulatedCluster
from autoscaler.sim.run import EPOCH, replay, sim_cluster


class RingProgress:
    """Feeds the simulated cluster's ring changes (a RingListener) into each job's progress, and
    reports that progress back (a ProgressSource) as the job's annotation would: the work
    committed, with no rate, so the simulated daemon measures the pace as the real one does."""

    def __init__(self, jobs: dict[str, Progress]) -> None:
        self.jobs = jobs

    def joined(self, job: str, pod: str, now: datetime) -> None:
        self.jobs[job].join(_seconds(now))

    def left(self, job: str, pod: str, now: datetime, graceful: bool) -> None:
        self.jobs[job].leave(_seconds(now), graceful)

    def progress(self, job: str, now: datetime) -> JobProgress:
        p = self.jobs[job]
        p.advance(_seconds(now))
        return JobProgress(EPOCH, p.committed, None)


class _Discard:
    """A logger that drops decision lines (when no decision log is asked for)."""

    def info(self, *_: Any, **__: Any) -> None:
        return None

    error = info


def autoscaler(
    world: World,
    policies: PolicySet | None = None,
    decisions_out: TextIO | None = None,
    rule: Rule | None = None,
) -> PolicyResult:
    """Our reconciler and core with `policies` (default: `Config()`'s), notified of removals; with
    a deadline, every policy is due then under its own deadline settings and on-demand bounds,
    and under `rule` if given (else the policy's own rule)."""
    rules = PolicySet() if policies is None else policies
    if world.deadline is not None:
        rules = due(rules, world.deadline, rule)
    return _reconciled("autoscaler", world, rules, decisions_out)


def uniform_progress(world: World, policies: PolicySet | None = None) -> PolicyResult:
    """Can't Be Late's rule through our core: behind the line to the deadline, fill to max with
    on-demand until ahead by two changeovers, then on-demand leaves only for spot; the Safety
    Net. No anchor (the paper has none); the policies' other on-demand bounds hold."""
    assert world.deadline is not None, "uniform_progress needs a deadline"
    rules = PolicySet() if policies is None else policies
    rules = due(rules, world.deadline, "uniform_progress", anchored=False)
    return _reconciled("uniform_progress", world, rules, None)


def due(
    rules: PolicySet, deadline: float, rule: Rule | None = None, anchored: bool = True
) -> PolicySet:
    """Every policy of `rules`, due `deadline` seconds after the job's start: its own deadline
    settings (margin, changeover, ...) and on-demand bounds are kept, its rule unless `rule` is
    given; without `anchored`, no anchor."""
    within: dict[str, object] = {"within": timedelta(seconds=deadline), "at": None}
    if rule is not None:
        within["rule"] = rule
    policies = []
    for p in rules.policies:
        own = p.deadline or DeadlineRules(within=timedelta(seconds=deadline))
        on_demand = p.on_demand if anchored else p.on_demand.model_copy(update={"min_on_demand": 0})
        update = {"deadline": own.model_copy(update=within), "on_demand": on_demand}
        policies.append(p.model_copy(update=update))
    return rules.model_copy(update={"policies": policies})


def setups(world: World, rules: PolicySet) -> dict[str, Setup]:
    """Per job, the deadline rule and the anchor its policy ran (none without a deadline)."""
    out = {}
    for j in world.jobs:
        job = Job(NAMESPACE, j.spec.name, j.spec.min_workers, j.max_workers, j.spec.gpus_per_worker)
        policy = rules.for_job(job)
        if policy is not None and policy.deadline is not None:
            out[j.spec.name] = Setup.of(policy)
    return out


def _reconciled(
    name: str, world: World, rules: PolicySet, decisions_out: TextIO | None
) -> PolicyResult:
    """`rules` through our reconciler, notified of removals; on-demand nodes from the pool when
    the world has a deadline."""
    config = sim_config(world, notices=True, policies=rules, pool=world.deadline is not None)
    progress = world.progress()
    ring = RingProgress(progress)
    cluster = sim_cluster(config, ring, progress=ring, seed=world.seed)
    logger = file_logger(decisions_out) if decisions_out is not None else _Discard()
    reconciler = Reconciler(cluster, cluster, config.policy_set, logger)
    result = _replayed(name, world, config, cluster, reconciler.tick, progress)
    result.actuation_errors = reconciler.errors
    result.setups = setups(world, rules)
    return result


def reactive_elastic(world: World) -> PolicyResult:
    """Elastic Horovod + et-operator, a greedy scaler, no notices: every preemption is abrupt."""
    config = sim_config(world, notices=False)
    progress = world.progress()
    timeout = world.overheads.reactive_scale_out_timeout
    ring = RingProgress(progress)
    cluster = sim_cluster(config, ring, timeout, progress=ring)
    scaler = GreedyScaler(cluster)
    return _replayed("reactive_elastic", world, config, cluster, scaler.tick, progress)


def sim_config(
    world: World, notices: bool, policies: PolicySet | None = None, pool: bool = False
) -> Config:
    """`policies` (default: the built-in ones) in the simulated world the parameters describe,
    with the world's on-demand node pool if `pool`."""
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
            on_demand_pool=world.pool if pool else None,
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
    run = replay(config, world.trace, world.seed, cluster, tick, until=world.deadline or 0.0)
    for p in progress.values():
        p.advance(run.end)
    workers = merge_steps(list(run.accounts.workers_over_time.values()))
    return PolicyResult(
        name, run.accounts.cost_usd, list(progress.values()), workers, run.accounts.cost_over_time
    )


def _seconds(now: datetime) -> float:
    return (now - EPOCH).total_seconds()
