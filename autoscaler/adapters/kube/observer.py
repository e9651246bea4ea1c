"""The cluster as one Snapshot for the core, built from the cache.

What an object means is worked out once per object, not once per tick: pods through the pod
index and nodes through the node table (only changed ones are read), scalers memoised by object
identity, jobs rebuilt only when one of their inputs changed. What does not come with a cached
object is read afresh on every snapshot: the board's notices and spot prices (a moved price
prices every GPU node again).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Generic, TypeVar

import structlog

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.jobs import build_job
from autoscaler.adapters.kube.kinds import KINDS
from autoscaler.adapters.kube.kinds.base import JobContext, JobKind
from autoscaler.adapters.kube.kinds.et_operator_scalers import ScalerFacts, by_job, scaler_facts
from autoscaler.adapters.kube.nodetable import NodeTable, NodeView
from autoscaler.adapters.kube.podindex import PodIndex
from autoscaler.adapters.kube.rejects import Rejections
from autoscaler.adapters.kube.resources import NODES, PODS, Obj, Resource, key_of
from autoscaler.config import Prices
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import CapacityType, Job, Notice, Scaler, Snapshot
from autoscaler.core.progress_rates import ProgressRates
from autoscaler.notices_and_prices import NoticeBoard, PriceBook

log = structlog.get_logger()
T = TypeVar("T")
# by job key and kind: what the job was built from (its object, workers, scaler facts, which of
# them are ahead of the pod view, GiB per GPU), and the job
_Built = dict[tuple[str, str], tuple[tuple[object, ...], Job]]


class _Derived(Generic[T]):
    """Values derived from cached objects, reused while the cache holds the very same dict: the
    cache replaces a changed object, never changes one in place. Holding the object keeps its id
    from being reused."""

    def __init__(self, derive: Callable[[Obj], T]) -> None:
        self._derive = derive
        self._memo: dict[int, tuple[Obj, T]] = {}

    def __call__(self, objs: Iterable[Obj]) -> list[T]:
        memo: dict[int, tuple[Obj, T]] = {}  # anew each time: objects gone from the cache go
        out: list[T] = []
        for obj in objs:
            hit = self._memo.get(id(obj))
            value = hit[1] if hit is not None and hit[0] is obj else self._derive(obj)
            memo[id(obj)] = (obj, value)
            out.append(value)
        self._memo = memo
        return out


def _read_scaler(rejects: Rejections, resource: Resource, obj: Obj) -> ScalerFacts | None:
    return rejects.read(resource.kind, obj, lambda o: scaler_facts(resource, o))


class KubeObserver:
    def __init__(
        self,
        cache: KubeCache,
        settings: KubernetesSettings,
        prices: Prices,
        board: NoticeBoard,
        price_book: PriceBook,
        rejections: Rejections | None = None,
    ) -> None:
        self._cache = cache
        self._rejects = rejections or Rejections()
        rejects = self._rejects
        self._settings = settings
        self._prices = prices
        self._board = board
        self._price_book = price_book
        self._pods = PodIndex(cache, settings, rejects)
        self._nodes = NodeTable(cache, settings, rejects)
        # the scaler objects of kinds that have them (et-operator's ScaleOut and ScaleIn)
        self._scalers = {
            r: _Derived(functools.partial(_read_scaler, rejects, r))
            for kind in KINDS
            for r in kind.helpers
        }
        self._built: _Built = {}  # the last snapshot's jobs
        # the kinds a snapshot is made of, and whose decisions one behind the server holds: every
        # job's (nodes, pods), or its backend's jobs' (Snapshot.stale)
        self._read = {NODES: "Node", PODS: "Pod"} | {
            r: kind.backend for kind in KINDS for r in kind.resources
        }
        self._warned: set[tuple[str, ...]] = set()
        # job -> hosts Horovod saw fail: a worker whose node died or went NotReady while it was
        # still in discovery. Horovod blacklists those names; et-operator may reuse them. Kept in
        # memory only: after a restart the warning is lost, never a wrong action taken.
        self._failed: dict[str, set[str]] = defaultdict(set)
        self._rates = ProgressRates()  # each job's pace, from its progress annotation over time

    def set_prices(self, prices: Prices) -> None:
        """A reloaded config's price table: the next snapshot prices nodes with it."""
        self._prices = prices

    def snapshot(self, now: datetime) -> Snapshot:
        before = self._as_of()
        view, notices = self._view(now)
        jobs = self._jobs(view.memory_per_gpu, before[1])
        for gone in self._failed.keys() - {j.key for j in jobs}:
            del self._failed[gone]  # the job finished or was deleted
        self._rates.forget_except({j.key for j in jobs})
        return self._snapshot(view, notices, jobs, now, before[0])

    def noticed(self, now: datetime) -> Snapshot:
        """The fast path's view: every node and notice, and only the jobs with a pod on a noticed
        node (all a notice's departures read). Building every job's was most of the fast path's
        CPU at 2,000 jobs on a real control plane (py-spy of benchmarks/reaction.py)."""
        before = self._as_of()
        view, notices = self._view(now)
        keys = self._pods.jobs_on({n.node for n in notices})
        jobs = self._jobs(view.memory_per_gpu, before[1], keys)
        return self._snapshot(view, notices, jobs, now, before[0])

    def _as_of(self) -> tuple[frozenset[Resource], int]:
        """What the views were before anything is read from them: the kinds behind, and the
        resourceVersion the pod view is complete up to. Read after, they could be newer than
        what was read (a re-list landing mid-snapshot: a pod view counted fresh, or complete
        past a ScaleOut whose pods the pod index had not taken in yet: `with_unseen` would not
        add them, and a ScaleOut sized on that count goes past max)."""
        return self._cache.behind(), self._cache.seen_rv(PODS)

    def _view(self, now: datetime) -> tuple[NodeView, list[Notice]]:
        held_changed = self._pods.refresh()
        price = functools.cache(self._price)  # for this snapshot only: prices move
        view = self._nodes.read(self._pods.held, held_changed, price)
        return view, [*view.notices, *self._board.active(now)]

    def _snapshot(
        self,
        view: NodeView,
        notices: list[Notice],
        jobs: list[Job],
        now: datetime,
        behind: frozenset[Resource],
    ) -> Snapshot:
        alive = view.alive
        lost = self._pods.jobs_on(self._pods.nodes() - alive)
        jobs = [self._with_failures(j, alive, j.key in lost) for j in jobs]
        spot = frozenset(n.name for n in view.gpu_nodes if n.capacity_type is CapacityType.SPOT)
        jobs = [self._rates.with_rate(j, now, spot) for j in jobs]
        behind |= self._cache.behind()  # before or after the reads: either way, not trusted
        if self._unconfirmed(view.notices, notices[len(view.notices) :]):
            behind |= {NODES}
        stale = frozenset(self._read[r] for r in behind if r in self._read)
        return Snapshot(nodes=view.gpu_nodes, notices=tuple(notices), jobs=tuple(jobs), stale=stale)

    def _unconfirmed(self, on_nodes: list[Notice], on_board: list[Notice]) -> bool:
        """Whether a notice read from a Node may be gone on the server: the node view holds the
        node from before its last break, and the resumed watch may not have replayed the
        change yet (KubeCache.current). The core then lets out only the notices' own
        departures (core/freshness.py), and the actuator confirms their drains on the server.
        A notice the cloud source's board holds as well is no ghost."""
        board = {n.node for n in on_board}
        return any(n.node not in board and not self._cache.current(NODES, n.node) for n in on_nodes)

    def _with_failures(self, job: Job, alive: frozenset[str], lost: bool) -> Job:
        """`lost`: the job has a pod on a node that is not alive, the only way to a new failure."""
        if lost:
            seen = self._failed[job.key]
            for w in job.workers:
                if not w.pending and w.node not in alive and w.host not in job.drained_hosts:
                    seen.add(w.host)
        failed = self._failed.get(job.key)
        return replace(job, failed_hosts=frozenset(failed)) if failed else job

    def _price(self, kind: CapacityType, itype: str, zone: str, gpus: float) -> float | None:
        spot = kind is CapacityType.SPOT
        price = self._price_book.spot_price(itype, zone) if spot else None
        return price if price is not None else self._prices.for_node(itype, spot, gpus)

    def _jobs(
        self, memory_per_gpu: float | None, pods_seen: int, only: set[str] | None = None
    ) -> list[Job]:
        """Every job, or those of the keys `only` (which then leaves the others' memo be);
        `pods_seen`: the pod view's resourceVersion from before the pod index was read."""
        helpers = (r for kind in KINDS for r in kind.helpers)
        facts = [f for r in helpers for f in self._scalers[r](self._cache.items(r))]
        scalers = by_job(f for f in facts if f is not None)
        built: _Built = {} if only is None else self._built
        jobs: list[Job] = []
        for kind in KINDS:
            workers = functools.partial(self._pods.workers, backend=kind.backend)
            ctx = JobContext(workers, scalers, pods_seen, self._newest)

            def build(obj: Obj, kind: JobKind = kind, ctx: JobContext = ctx) -> Job:
                return self._job(built, kind, obj, ctx, memory_per_gpu)

            for obj in self._objects(kind.jobs, only):
                if kind.phase(obj) in kind.finished:
                    continue
                if (job := self._rejects.read(kind.jobs.kind, obj, build)) is not None:
                    jobs.append(job)
        self._built = built
        return jobs

    def _objects(self, resource: Resource, keys: set[str] | None) -> list[Obj]:
        if keys is None:
            return self._cache.items(resource)
        return [obj for key in keys if (obj := self._cache.get(resource, key)) is not None]

    def _job(
        self,
        built: _Built,
        kind: JobKind,
        obj: Obj,
        ctx: JobContext,
        memory_per_gpu: float | None,
    ) -> Job:
        """The job built from its object and what JobContext gives its kind; the last snapshot's
        while those are the same (equality stops at identity: mostly the very same objects).
        On the notice path too: building every job's inputs was half of a snapshot."""
        key = key_of(obj)
        facts = tuple(ctx.scalers.get(key, ()))
        ahead = tuple(f.resource_version > ctx.pods_seen for f in facts)
        made_of = (obj, ctx.workers(key), facts, ahead, memory_per_gpu)
        hit = self._built.get((key, kind.backend))
        if hit is not None and hit[0] == made_of:
            job = hit[1]
        else:
            job = build_job(obj, kind, kind.inputs(obj, ctx), self._settings, memory_per_gpu)
        built[(key, kind.backend)] = (made_of, job)
        return job

    def _newest(
        self, job: str, in_flight: tuple[ScalerFacts, ...], workers: Iterable[str]
    ) -> Scaler | None:
        if not in_flight:
            return None
        if len(in_flight) > 1:
            names = tuple(s.name for s in in_flight)
            if (job, *names) not in self._warned:  # once per set, not every tick
                self._warned.add((job, *names))
                log.warning(
                    "several_scalers_in_flight", job=job, scalers=list(names), reported=names[-1]
                )
        return in_flight[-1].as_scaler(workers)
