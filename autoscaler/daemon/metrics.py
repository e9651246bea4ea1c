"""Prometheus metrics on a registry of our own (no process-global state; tests build many)."""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from autoscaler import __version__
from autoscaler.core import Action, CapacityType, Decision, GpuNode, Job, Reason

PREFIX = "spot_autoscaler"
# Not `job`: Prometheus sets `job` on every series (the scrape job) and would rename ours to
# `exported_job`.
JOB_LABEL = "training_job"
_SECONDS_PER_HOUR = 3600.0
# A spot notice gives 2 minutes (AWS) or less: resolve the first seconds finely.
_REACTION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 90, 120, 300)
_RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            f"{PREFIX}_decisions",
            "Decisions other than noop, by action and primary reason.",
            ["action", "reason"],
            registry=r,
        )
        self.notices = Counter(
            f"{PREFIX}_notices",
            "Distinct interruption/rebalance/maintenance notices seen.",
            ["source", "kind"],
            registry=r,
        )
        self.reaction = Histogram(
            f"{PREFIX}_reaction_latency_seconds",
            "From a notice being received to the drain or scale-in that answers it being applied.",
            buckets=_REACTION_BUCKETS,
            registry=r,
        )
        Info(f"{PREFIX}_build", "The running build.", registry=r).info(
            {"version": __version__, "python": platform.python_version()}
        )
        # per job and per capacity type: computed at scrape time from the last snapshot, not in
        # the pass (three gauges per job cost 28 ms a snapshot at 5,000 jobs, notice path too)
        self._seen = _Seen()
        r.register(self._seen)
        self.notices_lost = Counter(
            f"{PREFIX}_notices_lost",
            "Notices whose node's workers went before a drain or scale-in for them was applied "
            "(they may have left abruptly).",
            ["source", "kind"],
            registry=r,
        )
        self.unanswered_age = Gauge(
            f"{PREFIX}_notice_unanswered_age_seconds",
            "Age of the oldest notice on a node with workers that no drain or scale-in has "
            "answered yet (0: none).",
            registry=r,
        )
        self._errors = _Errors()
        r.register(self._errors)
        self._rejected = _Rejected()
        r.register(self._rejected)
        self.reconcile = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "One observe-decide-act pass.",
            buckets=_RECONCILE_BUCKETS,
            registry=r,
        )
        self.fast_path = Histogram(
            f"{PREFIX}_fast_path_step_seconds",
            "The notice fast path's steps: wait (for a pass's snapshot), look (its own), "
            "decide; its writes go out behind it.",
            ["step"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader", "1 while this replica holds the lease and acts.", registry=r
        )
        self.stuck_scalers = Gauge(
            f"{PREFIX}_stuck_scalers",
            "Jobs whose outstanding scaler is older than its policy's scalers.max_age.",
            registry=r,
        )
        self.backend_live = Gauge(
            f"{PREFIX}_backend_live",
            "1 while the API server serves every kind an operator backend needs, else 0.",
            ["backend"],
            registry=r,
        )
        self.config_ok = Gauge(
            f"{PREFIX}_config_last_reload_successful",
            "0 while the config file on disk is rejected (the previous config runs), else 1.",
            registry=r,
        )
        self.config_ok.set(1)

    def track_backends(self, backends: Callable[[], Mapping[str, bool]]) -> None:
        """Read at scrape time: a CRD installed or removed shows without a reconcile pass."""

        def live(name: str) -> Callable[[], float]:
            return lambda: 1.0 if backends().get(name) else 0.0

        for name in backends():
            self.backend_live.labels(name).set_function(live(name))

    def track_config(self, healthy: Callable[[], bool]) -> None:
        self.config_ok.set_function(lambda: 1.0 if healthy() else 0.0)

    def track_leader(self, is_leader: Callable[[], bool]) -> None:
        """Read at scrape time, so a lapsed lease shows even while a renewal call hangs."""
        self.leader.set_function(lambda: 1.0 if is_leader() else 0.0)

    def decided(self, decisions: list[Decision]) -> None:
        """One pass's decisions."""
        self.acted(decisions)
        self.stuck_scalers.set(sum(d.reason is Reason.SCALER_STUCK for d in decisions))

    def acted(self, decisions: Iterable[Decision]) -> None:
        """Decisions made outside a full pass too (the notice fast path): counted, no gauge."""
        for decision in decisions:
            if decision.action is not Action.NOOP:  # noops repeat every pass; the log says why
                self.decisions.labels(decision.action.value, decision.reason.value).inc()

    def error(self, component: str) -> None:
        self._errors.inc(component)

    def count_errors_from(self, component: str, count: Callable[[], int]) -> None:
        """Errors another part counts itself (e.g. the watch caches' failed lists and watches)."""
        self._errors.external[component] = count

    def count_rejected(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """Malformed objects skipped, counted by the adapter, read at scrape time."""
        self._rejected.counts = counts

    def set_workers(self, jobs: Iterable[Job]) -> None:
        """The jobs the gauges describe until the next call (a finished job's series is gone)."""
        self._seen.jobs = tuple(jobs)

    def set_nodes(self, nodes: Iterable[GpuNode]) -> None:
        self._seen.nodes = tuple(nodes)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Errors(Collector):
    """`errors_total{component}`: our own counts plus counts other parts keep, read at scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self.external: dict[str, Callable[[], int]] = {}

    def inc(self, component: str) -> None:
        with self._lock:
            self._counts[component] = self._counts.get(component, 0) + 1

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            f"{PREFIX}_errors",
            "Failures that were logged and survived, by component.",
            labels=["component"],
        )
        with self._lock:
            counts = dict(self._counts)
        for component, count in self.external.items():
            counts[component] = counts.get(component, 0) + count()
        for component, value in sorted(counts.items()):
            family.add_metric([component], value)
        yield family


class _Rejected(Collector):
    """`objects_rejected_total{kind,reason}`: objects skipped as malformed (each version once)."""

    def __init__(self) -> None:
        self.counts: Callable[[], Mapping[tuple[str, str], int]] = dict

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            f"{PREFIX}_objects_rejected",
            "Objects skipped as malformed (logged and told as an Event once per version).",
            labels=["kind", "reason"],
        )
        for (kind, reason), value in sorted(self.counts().items()):
            family.add_metric([kind, reason], value)
        yield family


class _Seen(Collector):
    """Gauges of the last snapshot, computed when scraped: workers and min/max per job, GPUs
    requested and the cost rate per capacity type."""

    def __init__(self) -> None:
        self.jobs: tuple[Job, ...] = ()
        self.nodes: tuple[GpuNode, ...] = ()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs, nodes = self.jobs, self.nodes  # one consistent pair, whatever a pass does meanwhile
        per_job = [
            (f"{PREFIX}_workers", "Running workers per elastic job.", _running),
            (f"{PREFIX}_workers_min", "The job's min workers.", lambda j: j.min_workers),
            (f"{PREFIX}_workers_max", "The job's max workers.", lambda j: j.max_workers),
        ]
        for name, text, value in per_job:
            family = GaugeMetricFamily(name, text, labels=[JOB_LABEL])
            for job in jobs:
                family.add_metric([job.key], value(job))
            yield family
        gpus = GaugeMetricFamily(
            f"{PREFIX}_gpus_requested",
            "GPUs requested by pods on GPU nodes, by capacity type.",
            labels=["capacity_type"],
        )
        cost = GaugeMetricFamily(
            f"{PREFIX}_gpu_nodes_cost_dollars_per_second",
            "What the GPU nodes of known price cost, by capacity type (x 3600 for USD per hour).",
            labels=["capacity_type"],
        )
        for capacity in CapacityType:
            mine = [n for n in nodes if n.capacity_type is capacity]
            gpus.add_metric([capacity.value], sum(n.gpus_requested for n in mine))
            rate = sum(n.price_per_hour or 0.0 for n in mine) / _SECONDS_PER_HOUR
            cost.add_metric([capacity.value], rate)
        yield gpus
        yield cost


def _running(job: Job) -> int:
    return sum(1 for w in job.workers if not w.pending)
