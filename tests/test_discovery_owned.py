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
