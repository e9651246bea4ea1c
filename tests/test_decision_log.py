"""Decision lines: required fields, secrets redacted, and the `decisions` reader's filters."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from core_fixtures import NOW

from autoscaler.cli import main
from autoscaler.core import Action, Decision, Reason
from autoscaler.decisionlog import log_decision
from autoscaler.logs import configure, file_logger

REQUIRED = {
    "ts",
    "event",
    "job",
    "action",
    "count",
    "from_workers",
    "to_workers",
    "pods",
    "hosts",
    "reason",
    "policy",
    "dry_run",
}


def write_log(decisions: list[Decision], dry_run: bool = False) -> str:
    out = io.StringIO()
    logger = file_logger(out)
    for d in decisions:
        log_decision(logger, d, now=NOW, dry_run=dry_run)
    return out.getvalue()


SCALE_IN = Decision(
    "ml/bert",
    Action.SCALE_IN,
    Reason.PREEMPTION_NOTICE,
    "default",
    4,
    2,
    2,
    pods=("bert-worker-0", "bert-worker-2"),
    hosts=("bert-worker-0", "bert-worker-2"),
    nodes=("a",),
    tags=(Reason.BELOW_MIN,),
)
SCALE_OUT = Decision(
    "ml/gpt", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "research", 2, 4, 2, nodes=("b",)
)
NOOP = Decision("ml/gpt", Action.NOOP, Reason.COOLDOWN, "research", 4, 4)


def test_one_json_line_per_decision_with_every_field() -> None:
    lines = write_log([SCALE_IN, SCALE_OUT], dry_run=True).splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert set(first) >= REQUIRED
    assert first["event"] == "decision" and first["ts"] == "2026-03-02T12:00:00.000Z"
    assert (first["action"], first["count"], first["from_workers"], first["to_workers"]) == (
        "scale_in",
        2,
        4,
        2,
    )
    assert first["pods"] == ["bert-worker-0", "bert-worker-2"] and first["tags"] == ["below_min"]
    assert first["dry_run"] is True


def test_secrets_never_reach_a_line() -> None:
    out = io.StringIO()
    file_logger(out).info(
        "aws_call",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG",
        note="key AKIAIOSFODNN7EXAMPLE",
        url="https://sqs/?X-Amz-Security-Token=abc123&x=1",
        headers={"Authorization": "Bearer tok.en"},
    )
    line = out.getvalue()
    for secret in ("wJalrXUtnFEMI", "AKIAIOSFODNN7EXAMPLE", "abc123", "tok.en"):
        assert secret not in line
    assert "[redacted]" in line


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "decisions.jsonl"
    path.write_text(write_log([SCALE_IN, SCALE_OUT, NOOP]) + "not json\n" + '{"event": "other"}\n')
    return path


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict]:
    assert main(["decisions", *args, "--json"]) == 0
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines()]


def test_filters(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert [e["action"] for e in run_json([str(log_file), "--job", "gpt"], capsys)] == [
        "scale_out",
        "noop",
    ]
    assert [e["job"] for e in run_json([str(log_file), "--reason", "below_min"], capsys)] == [
        "ml/bert"
    ]
    assert [e["job"] for e in run_json([str(log_file), "--action", "scale_out"], capsys)] == [
        "ml/gpt"
    ]
    assert run_json([str(log_file), "--since", "2026-03-02T12:00:01Z"], capsys) == []
    assert len(run_json([str(log_file), "--since", "2026-03-02T11:00:00Z"], capsys)) == 3


def test_table_counts_skipped_lines(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", str(log_file), "--job", "ml/bert"]) == 0
    captured = capsys.readouterr()
    assert "scale_in" in captured.out and "ml/gpt" not in captured.out
    assert "2 of 5 line(s) are not decisions" in captured.err


def test_reads_stdin(
    log_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(log_file.read_text()))
    assert len(run_json(["--action", "noop"], capsys)) == 1


@pytest.fixture
def global_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers, root.level = handlers, level


def test_library_logs_come_out_as_redacted_json_lines(global_logging: None) -> None:
    out = io.StringIO()
    configure(json_lines=True, stream=out)
    logging.getLogger("urllib3.connectionpool").warning(
        "retrying https://x/?Signature=s3cr3t after error"
    )
    line = json.loads(out.getvalue().splitlines()[-1])
    assert line["level"] == "warning" and line["logger"] == "urllib3.connectionpool"
    assert "s3cr3t" not in line["event"] and "[redacted]" in line["event"]


def test_table_marks_dry_run_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(write_log([SCALE_IN], dry_run=True))
    assert main(["decisions", str(path)]) == 0
    assert "scale_in [dry-run]" in capsys.readouterr().out
