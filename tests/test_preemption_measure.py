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
