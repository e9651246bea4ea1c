"""The whole config file: the policy set the core reads, plus what the shell needs around it."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field, model_validator

from autoscaler.config.cloud import AlibabaSettings, AwsSettings
from autoscaler.config.daemon import DaemonSettings
from autoscaler.config.discovery import StandaloneSettings
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.config.prices import Prices
from autoscaler.core.policy import Duration, PolicySet, Price, StrictModel, Workers

__all__ = ["Config", "OnDemandPool", "Prices", "SimJob", "SimulationSettings", "SyntheticTrace"]


class Config(StrictModel):
    """Top level of the YAML file. It holds the PolicySet `decide` takes (`policy_set`), written
    at the top level of the file (`policies`, `default_policy`, `cluster_budget_per_hour`), and
    the sections the shell needs."""

    policy_set: PolicySet = Field(default_factory=PolicySet)
    prices: Prices = Field(default_factory=Prices)
    simulate: SimulationSettings = Field(default_factory=lambda: SimulationSettings())  # `simulate`
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    aws: AwsSettings = Field(default_factory=AwsSettings)
    alibaba: AlibabaSettings = Field(default_factory=AlibabaSettings)
    standalone: StandaloneSettings = Field(default_factory=StandaloneSettings)

    @model_validator(mode="before")
    @classmethod
    def _policy_keys(cls, data: object) -> object:
        """The file's top-level policy keys go into `policy_set`."""
        if not isinstance(data, dict) or not (PolicySet.model_fields.keys() & data.keys()):
            return data
        moved = {k: v for k, v in data.items() if k in PolicySet.model_fields}
        rest = {k: v for k, v in data.items() if k not in PolicySet.model_fields}
        return {**rest, "policy_set": moved}


class SimJob(StrictModel):
    """One simulated elastic job; it starts at `min_workers`."""

    namespace: str = "default"  # for policy matching and the log's `ns/name`
    name: str  # the job's name
    min_workers: Workers = 1  # the job's own min
    max_workers: Workers  # the job's own max
    gpus_per_worker: Annotated[float, Field(gt=0)] = 1.0  # GPUs each worker takes
    priority: int = 0  # higher gets idle capacity first
    labels: dict[str, str] = {}  # for policy `match.labels` and the policy label


class SyntheticTrace(StrictModel):
    """The spot trace `simulate` makes from `--seed` when no `--trace` is given."""

    hours: Annotated[float, Field(gt=0)] = 8.0  # how long the trace runs
    max_nodes: Annotated[int, Field(ge=1)] = 16  # spot nodes at most
    mean_up_hours: Annotated[float, Field(gt=0)] = 1.5  # a node's mean life (exponential)
    mean_down_hours: Annotated[float, Field(gt=0)] = 0.4  # mean wait before a node comes back
    wave_every_hours: Annotated[float, Field(gt=0)] = 2.5  # mean time between preemption waves
    wave_fraction: Annotated[float, Field(gt=0, le=1)] = 0.4  # share of the nodes a wave takes


class OnDemandPool(StrictModel):
    """The cluster's node autoscaler for on-demand capacity, as Karpenter runs it: a pod no node
    can take gets a new on-demand node (the trace's instance type) after `provisioning_delay`; a
    pool node left without pods is removed after `empty_node_ttl` (Karpenter's consolidateAfter).
    A pool node is paid whole, at the on-demand price, from when it joins until it is removed."""

    # EC2 launch to a Ready node (Karpenter: roughly 45-90 s for GPU AMIs); 90 s is the slow end
    provisioning_delay: Duration = timedelta(seconds=90)
    # scarce on-demand: each node takes between provisioning_delay and this (uniform, seeded;
    # GPU nodes: 2-5 min is common, 20 min when a zone is short); None: provisioning_delay
    provisioning_delay_max: Duration | None = None
    # the chance a node is refused when it would join (EC2 InsufficientInstanceCapacity): its
    # pods stay Pending and the pool tries again with a new node
    refusal_probability: Annotated[float, Field(ge=0, le=1)] = 0.0
    # short, so an emptied node is not paid for long, yet a pod rescheduled right away still
    # finds it (Karpenter's consolidateAfter, default 0 s for WhenEmpty; 30 s is common)
    empty_node_ttl: Duration = timedelta(seconds=30)
    max_nodes: Annotated[int, Field(ge=1)] | None = None  # Karpenter NodePool limits; None: any

    @model_validator(mode="after")
    def _delays(self) -> OnDemandPool:
        top = self.provisioning_delay_max
        if top is not None and top < self.provisioning_delay:
            raise ValueError("provisioning_delay_max is below provisioning_delay")
        return self


class SimulationSettings(StrictModel):
    """`simulate`: how the replayed world behaves. Defaults follow the references (AWS 2-min notice,
    Bamboo's p3.2xlarge with 1 V100 at $0.91 spot / $3.06 on-demand)."""

    tick: Duration = timedelta(seconds=10)  # the simulated daemon's reconcile interval
    notice_lead_time: Duration = timedelta(seconds=120)  # notice to node death (`--lead-time`)
    # chance that a preemption comes with no notice at all (the workers then fail abruptly)
    notice_miss_probability: Annotated[float, Field(ge=0, le=1)] = 0.0
    pod_startup: Duration = timedelta(seconds=45)  # schedule + pull + start until Running
    scale_in_grace: Duration = timedelta(seconds=5)  # launcher's processes exit, pods deleted
    gpus_per_node: Annotated[int, Field(ge=1)] = 1  # GPUs of each trace node
    instance_type: str = "p3.2xlarge"  # of each trace node (for `prices`)
    spot_price_per_hour: Price = 0.91  # used when `prices` has no entry for the instance type
    on_demand_price_per_hour: Price = 3.06  # used when `prices` has no on-demand entry
    on_demand_nodes: Annotated[int, Field(ge=0)] = 0  # on-demand nodes up all the time
    on_demand_pool: OnDemandPool | None = None  # None: no node autoscaler, pending pods wait
    jobs: list[SimJob] = [SimJob(name="bert", min_workers=2, max_workers=32)]
    synthetic: SyntheticTrace = SyntheticTrace()
