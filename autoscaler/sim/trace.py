"""Spot availability traces: Bamboo's `t_ms,add|remove,nodeN` lines, or a seeded synthetic one.

A trace may also say what spot costs: `t_ms,price,F` makes every spot node cost F times the
instance's spot price from then on (1 is the list price; the adversarial traces have spikes)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True, order=True)
class TraceEvent:
    t: float  # seconds from the start of the trace
    kind: Literal["add", "remove", "price"]
    node: str  # for a price event, the factor on the spot price (as written)

    @property
    def factor(self) -> float:
        """A price event's factor on the instance's spot price."""
        return float(self.node)


def read_trace(path: str | Path) -> list[TraceEvent]:
    """The trace in a file; OSError when it cannot be read (the CLI: exit 2, naming it)."""
    path = Path(path)
    return parse_trace(path.read_text(encoding="utf-8"), str(path))


def parse_trace(text: str, source: str = "<trace>") -> list[TraceEvent]:
    events: list[TraceEvent] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or parts[1] not in ("add", "remove", "price") or not parts[2]:
            raise TraceError(f"{source}:{number}: expected 't_ms,add|remove,node', got {line!r}")
        if parts[1] == "price" and not _factor(parts[2]):
            raise TraceError(f"{source}:{number}: price factor {parts[2]!r} is not a number > 0")
        try:
            t_ms = float(parts[0])
        except ValueError:
            raise TraceError(f"{source}:{number}: time {parts[0]!r} is not a number") from None
        if t_ms < 0:
            raise TraceError(f"{source}:{number}: negative time {parts[0]}")
        events.append(TraceEvent(t_ms / 1000.0, parts[1], parts[2]))  # type: ignore[arg-type]
    if not any(e.kind != "price" for e in events):
        raise TraceError(f"{source}: no events")
    return sorted(events, key=event_order)


def event_order(e: TraceEvent) -> tuple[float, int]:
    """At one instant: removals, then prices, then additions."""
    return (e.t, ("remove", "price", "add").index(e.kind))


def _factor(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


def synthetic_trace(
    seed: int,
    hours: float = 8.0,
    max_nodes: int = 16,
    mean_up_hours: float = 1.5,
    mean_down_hours: float = 0.4,
    wave_every_hours: float = 2.5,
    wave_fraction: float = 0.4,
) -> list[TraceEvent]:
    """Nodes alternate up/down (exponential spells), plus reclaim waves that take a share at once.

    Real spot reclaims come in waves (Bamboo's traces): the waves matter more than the spells.
    """
    rng = random.Random(seed)
    end = hours * 3600
    up: dict[str, list[tuple[float, float]]] = {}
    for i in range(1, max_nodes + 1):
        spells: list[tuple[float, float]] = []
        t = rng.expovariate(1 / (mean_down_hours * 3600)) if i > max_nodes // 2 else 0.0
        while t < end:
            length = rng.expovariate(1 / (mean_up_hours * 3600))
            spells.append((t, min(end, t + length)))
            t += length + rng.expovariate(1 / (mean_down_hours * 3600))
        up[f"node{i}"] = spells
    t = rng.expovariate(1 / (wave_every_hours * 3600))
    while t < end:  # a wave cuts the spells of a random share of nodes short
        for name in rng.sample(sorted(up), k=max(1, int(wave_fraction * max_nodes))):
            up[name] = [(a, min(b, t)) if a < t < b else (a, b) for a, b in up[name]]
        t += rng.expovariate(1 / (wave_every_hours * 3600))
    events = []
    for name, spells in up.items():
        for a, b in spells:
            if b - a < 60:
                continue
            events.append(TraceEvent(round(a, 3), "add", name))
            if b < end:
                events.append(TraceEvent(round(b, 3), "remove", name))
    return sorted(events, key=event_order)
