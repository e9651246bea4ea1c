"""The checkpoint signal: what the daemon tells a training job when some of its hosts are doomed.

One JSON object, the same on every path it travels:
- the `spot-autoscaler.io/checkpoint-notice` annotation on the job and on its worker pods (a
  downwardAPI volume of `metadata.annotations` puts it in a file the training script can poll);
- the body of an opt-in HTTP POST to each of the job's pods (`spot-autoscaler.io/checkpoint-hook`
  on the job: "PORT" or "PORT/PATH");
- in standalone mode, a file beside the discovery file (`<hostfile>.notice`).

    {"hosts": ["worker-2"], "deadline": "2026-11-28T05:00:30Z", "reason": "preemption_notice",
     "job": "default/bert", "issued": "2026-11-28T05:00:00Z"}

This module is the only place that format is written down. It uses the standard library alone,
so a training script can import it (or copy this one file) without the daemon's dependencies.

The training side (docs/checkpoint-signal.md): `pending()` once a step, or `on_notice(callback)`,
reads the file named by $SPOT_AUTOSCALER_NOTICE_FILE (the standalone file or the downwardAPI
annotations file) and what `serve(port)` received; a notice counts when it names this host
($SPOT_AUTOSCALER_HOST, else $HOSTNAME: the pod name).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANNOTATION = "spot-autoscaler.io/checkpoint-notice"
HOOK_ANNOTATION = "spot-autoscaler.io/checkpoint-hook"
DEFAULT_HOOK_PATH = "/spot-autoscaler/notice"
STANDALONE_SUFFIX = ".notice"  # the standalone notice file: the discovery file's path + this


@dataclass(frozen=True, slots=True)
class CheckpointNotice:
    hosts: tuple[str, ...]  # the job's hosts (pod names, or standalone host names) going away
    deadline: datetime | None  # when the first of them may die; None when the cloud gave none
    reason: str  # the decision's reason code, e.g. preemption_notice
    job: str = ""  # namespace/name, or the standalone job's name
    issued: datetime | None = None

    def encode(self) -> str:
        return json.dumps(
            {
                "hosts": sorted(self.hosts),
                "deadline": _rfc3339(self.deadline),
                "reason": self.reason,
                "job": self.job,
                "issued": _rfc3339(self.issued),
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def decode(text: str | bytes) -> CheckpointNotice:
    """A notice from its JSON; ValueError saying what is wrong for anything else."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"checkpoint notice is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("checkpoint notice is not a JSON object")
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise ValueError("checkpoint notice: 'hosts' must be a list of host names")
    return CheckpointNotice(
        hosts=tuple(hosts),
        deadline=_parse_time(raw.get("deadline"), "deadline"),
        reason=str(raw.get("reason") or ""),
        job=str(raw.get("job") or ""),
        issued=_parse_time(raw.get("issued"), "issued"),
    )


def _rfc3339(when: datetime | None) -> str | None:
    if when is None:
        return None
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_time(value: object, key: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"checkpoint notice: {key!r} must be an RFC 3339 time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"checkpoint notice: {key!r} is not an RFC 3339 time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- the training side ---------------------------------------------------------------------------
# A training script asks `pending()` once a step (a stat of one file, a read only when it changed),
# or registers `on_notice(callback)`; `serve(port)` adds the daemon's HTTP POST as a source. Bad
# input (a half-written file, garbage in a POST) is ignored with one warning: nothing here raises
# into the training loop.

FILE_ENV = "SPOT_AUTOSCALER_NOTICE_FILE"  # the standalone notice file or a downwardAPI file
HOST_ENV = "SPOT_AUTOSCALER_HOST"  # this process's host as notices name it (default: HOSTNAME)
MAX_BODY = 64 * 1024  # a POST's body: a notice is a few hundred bytes

_log = logging.getLogger(__name__)

Callback = Callable[[CheckpointNotice], object]
_Stamp = tuple[int, int, int, int]  # device, inode, mtime_ns, size: a rewrite or rename changes it


def this_host() -> str:
    """The name a notice gives this process's host: $SPOT_AUTOSCALER_HOST, else $HOSTNAME (the
    pod name in Kubernetes), else the machine's hostname."""
    return os.environ.get(HOST_ENV) or os.environ.get("HOSTNAME") or socket.gethostname()


class Watch:
    """Where this process hears of notices: a file (polled when asked, or by a thread once a
    callback is registered) and the HTTP listeners `serve` starts. Thread-safe."""

    def __init__(self, file: str | os.PathLike[str] | None = None, host: str | None = None) -> None:
        self.file = os.fspath(file) if file else None
        self.host = host or this_host()
        self._lock = threading.Lock()
        self._stamp: _Stamp | None = None  # the file as last read
        self._from_file: CheckpointNotice | None = None
        self._posted: CheckpointNotice | None = None  # the last notice POSTed to us
        self._callbacks: list[tuple[Callback, bool, set[str]]] = []  # fn, for_any, delivered
        self._servers: list[ThreadingHTTPServer] = []
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._warned: set[str] = set()

    def pending(self, for_any: bool = False) -> CheckpointNotice | None:
        """The notice naming this host (any notice with `for_any`), or None. Never raises."""
        self._check()
        with self._lock:
            return _most_urgent(
                n for n in (self._from_file, self._posted) if n and self._counts(n, for_any)
            )

    def on_notice(self, callback: Callback, for_any: bool = False, poll: float = 0.1) -> None:
        """Call `callback(notice)` once for each new notice naming this host (or any, `for_any`),
        from a daemon thread that polls the file every `poll` seconds, from the HTTP listener's
        thread, or from `pending()`. An exception in it is logged, not raised."""
        with self._lock:
            self._callbacks.append((callback, for_any, set()))
            start = self.file is not None and self._poller is None
            if start:
                self._poller = threading.Thread(
                    target=self._poll, args=(poll,), name="checkpoint-notice-file", daemon=True
                )
        if start and self._poller is not None:
            self._poller.start()
        self._check()

    def serve(
        self, port: int, path: str = DEFAULT_HOOK_PATH, bind: str = "0.0.0.0"
    ) -> ThreadingHTTPServer:
        """Accept the daemon's POST of a notice on `port` (0: any free one; the server's
        `server_address` says which) and `path`, in a daemon thread: 200 for a notice, 400 for
        anything else. A notice with no hosts withdraws the last one posted. `bind`: an IPv4
        or IPv6 address ("::" for an IPv6 pod network)."""
        server = (_Server6 if ":" in bind else _Server)((bind, port), _Handler)
        server.watch, server.hook_path = self, "/" + path.strip("/")
        with self._lock:
            self._servers.append(server)
        name = f"checkpoint-notice-http-{server.server_address[1]}"
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True
        ).start()
        return server

    def receive(self, body: str | bytes) -> CheckpointNotice:
        """Take a POSTed notice (ValueError when it is none: the listener answers 400)."""
        notice = decode(body)
        with self._lock:
            self._posted = notice if notice.hosts else None
        self._deliver(notice)
        return notice

    def close(self) -> None:
        """Stop the listeners and the file poller."""
        self._stop.set()
        with self._lock:
            servers, self._servers = self._servers, []
        for server in servers:
            server.shutdown()
            server.server_close()
        if self._poller is not None:
            self._poller.join(5)

    def _counts(self, notice: CheckpointNotice, for_any: bool) -> bool:
        return bool(notice.hosts) and (for_any or self.host in notice.hosts)

    def _poll(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._check()

    def _check(self) -> None:
        """Read the file again if it changed, and tell the callbacks of what is new."""
        notice = self._read_file()
        if notice is not None:
            self._deliver(notice)

    def _read_file(self) -> CheckpointNotice | None:
        if self.file is None:
            return None
        try:
            st = os.stat(self.file)
        except FileNotFoundError:
            with self._lock:
                self._stamp, self._from_file = None, None
            return None
        except OSError as exc:  # e.g. permissions: said once, not on every step
            if str(exc) not in self._warned:
                self._warned.add(str(exc))
                _log.warning("checkpoint notice file %s unreadable: %s", self.file, exc)
            return None
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp == self._stamp:
                return self._from_file
        try:
            with open(self.file, "rb") as f:
                data = f.read(1024 * 1024)
            notice = parse_file(data)
        except Exception as exc:  # never into the training loop (RecursionError: deep JSON)
            # a notice we cannot read names no host we know: ignored, once per version
            _log.warning("checkpoint notice file %s ignored: %s", self.file, exc)
            notice = None
        with self._lock:
            self._stamp, self._from_file = stamp, notice
        return notice

    def _deliver(self, notice: CheckpointNotice) -> None:
        key = notice.encode()
        due = []
        with self._lock:
            for fn, for_any, delivered in self._callbacks:
                if self._counts(notice, for_any) and key not in delivered:
                    delivered.add(key)
                    due.append(fn)
        for fn in due:
            try:
                fn(notice)
            except Exception:
                _log.warning("checkpoint notice callback %r failed", fn, exc_info=True)


def parse_file(data: str | bytes) -> CheckpointNotice | None:
    """The notice in a notice file: the standalone file's JSON, or a downwardAPI
    `metadata.annotations` file (`key="value"` lines, Go %q quoting) read for ANNOTATION. None
    when it holds none (empty, no such annotation, no hosts); ValueError for garbage."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    text = text.strip()
    if not text:
        return None
    if text.startswith("{"):
        notice = decode(text)
    else:
        annotations = parse_annotations(text)
        if ANNOTATION not in annotations:
            return None
        if not annotations[ANNOTATION].strip():
            return None
        notice = decode(annotations[ANNOTATION])
    return notice if notice.hosts else None


def parse_annotations(text: str) -> dict[str, str]:
    """A downwardAPI annotations file (k8s fieldpath.FormatMap: `key=%q` per line, sorted);
    ValueError when a line is not that."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, quoted = line.partition("=")
        if not sep or not key:
            raise ValueError(f'line {n} is not key="value"')
        out[key] = _go_unquote(quoted, n)
    return out


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


def _go_unquote(quoted: str, line: int) -> str:
    """A Go double-quoted string literal (strconv.Quote's output) as the string it stands for."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise ValueError(f"line {line}: the value is not a quoted string")
    body, out, i = quoted[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == '"':
            raise ValueError(f"line {line}: unescaped quote")
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        esc = body[i + 1 : i + 2]
        if esc in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[esc].encode()
            i += 2
        elif esc in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = body[i + 2 : i + 2 + width]
            value = _number(digits, 16, width, line)
            out += bytes([value]) if esc == "x" else _char(value, line).encode("utf-8")
            i += 2 + width
        elif esc and esc in "01234567":
            out.append(_number(body[i + 1 : i + 4], 8, 3, line) & 0xFF)
            i += 4
        else:
            raise ValueError(f"line {line}: bad escape \\{esc}")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"line {line}: the value is not UTF-8") from None


def _number(digits: str, base: int, width: int, line: int) -> int:
    try:
        if len(digits) != width:
            raise ValueError
        return int(digits, base)
    except ValueError:
        raise ValueError(f"line {line}: bad escape digits {digits!r}") from None


def _char(code: int, line: int) -> str:
    try:
        return chr(code)
    except (ValueError, OverflowError):
        raise ValueError(f"line {line}: no such character {code:#x}") from None


def _most_urgent(notices: Iterable[CheckpointNotice]) -> CheckpointNotice | None:
    """The one whose deadline comes first (one with none last)."""
    far = datetime.max.replace(tzinfo=UTC)
    return min(notices, key=lambda n: n.deadline or far, default=None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    watch: Watch
    hook_path: str


class _Server6(_Server):
    """An IPv6 address to bind ("::" also takes IPv4, where the system allows it)."""

    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 5  # a client that stalls mid-request holds one thread this long, at most
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") != self.server.hook_path.rstrip("/"):
            self._answer(404, "not the checkpoint notice path")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(400, "a Content-Length is needed")
            return
        if not 0 <= length <= MAX_BODY:
            self._answer(400, f"a notice is at most {MAX_BODY} bytes")
            return
        body = self.rfile.read(length)  # a stalled client: a timeout, handled by socketserver
        try:
            self.server.watch.receive(body)
        except Exception as exc:  # garbage: a ValueError; a deep JSON: a RecursionError
            _log.warning("checkpoint notice POST from %s ignored: %s", self.client_address[0], exc)
            self._answer(400, str(exc))
            return
        self._answer(200, "ok")

    def do_GET(self) -> None:
        self._answer(405, "POST a checkpoint notice")

    do_PUT = do_DELETE = do_PATCH = do_GET

    def _answer(self, code: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("checkpoint notice listener: " + format, *args)


_default: Watch | None = None
_default_lock = threading.Lock()


def watch() -> Watch:
    """The process's watch: the file named by $SPOT_AUTOSCALER_NOTICE_FILE, this_host()."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Watch(os.environ.get(FILE_ENV) or None, this_host())
        return _default


def pending(for_any: bool = False) -> CheckpointNotice | None:
    """The notice naming this host (any notice with `for_any`), or None: cheap enough for every
    step (a stat of the notice file; a read only when it changed). Never raises."""
    return watch().pending(for_any)


def on_notice(callback: Callback, for_any: bool = False, poll: float = 0.1) -> None:
    """Call `callback(notice)` once for each new notice naming this host (see Watch.on_notice)."""
    watch().on_notice(callback, for_any, poll)


def serve(port: int, path: str = DEFAULT_HOOK_PATH, bind: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Listen for the daemon's POST of a notice (see Watch.serve); one per pod and port."""
    return watch().serve(port, path, bind)
