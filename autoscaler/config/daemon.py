"""`daemon:` section: ticks, metrics/health port, leader election."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, model_validator

from autoscaler.core.policy import Duration, StrictModel

Positive = Annotated[Duration, Field(gt=timedelta(0))]
NonNegative = Annotated[Duration, Field(ge=timedelta(0))]


class LeaderElectionSettings(StrictModel):
    """A coordination.k8s.io/v1 Lease, with client-go's timing rules: only the holder acts."""

    enabled: bool = True  # false: this replica acts alone (run one replica only)
    lease_name: str = "spot-autoscaler"  # the Lease object's name
    # null: the pod's own namespace (POD_NAMESPACE, else the service account's)
    lease_namespace: str | None = None
    lease_duration: Positive = timedelta(seconds=15)  # others wait this long for a silent holder
    # the holder stops acting if not renewed by then
    renew_deadline: Positive = timedelta(seconds=10)
    retry_period: Positive = timedelta(seconds=2)  # between acquire / renew attempts
    identity: str | None = None  # None: $POD_NAME, else hostname-pid
    # process: renewals in a child process of their own, which the daemon's busy threads cannot
    # starve of the interpreter lock (a lapsed lease at 2,000 nodes, docs/benchmarks.md);
    # thread: in the daemon's process (one interpreter less, ~85 MB resident)
    renew_in: Literal["process", "thread"] = "process"

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionSettings:
        # The holder must give up before anyone else may take over, and get several tries first.
        if not self.lease_duration > self.renew_deadline > self.retry_period:
            raise ValueError("need lease_duration > renew_deadline > retry_period")
        return self


class DaemonSettings(StrictModel):
    """`spot-autoscaler run`: how the daemon runs, listens and logs."""

    # kubernetes: a cluster's jobs via the API server; standalone: one horovodrun job on plain
    # hosts (the `standalone:` section), no API server
    mode: Literal["kubernetes", "standalone"] = "kubernetes"
    tick_interval: Positive = timedelta(seconds=15)  # periodic reconcile; watches wake it sooner
    # after the first wake-up, wait this long for more before reconciling: a burst (one SQS
    # receive brings up to 10 notices together) is one pass, and every ms here delays a drain
    wake_coalesce: NonNegative = timedelta(milliseconds=50)
    config_reload_interval: NonNegative = timedelta(seconds=30)  # 0 disables reloading
    sync_timeout: Positive = timedelta(seconds=60)  # how long --once waits for caches to fill
    # failed passes are retried after 1 s, 2 s, 4 s ... up to this
    error_backoff_max: Positive = timedelta(minutes=1)
    # /healthz fails once the loop has not come round for this long (a hung call); never less
    # than two ticks or two back-offs, which are the loop's normal silences
    liveness_timeout: Positive = timedelta(minutes=2)
    # one port for /metrics, /healthz and /readyz; 0 = any free port
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9090
    metrics_bind_address: str = "0.0.0.0"  # 127.0.0.1 keeps the port off the network
    # auto: console lines on a terminal, else JSON
    log_format: Literal["json", "console", "auto"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"  # `run --log-level` overrides
    leader_election: LeaderElectionSettings = LeaderElectionSettings()

    @property
    def effective_liveness_timeout(self) -> timedelta:
        return max(self.liveness_timeout, 2 * self.tick_interval, 2 * self.error_backoff_max)
