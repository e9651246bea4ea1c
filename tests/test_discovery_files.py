"""Files Horovod's discovery reads while we write them: atomic, idempotent, readable by all."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

from autoscaler.adapters.discovery.drainfile import write_drain_file
from autoscaler.adapters.discovery.files import write_if_changed
from autoscaler.adapters.discovery.scripts import OVERLAY_SCRIPT, OWNED_SCRIPT, install_scripts


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    # big enough that a plain write would take several syscalls
    versions = ["".join(f"host-{v}-{i}:8\n" for i in range(3000)) for v in range(2)]
    write_if_changed(path, versions[0])
    seen: set[str] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(200):
            write_if_changed(path, versions[n % 2])
    finally:
        stop.set()
        reader.join()
    assert seen <= set(versions)
    assert len(seen) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["hosts"]  # no temp file left behind


def test_an_unchanged_write_does_not_touch_the_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    assert write_if_changed(path, "a:1\n") is True
    before = path.stat()
    assert write_if_changed(path, "a:1\n") is False
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert write_if_changed(path, "b:1\n") is True
    assert path.read_text() == "b:1\n"


def test_files_are_readable_by_other_users_and_parents_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "hosts"
    write_if_changed(path, "a:1\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600
    os.chmod(path, 0o600)
    assert write_if_changed(path, "a:1\n") is True  # same text, wrong mode: fixed
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_drain_file_is_sorted_names_one_per_line(tmp_path: Path) -> None:
    path = tmp_path / "drained-hosts"
    assert write_drain_file(path, {"w-2", "w-10", "w-1"}) is True
    assert path.read_text() == "w-1\nw-10\nw-2\n"
    assert write_drain_file(path, ["w-10", "w-1", "w-2"]) is False
    assert write_drain_file(path, set()) is True
    assert path.read_text() == ""


def test_drain_file_skips_names_that_would_break_its_format(tmp_path: Path) -> None:
    path = tmp_path / "drained-hosts"
    write_drain_file(path, {"w-1", "evil\nw-2", "a b", "w-3:1", ""})
    assert path.read_text() == "w-1\n"


def test_install_scripts_copies_executables_idempotently(tmp_path: Path) -> None:
    installed = install_scripts(tmp_path / "spot")
    assert [p.name for p in installed] == [OVERLAY_SCRIPT, OWNED_SCRIPT]
    for p in installed:
        assert stat.S_IMODE(p.stat().st_mode) == 0o755
        assert p.read_text().startswith("#!/bin/sh\n")
    mtimes = [p.stat().st_mtime_ns for p in installed]
    install_scripts(tmp_path / "spot")
    assert [p.stat().st_mtime_ns for p in installed] == mtimes


def test_the_owned_script_prints_the_file_and_never_fails(tmp_path: Path) -> None:
    script = install_scripts(tmp_path)[1]
    hosts = tmp_path / "hosts"
    missing = subprocess.run([str(script), str(hosts)], capture_output=True, text=True, timeout=10)
    assert (missing.returncode, missing.stdout, missing.stderr) == (0, "", "")
    hosts.write_text("a:1\nb:2\n")
    by_arg = subprocess.run([str(script), str(hosts)], capture_output=True, text=True, timeout=10)
    env = {"PATH": os.environ["PATH"], "SPOT_HOSTS_FILE": str(hosts)}
    by_env = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=10)
    assert by_arg.stdout == by_env.stdout == "a:1\nb:2\n"
