"""Replay spot availability through the same reconciler and core the daemon uses.

Discrete events: trace adds/removes, notices `notice_lead_time` before each removal (some missed at
random, seeded), reconcile ticks, and the cluster's own changes (pods starting, scalers ending).
A notice triggers a reconcile at once, as the daemon's watches do. `replay` is the event loop with
any controller (the benchmark drives baselines through it); `simulate` runs it with the reconciler.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from autoscaler.config.schema import Config
from autoscaler.core import Action, CapacityType, Decision, Notice, NoticeKind
from autoscaler.logs import file_logger
from autoscaler.reconcile import Reconciler
from autoscaler.sim.cluster import (
    Loss,
    NodePool,
    ProgressSource,
    RingListener,
    SimNode,
    SimulatedCluster,
)
from autoscaler.sim.trace import TraceEvent

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # simulated time starts here: runs are reproducible
_ORDER = {
    "remove": 0,
    "price": 1,
    "add": 2,
    "notice": 3,
    "tick": 4,
}  # same instant: world first, then react


@dataclass
class Accounts:
    """Integrals over simulated time, advanced before every state change."""

    gpu_hours: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cost_usd: float = 0.0
    worker_hours: float = 0.0
    workers_over_time: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    cost_over_time: list[tuple[float, float]] = field(default_factory=list)  # (t, cumulative $)
    at: datetime = EPOCH

    def advance(self, cluster: SimulatedCluster, now: datetime) -> None:
        hours = (now - self.at).total_seconds() / 3600
        if hours > 0:
            self._charge(cluster, hours)
        self.at = now
        t = (now - EPOCH).total_seconds()
        if hours > 0 or not self.cost_over_time:
            self.cost_over_time.append((t, self.cost_usd))
        self._count_workers(cluster, t)

    def _charge(self, cluster: SimulatedCluster, hours: float) -> None:
        """Bill `hours` of the cluster as it stands, and count its running workers' hours."""
        # a pool node is paid whole while it exists (empty or not); elsewhere a pod pays
        # for its GPUs (the trace's nodes stand for capacity the node autoscaler would hold
        # only while pods use it)
        for pooled in (n for n in cluster.nodes.values() if n.pooled):
            self._bill(pooled, pooled.gpus, hours)
        for pod in cluster.pods.values():
            host = cluster.nodes.get(pod.node or "")
            if host is None:
                continue
            if not host.pooled:
                self._bill(host, pod.gpus, hours)
            self.worker_hours += hours if pod.running else 0.0

    def _count_workers(self, cluster: SimulatedCluster, t: float) -> None:
        """Each job's running workers at `t`, recorded where the count changed."""
        for key in cluster.jobs:
            running = sum(1 for p in cluster.pods.values() if p.job == key and p.running)
            series = self.workers_over_time.setdefault(key, [])
            if not series or series[-1][1] != running:
                series.append((t, running))

    def _bill(self, node: SimNode, gpus: float, hours: float) -> None:
        self.gpu_hours[node.capacity.value] += gpus * hours
        self.cost_usd += gpus * node.price_per_hour / node.gpus * hours


@dataclass
class NoticeStats:
    posted: int = 0
    not_delivered: int = 0  # dropped by `notice_miss_probability`
    removals_with_workers: int = 0
    handled_gracefully: int = 0  # every worker was out of discovery before its node died
    missed: int = 0  # some worker died while still in discovery
    workers_graceful: int = 0  # on a noticed node, out of discovery before it died
    workers_abrupt: int = 0  # died while still in discovery


@dataclass
class Replay:
    accounts: Accounts
    notices: NoticeStats
    end: float  # seconds: the last tick
    nodes_max: int
    spot_nodes: list[tuple[float, int]] = field(default_factory=list)  # (t, up) at each change
    notices_at: list[float] = field(default_factory=list)  # t of each notice posted


def sim_cluster(
    config: Config,
    listener: RingListener | None = None,
    scale_out_timeout: timedelta | None = None,
    progress: ProgressSource | None = None,
    seed: int = 0,
) -> SimulatedCluster:
    """The simulated cluster `config.simulate` describes; ScaleOut timeout from the policies;
    `seed` draws the on-demand pool's delays and refusals."""
    settings = config.simulate
    if scale_out_timeout is None:
        timeouts = [p.scale_out.timeout for p in config.policy_set.policies]
        scale_out_timeout = max(timeouts, default=timedelta(minutes=5))
    pool = settings.on_demand_pool
    return SimulatedCluster(
        settings.jobs,
        pod_startup=settings.pod_startup,
        scale_out_timeout=scale_out_timeout,
        scale_in_grace=settings.scale_in_grace,
        listener=listener,
        pool=None if pool is None else NodePool(pool, _node(config, "", spot=False, pooled=True)),
        progress=progress,
        seed=seed,
    )


def simulate(
    config: Config,
    trace: list[TraceEvent],
    seed: int,
    decisions_out: TextIO,
    progress: Callable[[float, float], None] | None = None,
) -> dict[str, Any]:
    cluster = sim_cluster(config, seed=seed)
    decisions: Counter[tuple[str, str]] = Counter()

    def count(decision: Decision) -> None:
        if decision.action is not Action.NOOP:
            decisions[(decision.action.value, decision.reason.value)] += 1

    reconciler = Reconciler(
        cluster, cluster, config.policy_set, file_logger(decisions_out), on_decision=count
    )
    started = time.perf_counter()
    run = replay(config, trace, seed, cluster, reconciler.tick, progress)
    return _summary(
        config, cluster, run, decisions, time.perf_counter() - started, reconciler.errors
    )


def replay(
    config: Config,
    trace: list[TraceEvent],
    seed: int,
    cluster: SimulatedCluster,
    tick: Callable[[datetime], object],
    progress: Callable[[float, float], None] | None = None,
    until: float = 0.0,
) -> Replay:
    """Feed `trace` (plus notices and ticks) to `cluster`; `tick(now)` is the controller. The
    replay runs to the trace's end, or holds its last state until `until` seconds."""
    settings = config.simulate
    rng = random.Random(seed)
    accounts = Accounts()
    world = _TraceWorld(config, cluster)
    end = horizon(trace, settings.tick, until)
    events, world.notices.not_delivered = _schedule(
        trace, settings.notice_lead_time, settings.tick, settings.notice_miss_probability, rng, end
    )
    for i in range(settings.on_demand_nodes):
        cluster.add_node(_node(config, f"on-demand-{i + 1}", spot=False))

    while events:
        t = events[0][0]
        own = cluster.next_change()
        if own is not None and (own - EPOCH).total_seconds() < t:
            accounts.advance(cluster, own)
            cluster.advance(own)
            continue
        now = EPOCH + timedelta(seconds=t)
        accounts.advance(cluster, now)
        cluster.advance(now)
        react = False
        while events and events[0][0] == t:
            _, _, kind, node = heapq.heappop(events)
            react = world.happen(kind, node, t, now) or react
        if react:
            tick(now)
        if progress is not None:
            progress(t, end)
    accounts.advance(cluster, EPOCH + timedelta(seconds=end))
    return Replay(accounts, world.notices, end, world.nodes_max, world.spot_nodes, world.notices_at)


@dataclass
class _TraceWorld:
    """What the trace's events do to the cluster during a replay, and what they leave to report."""

    config: Config
    cluster: SimulatedCluster
    notices: NoticeStats = field(default_factory=NoticeStats)
    nodes_max: int = 0
    price_factor: float = 1.0  # on the spot price, from the trace's price lines
    noticed_workers: dict[str, int] = field(default_factory=dict)  # noticed node -> running then
    spot_nodes: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])
    notices_at: list[float] = field(default_factory=list)

    def happen(self, kind: str, node: str, t: float, now: datetime) -> bool:
        """Apply one scheduled event; True if the controller should react at this instant."""
        if kind == "add":
            self.cluster.add_node(_node(self.config, node, spot=True, factor=self.price_factor))
            self.nodes_max = max(self.nodes_max, len(self.cluster.nodes))
            self.spot_nodes.append((t, self.spot_nodes[-1][1] + 1))
        elif kind == "remove":
            losses = self.cluster.remove_node(node, now)
            _tally_removal(self.notices, losses, self.noticed_workers.pop(node, 0))
            self.spot_nodes.append((t, self.spot_nodes[-1][1] - 1))
        elif kind == "price":
            self._reprice(float(node))
        elif kind == "notice":
            self._post_notice(node, t, now)
        return kind in ("notice", "tick")

    def _reprice(self, factor: float) -> None:
        self.price_factor = factor
        priced = _node(self.config, "", spot=True, factor=factor).price_per_hour
        for up in self.cluster.nodes.values():
            if up.capacity is CapacityType.SPOT:
                up.price_per_hour = priced

    def _post_notice(self, node: str, t: float, now: datetime) -> None:
        self.notices.posted += 1
        self.notices_at.append(t)
        self.noticed_workers[node] = sum(
            1 for p in self.cluster.pods.values() if p.node == node and p.running
        )
        self.cluster.post_notice(
            Notice(
                node,
                NoticeKind.INTERRUPTION,
                "simulator",
                f"sim-{node}-{t:.0f}",
                deadline=now + self.config.simulate.notice_lead_time,
                received_at=now,
            )
        )


def horizon(trace: list[TraceEvent], tick: timedelta, until: float = 0.0) -> float:
    """When a replay of `trace` ends: the first tick after its last event, or after `until` if
    later (seconds)."""
    step = tick.total_seconds()
    last = max((e.t for e in trace), default=0.0)
    return int((max(last, until) + step) // step) * step


def _schedule(
    trace: list[TraceEvent],
    lead: timedelta,
    tick: timedelta,
    miss: float,
    rng: random.Random,
    end: float,
) -> tuple[list[tuple[float, int, str, str]], int]:
    """The event heap, and how many notices were dropped (never delivered)."""
    events: list[tuple[float, int, str, str]] = []
    added_at: dict[str, float] = {}
    dropped = 0
    for e in trace:
        events.append((e.t, _ORDER[e.kind], e.kind, e.node))
        if e.kind == "price":
            continue
        if e.kind == "add":
            added_at[e.node] = e.t
        elif rng.random() < miss:
            dropped += 1
        else:  # a node younger than the lead time gets its notice when it appears
            at = max(added_at.get(e.node, 0.0), e.t - lead.total_seconds())
            events.append((at, _ORDER["notice"], "notice", e.node))
    step = tick.total_seconds()
    ticks = int(end // step) + 1
    events += [(i * step, _ORDER["tick"], "tick", "") for i in range(ticks)]
    heapq.heapify(events)
    return events, dropped


def _node(
    config: Config, name: str, spot: bool, pooled: bool = False, factor: float = 1.0
) -> SimNode:
    """A node of the simulated instance type; a spot one at `factor` times its price."""
    s = config.simulate
    fallback = s.spot_price_per_hour if spot else s.on_demand_price_per_hour
    price = config.prices.for_node(s.instance_type, spot, s.gpus_per_node, warn=False)
    return SimNode(
        name=name,
        gpus=s.gpus_per_node,
        capacity=CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
        price_per_hour=(fallback if price is None else price) * (factor if spot else 1.0),
        instance_type=s.instance_type,
        pooled=pooled,
    )


def _tally_removal(stats: NoticeStats, losses: list[Loss], noticed: int) -> None:
    """A removal counts if its node ran workers when noticed or when it died. Workers scaled in
    between the notice and the death left gracefully, like those drained but still there."""
    abrupt = sum(loss.abrupt for loss in losses)
    graceful = max(noticed, sum(loss.graceful for loss in losses) + abrupt) - abrupt
    if graceful + abrupt == 0:
        return
    stats.removals_with_workers += 1
    stats.workers_graceful += graceful
    stats.workers_abrupt += abrupt
    if abrupt:
        stats.missed += 1
    else:
        stats.handled_gracefully += 1


def _summary(
    config: Config,
    cluster: SimulatedCluster,
    run: Replay,
    decisions: Counter[tuple[str, str]],
    wall: float,
    errors: int,
) -> dict[str, Any]:
    s = config.simulate
    accounts, notices, end = run.accounts, run.notices, run.end
    gpu_hours = sum(accounts.gpu_hours.values())
    on_demand_gpu_price = (
        config.prices.for_node(s.instance_type, False, s.gpus_per_node, warn=False)
        or s.on_demand_price_per_hour
    ) / s.gpus_per_node
    jobs = {}
    for key, state in cluster.jobs.items():
        series = accounts.workers_over_time.get(key, [])
        jobs[key] = {
            "min_workers": state.spec.min_workers,
            "max_workers": state.spec.max_workers,
            "mean_workers": round(_time_mean(series, end), 3),
            "workers_over_time": [[round(t, 3), n] for t, n in series],
        }
    by_action: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    for (action, reason), n in decisions.items():
        by_action[action] += n
        by_reason[reason] += n
    return {
        "duration_hours": round(end / 3600, 3),
        "nodes_max": run.nodes_max,
        # for the picture (sim/plot.py): change points, notice times, cost sampled
        "spot_nodes_over_time": [[round(t, 3), n] for t, n in run.spot_nodes],
        "notices_at": [round(t, 3) for t in run.notices_at],
        "cost_over_time": [
            [round(t, 3), round(c, 4)] for t, c in _sampled(accounts.cost_over_time)
        ],
        "jobs": jobs,
        "gpu_hours": {k: round(accounts.gpu_hours.get(k, 0.0), 3) for k in ("spot", "on-demand")},
        "worker_hours": round(accounts.worker_hours, 3),
        "cost_usd": round(accounts.cost_usd, 2),
        "on_demand_cost_usd": round(gpu_hours * on_demand_gpu_price, 2),
        "notices": {
            "posted": notices.posted,
            "not_delivered": notices.not_delivered,
            "removals_with_workers": notices.removals_with_workers,
            "handled_gracefully": notices.handled_gracefully,
            "missed": notices.missed,
            "workers_removed_gracefully": notices.workers_graceful,
            "workers_lost_abruptly": notices.workers_abrupt,
        },
        "scale_outs_failed": cluster.scale_outs_failed,
        "decisions": {
            "by_action": dict(sorted(by_action.items())),
            "by_reason": dict(sorted(by_reason.items())),
        },
        "actuation_errors": errors,
        "wall_seconds": round(wall, 3),
    }


def _sampled(series: list[tuple[float, float]], most: int = 500) -> list[tuple[float, float]]:
    """At most `most` points, plus the last if the stride missed it: a cumulative curve loses
    nothing visible."""
    picked = series[:: max(1, -(-len(series) // most))]  # ceil: the stride keeps `most` at most
    return picked if not series or picked[-1] == series[-1] else [*picked, series[-1]]


def _time_mean(series: list[tuple[float, int]], end: float) -> float:
    if not series or end <= 0:
        return 0.0
    total = 0.0
    for (t0, n), (t1, _) in zip(series, [*series[1:], (end, 0)], strict=True):
        total += n * max(0.0, min(t1, end) - t0)
    return total / end
