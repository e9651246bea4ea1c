"""How the owned discovery file maps onto the core's workers, both ways.

A worker is `gpus_per_worker` slots on one host, named `host#i`: the line `node-a:4` with 2 GPUs
per worker is the workers `node-a#0` and `node-a#1`. Removing a worker removes its slots.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from autoscaler.adapters.discovery.hostlines import HostSlots
from autoscaler.adapters.discovery.owned import OwnedHostsFile
from autoscaler.config.discovery import StandaloneJob, StandaloneSettings
from autoscaler.core.model import Worker


def owned_file(settings: StandaloneSettings) -> OwnedHostsFile:
    return OwnedHostsFile(
        settings.discovery_file, settings.joined_file, settings.join_grace, settings.assigned_file
    )


def job_of(settings: StandaloneSettings) -> StandaloneJob:
    if settings.job is None or not settings.hosts:
        raise ValueError("standalone mode needs standalone.job and standalone.hosts")
    return settings.job


def workers_of(
    hosts: Sequence[HostSlots], gpus_per_worker: int, joined: Mapping[str, datetime]
) -> tuple[Worker, ...]:
    """File order is join order, so indices grow with age like et-operator's pod indices.

    A listed worker is running, as a Running pod is for et-operator (never `pending`): Horovod
    starts it at its next discovery tick. The file's guard protects workers still joining.
    """
    workers: list[Worker] = []
    for h in hosts:
        for i in range(max(1, h.slots // gpus_per_worker)):
            workers.append(
                Worker(
                    f"{h.host}#{i}", h.host, h.host, len(workers), ready_since=joined.get(h.host)
                )
            )
    return tuple(workers)


def without_workers(
    hosts: Sequence[HostSlots], pods: Sequence[str], gpus_per_worker: int
) -> list[HostSlots]:
    """The hosts with the named workers' slots taken out; a host left with none disappears.

    Only workers still in the file count: a ScaleIn after its drain must not remove more.
    """
    present = {w.pod for w in workers_of(hosts, gpus_per_worker, {})}
    leaving = Counter(pod.rpartition("#")[0] for pod in pods if pod in present)
    out = []
    for h in hosts:
        slots = h.slots - leaving[h.host] * gpus_per_worker
        if slots > 0:
            out.append(HostSlots(h.host, slots))
    return out


def with_workers(
    hosts: Sequence[HostSlots],
    nodes: Sequence[str],
    count: int,
    capacity: Mapping[str, int],
    gpus_per_worker: int,
) -> tuple[list[HostSlots], int]:
    """Place `count` workers on `nodes`, in order, as far as each has free slots; new hosts go last.

    Returns the hosts and how many workers found no room (0 unless the world changed meanwhile).
    """
    used = {h.host: h.slots for h in hosts}
    order = [h.host for h in hosts]
    left = count
    for node in nodes:
        fit = min((capacity.get(node, 0) - used.get(node, 0)) // gpus_per_worker, left)
        if fit <= 0:
            continue
        if node not in used:
            order.append(node)
        used[node] = used.get(node, 0) + fit * gpus_per_worker
        left -= fit
    return [HostSlots(host, used[host]) for host in order], left
