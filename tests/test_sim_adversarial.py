"""The adversarial spot traces: seeded, consistent, with the spells they promise; price lines."""

from __future__ import annotations

import pytest

from autoscaler.bench.world import availability
from autoscaler.sim.adversarial import adversarial_trace, family, write_trace
from autoscaler.sim.trace import TraceError, parse_trace


def test_a_seed_gives_one_trace_and_a_file_that_reads_back_the_same() -> None:
    trace = adversarial_trace(7, hours=10, max_nodes=16)
    assert trace == adversarial_trace(7, hours=10, max_nodes=16)
    assert trace != adversarial_trace(8, hours=10, max_nodes=16)
    assert parse_trace(write_trace(trace)) == trace


@pytest.mark.parametrize("seed", range(1, 21))
def test_nodes_are_only_added_when_down_and_removed_when_up(seed: int) -> None:
    up: set[str] = set()
    for e in adversarial_trace(seed, hours=10, max_nodes=8):
        if e.kind == "add":
            assert e.node not in up
            up.add(e.node)
        elif e.kind == "remove":
            assert e.node in up
            up.discard(e.node)


def test_the_family_has_zero_spells_flapping_and_price_spikes() -> None:
    traces = [events for _, events in family(20, hours=10, max_nodes=16)]
    zero_hours, removals, spikes = [], [], []
    for events in traces:
        steps = availability(events)
        spans = zip(steps, [*steps[1:], (10 * 3600, 0)], strict=True)
        zero_hours.append(sum(b[0] - a[0] for a, b in spans if a[1] == 0) / 3600)
        removals.append(sum(e.kind == "remove" for e in events))
        spikes += [e.factor for e in events if e.kind == "price" and e.factor > 1]
    assert max(zero_hours) >= 2  # hours with no spot at all
    assert max(removals) >= 100  # flapping: a removal every few minutes
    assert spikes and max(spikes) > 3.3  # spot above on-demand (3.06 / 0.91) at times


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "cheap"])
def test_a_price_line_needs_a_positive_factor(bad: str) -> None:
    with pytest.raises(TraceError, match="price factor"):
        parse_trace(f"0,add,node1\n60000,price,{bad}\n")


def test_the_replay_bills_spot_at_the_price_the_trace_says() -> None:
    from autoscaler.bench.elastic import reactive_elastic
    from autoscaler.bench.params import BenchParams
    from autoscaler.bench.world import resolve

    base = "0,add,node1\n0,add,node2\n3600000,remove,node1\n3600000,remove,node2\n"
    spiked = base + "0,price,2.5\n"
    costs = [
        reactive_elastic(resolve(BenchParams(), parse_trace(text), "p3", 1)).cost_usd
        for text in (base, spiked)
    ]
    assert costs[1] == pytest.approx(2.5 * costs[0])
