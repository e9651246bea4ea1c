"""Pod facts kept current from the cache's changes, grouped the two ways a snapshot reads them:
the GPUs held on each node and the workers of each job.

At 50,000 pods, reading every pod on every tick costs more than deciding; a pod changes far less
often than the autoscaler ticks. So each changed pod is read once, and only the nodes and jobs
it was or is on are counted again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.jobs import by_index, worker_of
from autoscaler.adapters.kube.kinds import recognise
from autoscaler.adapters.kube.pods import PodFacts, pod_facts
from autoscaler.adapters.kube.rejects import Rejections
from autoscaler.adapters.kube.resources import PODS, Obj
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import Worker

JobKey = tuple[str, str]  # `ns/name` of the job, and the kind (backend) whose workers these are
K = TypeVar("K")
V = TypeVar("V")
_NOTHING = (0.0, 0.0)


class PodIndex:
    def __init__(self, cache: KubeCache, settings: KubernetesSettings, rejects: Rejections) -> None:
        self._cache = cache
        self._rejects = rejects
        self._settings = settings
        self._changes = cache.track(PODS)  # every pod the cache holds, to start with
        self._facts: dict[str, PodFacts] = {}  # by pod key
        # pod key -> its facts per node (None: not bound), its Worker per job
        self._on_node: dict[str | None, dict[str, PodFacts]] = {}
        self._of_job: dict[JobKey, dict[str, Worker]] = {}  # a Worker per pod version
        self._held: dict[str | None, tuple[float, float]] = {}  # (GPUs, GPU memory) per node
        self._workers: dict[JobKey, tuple[Worker, ...]] = {}  # the same tuple while unchanged

    def refresh(self) -> set[str | None]:
        """Take in the pods changed since the last refresh; the nodes whose GPUs held changed."""
        nodes: set[str | None] = set()
        jobs: set[JobKey] = set()
        for key in self._changes.take():
            pod = self._cache.get(PODS, key)
            new = self._rejects.read("Pod", pod, self._facts_of) if pod is not None else None
            if new is not None and new == self._facts.get(key):
                continue  # a status update that changed nothing read here (most of them)
            if (old := self._facts.pop(key, None)) is not None:
                nodes.add(_leave(self._on_node, old.node, key))
                if (job := _job_of(old)) is not None:
                    jobs.add(_leave(self._of_job, job, key))
            if new is not None:
                self._facts[key] = new
                nodes.add(_join(self._on_node, new.node, key, new))
                if (job := _job_of(new)) is not None:
                    jobs.add(_join(self._of_job, job, key, worker_of(new)))
        for node in nodes:
            if pods := self._on_node.get(node):
                gpus = sum(p.gpus for p in pods.values())
                self._held[node] = (gpus, sum(p.gpu_memory for p in pods.values()))
            else:
                self._held.pop(node, None)
        for job in jobs:
            if workers := self._of_job.get(job):
                self._workers[job] = by_index(workers.values())
            else:
                self._workers.pop(job, None)
        return nodes

    def _facts_of(self, pod: Obj) -> PodFacts:
        return pod_facts(pod, self._settings, _recognise)

    def held(self, node: str) -> tuple[float, float]:
        """(whole GPUs, shared-GPU memory) the pods bound to `node` request."""
        return self._held.get(node, _NOTHING)

    def workers(self, job: str, backend: str) -> tuple[Worker, ...]:
        return self._workers.get((job, backend), ())

    def jobs_on(self, nodes: Iterable[str | None]) -> set[str]:
        """Keys of the jobs with a worker pod bound to any of `nodes` (None: unbound)."""
        return {p.job for n in nodes for p in self._on_node.get(n, {}).values() if p.job}

    def nodes(self) -> set[str | None]:
        """Every node a pod is bound to (None if a pod is not bound)."""
        return set(self._on_node)


def _recognise(meta: Obj, name: str, labels: dict[str, str]) -> tuple[str, str] | None:
    """(backend, job) of a worker pod of any kind."""
    found = recognise(meta, name, labels)
    return (found[0].backend, found[1]) if found is not None else None


def _job_of(facts: PodFacts) -> JobKey | None:
    if facts.job is None or facts.backend is None:
        return None
    return facts.job, facts.backend


def _join(groups: dict[K, dict[str, V]], group: K, key: str, member: V) -> K:
    groups.setdefault(group, {})[key] = member
    return group


def _leave(groups: dict[K, dict[str, V]], group: K, key: str) -> K:
    members = groups[group]
    del members[key]
    if not members:
        del groups[group]
    return group
