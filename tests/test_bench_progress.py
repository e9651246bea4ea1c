"""The job progress model: what resets, rollbacks and restarts cost a Horovod ring."""

from __future__ import annotations

from datetime import timedelta

import pytest
from structlog.testing import CapturingLogger

from autoscaler.bench.params import Overheads, Workload
from autoscaler.bench.progress import Progress, throughput
from autoscaler.config import Config
from autoscaler.reconcile import Reconciler
from autoscaler.sim.run import replay, sim_cluster
from autoscaler.sim.trace import synthetic_trace

# linear scaling keeps the arithmetic readable: n workers do n units per hour
LINEAR = Workload(
    scaling_efficiency=1.0,
    commit_interval=timedelta(seconds=100),
    checkpoint_interval=timedelta(seconds=1000),
)
HOUR = 3600.0


def _ring(workers: int) -> Progress:
    p = Progress(LINEAR, Overheads(), target=1e9)
    p.join(0.0, workers)
    return p


def test_throughput_is_sublinear_and_increasing() -> None:
    speeds = [throughput(n, 0.9) for n in (1, 2, 4, 8, 32)]
    assert speeds[0] == 1.0 and throughput(0, 0.9) == 0.0
    assert speeds == sorted(speeds)
    assert throughput(2, 0.9) == pytest.approx(1.8) and throughput(4, 0.9) == pytest.approx(3.24)


def test_graceful_removal_costs_a_short_reset_and_no_work() -> None:
    p = _ring(4)
    p.leave(HOUR, graceful=True)
    p.advance(2 * HOUR)
    join, reset = Overheads().join_reset.total_seconds(), Overheads().graceful_reset.total_seconds()
    assert p.rolled_back == 0 and p.resets == 2
    assert p.work == pytest.approx(4 * (HOUR - join) / HOUR + 3 * (HOUR - reset) / HOUR)


def test_abrupt_failure_rolls_back_to_the_last_commit_and_waits_for_gloo() -> None:
    p = _ring(4)
    p.leave(7 + 250.0, graceful=False)  # 250 s after the join reset: 50 s since the last commit
    assert p.rolled_back == pytest.approx(4 * 50 / HOUR)
    assert p.stalled_until == pytest.approx(257 + 30 + 0.5)
    assert p.abrupt_failures == 1 and p.restarts == 0


def test_losing_the_whole_ring_restarts_from_the_checkpoint() -> None:
    p = _ring(2)
    p.leave(7 + 1500.0, graceful=False)
    p.leave(7 + 1500.0, graceful=False)  # same instant: one failure of the whole ring
    assert p.restarts == 1 and p.ring == 0
    assert p.rolled_back == pytest.approx(2 * 500 / HOUR)  # checkpoint at 1000 s of training
    p.join(2000.0)
    assert p.stalled_until == pytest.approx(2000 + 7 + 10)  # join plus checkpoint load


def test_completion_is_the_first_time_the_target_is_reached() -> None:
    p = Progress(LINEAR, Overheads(), target=2.0)
    p.join(0.0, 2)
    p.advance(3 * HOUR)
    assert p.completed_at == pytest.approx(HOUR + 7)


def test_work_over_time_shows_stalls_and_rollbacks() -> None:
    p = _ring(4)
    p.leave(7 + 250.0, graceful=False)  # 50 s of work since the last commit are lost
    p.advance(1000.0)
    kept = 4 * 200 / HOUR
    assert p.history[:4] == [
        (0.0, 0.0),
        (7.0, 0.0),  # the join's reset: no work until then
        (257.0, pytest.approx(4 * 250 / HOUR)),
        (257.0, pytest.approx(kept)),  # the rollback: a drop at one instant
    ]
    assert p.history[4:] == [(287.5, pytest.approx(kept)), (1000.0, pytest.approx(p.work))]


def test_reported_progress_is_the_committed_clamped_fraction() -> None:
    # commits every 30 s: 45 s in, the last commit was at 30 s (after the 7 s reset: 23 s in)
    p = Progress(Workload(scaling_efficiency=0.9), Overheads(), target=10.0)
    assert p.done == 0.0 and p.committed == 0.0
    p.join(0.0, 4)
    p.advance(45.0)
    rate = throughput(4, 0.9) / HOUR
    assert p.done == pytest.approx(38 * rate / 10)
    assert p.committed == pytest.approx(30 * rate / 10)
    p.advance(10 * HOUR)
    assert p.work > p.target and p.done == 1.0 and p.committed == 1.0


def test_ring_events_agree_with_the_simulators_own_loss_count() -> None:
    class Count:
        def __init__(self) -> None:
            self.abrupt = 0

        def joined(self, *_: object) -> None: ...

        def left(self, job: str, pod: str, now: object, graceful: bool) -> None:
            self.abrupt += not graceful

    config = Config.model_validate({"simulate": {"notice_miss_probability": 1.0}})
    counter = Count()
    cluster = sim_cluster(config, counter)
    reconciler = Reconciler(cluster, cluster, config.policy_set, CapturingLogger())
    run = replay(config, synthetic_trace(seed=3, hours=4), 3, cluster, reconciler.tick)
    assert counter.abrupt == run.notices.workers_abrupt > 0


def test_a_restart_after_the_job_is_done_is_counted_apart() -> None:
    p = Progress(LINEAR, Overheads(), target=2.0)  # two workers finish in about an hour
    p.join(0.0, 2)
    p.leave(HOUR / 2, graceful=False)
    p.leave(HOUR / 2, graceful=False)  # the whole ring, before completion: a restart
    p.join(HOUR, 2)
    p.leave(3 * HOUR, graceful=False)
    p.leave(3 * HOUR, graceful=False)  # the whole ring again, once the job is done
    assert p.completed_at is not None and p.completed_at < 3 * HOUR
    assert (p.restarts, p.restarts_after_completion) == (1, 1)
