"""Adversarial spot availability: seeded traces of the spells a deadline rule must survive.

Real multi-day GPU spot traces (and Bamboo's) show what a mean availability hides: long spells
with no spot at all, nodes that come and go every few minutes, waves that take most of the nodes
at once, recoveries that bring nodes back one by one over an hour or more, and spot prices that
jump. `adversarial_trace` strings such regimes together at random (seeded), so a deadline rule
can be replayed against many of them: `benchmarks/deadline_seeds.py` runs a family of these next
to the Bamboo traces. The format is Bamboo's (`t_ms,add|remove,nodeN`) plus price lines
(`t_ms,price,F`: spot costs F times the instance's spot price from then on).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from autoscaler.sim.trace import TraceEvent, event_order

# how often each regime comes next: a zero spell most often, as in the long real traces
REGIMES = {"plenty": 4, "partial": 4, "zero": 5, "flapping": 3, "recovering": 4}
MINUTE = 60.0


@dataclass
class _Spot:
    """The nodes up now, and the events so far."""

    nodes: list[str]
    rng: random.Random
    up: set[str]
    events: list[TraceEvent]

    def add(self, t: float, count: int) -> None:
        down = [n for n in self.nodes if n not in self.up]
        for name in self.rng.sample(down, max(0, min(count, len(down)))):
            self.up.add(name)
            self._event(TraceEvent(round(t, 3), "add", name))

    def remove(self, t: float, count: int) -> None:
        for name in self.rng.sample(sorted(self.up), max(0, min(count, len(self.up)))):
            self.up.discard(name)
            self._event(TraceEvent(round(t, 3), "remove", name))

    def _event(self, event: TraceEvent) -> None:
        """A node taken and given back at one instant did not change: neither is written (the
        file sorts removals first, which would turn them around)."""
        for i in range(len(self.events) - 1, -1, -1):  # events come in time order
            if self.events[i].t != event.t:
                break
            if self.events[i].node == event.node:
                del self.events[i]
                return
        self.events.append(event)

    def toward(self, t: float, target: int) -> None:
        if target > len(self.up):
            self.add(t, target - len(self.up))
        elif target < len(self.up):
            self.remove(t, len(self.up) - target)


def adversarial_trace(
    seed: int, hours: float = 10.0, max_nodes: int = 16, price_spikes: bool = True
) -> list[TraceEvent]:
    """Regimes one after another until `hours`, each entered by a mass preemption, a slow
    recovery or a jump; spells last from minutes to a third of the trace (a zero spell often
    that long). With `price_spikes`, a few spells where spot costs 1.5-4x its price."""
    rng = random.Random(seed)
    end = hours * 3600
    spot = _Spot([f"node{i}" for i in range(1, max_nodes + 1)], rng, set(), [])
    t = 0.0
    spot.toward(t, rng.randint(0, max_nodes))
    while t < end:
        (regime,) = rng.choices(list(REGIMES), weights=list(REGIMES.values()))
        length = min(end - t, rng.uniform(0.02, 0.4) * end)
        _REGIME[regime](spot, t, t + length, max_nodes)
        t += length
    if price_spikes:
        spot.events += _price_spikes(rng, end)
    return sorted(spot.events, key=event_order)


def _plenty(spot: _Spot, t: float, until: float, most: int) -> None:
    """Most nodes up; now and then one is taken and comes back 5-30 minutes later."""
    _churn(spot, t, until, lambda: spot.rng.randint(most * 3 // 4, most), 45 * MINUTE)


def _partial(spot: _Spot, t: float, until: float, most: int) -> None:
    """A low plateau (a tenth to half of the nodes) with churn."""
    _churn(spot, t, until, lambda: spot.rng.randint(max(1, most // 10), most // 2), 20 * MINUTE)


def _churn(spot: _Spot, t: float, until: float, level: Callable[[], int], every: float) -> None:
    spot.toward(t, level())
    for at in _ticks(spot.rng, t, until, every):
        spot.toward(at, level())


def _zero(spot: _Spot, t: float, until: float, most: int) -> None:
    """A correlated mass preemption takes every node (or all but one or two), none come back."""
    spot.remove(t, len(spot.up) - spot.rng.choice((0, 0, 0, 1, 2)))


def _flapping(spot: _Spot, t: float, until: float, most: int) -> None:
    """Nodes up for 2-10 minutes, down for 2-10 minutes, over and over."""
    for at in _ticks(spot.rng, t, until, 5 * MINUTE):
        if spot.rng.random() < 0.5:
            spot.toward(at, spot.rng.randint(0, most))
        else:
            spot.toward(at, spot.rng.randint(0, max(1, most // 4)))


def _recovering(spot: _Spot, t: float, until: float, most: int) -> None:
    """A wave takes 70-100% of the nodes; they come back one at a time over the spell."""
    spot.remove(t, int(len(spot.up) * spot.rng.uniform(0.7, 1.0)))
    missing = most - len(spot.up)
    if missing <= 0:
        return
    step = (until - t) / (missing + 1)
    for i in range(1, missing + 1):
        spot.add(t + i * step, 1)


_REGIME: dict[str, Callable[[_Spot, float, float, int], None]] = {
    "plenty": _plenty,
    "partial": _partial,
    "zero": _zero,
    "flapping": _flapping,
    "recovering": _recovering,
}


def _ticks(rng: random.Random, t: float, until: float, mean: float) -> Iterator[float]:
    """Times in (t, until) spaced 0.4-1.6 `mean` apart."""
    at = t + rng.uniform(0.4, 1.6) * mean
    while at < until:
        yield at
        at += rng.uniform(0.4, 1.6) * mean


def _price_spikes(rng: random.Random, end: float) -> list[TraceEvent]:
    """Up to three spells of 20 minutes to a tenth of the trace where spot costs 1.5-4x its
    price (spot above on-demand from about 3.3x)."""
    events = []
    starts = sorted(rng.uniform(0, end) for _ in range(rng.randint(0, 3)))
    for start, following in zip(starts, [*starts[1:], end], strict=False):
        stop = min(following, start + rng.uniform(20 * MINUTE, max(20 * MINUTE, end / 10)))
        events.append(TraceEvent(round(start, 3), "price", f"{rng.uniform(1.5, 4.0):.2f}"))
        events.append(TraceEvent(round(stop, 3), "price", "1"))
    return events


def family(
    count: int, hours: float, max_nodes: int = 16, first_seed: int = 1
) -> Iterator[tuple[str, list[TraceEvent]]]:
    """`count` adversarial traces, seeds `first_seed`...: (name, events)."""
    for seed in range(first_seed, first_seed + count):
        yield f"adversarial-{seed}", adversarial_trace(seed, hours, max_nodes)


def write_trace(events: list[TraceEvent]) -> str:
    """The trace as its file's text."""
    lines = []
    for e in events:
        lines.append(f"{e.t * 1000:.0f},{e.kind},{e.node}")
    return "\n".join(lines) + "\n"
