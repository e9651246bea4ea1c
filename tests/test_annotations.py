"""Our annotations' values as the training script and the daemon write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.annotations import decode_progress
from autoscaler.core import Job, Worker
from autoscaler.core.progress_rates import ProgressRates

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "fraction"),
    [
        ("0.42", 0.42),
        (" 42% ", 0.42),
        ("4200/10000", 0.42),
        ("1.5", 1.0),  # past the end: done
        ("0", 0.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("1/0", None),
        ("-0.1", None),
        ("nan", None),
    ],
)
def test_progress_values(value: str | None, fraction: float | None) -> None:
    assert decode_progress(value) == (pytest.approx(fraction) if fraction is not None else None)


def _job(progress: float | None, running: int) -> Job:
    workers = tuple(Worker(f"w{i}", "n", f"w{i}", i) for i in range(running))
    return Job("ml", "bert", 1, 8, workers=workers, progress=progress)


def test_the_pace_is_progress_over_the_worker_hours_that_made_it() -> None:
    rates = ProgressRates()
    assert rates.with_rate(_job(0.10, 2), T0).progress_rate is None
    # 2 workers for 3 min, then 4 workers for 3 min: 0.1 + 0.2 = 0.3 worker-hours for 3%
    rates.with_rate(_job(0.11, 4), T0 + timedelta(minutes=3))
    paced = rates.with_rate(_job(0.13, 4), T0 + timedelta(minutes=6))
    assert paced.progress_rate == pytest.approx(0.03 / 0.3)


def test_a_restart_from_a_checkpoint_starts_the_window_again_and_keeps_the_last_pace() -> None:
    rates = ProgressRates()
    rates.with_rate(_job(0.10, 2), T0)
    rates.with_rate(_job(0.12, 2), T0 + timedelta(minutes=6))  # 0.02 / 0.2 worker-hours
    back = rates.with_rate(_job(0.05, 2), T0 + timedelta(minutes=7))
    assert back.progress_rate == pytest.approx(0.1)
    assert rates.with_rate(_job(None, 2), T0 + timedelta(minutes=8)).progress_rate is None


def _ring(progress: float, running: int, pending: int = 0, ready: datetime | None = None) -> Job:
    workers = tuple(Worker(f"w{i}", "n", f"w{i}", i, ready_since=ready) for i in range(running))
    workers += tuple(
        Worker(f"w{i}", None, f"w{i}", i, pending=True) for i in range(running, running + pending)
    )
    return Job("ml", "bert", 1, 8, workers=workers, progress=progress)


def _read(rates: ProgressRates, readings: list[tuple[float, float, int]]) -> Job:
    """(minutes after T0, progress, running workers) in turn; the last job seen."""
    job = None
    for minutes, progress, running in readings:
        job = rates.with_rate(_ring(progress, running), T0 + timedelta(minutes=minutes))
    assert job is not None
    return job


def test_the_ring_rate_is_measured_per_size_between_moves_of_the_progress() -> None:
    # 4 workers: from the first move (1 min) to one 3 min later, 3% in 3 min: 60% an hour
    job = _read(ProgressRates(), [(0, 0.10, 4), (1, 0.11, 4), (2, 0.12, 4), (4, 0.14, 4)])
    assert job.pace is not None and job.pace.rates == ((4, pytest.approx(0.6)),)
    assert job.pace.commit_gap == pytest.approx(120)  # the longest gap between two moves


def test_a_ring_that_changed_too_soon_gives_no_rate_and_the_slowest_stretch_counts() -> None:
    rates = ProgressRates()
    job = _read(rates, [(0, 0.1, 4), (1, 0.11, 4), (2, 0.12, 2), (3, 0.13, 4)])
    assert job.pace is not None and job.pace.rates == ()
    readings = [(4, 0.14, 4), (7, 0.17, 4), (8, 0.18, 4), (10, 0.19, 4)]  # 60%/h, then 40%/h
    job = _read(rates, readings)
    assert job.pace is not None and job.pace.rates == ((4, pytest.approx(0.4)),)


def test_worker_starts_restarts_and_stalls_are_measured() -> None:
    rates = ProgressRates()
    rates.with_rate(_ring(0.30, 2, pending=1), T0)
    ready = T0 + timedelta(minutes=3)  # the pending worker ran 3 min after it was seen
    job = rates.with_rate(_ring(0.31, 3, ready=ready), T0 + timedelta(minutes=4))
    assert job.pace is not None and job.pace.slowest_start == pytest.approx(180)
    job = rates.with_rate(_ring(0.25, 3), T0 + timedelta(minutes=5))  # back to a checkpoint
    assert job.pace is not None and job.pace.restart_loss == pytest.approx(0.06)
    job = rates.with_rate(_ring(0.25, 3), T0 + timedelta(minutes=95))  # 91 min since the move
    assert job.pace is not None and job.pace.stalled_hours == pytest.approx(91 / 60)
    job = rates.with_rate(_ring(0.26, 3), T0 + timedelta(minutes=96))
    assert job.pace is not None and job.pace.stalled_hours == 0.0


def _with(job: Job, *extra: Worker) -> Job:
    return Job("ml", "bert", 1, 8, workers=(*job.workers, *extra), progress=job.progress)


def test_a_worker_gone_while_pending_counts_its_wait_and_only_on_demand_starts_age_it_out() -> None:
    rates, spot = ProgressRates(), frozenset({"n"})  # _ring's running workers are on spot
    asked = T0 - timedelta(minutes=1)  # the pod's creation, before the daemon first saw it
    rates.with_rate(_with(_ring(0.30, 2), Worker("w2", None, "w2", 2, True, created_at=asked)), T0)
    # its ScaleOut timed out 25 min after it was made: the pod is gone, it never started
    job = rates.with_rate(_ring(0.32, 2), asked + timedelta(minutes=25), spot)
    assert job.pace is not None and job.pace.on_demand_wait == pytest.approx(1500)
    assert job.pace.slowest_start == 0.0 and job.pace.changeover_hours(1 / 12) >= 25 / 60
    # spot workers that start in a minute say nothing of on-demand: five of them leave it
    for i in range(5):
        at = T0 + timedelta(minutes=30 + 2 * i)
        rates.with_rate(_ring(0.33, 2 + i, pending=1), at, spot)
        job = rates.with_rate(_ring(0.34, 3 + i, ready=at + timedelta(minutes=1)), at, spot)
    assert job.pace is not None and job.pace.on_demand_wait == pytest.approx(1500)
    assert job.pace.slowest_start == pytest.approx(60)
    # five on-demand workers that start in 3 min push it out, as later starts do a slow start
    for i in range(5):
        at = T0 + timedelta(minutes=50 + 4 * i)
        name = f"od{i}"
        rates.with_rate(_with(_ring(0.35, 7), Worker(name, None, name, 10 + i, True)), at, spot)
        ready = Worker(name, "od", name, 10 + i, ready_since=at + timedelta(minutes=3))
        job = rates.with_rate(_with(_ring(0.36, 7), ready), at + timedelta(minutes=3), spot)
    assert job.pace is not None and job.pace.on_demand_wait == pytest.approx(180)
