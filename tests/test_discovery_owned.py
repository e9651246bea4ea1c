"""The owned discovery file (standalone): validated, guarded, atomic, join times recorded."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from autoscaler.adapters.discovery.hostlines import HostSlots, parse_host_lines
from autoscaler.adapters.discovery.owned import OwnedHostsFile

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def owned(tmp_path: Path) -> OwnedHostsFile:
    return OwnedHostsFile(tmp_path / "hosts", tmp_path / "hosts.joined.json", timedelta(0))


def hs(*specs: str) -> list[HostSlots]:
    hosts, skipped = parse_host_lines("\n".join(specs))
    assert not skipped
    return hosts


def test_a_missing_file_has_no_hosts(owned: OwnedHostsFile) -> None:
    assert owned.read() == []
    assert owned.joined() == {}


def test_write_then_read_back(owned: OwnedHostsFile) -> None:
    written = owned.write(hs("a:1", "b:2"), T0)
    assert written.changed and written.kept is None
    assert owned.path.read_text() == "a:1\nb:2\n"
    assert owned.read() == hs("a:1", "b:2")
    assert set(owned.joined()) == {"a", "b"}


def test_writes_are_idempotent(owned: OwnedHostsFile) -> None:
    owned.write(hs("a:1", "b:1"), T0)
    mtime = owned.path.stat().st_mtime_ns
    assert owned.write(hs("a:1", "b:1"), T0 + timedelta(seconds=5)).changed is False
    assert owned.path.stat().st_mtime_ns == mtime  # the mtime is the job's last scale: keep it


def test_invalid_entries_are_never_written(owned: OwnedHostsFile) -> None:
    owned.write([HostSlots("a", 1), HostSlots("b c", 1), HostSlots("d", 0), HostSlots("#e", 1)], T0)
    assert owned.path.read_text() == "a:1\n"


def test_hand_edited_lines_are_read_strictly(owned: OwnedHostsFile) -> None:
    owned.path.write_text("a:1\n# note\nb:2\nb:3\nc\n")
    assert owned.read() == hs("a:1", "b:2")


def test_never_empties_a_non_empty_file(owned: OwnedHostsFile) -> None:
    owned.write(hs("a:1", "b:1"), T0)
    written = owned.write([], T0)
    assert written.kept == "a"
    assert owned.path.read_text() == "a:1\n"


def test_keeps_a_previous_host_when_the_proposal_replaces_them_all(owned: OwnedHostsFile) -> None:
    owned.write(hs("a:1", "b:1"), T0)
    written = owned.write(hs("c:1", "d:1"), T0)
    assert written.kept == "a"
    assert owned.path.read_text() == "a:1\nc:1\nd:1\n"
    # once c and d are in the previous set, a can go
    assert owned.write(hs("c:1", "d:1"), T0).kept is None
    assert owned.path.read_text() == "c:1\nd:1\n"


def test_an_empty_file_may_start_empty(owned: OwnedHostsFile) -> None:
    written = owned.write([], T0)
    assert written.changed and owned.path.read_text() == ""  # horovodrun's `cat` then finds it


def test_plan_is_what_write_would_do_without_writing(owned: OwnedHostsFile) -> None:
    owned.write(hs("a:1"), T0)
    assert owned.plan([], T0).hosts == hs("a:1")
    assert owned.plan(hs("b:1"), T0).hosts == hs("a:1", "b:1")
    assert owned.path.read_text() == "a:1\n"


def test_join_times_are_recorded_for_new_hosts_and_more_slots(owned: OwnedHostsFile) -> None:
    t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    owned.write(hs("a:1", "b:1"), T0)
    owned.write(hs("a:1", "b:2", "c:1"), t1)  # b got a worker more; c is new
    owned.write(hs("a:1", "c:1"), t2)  # b left: forgotten
    assert owned.joined() == {"a": T0, "c": t1}
    assert json.loads(owned.joined_path.read_text()) == {"a": T0.isoformat(), "c": t1.isoformat()}


def test_a_hand_made_file_records_no_join_time(owned: OwnedHostsFile) -> None:
    owned.path.write_text("a:1\n")
    owned.write(hs("a:1", "b:1"), T0)
    assert owned.joined() == {"b": T0}


def test_a_corrupt_join_record_counts_as_none(owned: OwnedHostsFile) -> None:
    owned.joined_path.write_text("{not json")
    assert owned.joined() == {}


def test_a_settled_host_stays_while_the_others_are_still_joining(tmp_path: Path) -> None:
    owned = OwnedHostsFile(tmp_path / "hosts", tmp_path / "j.json", timedelta(seconds=30))
    owned.write(hs("a:1"), T0)
    owned.write(hs("a:1", "b:1"), T0 + timedelta(seconds=40))  # b joins at +40 s
    # a settled at +30 s; b is still joining at +50 s: b alone could not hand on the state
    written = owned.write(hs("b:1"), T0 + timedelta(seconds=50))
    assert (written.kept, written.changed) == ("a", False)
    assert owned.write(hs("b:1"), T0 + timedelta(seconds=70)).hosts == hs("b:1")  # b settled


def test_with_no_settled_host_any_previous_host_may_stay(tmp_path: Path) -> None:
    owned = OwnedHostsFile(tmp_path / "hosts", tmp_path / "j.json", timedelta(seconds=30))
    owned.write(hs("a:1", "b:1", "c:1"), T0)
    assert owned.write(hs("b:1", "c:1"), T0 + timedelta(seconds=1)).hosts == hs("b:1", "c:1")


# --- owned_hosts.sh's report of Horovod's rank assignment (`<file>.assigned`) --------------------
def _report(path: Path, scanned: datetime, **since: datetime) -> None:
    lines = [f"scanned {int(scanned.timestamp())}"]
    lines += [f"{h} {int(t.timestamp())}" for h, t in since.items()]
    path.write_text("\n".join(lines) + "\n")


def _reported(tmp_path: Path) -> OwnedHostsFile:
    return OwnedHostsFile(
        tmp_path / "hosts", tmp_path / "j.json", timedelta(seconds=30), tmp_path / "hosts.assigned"
    )


def test_the_assignment_report_is_read_with_its_since_times(tmp_path: Path) -> None:
    owned = _reported(tmp_path)
    assert owned.assigned(T0) is None  # none written: fall back to join_grace
    _report(owned.assigned_path, T0, a=T0 - timedelta(minutes=5), b=T0 - timedelta(seconds=2))
    assert owned.assigned(T0 + timedelta(seconds=3)) == {
        "a": T0 - timedelta(minutes=5),
        "b": T0 - timedelta(seconds=2),
    }
    assert owned.assigned(T0 + timedelta(seconds=11)) is None  # stale: horovodrun gone
    owned.assigned_path.write_text("garbage\n")
    assert owned.assigned(T0) is None


def test_with_a_report_an_assigned_replacement_frees_the_old_host_before_join_grace(
    tmp_path: Path,
) -> None:
    owned = _reported(tmp_path)
    owned.write(hs("a:1"), T0)
    t = T0 + timedelta(minutes=5)
    owned.write(hs("a:1", "b:1"), t)  # b enters the file at t
    # b not in Horovod's assignment yet: a stays (Horovod needs a host of the previous set)
    _report(owned.assigned_path, t + timedelta(seconds=2), a=T0)
    assert owned.write(hs("b:1"), t + timedelta(seconds=3)).kept == "a"
    # b assigned 2 s after entering: the guard lets a go (when b has the state is the core's call)
    _report(owned.assigned_path, t + timedelta(seconds=4), a=T0, b=t + timedelta(seconds=3))
    written = owned.write(hs("b:1"), t + timedelta(seconds=5))
    assert written.kept is None and owned.read() == hs("b:1")


def test_owned_script_reports_the_hosts_running_a_worker_and_since_when(tmp_path: Path) -> None:
    import subprocess
    import time

    from autoscaler.adapters.discovery.scripts import OWNED_SCRIPT, script_path

    hosts, proc = tmp_path / "hosts", tmp_path / "proc"
    hosts.write_text("a:1\nb:1\n")
    proc.mkdir()

    def worker(pid: int, host: str) -> None:
        d = proc / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(b"python\0train.py\0")
        (d / "environ").write_bytes(f"PATH=/bin\0HOROVOD_HOSTNAME={host}\0".encode())

    def call() -> str:
        env = {"PATH": "/usr/bin:/bin", "SPOT_PROC_DIR": str(proc)}
        out = subprocess.run(
            [script_path(OWNED_SCRIPT), str(hosts)], env=env, capture_output=True, check=True
        )
        return out.stdout.decode()

    report = tmp_path / "hosts.assigned"
    assert call() == "a:1\nb:1\n" and not report.exists()  # no worker seen: no report
    worker(10, "a")
    before = int(time.time())
    assert call() == "a:1\nb:1\n"
    owned = OwnedHostsFile(hosts, tmp_path / "j.json", timedelta(seconds=30), report)
    first = owned.assigned(datetime.now(UTC))
    assert first is not None and set(first) == {"a"}
    assert first["a"] >= datetime.fromtimestamp(before, UTC)
    worker(11, "b")
    time.sleep(1.1)
    call()
    second = owned.assigned(datetime.now(UTC))
    assert second is not None and second["a"] == first["a"] and second["b"] > first["a"]
    for pid in (10, 11):  # the workers exit
        for f in (proc / str(pid)).iterdir():
            f.unlink()
        (proc / str(pid)).rmdir()
    call()
    assert not report.exists()
