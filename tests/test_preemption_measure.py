"""benchmarks/preemption.py's measuring on a hand-written train log (no Horovod)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.horovod_job import TrainLog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def preemption() -> ModuleType:
    spec = importlib.util.spec_from_file_location("preemption", ROOT / "benchmarks/preemption.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def write(path: Path, events: list[dict[str, Any]]) -> TrainLog:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return TrainLog(path)


def trained(until: int) -> list[dict[str, Any]]:
    """Three ranks start at step 0; rank 0 logs steps 1..`until`, 0.1 s apart."""
    start = [
        {"event": "resume", "t": 0.01, "pid": 100 + r, "step": 0, "size": 3, "rank": r}
        for r in range(3)
    ]
    steps = [
        {"event": "step", "t": i / 10, "pid": 100, "step": i, "size": 3}
        for i in range(1, until + 1)
    ]
    return start + steps


def test_a_failure_rolls_back_to_the_last_commit(preemption: ModuleType, tmp_path: Path) -> None:
    log = write(
        tmp_path / "train.log",
        [
            *trained(24),
            {"event": "rollback", "t": 2.6, "pid": 101, "step": 20, "rank": 1},
            {"event": "resume", "t": 2.7, "pid": 100, "step": 20, "size": 2, "rank": 0},
            {"event": "step", "t": 2.8, "pid": 100, "step": 21, "size": 2},
        ],
    )
    run = preemption.measure(log, 0.0, [1.0], [2.8], 5.0)
    assert run["rolled_back_steps"] == 4 and run["preemptions"][0]["rolled_back_steps"] == 4
    assert run["reset_log"][0]["kind"] == "failure"


def test_a_job_that_never_recovered_has_no_rolled_back_figure(
    preemption: ModuleType, tmp_path: Path
) -> None:
    """It lost every step: a 0 would count as a graceful run in the medians of the table."""
    log = write(tmp_path / "train.log", trained(24))
    run = preemption.measure(log, 0.0, [1.0], [None], 5.0)
    assert run["rolled_back_steps"] is None and run["preemptions"][0]["rolled_back_steps"] is None
    assert run["preemptions"][0]["stall_s"] is None
    summary = preemption.summarize([{**run, "run": 0, "survived": False}], {0: 10.0})
    assert summary["rolled_back_steps"] == {"min": None, "median": None, "max": None}


def test_a_wait_the_machine_stopped_abandons_the_run(preemption: ModuleType) -> None:
    """A 0.05 s wait that took 5 s: the run's processes were stopped, its timings are void."""
    times = iter([10.0, 10.05, 20.0, 25.0])
    preemption.nap(0.0, clock=lambda: next(times))  # on time
    with pytest.raises(preemption.Paused, match="took 5.0 s"):
        preemption.nap(0.0, clock=lambda: next(times))


def test_a_stopped_run_is_run_again_in_a_new_directory(
    preemption: ModuleType, tmp_path: Path
) -> None:
    dirs: list[Path] = []

    def run(tmp: Path, stops: int) -> str:
        dirs.append(tmp)
        if len(dirs) <= stops:
            raise preemption.Paused("stopped")
        return "measured"

    assert preemption.unpaused("run 0", str(tmp_path), lambda t: run(t, 2)) == "measured"
    assert len(set(dirs)) == 3 and all(d.parent == tmp_path for d in dirs)
    dirs.clear()
    with pytest.raises(preemption.Paused):  # three attempts at most
        preemption.unpaused("run 1", str(tmp_path), lambda t: run(t, 3))
    assert len(dirs) == 3


# --- --framework torchrun (benchmarks/preemption_torchrun.py): the counting, no torch -----------
@pytest.fixture(scope="module")
def torchrun_side() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "preemption_torchrun", ROOT / "benchmarks/preemption_torchrun.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


HOST_OF_RANK = {0: "node-a", 1: "node-b", 2: "node-c"}


def ev(event: str, t: float, host: str = "node-a", **fields: Any) -> dict[str, Any]:
    return {"event": event, "t": t, "host": host, "pid": 1, "restart": 0, **fields}


def world(t: float, step: int, hosts: list[str], restart: int = 0) -> list[dict[str, Any]]:
    """A world's workers start at `t` and resume from `step` (rank 0 on the first host)."""
    out = [ev("started", t - 0.5, h, restart=restart) for h in hosts]
    return out + [
        ev("resume", t, h, step=step, size=len(hosts), rank=r, restart=restart)
        for r, h in enumerate(hosts)
    ]


def steps(first: int, last: int, t: float, size: int) -> list[dict[str, Any]]:
    """Rank 0's steps `first`..`last`, 0.1 s apart from `t`."""
    return [ev("step", t + 0.1 * i, step=first + i, size=size) for i in range(last - first + 1)]


ALL = ["node-a", "node-b", "node-c"]
SURVIVORS = ["node-a", "node-c"]


def test_the_signal_saves_the_step_the_notice_came_at(torchrun_side: ModuleType) -> None:
    """Notice at 5.0 s, the victim's flag at step 50, rank 0 saves 50; the survivors restart
    once and resume from 50: nothing lost, a stall from the last step to the first after."""
    events = [
        *world(0.0, 0, ALL),
        *steps(1, 50, 0.1, 3),  # step 50 at 5.0 s
        ev("checkpoint", 5.05, step=50, size=3, why="signal", save_s=0.003),
        ev("signal", 5.04, "node-b", via="notice", step=50),
        *world(15.0, 50, SURVIVORS, restart=1),
        *steps(51, 70, 15.5, 2),
    ]
    r = torchrun_side.measure(events, "node-b", 0.0, 4.95, 20.0)
    assert r["recovered"] and r["steps_lost"] == 0 and r["stall_s"] == 10.5
    assert r["restarts"] == 1 and r["restart_count_used"] == 1
    assert r["signal_checkpoint"] == {"after_s": 0.1, "step": 50}
    assert r["victim_flag"] == {"via": "notice", "after_s": 0.09}
    assert r["steps_per_s"]["before"] == 10.0 and r["lost_s"] == 0.0
    assert r["checkpoints"] == {"periodic": 0, "signal": 1}


def test_without_the_signal_the_steps_since_the_periodic_checkpoint_are_redone(
    torchrun_side: ModuleType,
) -> None:
    """The node dies at step 57; the last checkpoint was the periodic one at 40: 17 steps lost;
    two worlds formed in the one gap (the first failed before stepping): one stall, two
    restarts."""
    events = [
        *world(0.0, 0, ALL),
        *steps(1, 57, 0.1, 3),  # step 57 at 5.7 s
        ev("checkpoint", 4.05, step=40, size=3, why="periodic", save_s=0.004),
        *world(10.0, 40, SURVIVORS, restart=1),
        *world(14.0, 40, SURVIVORS, restart=2),
        *steps(41, 60, 14.5, 2),
    ]
    r = torchrun_side.measure(events, "node-b", 0.0, 1.0, 20.0)
    assert r["steps_lost"] == 17 and r["stall_s"] == 8.8
    assert r["restarts"] == 2 and r["restart_count_used"] == 2
    assert r["signal_checkpoint"] is None and r["victim_flag"] is None
    assert r["lost_s"] == 1.7 and r["gaps"][0]["worlds_formed"] == 2


def test_two_gaps_add_up(torchrun_side: ModuleType) -> None:
    """A world that stepped and then failed again: each gap's loss and stall count."""
    events = [
        *world(0.0, 0, ALL),
        *steps(1, 30, 0.1, 3),
        *world(5.0, 30, SURVIVORS, restart=1),
        *steps(31, 35, 5.5, 2),  # 35 at 5.9 s
        *world(8.0, 30, SURVIVORS, restart=2),
        *steps(31, 40, 8.5, 2),
    ]
    r = torchrun_side.measure(events, "node-b", 0.0, 2.0, 10.0)
    assert [g["steps_lost"] for g in r["gaps"]] == [0, 5]
    assert r["steps_lost"] == 5 and r["stall_s"] == round(2.5 + 2.6, 3) and r["restarts"] == 2


def test_a_job_that_never_stepped_again_has_no_loss_figure(torchrun_side: ModuleType) -> None:
    events = [*world(0.0, 0, ALL), *steps(1, 30, 0.1, 3), *world(5.0, 20, SURVIVORS, 1)]
    r = torchrun_side.measure(events, "node-b", 0.0, 2.0, 10.0)
    assert not r["recovered"] and r["steps_lost"] is None and r["stall_s"] is None
    nothing = torchrun_side.measure([*world(0.0, 0, ALL), *steps(1, 30, 0.1, 3)], "node-b", 0, 2, 9)
    assert not nothing["recovered"] and nothing["restarts"] == 0


def test_the_aggregate_is_median_min_max_per_mode_and_lead(torchrun_side: ModuleType) -> None:
    def run(mode: str, lead: float, lost: int | None, stall: float | None) -> dict[str, Any]:
        return {
            "mode": mode,
            "lead_s": lead,
            "recovered": lost is not None,
            "steps_lost": lost,
            "stall_s": stall,
            "restarts": 1,
            "lost_s": None if lost is None else lost / 10,
            "steps_per_s": {"before": 10.0},
            "save_s": 0.003,
        }

    runs = [
        run("periodic", 30, 17, 9.0),
        run("spot-autoscaler", 30, 0, 7.0),
        run("periodic", 30, 60, 12.0),
        run("periodic", 30, None, None),
        run("spot-autoscaler", 120, 0, 8.0),
    ]
    rows = torchrun_side.aggregate(runs)
    assert [(r["mode"], r["lead_s"]) for r in rows] == [
        ("spot-autoscaler", 30),
        ("periodic", 30),
        ("spot-autoscaler", 120),
    ]
    periodic = rows[1]
    assert periodic["runs"] == 3 and periodic["recovered"] == 2 and periodic["zero_steps_lost"] == 0
    assert periodic["steps_lost"] == {"min": 17, "median": 38.5, "max": 60}
    assert rows[0]["zero_steps_lost"] == 1 and rows[0]["stall_s"]["median"] == 7.0
    assert "| 30 s | periodic | 38 (17-60) |" in torchrun_side.table(rows)


def test_every_mode_of_a_run_index_preempts_the_same_host_at_the_same_phase(
    torchrun_side: ModuleType,
) -> None:
    assert torchrun_side.plan(1, 0, 30.0) == torchrun_side.plan(1, 0, 30.0)
    victims = {torchrun_side.plan(1, i, 30.0)[0] for i in range(12)}
    assert victims <= set(HOST_OF_RANK.values()) and len(victims) > 1
    phases = [torchrun_side.plan(1, 0, lead)[1] for lead in (30.0, 120.0)]
    assert phases[0] != phases[1] and all(0 <= p < 1 for p in phases)
