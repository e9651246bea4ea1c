"""The benchmark's world model: every number a documented, overridable parameter (`--params` YAML).

Sources for the defaults are in docs/benchmarks.md; the comment on each field names the main one.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import Field, ValidationError, field_validator

from autoscaler.config.schema import OnDemandPool
from autoscaler.core.policy import Duration, Price, StrictModel


class ParamsError(ValueError):
    """A params file that cannot be read or does not validate; the message lists every problem."""


class Instance(StrictModel):
    """One spot node type: per-node prices per hour and GPUs per node."""

    name: str
    gpus: Annotated[int, Field(ge=1)] = 1
    spot_price_per_hour: Price
    on_demand_price_per_hour: Price


INSTANCES = {
    # Bamboo's simulator prices (uclasystem/bamboo project_pactum/simulation/simulator.py): 1x V100
    "p3.2xlarge": Instance(
        name="p3.2xlarge", spot_price_per_hour=0.91, on_demand_price_per_hour=3.06
    ),
    # AWS on-demand list price us-east-1 Linux (1x T4); spot at the same 70% discount Bamboo used
    # for p3 (spotDNN's g4dn.4xlarge table has 0.30 of on-demand too): an assumption, override it
    "g4dn.xlarge": Instance(
        name="g4dn.xlarge", spot_price_per_hour=0.158, on_demand_price_per_hour=0.526
    ),
}


class Workload(StrictModel):
    """One elastic data-parallel job and how fast it trains."""

    name: str = "train"
    min_workers: Annotated[int, Field(ge=1)] = 1  # Horovod --min-np: below it the ring waits
    max_workers: Annotated[int, Field(ge=1)] | None = None  # None: the trace's peak, all nodes
    gpus_per_worker: Annotated[float, Field(gt=0)] = 1.0
    # Each worker runs at `scaling_efficiency ** log2(n)` of its lone speed in a ring of n.
    # 0.9: between Horovod's paper (~90% at 512 GPUs over RDMA, ~0.99 per doubling) and Bamboo's
    # measured ResNet-50 on 1-GPU AWS nodes (343 -> 1200 img/s at 8 nodes, ~0.76 per doubling).
    scaling_efficiency: Annotated[float, Field(gt=0.5, le=1)] = 0.9
    # state.commit() period: Horovod's elastic ResNet-50 example commits every 100 batches
    # (~10-30 s on a V100); an abrupt failure loses the work since the last commit.
    commit_interval: Annotated[Duration, Field(gt=timedelta(0))] = timedelta(seconds=30)
    # Checkpoint to disk (assumption: every 10 min): a restart resumes from the last one.
    checkpoint_interval: Annotated[Duration, Field(gt=timedelta(0))] = timedelta(minutes=10)
    checkpoint_load: Duration = timedelta(seconds=10)  # assumption: ~100 MB from shared storage
    # spot_static_restart's fixed worker count; None: the trace's time-mean of available nodes.
    static_workers: Annotated[int, Field(ge=1)] | None = None
    # The fixed job size for completion times: what max_workers on-demand workers train in this
    # many hours (cost and work are also reported over the whole trace).
    target_on_demand_hours: Annotated[float, Field(gt=0)] = 4.0


class Overheads(StrictModel):
    """How long Kubernetes, et-operator and Horovod take to change a ring (horovod-elastic.md)."""

    # reconcile period (simulate's default); a notice triggers a reconcile at once
    tick: Annotated[Duration, Field(gt=timedelta(0))] = timedelta(seconds=10)
    pod_startup: Duration = timedelta(seconds=45)  # Bamboo's simulator: 45 s to a running node
    join_reset: Duration = timedelta(seconds=7)  # measured: new process imports torch, ~5-7 s
    graceful_reset: Duration = timedelta(seconds=0.5)  # measured: 4->2 resumed in ~0.3-0.5 s
    failure_detection: Duration = timedelta(seconds=30)  # HOROVOD_GLOO_TIMEOUT_SECONDS
    scale_in_grace: Duration = timedelta(seconds=5)  # launcher lets go, victims deleted
    reactive_scale_out_timeout: Duration = timedelta(seconds=60)  # et-operator ScaleOut default


class Notices(StrictModel):
    lead_time: Duration = timedelta(seconds=120)  # AWS spot interruption warning
    miss_probability: Annotated[float, Field(ge=0, le=1)] = 0.0  # AWS publishes no rate


class BenchParams(StrictModel):
    # "auto": g4dn.xlarge if the trace file name says g4dn, else p3.2xlarge; or a preset name,
    # or a full mapping (name, gpus, spot_price_per_hour, on_demand_price_per_hour)
    instance: str | Instance = "auto"
    jobs: Annotated[list[Workload], Field(min_length=1)] = [Workload()]
    overheads: Overheads = Overheads()
    notices: Notices = Notices()
    # every job must be done this many hours after the start (`--deadline`); None: no deadline,
    # and the deadline policies (uniform_progress, the autoscaler's pace and anchor) are not run
    deadline_hours: Annotated[float, Field(gt=0)] | None = None
    # the node autoscaler the deadline policies rely on for on-demand workers (Karpenter-like)
    on_demand_pool: OnDemandPool = OnDemandPool()

    @field_validator("instance")
    @classmethod
    def _known(cls, value: str | Instance) -> str | Instance:
        if isinstance(value, str) and value != "auto" and value not in INSTANCES:
            raise ValueError(
                f"unknown instance {value!r}: one of auto, {', '.join(INSTANCES)}, "
                "or a mapping with name, gpus, spot/on_demand_price_per_hour"
            )
        return value

    @field_validator("jobs")
    @classmethod
    def _unique(cls, jobs: list[Workload]) -> list[Workload]:
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        return jobs

    def with_job_hours(self, hours: float) -> BenchParams:
        """Every job sized to what its max workers do on on-demand in `hours` (`--job-hours`)."""
        jobs = [j.model_copy(update={"target_on_demand_hours": hours}) for j in self.jobs]
        return self.model_copy(update={"jobs": jobs})

    def instance_for(self, trace_name: str) -> Instance:
        if isinstance(self.instance, Instance):
            return self.instance
        if self.instance == "auto":
            return INSTANCES["g4dn.xlarge" if "g4dn" in trace_name else "p3.2xlarge"]
        return INSTANCES[self.instance]


def load_params(path: str | Path) -> BenchParams:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParamsError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: bad YAML: {exc}") from exc
    try:
        return BenchParams.model_validate(data or {})
    except ValidationError as exc:
        problems = [
            f"{path}: {'.'.join(str(p) for p in err['loc']) or '<top>'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        ]
        raise ParamsError("\n".join(problems)) from exc
