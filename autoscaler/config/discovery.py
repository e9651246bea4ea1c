"""`discovery:` and `standalone:` sections: Horovod host-discovery files, operator-less mode."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from autoscaler.core.model import CapacityType
from autoscaler.core.policy import Duration, Price, StrictModel, Workers

# What Horovod's strict parser accepts as a hostname (`^[\w.-]+:[0-9]+$`), ASCII only.
HOSTNAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
HostName = Annotated[str, StringConstraints(pattern=HOSTNAME_PATTERN)]


class DiscoverySettings(StrictModel):
    """`discovery:` the overlay on et-operator's hostfile (defaults of `discovery-sidecar`).

    The launcher's sidecar writes `dir/drain_file` from the job's drained-hosts annotation;
    the shipped `discover_hosts.sh` prints the operator's hostfile minus those hosts.
    """

    dir: Path = Path("/etc/edl")  # the launcher's shared emptyDir (et-operator mounts it there)
    drain_file: str = "drained-hosts"  # = the script's SPOT_DRAIN_FILE default, under /etc/edl
    watch_timeout: Duration = timedelta(minutes=5)  # server-side watch timeout, then resume
    backoff_max: Duration = timedelta(seconds=30)  # cap of the retry delay after API errors

    @property
    def drain_path(self) -> Path:
        return self.dir / self.drain_file


class StandaloneHost(StrictModel):
    """A machine Horovod can run on; `slots` = its GPUs (processes Horovod may start there)."""

    name: HostName  # as horovodrun reaches it (a DNS name or address)
    slots: Annotated[int, Field(ge=1)] = 1  # its GPUs
    capacity_type: CapacityType = CapacityType.SPOT  # spot hosts may get notices
    price_per_hour: Price | None = None  # the whole host, USD; null: unknown (caps exclude it)


class StandaloneJob(StrictModel):
    """The one horovodrun job a standalone daemon scales."""

    name: str  # for policy matching and the decision log
    namespace: str = "standalone"  # only for policy matching and the decision log (`ns/name`)
    min_workers: Workers = 1  # hosts in the discovery file at the least
    max_workers: Workers  # hosts in the discovery file at the most
    gpus_per_worker: Annotated[int, Field(ge=1)] = 1  # slots per worker
    labels: dict[str, str] = {}  # for policy `match.labels` and the policy label

    @model_validator(mode="after")
    def _ordered(self) -> StandaloneJob:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers {self.min_workers} > max_workers {self.max_workers}")
        return self


class StandaloneSettings(StrictModel):
    """`standalone:` horovodrun on plain machines: we own the whole discovery file."""

    hosts: list[StandaloneHost] = []  # every machine the job may use
    job: StandaloneJob | None = None  # required in standalone mode
    discovery_file: Path = Path("/var/lib/spot-autoscaler/hosts")  # horovodrun cats this file
    notice_dir: Path | None = None  # `<host>.json` in it = a notice for that host
    # how often `notice_dir` is read (at most 0.5 s: a notice must drain within a second)
    notice_poll: Annotated[Duration, Field(gt=timedelta(0), le=timedelta(seconds=0.5))] = timedelta(
        seconds=0.25
    )
    # A host added to the file counts as joining this long: Horovod's new processes still start
    # and sync state, so the file keeps a settled host until then (see adapters.discovery.owned).
    join_grace: Duration = timedelta(seconds=30)

    @model_validator(mode="after")
    def _unique_hosts(self) -> StandaloneSettings:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate host names: {', '.join(dupes)}")
        return self

    @property
    def joined_file(self) -> Path:
        """When each host entered the discovery file (JSON), beside it."""
        return self.discovery_file.with_name(self.discovery_file.name + ".joined.json")

    @property
    def assigned_file(self) -> Path:
        """Which hosts run a Horovod worker, since when: owned_hosts.sh's report, beside it."""
        return self.discovery_file.with_name(self.discovery_file.name + ".assigned")
