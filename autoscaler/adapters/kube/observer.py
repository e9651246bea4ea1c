"""The cluster as one Snapshot for the core, built from the cache in one pass over the pods."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime

import structlog

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.jobs import FINISHED_PHASES, build_job, cce_scaler, job_phase
from autoscaler.adapters.kube.nodes import (
    INSTANCE_TYPE_LABELS,
    ZONE_LABELS,
    capacity_type,
    first_label,
    node_gpus,
    node_notices,
    ready,
    schedulable,
)
from autoscaler.adapters.kube.pods import PodFacts, pod_facts
from autoscaler.adapters.kube.resources import (
    AI_TRAINING_JOBS,
    NODES,
    PODS,
    SCALE_INS,
    SCALE_OUTS,
    TRAINING_JOBS,
    Obj,
    key_of,
    labels_of,
)
from autoscaler.adapters.kube.scalers import ScalerFacts, by_job, scaler_facts, scaler_state
from autoscaler.config import Prices
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import Backend, CapacityType, GpuNode, Job, Notice, Scaler, Snapshot
from autoscaler.signals import NoticeBoard, PriceBook

log = structlog.get_logger()


class KubeObserver:
    def __init__(
        self,
        cache: KubeCache,
        settings: KubernetesSettings,
        prices: Prices,
        board: NoticeBoard,
        price_book: PriceBook,
    ) -> None:
        self._cache = cache
        self._settings = settings
        self._prices = prices
        self._board = board
        self._price_book = price_book
        # Pod facts by object identity, reused while the cache holds the very same dict (a
        # changed pod is a new dict): most pods do not change between snapshots. Holding the
        # object keeps its id from being reused.
        self._pod_memo: dict[int, tuple[Obj, PodFacts]] = {}
        self._warned: set[tuple[str, ...]] = set()
        # job -> hosts Horovod saw fail: a worker whose node died or went NotReady while it was
        # still in discovery. Horovod blacklists those names; et-operator may reuse them. Kept in
        # memory only: after a restart the warning is lost, never a wrong action taken.
        self._failed: dict[str, set[str]] = defaultdict(set)

    def snapshot(self, now: datetime) -> Snapshot:
        pods = self._pods()
        gpus_on: dict[str, float] = defaultdict(float)
        memory_on: dict[str, float] = defaultdict(float)
        workers: dict[str, list[PodFacts]] = defaultdict(list)
        for p in pods:  # the terminated are filtered by the cache already
            if p.node is not None:
                gpus_on[p.node] += p.gpus
                memory_on[p.node] += p.gpu_memory
            if p.job is not None:
                workers[p.job].append(p)

        nodes: list[GpuNode] = []
        notices: list[Notice] = []
        memory_per_gpu: list[float] = []
        alive: set[str] = set()
        for node in self._cache.items(NODES):
            if ready(node):
                alive.add(key_of(node))
            notices.extend(node_notices(node, self._settings))
            gpu = node_gpus(node, self._settings)
            if gpu.whole <= 0:
                continue
            name = key_of(node)
            requested = gpus_on.get(name, 0.0)
            if gpu.memory_per_gpu:
                memory_per_gpu.append(gpu.memory_per_gpu)
                requested += memory_on.get(name, 0.0) / gpu.memory_per_gpu
            nodes.append(self._gpu_node(node, name, gpu.whole, requested))
        notices.extend(self._board.active(now))
        jobs = self._jobs(workers, min(memory_per_gpu, default=None))
        for gone in self._failed.keys() - {j.key for j in jobs}:
            del self._failed[gone]  # the job finished or was deleted
        jobs = [self._with_failures(j, alive) for j in jobs]
        return Snapshot(nodes=tuple(nodes), notices=tuple(notices), jobs=tuple(jobs))

    def _with_failures(self, job: Job, alive: set[str]) -> Job:
        failed = self._failed[job.key]
        for w in job.workers:
            if not w.pending and w.node not in alive and w.host not in job.drained_hosts:
                failed.add(w.host)
        return replace(job, failed_hosts=frozenset(failed)) if failed else job

    def _pods(self) -> list[PodFacts]:
        memo: dict[int, tuple[Obj, PodFacts]] = {}
        out: list[PodFacts] = []
        for pod in self._cache.items(PODS):
            hit = self._pod_memo.get(id(pod))
            facts = hit[1] if hit is not None and hit[0] is pod else pod_facts(pod, self._settings)
            memo[id(pod)] = (pod, facts)
            out.append(facts)
        self._pod_memo = memo
        return out

    def _gpu_node(self, node: Obj, name: str, allocatable: float, requested: float) -> GpuNode:
        labels = labels_of(node)
        kind = capacity_type(node, self._settings)
        itype, zone = first_label(labels, INSTANCE_TYPE_LABELS), first_label(labels, ZONE_LABELS)
        spot = kind is CapacityType.SPOT
        price = self._price_book.spot_price(itype, zone) if spot else None
        if price is None:
            price = self._prices.for_node(itype, spot=spot)
        return GpuNode(
            name=name, gpus_allocatable=allocatable, gpus_requested=requested, capacity_type=kind,
            price_per_hour=price, schedulable=schedulable(node, self._settings), zone=zone,
            instance_type=itype, labels=labels,
        )

    def _jobs(self, workers: dict[str, list[PodFacts]], memory_per_gpu: float | None) -> list[Job]:
        scalers = by_job(
            scaler_facts(resource, obj)
            for resource in (SCALE_OUTS, SCALE_INS)
            for obj in self._cache.items(resource)
        )
        jobs: list[Job] = []
        for obj in self._cache.items(TRAINING_JOBS):
            if job_phase(obj) in FINISHED_PHASES:
                continue
            key = key_of(obj)
            state = scaler_state(obj, key, scalers.get(key, []))
            pods = [p for p in workers.get(key, ()) if p.backend is Backend.ET_OPERATOR]
            scaler = self._newest(key, state.in_flight)
            jobs.append(build_job(obj, Backend.ET_OPERATOR, pods, state, scaler, self._settings,
                                  memory_per_gpu))
        for obj in self._cache.items(AI_TRAINING_JOBS):
            if job_phase(obj) in FINISHED_PHASES:
                continue
            pods = [p for p in workers.get(key_of(obj), ()) if p.backend is Backend.CCE]
            jobs.append(build_job(obj, Backend.CCE, pods, None, cce_scaler(obj, pods),
                                  self._settings, memory_per_gpu))
        return jobs

    def _newest(self, job: str, in_flight: tuple[ScalerFacts, ...]) -> Scaler | None:
        if not in_flight:
            return None
        if len(in_flight) > 1:
            names = tuple(s.name for s in in_flight)
            if (job, *names) not in self._warned:  # once per set, not every tick
                self._warned.add((job, *names))
                log.warning("several_scalers_in_flight", job=job, scalers=list(names),
                            reported=names[-1])
        return in_flight[-1].as_scaler()
