"""The deadline rule against Uniform Progress, trace by trace: the dominance gate.

A deadline rule beyond Uniform Progress is kept only if, on every replayed trace, it misses no
deadline UP meets and costs no more than UP to the work target. `compare` replays both (the
autoscaler's `paced` rule and the `uniform_progress` baseline, through the same reconciler and
simulated cluster) on one trace and deadline; `gate` lists every trace that breaks the rule, and
`aggregate` sums a family up. benchmarks/deadline_seeds.py runs it over the Bamboo traces and a
family of adversarial ones (autoscaler/sim/adversarial.py).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from autoscaler.bench.elastic import autoscaler, uniform_progress
from autoscaler.bench.params import BenchParams
from autoscaler.bench.result import PolicyResult
from autoscaler.bench.world import resolve
from autoscaler.sim.trace import TraceEvent

OURS, UP = "autoscaler", "uniform_progress"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One policy on one trace and deadline."""

    completion_hours: float | None  # None: not done by the end of the replay
    met: bool
    cost_to_target: float | None
    restarts: int
    resets: int

    @classmethod
    def of(cls, result: PolicyResult, deadline: float) -> Outcome:
        done = result.completion
        return cls(
            None if done is None else round(done / 3600, 3),
            done is not None and done <= deadline,
            None if done is None else round(result.cost_at(done), 2),
            sum(p.restarts for p in result.jobs),
            sum(p.resets for p in result.jobs),
        )


@dataclass(frozen=True, slots=True)
class Row:
    trace: str
    job_hours: float
    deadline_hours: float
    max_workers: int
    ours: Outcome
    up: Outcome

    @property
    def cost_ratio(self) -> float | None:
        """Our cost to target over UP's (None unless both got there)."""
        if self.ours.cost_to_target is None or not self.up.cost_to_target:
            return None
        return round(self.ours.cost_to_target / self.up.cost_to_target, 4)

    @property
    def breaks(self) -> list[str]:
        """How this trace breaks the gate: a deadline UP meets and we miss, a higher cost."""
        out = []
        if self.up.met and not self.ours.met:
            out.append("missed a deadline uniform_progress met")
        ratio = self.cost_ratio
        if self.up.met and ratio is not None and ratio > 1.0:
            out.append(f"cost {ratio:.3f}x uniform_progress")
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"cost_ratio": self.cost_ratio, "breaks": self.breaks}


def clip(trace: list[TraceEvent], seconds: float) -> list[TraceEvent]:
    """`trace` up to `seconds`, then every spot node gone a minute later: a replay then ends just
    after the deadline (what comes later changes no figure here), and never before it."""
    up: set[str] = set()
    out = []
    for e in trace:
        if e.t > seconds:
            break
        out.append(e)
        if e.kind == "add":
            up.add(e.node)
        elif e.kind == "remove":
            up.discard(e.node)
    end = seconds + 60
    marker = "deadline-marker"  # a node that comes and goes after the deadline: the replay's end
    return [
        *out,
        *(TraceEvent(end, "remove", n) for n in sorted(up)),
        TraceEvent(end, "add", marker),
        TraceEvent(end + 60, "remove", marker),
    ]


def compare(
    params: BenchParams, trace: list[TraceEvent], name: str, deadline_hours: float, seed: int = 1
) -> Row:
    """Both rules on `trace`, due `deadline_hours` after the start (params' job size)."""
    params = params.model_copy(update={"deadline_hours": deadline_hours})
    deadline = deadline_hours * 3600
    world = resolve(params, clip(trace, deadline), name, seed)
    ours, up = autoscaler(world), uniform_progress(world)
    (job,) = world.jobs
    return Row(
        name,
        job.spec.target_on_demand_hours,
        deadline_hours,
        job.max_workers,
        Outcome.of(ours, deadline),
        Outcome.of(up, deadline),
    )


def gate(rows: list[Row]) -> list[Row]:
    """The traces that break the gate."""
    return [r for r in rows if r.breaks]


def aggregate(rows: list[Row]) -> dict[str, Any]:
    """Misses, cost ratios (where both finished), restarts and the gate over `rows`."""
    ratios = [r.cost_ratio for r in rows if r.cost_ratio is not None and r.up.met]
    return {
        "runs": len(rows),
        "uniform_progress_met": sum(r.up.met for r in rows),
        "autoscaler_met": sum(r.ours.met for r in rows),
        "missed_where_uniform_progress_met": sum(r.up.met and not r.ours.met for r in rows),
        "cost_ratio": None
        if not ratios
        else {
            "min": min(ratios),
            "median": round(statistics.median(ratios), 4),
            "max": max(ratios),
            "above_1": sum(x > 1.0 for x in ratios),
        },
        "restarts": {
            "autoscaler": sum(r.ours.restarts for r in rows),
            "uniform_progress": sum(r.up.restarts for r in rows),
        },
        "resets": {
            "autoscaler": sum(r.ours.resets for r in rows),
            "uniform_progress": sum(r.up.resets for r in rows),
        },
        "gate_broken_by": [f"{r.trace} @ {r.deadline_hours:g} h" for r in gate(rows)],
    }
