"""Our annotations' values as the training script and the daemon write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.adapters.kube.progress import ProgressRates
from autoscaler.annotations import decode_progress
from autoscaler.core import Job, Worker

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
