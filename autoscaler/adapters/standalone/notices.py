"""A notice source the operator (or a test) controls: `<host>.json` files in a directory.

A file is a notice for that host; deleting it withdraws the notice. The content is optional JSON,
`{"kind": "interruption|rebalance|state-change|maintenance", "deadline": ISO, "id": str}`; an
empty or unreadable file is an interruption (a notice we cannot read still means the host goes).
Polled (no inotify in plain POSIX); each change wakes the daemon, a posted notice as a notice
(`notice_wake`), so the loop's fast path drains at once and its full pass, right after, refills.
Level-triggered: the files are the state, so a restarted daemon sees the same notices.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime, timedelta

import structlog

from autoscaler.adapters.discovery.hostlines import valid_host
from autoscaler.core.model import Notice, NoticeKind
from autoscaler.notices_and_prices import Wake, notice_wake
from autoscaler.times import parse_utc

SOURCE = "notice-dir"
_SUFFIX = ".json"

log = structlog.get_logger("autoscaler.standalone.notices")

_Stamp = tuple[int, int, int]  # inode, mtime_ns, size: a rewrite or replacement changes it


class NoticeDirectory:
    def __init__(self, path: os.PathLike[str] | str, wake: Wake, poll: timedelta) -> None:
        self.path = os.fspath(path)
        self._wake = wake
        self._poll = poll.total_seconds()
        self._lock = threading.Lock()
        self._files: dict[str, tuple[_Stamp, Notice]] = {}  # host -> what its file said
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.scans = 0  # directory reads so far (synced once > 0)

    def start(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        self.scan()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="notice-dir", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def notices(self) -> tuple[Notice, ...]:
        with self._lock:
            return tuple(notice for _, notice in self._files.values())

    def scan(self) -> None:
        """Read the directory once; wake the daemon if any notice appeared, changed or went."""
        found: dict[str, tuple[_Stamp, Notice]] = {}
        with self._lock:
            known = dict(self._files)
        for entry in _entries(self.path):
            host = entry.name[: -len(_SUFFIX)]
            try:
                st = entry.stat()
            except FileNotFoundError:  # deleted since the listing
                continue
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if host in known and known[host][0] == stamp:
                found[host] = known[host]
                continue
            notice = _read(entry.path, host, datetime.fromtimestamp(st.st_mtime, UTC))
            if notice is not None:
                found[host] = (stamp, notice)
        with self._lock:
            self._files = found
        self.scans += 1
        posted = sorted(h for h in found if known.get(h) != found[h])
        withdrawn = sorted(set(known) - set(found))
        if posted or withdrawn:
            log.info("notice_dir_changed", posted=posted, withdrawn=withdrawn)
        # as a notice: else no fast path, and the one full pass drains but, workers leaving, does
        # not refill; the refill waited for the next tick (tick_interval). Written ms apart, the
        # drain and the refill reach Horovod in one discovery call (horovod/runner/elastic/
        # driver.py `_discover_hosts`, every 1 s), so one reset removes the hosts and starts the
        # replacement's join: with every host noticed, its only way to the state before they die
        for host in posted:
            self._wake(notice_wake(found[host][1]))
        if withdrawn:
            self._wake(f"{SOURCE}: withdrawn {withdrawn}")

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.scan()
            except OSError as exc:  # e.g. the directory was removed: no notices until it is back
                log.warning("notice_dir_unreadable", path=self.path, error=str(exc))


def _entries(path: str) -> list[os.DirEntry[str]]:
    """Notice files: `<valid host>.json`; dot files are writers' temporaries."""
    try:
        with os.scandir(path) as it:
            return [
                e
                for e in it
                if e.name.endswith(_SUFFIX)
                and not e.name.startswith(".")
                and valid_host(e.name[: -len(_SUFFIX)])
                and e.is_file()
            ]
    except FileNotFoundError:
        return []


def read_notice(directory: os.PathLike[str] | str, host: str) -> Notice | None:
    """The notice `<host>.json` in `directory` stands for, or None without the file."""
    path = os.path.join(directory, f"{host}{_SUFFIX}")
    try:
        return _read(path, host, datetime.fromtimestamp(os.stat(path).st_mtime, UTC))
    except OSError:  # gone meanwhile, unreadable: no deadline from it
        return None


def _read(path: str, host: str, mtime: datetime) -> Notice | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    plain = Notice(
        node=host, kind=NoticeKind.INTERRUPTION, source=SOURCE, id=host, received_at=mtime
    )
    if not text.strip():
        return plain
    try:
        data = json.loads(text)
        deadline = parse_utc(data.get("deadline"))
        if data.get("deadline") and deadline is None:
            raise ValueError(f"not a time: {data['deadline']!r}")
        return Notice(
            node=host,
            kind=NoticeKind.parse(data.get("kind", NoticeKind.INTERRUPTION)),
            source=SOURCE,
            id=str(data.get("id") or host),
            deadline=deadline,
            received_at=mtime,
        )
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("notice_file_unreadable", path=path, error=str(exc), treated_as="interruption")
        return plain
