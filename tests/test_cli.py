"""The command line on bad input: one line naming the input and the problem, an exit code that
says whose fault it was (2: the command line or a file it names, 1: while running), no traceback;
pipes that close early close quietly; `decisions` reads what log rotation leaves behind."""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import subprocess
from pathlib import Path

import pytest
from support.cli import CLI, ROOT, run_cli
from support.kube_api import KubeApiServer
from test_daemon_support import KUBE_CONFIG
from test_decision_log import NOOP, SCALE_IN, SCALE_OUT, write_log

from autoscaler import cli
from autoscaler.cli import simulate as simulate_command
from autoscaler.core import Action, Decision, Reason


def spot_autoscaler(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], cwd=ROOT, input=stdin, text=True, capture_output=True, timeout=60
    )


def one_line_no_traceback(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# --- decisions: inputs -------------------------------------------------------------------------
def jobs_of(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert cli.main(["decisions", *args, "--json"]) == 0
    return [json.loads(line)["job"] for line in capsys.readouterr().out.splitlines()]


def test_gzip_and_rotated_logs_read_oldest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "decisions.jsonl").write_text(write_log([NOOP]))  # the live file: newest
    (tmp_path / "decisions.jsonl.1").write_text(write_log([SCALE_OUT]))
    with gzip.open(tmp_path / "decisions.jsonl.2.gz", "wt") as f:  # logrotate's compressed one
        f.write(write_log([SCALE_IN]))
    newest_first = ["decisions.jsonl", "decisions.jsonl.1", "decisions.jsonl.2.gz"]
    in_time_order = ["ml/bert", "ml/gpt", "ml/gpt"]
    assert jobs_of([str(tmp_path / n) for n in newest_first], capsys) == in_time_order
    assert jobs_of([str(tmp_path)], capsys) == in_time_order  # a folder: the logs in it
    # gzip is told by content: a compressed file without .gz reads the same
    gz_named_plain = tmp_path / "copy.jsonl"
    gz_named_plain.write_bytes((tmp_path / "decisions.jsonl.2.gz").read_bytes())
    assert jobs_of([str(gz_named_plain)], capsys) == ["ml/bert"]


def test_stdin_is_dash_and_mixes_with_files(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text(write_log([SCALE_OUT]))
    done = spot_autoscaler("decisions", "--json", "-", str(log), stdin=write_log([SCALE_IN]))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["job"] for line in done.stdout.splitlines()] == ["ml/bert", "ml/gpt"]


@pytest.mark.parametrize(
    ("make", "code", "said"),
    [
        (lambda d: d / "missing.jsonl", 2, "missing.jsonl: No such file or directory"),
        (lambda d: d, 2, "a directory with no decisions.jsonl* in it"),
        (lambda d: _write(d / "notes.txt", b"meeting at 10\nbring GPUs\n"), 1, "no decision lines"),
        (lambda d: _write(d / "empty.jsonl", b""), 1, "no decision lines"),
        (
            lambda d: _write(d / "cut.gz", gzip.compress(b'{"event": "decision"}\n' * 50)[:30]),
            2,
            "cut.gz: ",
        ),
        (lambda d: _write(d / "bin.log", bytes(range(256)) * 4), 1, "no decision lines"),
    ],
    ids=["missing", "folder-without-logs", "not-a-log", "empty", "truncated-gzip", "binary"],
)
def test_bad_inputs_say_which_and_why_in_one_line(
    tmp_path: Path, make, code: int, said: str
) -> None:
    path = make(tmp_path)
    done = spot_autoscaler("decisions", str(path))
    assert done.returncode == code and done.stdout == ""  # not even an empty table
    assert said in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_lines_that_are_not_decisions_are_counted(tmp_path: Path) -> None:
    log = tmp_path / "d.jsonl"
    log.write_text(write_log([SCALE_IN]) + "not json\n" + '{"event": "tick"}\n')
    done = spot_autoscaler("decisions", str(log))
    assert done.returncode == 0
    assert one_line_no_traceback(done.stderr) == f"{log}: 2 of 3 line(s) are not decisions"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    log = tmp_path / "big.jsonl"
    log.write_text(write_log([SCALE_IN] * 5000))  # ~2 MB: far past a pipe's buffer
    for table in ([], ["--json"]):
        proc = subprocess.Popen(
            [str(CLI), "decisions", str(log), *table],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline()  # `| head -1`
        proc.stdout.close()
        assert proc.wait(timeout=60) == cli.EXIT_PIPE_CLOSED
        assert proc.stderr.read() == b""


def test_piped_table_rows_do_not_wrap(tmp_path: Path) -> None:
    pods = tuple(f"a-very-long-training-job-name-worker-{i}" for i in range(3))
    wide = Decision(
        "research-namespace/a-very-long-training-job-name",
        Action.SCALE_IN,
        Reason.PREEMPTION_NOTICE,
        "a-policy-with-a-long-name",
        8,
        5,
        3,
        pods=pods,
        tags=(Reason.BELOW_MIN,),
    )
    log = tmp_path / "d.jsonl"
    log.write_text(write_log([wide]))
    done = spot_autoscaler("decisions", str(log))
    assert done.returncode == 0
    rows = [line for line in done.stdout.splitlines() if "scale_in" in line]
    assert len(rows) == 1 and all(p in rows[0] for p in pods)
    assert len(rows[0]) > 200  # one line, however long, rather than folded at 80 columns


# --- every command: listed, loaded when it runs ------------------------------------------------
def test_help_lists_every_command() -> None:
    done = spot_autoscaler("--help")
    assert done.returncode == 0, done.stderr
    listing = " ".join(done.stdout.split())  # argparse wraps long help lines
    for command in cli.COMMANDS:
        assert f"{command.name} {command.help}" in listing


def test_each_command_is_added_by_its_own_module() -> None:
    for command in cli.COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        command.register(sub)
        assert sub.choices[command.name].get_default("func").__module__ == command.module


# --- every command: no traceback ---------------------------------------------------------------
def test_an_unforeseen_error_is_one_line_and_debug_shows_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(simulate_command, "simulate", broken)
    assert cli.main(["simulate", "--out", str(tmp_path)]) == cli.EXIT_FAILED
    assert capsys.readouterr().err == "error: RuntimeError: disk on fire (--debug shows where)\n"
    with pytest.raises(RuntimeError, match="disk on fire"):
        cli.main(["--debug", "simulate", "--out", str(tmp_path)])


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--trace", "nowhere.csv"],
        ["simulate", "--config", "nowhere.yaml"],
        ["bench", "--trace", "nowhere.csv"],
        ["check-config", "nowhere.yaml"],
        ["run", "--config", "nowhere.yaml", "--once"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_missing_file_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    done = spot_autoscaler(*args)
    assert done.returncode == 2, done.stderr
    assert "nowhere" in done.stderr and "Traceback" not in done.stderr


# --- run ---------------------------------------------------------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_once_without_an_api_server_fails_fast_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(KUBE_CONFIG)
    server = f"http://127.0.0.1:{closed_port()}"
    (tmp_path / "kubeconfig").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    proc = run_cli(tmp_path, "--once", "--connect-timeout", "1s", "--log-format", "json")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and out == ""
    line = json.loads(one_line_no_traceback(err))
    assert line["event"] == "api_unreachable" and line["waited_s"] == 1.0
    assert line["error"] == f"{server}: Connection refused"


def test_log_flags_override_the_config(tmp_path: Path) -> None:
    with KubeApiServer() as api:
        api.kubeconfig(str(tmp_path / "kubeconfig"))
        (tmp_path / "config.yaml").write_text(KUBE_CONFIG)
        quiet = run_cli(tmp_path, "--once", "--dry-run", "--log-level", "error")
        _, err = quiet.communicate(timeout=30)
        assert quiet.returncode == 0 and err == ""  # info lines (synced, pass) are gone
        console = run_cli(tmp_path, "--once", "--dry-run", "--log-format", "console")
        _, err = console.communicate(timeout=30)
        assert console.returncode == 0 and err
        assert not any(line.startswith("{") for line in err.splitlines())
