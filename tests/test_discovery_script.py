"""The shipped overlay script `discover_hosts.sh`, run by `sh` against fixture files.

The guard cases are shared with the Python guard (owned mode): one table holds both to one rule.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoscaler.adapters.discovery.hostlines import (
    HostSlots,
    format_host_lines,
    guard,
    parse_host_lines,
)
from autoscaler.adapters.discovery.scripts import OVERLAY_SCRIPT, script_path

SCRIPT = script_path(OVERLAY_SCRIPT)


@dataclass
class Overlay:
    """One launcher's /etc/edl: the operator's hostfile, our drain file, the script's cache."""

    dir: Path

    @property
    def hostfile(self) -> Path:
        return self.dir / "hostfile"

    @property
    def drain(self) -> Path:
        return self.dir / "drained-hosts"

    @property
    def cache(self) -> Path:
        return self.dir / "last-hosts"

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "SPOT_HOSTFILE": str(self.hostfile),
            "SPOT_DRAIN_FILE": str(self.drain),
            "SPOT_CACHE_FILE": str(self.cache),
        }

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", str(SCRIPT)], env=self.env(), capture_output=True, text=True, timeout=10
        )

    def discover(self) -> str:
        result = self.run()
        assert result.returncode == 0, result.stderr
        return result.stdout

    def set(self, hostfile: str | None = None, drained: list[str] | None = None) -> None:
        if hostfile is not None:
            self.hostfile.write_text(hostfile)
        if drained is not None:
            self.drain.write_text("".join(f"{h}\n" for h in drained))


@pytest.fixture
def edl(tmp_path: Path) -> Overlay:
    return Overlay(tmp_path)


def lines(*hosts: str) -> str:
    return "".join(f"{h}\n" for h in hosts)


def test_prints_the_hostfile_as_horovod_reads_it(edl: Overlay) -> None:
    # et-operator's rewrite is `echo '<lines>\n' > hostfile`: a trailing blank line
    edl.set("job-worker-0:1\njob-worker-1:1\n\n")
    assert edl.discover() == lines("job-worker-0:1", "job-worker-1:1")
    assert edl.cache.read_text() == lines("job-worker-0:1", "job-worker-1:1")


def test_drained_hosts_are_removed(edl: Overlay) -> None:
    edl.set(lines("w-0:2", "w-1:2", "w-2:2"), drained=["w-1", "w-9"])
    assert edl.discover() == lines("w-0:2", "w-2:2")


def test_a_missing_drain_file_drains_nothing(edl: Overlay) -> None:
    edl.set(lines("w-0:1", "w-1:1"))
    assert edl.discover() == lines("w-0:1", "w-1:1")


def test_invalid_lines_are_skipped_never_blank_or_comments(edl: Overlay) -> None:
    edl.set(
        "# comment\n"
        "w-0:1\n"
        "\n"
        "  w-1:2  \n"  # surrounding blanks: hostnames have none, so the line is meant as w-1
        " # x:1\n"
        "bad host:1\n"
        "w-2\n"  # no slots: Horovod would need --slots-per-host
        "w-3:x\n"
        "w-4:0\n"  # no slot: nothing could run there
        "w-5:1:2\n"
        ":1\n"
        "w-6:\n"
        "[::1]:1\n"
        "héte:1\n"  # \\w in Horovod's regex is Unicode; DNS names are not: stay ASCII
        "w-7:1\r\n"
        "w-0:4\n"  # repeated host: the first wins (Horovod's set would pick arbitrarily)
        "w_8.example-1:16\n"
    )
    out = edl.discover()
    assert out == lines("w-0:1", "w-1:2", "w_8.example-1:16")
    for line in out.splitlines():
        assert line and not line.startswith("#")


@pytest.mark.parametrize(
    "hostfile",
    [
        "",  # truncated by `echo ... >`, not yet written
        "w-0:1\nw-",  # cut mid-line
        "w-0:1\nw-1:1",  # cut before the final newline
        "\n",  # the operator's rewrite with no running workers
        "# nothing valid\n",
    ],
    ids=["empty", "cut-mid-line", "unterminated", "no-workers", "no-valid-line"],
)
def test_an_empty_or_partial_hostfile_repeats_the_last_good_output(
    edl: Overlay, hostfile: str
) -> None:
    edl.set(lines("w-0:1", "w-1:1", "w-2:1"))
    good = edl.discover()
    edl.set(hostfile)
    assert edl.discover() == good
    assert edl.cache.read_text() == good


def test_a_missing_hostfile_with_no_history_prints_nothing_and_still_exits_0(edl: Overlay) -> None:
    result = edl.run()
    assert result.returncode == 0
    assert result.stdout == ""
    assert "hostfile" in result.stderr  # horovodrun shows the script's stderr: say why


def test_after_a_partial_read_the_next_complete_hostfile_is_used(edl: Overlay) -> None:
    edl.set(lines("w-0:1", "w-1:1"))
    edl.discover()
    edl.set("w-0:1\nw-1:1\nw-")
    edl.discover()
    edl.set(lines("w-0:1", "w-1:1", "w-2:1"))
    assert edl.discover() == lines("w-0:1", "w-1:1", "w-2:1")


def test_all_hosts_drained_keeps_one(edl: Overlay) -> None:
    edl.set(lines("w-0:1", "w-1:1", "w-2:1"))
    edl.discover()
    edl.set(drained=["w-0", "w-1", "w-2"])
    assert edl.discover() == lines("w-0:1")
    assert edl.discover() == lines("w-0:1")  # stable while everything stays drained


def test_all_drained_keeps_the_first_previous_host_still_in_the_hostfile(edl: Overlay) -> None:
    edl.set(lines("w-0:1", "w-1:1", "w-2:1"), drained=["w-0"])
    assert edl.discover() == lines("w-1:1", "w-2:1")
    edl.set(drained=["w-0", "w-1", "w-2"])
    assert edl.discover() == lines("w-1:1")  # w-0 left discovery already; w-1 is the oldest left


def test_all_hosts_drained_on_the_first_call_keeps_the_first_host(edl: Overlay) -> None:
    edl.set(lines("w-0:1", "w-1:1"), drained=["w-0", "w-1"])
    assert edl.discover() == lines("w-0:1")


def test_a_kept_host_leaves_once_a_newer_host_is_shown(edl: Overlay) -> None:
    edl.set(lines("w-0:1"))
    edl.discover()
    edl.set(lines("w-0:1", "w-3:1"), drained=["w-0"])
    assert edl.discover() == lines("w-0:1", "w-3:1")  # nothing of the previous set otherwise
    assert edl.discover() == lines("w-3:1")  # w-3 is in the previous set now


def test_output_is_cached_only_when_it_changes(edl: Overlay) -> None:
    edl.set(lines("w-0:1", "w-1:1"))
    edl.discover()
    before = edl.cache.stat()
    time.sleep(0.01)
    edl.discover()
    after = edl.cache.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not [p for p in edl.dir.iterdir() if p.name.startswith("last-hosts.")]  # no temp left


def test_an_unwritable_cache_never_fails_the_call(edl: Overlay, tmp_path: Path) -> None:
    edl.set(lines("w-0:1"))
    env = {**edl.env(), "SPOT_CACHE_FILE": str(tmp_path / "no-such-dir" / "last-hosts")}
    result = subprocess.run(
        ["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=10
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "w-0:1\n", "")


# --- one table for both guards: the script (overlay) and the Python guard (owned file) ---------
GUARD_CASES = [
    # previous output, hosts now (all in the hostfile), drained -> expected output
    ([], ["a:1", "b:1"], [], ["a:1", "b:1"]),
    (["a:1", "b:1"], ["a:1", "b:1", "c:2"], [], ["a:1", "b:1", "c:2"]),
    (["a:1", "b:1", "c:1"], ["a:1", "b:1", "c:1"], ["b"], ["a:1", "c:1"]),
    (["a:1", "b:1"], ["a:1", "b:1"], ["a", "b"], ["a:1"]),  # all drained: keep one
    (["a:1", "b:1"], ["a:1", "b:1", "c:1"], ["a", "b"], ["a:1", "c:1"]),  # kept until c is known
    (["a:1"], ["a:2"], [], ["a:2"]),  # slots change: same host
]


@pytest.mark.parametrize(("previous", "now", "drained", "expected"), GUARD_CASES)
def test_the_script_guard(
    edl: Overlay, previous: list[str], now: list[str], drained: list[str], expected: list[str]
) -> None:
    edl.cache.write_text(lines(*previous))
    edl.set(lines(*now), drained=drained)
    assert edl.discover() == lines(*expected)


@pytest.mark.parametrize(("previous", "now", "drained", "expected"), GUARD_CASES)
def test_the_python_guard(
    previous: list[str], now: list[str], drained: list[str], expected: list[str]
) -> None:
    prev, _ = parse_host_lines(lines(*previous))
    hosts, _ = parse_host_lines(lines(*now))
    proposed = [h for h in hosts if h.host not in drained]
    assert format_host_lines(guard(prev, proposed).hosts) == lines(*expected)


def test_the_python_parser_skips_what_the_script_skips(edl: Overlay) -> None:
    text = "w-0:1\n  w-1:2 \n# c\nbad host:1\nw-3:0\nw-4:x\nhéte:1\nw-7:1\r\nw-0:4\n\n"
    edl.set(text)
    hosts, skipped = parse_host_lines(text)
    assert format_host_lines(hosts) == edl.discover()
    assert hosts == [HostSlots("w-0", 1), HostSlots("w-1", 2)]
    assert len(skipped) == 6


def test_script_speed(edl: Overlay) -> None:
    """Horovod runs the script every second: it must cost milliseconds (reported with -s)."""
    edl.set(
        lines(*(f"job-worker-{i}:8" for i in range(64))),
        drained=[f"job-worker-{i}" for i in range(0, 64, 4)],
    )
    edl.discover()
    runs = 100
    started = time.perf_counter()
    for _ in range(runs):
        edl.run()
    per_run_ms = (time.perf_counter() - started) * 1000 / runs
    print(f"\ndiscover_hosts.sh: {per_run_ms:.2f} ms per run (64 hosts, 16 drained, with spawn)")
    assert per_run_ms < 50
