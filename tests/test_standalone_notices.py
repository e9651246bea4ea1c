"""The notice directory: `<host>.json` = a notice, deleting it withdraws it; changes wake us."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.waiting import seconds_until, wait_for

from autoscaler.adapters.standalone.notices import SOURCE, NoticeDirectory
from autoscaler.core.model import Notice, NoticeKind
from autoscaler.notices_and_prices import may_be_notice


class Wakes:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.event.set()


@pytest.fixture
def wakes() -> Wakes:
    return Wakes()


@pytest.fixture
def notices(tmp_path: Path, wakes: Wakes) -> Iterator[NoticeDirectory]:
    source = NoticeDirectory(tmp_path / "notices", wakes, timedelta(seconds=0.05))
    yield source
    source.stop()


def by_node(source: NoticeDirectory) -> dict[str, Notice]:
    return {n.node: n for n in source.notices()}


def test_start_creates_the_directory_and_scans_it(notices: NoticeDirectory, wakes: Wakes) -> None:
    notices.start()
    assert os.path.isdir(notices.path) and notices.scans > 0
    assert notices.notices() == () and wakes.reasons == []


def test_existing_files_are_notices_at_start(tmp_path: Path, wakes: Wakes) -> None:
    (tmp_path / "notices").mkdir()
    (tmp_path / "notices" / "node-a.json").write_text("")
    source = NoticeDirectory(tmp_path / "notices", wakes, timedelta(seconds=0.05))
    source.start()
    try:
        assert set(by_node(source)) == {"node-a"}  # level-triggered: a restart sees the same
    finally:
        source.stop()


def test_posting_and_withdrawing_wake_the_daemon_within_the_poll(
    notices: NoticeDirectory, wakes: Wakes
) -> None:
    notices.start()
    path = Path(notices.path) / "node-b.json"
    path.write_text("")
    took = seconds_until(lambda: "node-b" in by_node(notices))
    assert took < 0.5
    # the poller publishes the notice, then wakes: a look in between sees no wake yet
    wait_for(wakes.event.is_set, what="the wake that follows the notice")
    notice = by_node(notices)["node-b"]
    assert (notice.kind, notice.source, notice.id) == (NoticeKind.INTERRUPTION, SOURCE, "node-b")
    assert notice.received_at is not None
    wakes.event.clear()
    path.unlink()
    wait_for(lambda: notices.notices() == ())
    assert wakes.event.is_set()
    assert len(wakes.reasons) == 2 and "withdrawn ['node-b']" in wakes.reasons[1]
    # the loop takes the fast path (drains at once) for a notice's wake, not for a withdrawal's
    assert [may_be_notice(r) for r in wakes.reasons] == [True, False]


def test_the_content_sets_kind_deadline_and_id(notices: NoticeDirectory) -> None:
    notices.start()
    deadline = datetime(2026, 1, 1, 12, 2, tzinfo=UTC)
    (Path(notices.path) / "node-c.json").write_text(
        f'{{"kind": "rebalance", "deadline": "{deadline.isoformat()}", "id": "evt-9"}}'
    )
    (Path(notices.path) / "node-d.json").write_text('{"deadline": "2026-01-01T12:02:00"}')
    wait_for(lambda: len(notices.notices()) == 2)
    c, d = by_node(notices)["node-c"], by_node(notices)["node-d"]
    assert (c.kind, c.deadline, c.id) == (NoticeKind.REBALANCE, deadline, "evt-9")
    assert (d.kind, d.deadline) == (NoticeKind.INTERRUPTION, deadline)  # naive = UTC


@pytest.mark.parametrize(
    "text", ["{not json", "[1, 2]", '{"kind": "meteor"}', '{"deadline": "soon"}']
)
def test_an_unreadable_notice_is_still_an_interruption(notices: NoticeDirectory, text: str) -> None:
    notices.start()
    (Path(notices.path) / "node-e.json").write_text(text)
    wait_for(lambda: "node-e" in by_node(notices))
    assert by_node(notices)["node-e"].kind is NoticeKind.INTERRUPTION


def test_rewriting_a_notice_updates_it(notices: NoticeDirectory, wakes: Wakes) -> None:
    notices.start()
    path = Path(notices.path) / "node-f.json"
    path.write_text('{"kind": "rebalance"}')
    wait_for(lambda: "node-f" in by_node(notices))
    path.write_text('{"kind": "interruption", "id": "second"}')
    wait_for(lambda: by_node(notices)["node-f"].kind is NoticeKind.INTERRUPTION)
    assert by_node(notices)["node-f"].id == "second"


def test_other_files_are_ignored(notices: NoticeDirectory, wakes: Wakes) -> None:
    notices.start()
    d = Path(notices.path)
    for name in (".node-g.json.tmp", ".node-g.json", "node-g.txt", "bad host.json", "README"):
        (d / name).write_text("")
    (d / "dir.json").mkdir()
    seen = notices.scans
    wait_for(lambda: notices.scans >= seen + 3, what="three polls")  # nothing may appear
    assert notices.notices() == () and wakes.reasons == []


def test_an_unchanged_directory_wakes_nobody(notices: NoticeDirectory, wakes: Wakes) -> None:
    notices.start()
    (Path(notices.path) / "node-h.json").write_text("")
    wait_for(lambda: len(wakes.reasons) == 1)
    seen = notices.scans
    wait_for(lambda: notices.scans >= seen + 3, what="three more polls")
    assert len(wakes.reasons) == 1


def test_stop_ends_the_poller(notices: NoticeDirectory) -> None:
    notices.start()
    notices.stop()
    assert notices._thread is not None and not notices._thread.is_alive()
