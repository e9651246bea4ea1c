"""Pytest plugin: a session-scoped real control plane (support/control_plane.py).

Load it with ``pytest_plugins = ["support.real_cluster"]`` (a test module or the root conftest).
The ``control_plane`` fixture finds the binaries in env ``SPOT_AUTOSCALER_CONTROL_PLANE_BIN``
or else where ``scripts/build-control-plane.sh --print-bin-dir`` says the pinned versions are
cached. Without them the tests using it are skipped with one line saying how to build them
(``make control-plane``), unless ``REQUIRE_REAL_CLUSTER=1``: then they fail. Tests using the
fixture get the ``real_cluster`` marker (``-m "not real_cluster"`` leaves them out).

``training_operator`` is the same plane with the Kubeflow training-operator (PyTorchJob only)
started on first use (``ControlPlane.start_training_operator``); mpi-operator is started by its
test modules (``start_mpi_operator``), as its fixed health port needs waiting for.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .control_plane import BINARIES, ControlPlane

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-control-plane.sh"
BIN_ENV = "SPOT_AUTOSCALER_CONTROL_PLANE_BIN"
REQUIRED = BINARIES[:5]  # mpi-operator and training-operator are optional (started on demand)


def find_bin_dir() -> tuple[Path | None, str]:
    """The directory with the control-plane binaries, or None and one line saying why."""
    override = os.environ.get(BIN_ENV)
    if override:
        bin_dir = Path(override)
        missing = [b for b in REQUIRED if not os.access(bin_dir / b, os.X_OK)]
        if missing:
            return None, f"{BIN_ENV}={override} lacks {', '.join(missing)} (`make control-plane`)"
        return bin_dir, ""
    try:
        found = subprocess.run(
            [str(BUILD_SCRIPT), "--print-bin-dir"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{BUILD_SCRIPT.name} --print-bin-dir failed ({e}): run `make control-plane`"
    if found.returncode != 0:
        lines = found.stderr.strip().splitlines() or ["no output"]
        return None, lines[-1].replace("[build-control-plane] ERROR: ", "")
    return Path(found.stdout.strip().splitlines()[-1]), ""


_LEFT_OUT: list[str] = []  # why the real-cluster tests were left out of this run, if they were


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that need the plane; without its binaries (and without
    REQUIRE_REAL_CLUSTER=1) leave them out, said once at the end instead of once per test.
    Under `pytest -n 2 --dist loadgroup` (`make test`) they all run on one worker, in order:
    one plane for the session, and no test beside another's controllers (their timing)."""
    real = []
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_cluster)
        if item.get_closest_marker("real_cluster") is not None:
            item.add_marker(pytest.mark.xdist_group("real_cluster"))
            real.append(item)
    if not real or os.environ.get("REQUIRE_REAL_CLUSTER") == "1":
        return
    bin_dir, why = find_bin_dir()
    if bin_dir is not None:
        return
    config.hook.pytest_deselected(items=real)
    items[:] = [item for item in items if item not in set(real)]
    _LEFT_OUT.append(f"{len(real)} real-cluster tests not run: {why}")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist sends the worker's collection
def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker under `--dist loadgroup`, every real-cluster test must carry its
    group in its id, or the scheduler deals them to both workers: two planes on two cores, and
    a class's tests split between two daemons. pytest 9.2 keeps the id where xdist 3.8 no
    longer renames it (pyproject.toml pins pytest below 9.2 for that); fail, never split."""
    config = session.config
    if not hasattr(config, "workerinput") or config.getoption("dist", None) != "loadgroup":
        return
    loose = [i.nodeid for i in session.items if i.get_closest_marker("real_cluster") is not None]
    loose = [n for n in loose if not n.endswith("@real_cluster")]
    if loose:
        raise pytest.UsageError(
            f"{len(loose)} real-cluster tests lack their xdist group (e.g. {loose[0]}): "
            "this pytest and pytest-xdist do not group tests; see pyproject.toml's pin"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _LEFT_OUT:
        terminalreporter.write_line(line, yellow=True)


def require_bin_dir() -> Path:
    """The binaries' directory (`find_bin_dir`); without them the calling test is skipped, or
    fails with REQUIRE_REAL_CLUSTER=1."""
    bin_dir, why = find_bin_dir()
    if bin_dir is None:
        message = f"no real control plane: {why}"
        if os.environ.get("REQUIRE_REAL_CLUSTER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return bin_dir


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A started ControlPlane shared by the session; stopped at its end, with no process left."""
    plane = ControlPlane(require_bin_dir())
    with plane:
        yield plane
    leftover = plane.leftover_processes()
    assert not leftover, f"control-plane processes still alive after stop(): {leftover}"


@pytest.fixture(scope="session")
def training_operator(control_plane: ControlPlane) -> ControlPlane:
    """The session's plane with training-operator running PyTorchJobs: started on first use,
    stopped with the plane. Its ports are free ones, so sessions never wait for each other. A bin
    dir without the binary (an override built before it was pinned) skips the test, or fails it
    with REQUIRE_REAL_CLUSTER=1."""
    binary = control_plane.bin_dir / "training-operator"
    if not os.access(binary, os.X_OK):
        message = f"no training-operator in {control_plane.bin_dir} (`make control-plane`)"
        if os.environ.get("REQUIRE_REAL_CLUSTER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    control_plane.start_training_operator()
    return control_plane
