"""The checkpoint signal's training side (autoscaler/notice.py): real files, real HTTP on
127.0.0.1, real threads; garbage never reaches the training loop as an exception."""

from __future__ import annotations

import http.client
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.waiting import wait_for

from autoscaler import notice
from autoscaler.notice import (
    ANNOTATION,
    DEFAULT_HOOK_PATH,
    CheckpointNotice,
    Watch,
    decode,
    parse_annotations,
    parse_file,
)

DEADLINE = datetime(2026, 11, 28, 5, 0, 30, tzinfo=UTC)
ISSUED = datetime(2026, 11, 28, 5, 0, 0, tzinfo=UTC)


def a_notice(*hosts: str, deadline: datetime | None = DEADLINE) -> CheckpointNotice:
    return CheckpointNotice(hosts, deadline, "preemption_notice", "default/bert", ISSUED)


def go_quote(value: str) -> str:
    """Go's strconv.Quote (what %q prints) for the characters a test uses: escapes for \\a \\b
    \\f \\n \\r \\t \\v \\\\ \\", \\xNN below 0x20 and 0x7f, \\uNNNN for other non-printables."""
    named = {"\a": "a", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t", "\v": "v"}
    out = []
    for c in value:
        if c in ('"', "\\"):
            out.append("\\" + c)
        elif c in named:
            out.append("\\" + named[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        elif not c.isprintable():
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def annotations_file(annotations: dict[str, str]) -> str:
    """What the kubelet writes for a downwardAPI `metadata.annotations` item
    (k8s.io/kubernetes pkg/fieldpath FormatMap: sorted `key=%q` lines, no newline at the end)."""
    return "\n".join(f"{k}={go_quote(v)}" for k, v in sorted(annotations.items()))


def replace(path: Path, text: str) -> None:
    """As the daemon and the kubelet write: a new file renamed over the old one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def notice_file(tmp_path: Path) -> Path:
    return tmp_path / "hosts.notice"


@pytest.fixture
def watch(notice_file: Path) -> Iterator[Watch]:
    w = Watch(notice_file, host="worker-1")
    yield w
    w.close()


# --- the format --------------------------------------------------------------------------------


def test_a_notice_survives_encoding() -> None:
    sent = a_notice("worker-2", "worker-1")
    got = decode(sent.encode())
    assert got.hosts == ("worker-1", "worker-2")  # sorted on the wire
    assert (got.deadline, got.reason, got.job, got.issued) == (
        DEADLINE,
        "preemption_notice",
        "default/bert",
        ISSUED,
    )
    assert json.loads(sent.encode())["deadline"] == "2026-11-28T05:00:30Z"
    assert decode(a_notice("w", deadline=None).encode()).deadline is None


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"hosts": "w"}', '{"hosts": [1]}', '{"hosts": ["w"], "deadline": 5}'],
)
def test_decode_says_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="checkpoint notice"):
        decode(text)


def test_go_quoted_values_are_unquoted() -> None:
    value = 'héllo\n\t"x"\\ \x00\x7f\u2028 ok'
    quoted = go_quote(value)
    assert quoted == '"héllo\\n\\t\\"x\\"\\\\ \\x00\\x7f\\u2028 ok"'  # as Go prints it
    assert parse_annotations(f"a/b={quoted}") == {"a/b": value}
    # escapes strconv.Quote never writes but a Go literal may hold: octal, \U, \' and \a
    assert parse_annotations('k="\\101\\U0001F600\\\'\\a"') == {"k": "A\U0001f600'\a"}
    # a \x run that spells UTF-8 bytes (strconv.Quote writes invalid UTF-8 bytes so)
    assert parse_annotations('k="\\xc3\\xa9"') == {"k": "é"}


@pytest.mark.parametrize(
    "line",
    ["no-equals", "k=unquoted", 'k="open', 'k="a"b"', 'k="\\q"', 'k="\\x4"', 'k="\\xff"', '="v"'],
)
def test_a_line_that_is_not_go_quoted_is_an_error(line: str) -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_annotations(line)


def test_the_annotations_file_gives_our_annotation_only() -> None:
    text = annotations_file(
        {
            "kubectl.kubernetes.io/last-applied-configuration": '{"a": 1}\n',
            ANNOTATION: a_notice("bert-worker-2").encode(),
            "kubernetes.io/config.seen": "2026-11-28T05:00:00.123456789Z",
        }
    )
    assert text.count("\n") == 2 and "\\n" in text  # one line per annotation, as the kubelet's
    parsed = parse_file(text)
    assert parsed is not None and parsed.hosts == ("bert-worker-2",)
    assert parse_file(annotations_file({"other": "x"})) is None
    assert parse_file(annotations_file({ANNOTATION: ""})) is None  # withdrawn by emptying
    assert parse_file("") is None and parse_file("\n") is None
    assert parse_file(a_notice().encode()) is None  # no hosts: nothing doomed


# --- pending(): the file -----------------------------------------------------------------------


def test_pending_reads_the_standalone_file_for_this_host(watch: Watch, notice_file: Path) -> None:
    assert watch.pending() is None  # no file yet
    replace(notice_file, a_notice("worker-2").encode())
    assert watch.pending() is None  # not ours
    other = watch.pending(for_any=True)
    assert other is not None and other.hosts == ("worker-2",)
    replace(notice_file, a_notice("worker-2", "worker-1").encode())
    ours = watch.pending()
    assert ours is not None and ours.deadline == DEADLINE
    notice_file.unlink()
    assert watch.pending() is None and watch.pending(for_any=True) is None


def test_pending_reads_a_downward_api_annotations_file(tmp_path: Path) -> None:
    # the kubelet's layout: the file is a symlink into a ..data directory it swaps atomically
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()

    def kubelet_writes(version: int, annotations: dict[str, str]) -> None:
        data = podinfo / f"..2026_11_28_05_00_0{version}.{version}"
        data.mkdir()
        (data / "annotations").write_text(annotations_file(annotations))
        link = podinfo / "..data_tmp"
        link.symlink_to(data.name)
        os.replace(link, podinfo / "..data")

    kubelet_writes(1, {"team": "nlp"})
    (podinfo / "annotations").symlink_to("..data/annotations")
    w = Watch(podinfo / "annotations", host="bert-worker-2")
    try:
        assert w.pending() is None
        kubelet_writes(2, {"team": "nlp", ANNOTATION: a_notice("bert-worker-2").encode()})
        got = w.pending()
        assert got is not None and got.reason == "preemption_notice"
        kubelet_writes(3, {"team": "nlp"})  # the daemon removed the annotation
        assert w.pending() is None
    finally:
        w.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"{not json",
        b'{"hosts": 3}',
        b"\xff\xfe\x00",
        b"random words\nno=quotes",
        (ANNOTATION + "=" + go_quote("{")).encode(),
        b"[" * 100_000,  # deep JSON: a RecursionError inside json, still only a warning
    ],
)
def test_garbage_in_the_file_is_ignored_with_one_warning(
    watch: Watch, notice_file: Path, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    notice_file.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="autoscaler.notice"):
        assert watch.pending() is None
        assert watch.pending() is None  # unchanged: not read, not warned again
    warnings = [r for r in caplog.records if "ignored" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    replace(notice_file, a_notice("worker-1").encode())  # a good notice after garbage
    assert watch.pending() is not None


def test_an_unreadable_file_warns_once_and_reads_as_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = Watch(tmp_path / "not-a-dir" / "x", host="h")
    (tmp_path / "not-a-dir").write_text("a file, not a directory")  # stat: NotADirectoryError
    with caplog.at_level(logging.WARNING, logger="autoscaler.notice"):
        assert w.pending() is None and w.pending() is None
    assert len(caplog.records) == 1
    w.close()


def test_pending_only_reads_the_file_when_it_changed(
    watch: Watch, notice_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replace(notice_file, a_notice("worker-1").encode())
    assert watch.pending() is not None
    opened: list[object] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    for _ in range(100):
        assert watch.pending() is not None
    assert opened == []  # a stat per call, nothing more


# --- serve(): the HTTP listener ----------------------------------------------------------------


def post(
    port: int, body: bytes, path: str = DEFAULT_HOOK_PATH, method: str = "POST"
) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def port(watch: Watch) -> int:
    return int(watch.serve(0, bind="127.0.0.1").server_address[1])


def test_a_posted_notice_is_pending(watch: Watch, port: int) -> None:
    assert post(port, a_notice("worker-3").encode().encode()) == (200, "ok\n")
    assert watch.pending() is None
    seen = watch.pending(for_any=True)
    assert seen is not None and seen.hosts == ("worker-3",)
    assert post(port, a_notice("worker-1").encode().encode())[0] == 200
    ours = watch.pending()
    assert ours is not None and ours.hosts == ("worker-1",)
    assert post(port, a_notice().encode().encode())[0] == 200  # no hosts: withdrawn
    assert watch.pending(for_any=True) is None


def test_a_bad_post_gets_400_and_changes_nothing(
    watch: Watch, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    assert post(port, a_notice("worker-1").encode().encode())[0] == 200
    with caplog.at_level(logging.WARNING, logger="autoscaler.notice"):
        status, text = post(port, b"{garbage")
        assert (status, "not JSON" in text) == (400, True)
        assert post(port, b'{"hosts": "worker-1"}')[0] == 400
        assert post(port, b"[" * 50_000)[0] == 400
        assert post(port, b"x" * (notice.MAX_BODY + 1))[0] == 400
    assert len([r for r in caplog.records if "POST" in r.getMessage()]) == 3
    assert post(port, b"{}", path="/elsewhere")[0] == 404
    assert post(port, b"", method="GET")[0] == 405
    still = watch.pending()
    assert still is not None and still.hosts == ("worker-1",)


def test_the_path_is_configurable(watch: Watch) -> None:
    port = watch.serve(0, path="hooks/ckpt/", bind="127.0.0.1").server_address[1]
    assert post(port, a_notice("worker-1").encode().encode(), path="/hooks/ckpt")[0] == 200
    assert post(port, b"{}", path=DEFAULT_HOOK_PATH)[0] == 404


def test_the_listener_takes_ipv6(watch: Watch) -> None:
    try:
        server = watch.serve(0, bind="::1")
    except OSError as exc:  # no IPv6 on this machine
        pytest.skip(f"no IPv6 loopback: {exc}")
    conn = http.client.HTTPConnection("::1", server.server_address[1], timeout=5)
    try:
        conn.request("POST", DEFAULT_HOOK_PATH, body=a_notice("worker-1").encode().encode())
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    assert watch.pending() is not None


# --- on_notice(): callbacks --------------------------------------------------------------------


class Heard:
    def __init__(self) -> None:
        self.notices: list[CheckpointNotice] = []
        self.threads: list[str] = []

    def __call__(self, n: CheckpointNotice) -> None:
        self.notices.append(n)
        self.threads.append(threading.current_thread().name)


def test_callbacks_hear_each_new_notice_once_from_the_file(watch: Watch, notice_file: Path) -> None:
    mine, anyone = Heard(), Heard()
    watch.on_notice(mine, poll=0.02)
    watch.on_notice(anyone, for_any=True, poll=0.02)
    replace(notice_file, a_notice("worker-2").encode())
    wait_for(lambda: anyone.notices, 5, "the poller to see the file")
    assert anyone.threads == ["checkpoint-notice-file"]
    replace(notice_file, a_notice("worker-1", "worker-2").encode())
    wait_for(lambda: mine.notices, 5, "our host's notice")
    replace(notice_file, a_notice("worker-1", "worker-2").encode())  # rewritten, same notice
    assert watch.pending() is not None  # reads the new version here, delivers nothing new
    assert len(mine.notices) == 1 and len(anyone.notices) == 2


def test_callbacks_hear_a_post_and_a_failing_one_is_only_logged(
    watch: Watch, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    heard = Heard()

    def broken(_: CheckpointNotice) -> None:
        raise RuntimeError("the user's bug")

    watch.on_notice(broken)
    watch.on_notice(heard)
    with caplog.at_level(logging.WARNING, logger="autoscaler.notice"):
        assert post(port, a_notice("worker-1").encode().encode())[0] == 200
    assert [n.hosts for n in heard.notices] == [("worker-1",)]
    assert heard.threads[0].startswith("Thread-")  # the listener's request thread
    assert "callback" in caplog.text and "the user's bug" in caplog.text


def test_a_callback_registered_late_hears_the_standing_notice(
    watch: Watch, notice_file: Path
) -> None:
    replace(notice_file, a_notice("worker-1").encode())
    heard = Heard()
    watch.on_notice(heard)
    assert len(heard.notices) == 1


def test_the_file_and_a_post_give_the_earliest_deadline(watch: Watch, port: int) -> None:
    later = a_notice("worker-1", deadline=DEADLINE.replace(minute=9))
    replace(Path(str(watch.file)), later.encode())
    assert post(port, a_notice("worker-1").encode().encode())[0] == 200
    got = watch.pending()
    assert got is not None and got.deadline == DEADLINE


# --- the process's default watch --------------------------------------------------------------


@pytest.fixture
def fresh_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(notice, "_default", None)
    yield
    if notice._default is not None:
        notice._default.close()


def test_this_host_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTNAME", "bert-worker-0")
    monkeypatch.delenv(notice.HOST_ENV, raising=False)
    assert notice.this_host() == "bert-worker-0"
    monkeypatch.setenv(notice.HOST_ENV, "node-a")
    assert notice.this_host() == "node-a"


def test_the_module_functions_read_the_environment(
    monkeypatch: pytest.MonkeyPatch, notice_file: Path, fresh_default: None
) -> None:
    monkeypatch.setenv(notice.FILE_ENV, str(notice_file))
    monkeypatch.setenv(notice.HOST_ENV, "node-a")
    assert notice.pending() is None
    heard = Heard()
    notice.on_notice(heard, poll=0.02)
    replace(notice_file, a_notice("node-a").encode())
    got = notice.pending()
    assert got is not None and got.hosts == ("node-a",)
    wait_for(lambda: heard.notices, 5, "the callback")
    port = notice.serve(0, bind="127.0.0.1").server_address[1]
    assert post(port, b"junk")[0] == 400


def test_without_a_file_pending_is_none(
    fresh_default: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(notice.FILE_ENV, raising=False)
    assert notice.pending() is None and notice.pending(for_any=True) is None


def test_the_module_runs_on_the_standard_library_alone(tmp_path: Path, notice_file: Path) -> None:
    """A training script may copy notice.py beside itself: no site-packages (-S), no repo (-I)."""
    (tmp_path / "notice.py").write_text(Path(notice.__file__).read_text())
    replace(notice_file, a_notice("h").encode())
    code = (
        "import notice, sys\n"
        "assert not any(m.split('.')[0] in ('autoscaler', 'structlog', 'pydantic', 'yaml')"
        " for m in sys.modules)\n"
        "n = notice.pending()\n"
        "print(n.hosts, n.deadline.isoformat())\n"
    )
    env = {"SPOT_AUTOSCALER_NOTICE_FILE": str(notice_file), "SPOT_AUTOSCALER_HOST": "h"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "('h',) 2026-11-28T05:00:30+00:00"
