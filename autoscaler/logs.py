"""structlog set-up: JSON lines for the daemon and files, readable key=value on a terminal.

Every line passes a redactor, so a credential that reaches a log call never reaches the output.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

_SECRET_KEY = re.compile(
    r"secret|password|passwd|token|credential|access_?key|signature|authorization", re.I
)
# AWS access key ids, Alibaba AccessKey ids, bearer tokens, URL query credentials
_SECRET_VALUE = re.compile(
    r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b|\bLTAI[A-Za-z0-9]{12,30}\b|(?i:bearer)\s+[\w.~+/-]+=*"
    r"|(?i:(?:signature|token|accesskeyid|x-amz-security-token)=)[^&\s\"']+"
)
REDACTED = "[redacted]"
# daemon.log_format -> configure()'s json_lines (auto: JSON unless on a terminal)
JSON_LINES: dict[str, bool | None] = {"json": True, "console": False, "auto": None}


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return {k: _redact_value(k, v) for k, v in event.items()}


def _redact_value(key: str, value: Any) -> Any:
    if isinstance(key, str) and _SECRET_KEY.search(key) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, str):
        return _SECRET_VALUE.sub(REDACTED, value)
    if isinstance(value, dict):
        return {k: _redact_value(k, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value("", v) for v in value]
    return value


def _timestamp(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # Decisions carry the tick's `now` (simulated time in `simulate`); other lines get wall time.
    event.setdefault(
        "ts", datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
    return event


def _renderer(json_lines: bool) -> Any:
    if json_lines:
        return structlog.processors.JSONRenderer(sort_keys=False)
    return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())


def processors(json_lines: bool) -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _timestamp,
        structlog.processors.format_exc_info,
        redact,
        _renderer(json_lines),
    ]


def configure(
    json_lines: bool | None = None, level: str = "info", stream: TextIO | None = None
) -> None:
    """Process-wide logging: JSON unless attached to a terminal (override with `json_lines`)."""
    stream = stream or sys.stderr
    if json_lines is None:
        json_lines = not stream.isatty()
    structlog.configure(
        processors=processors(json_lines),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries (kubernetes, urllib3, botocore) log through stdlib: same format, same redaction.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                _timestamp,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact,
                _renderer(json_lines),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)  # their INFO is chatter; warnings and errors matter


def file_logger(stream: TextIO) -> structlog.typing.FilteringBoundLogger:
    """A JSON-lines logger bound to one stream (e.g. simulate's decisions.jsonl)."""
    return structlog.wrap_logger(
        structlog.WriteLogger(stream),
        processors=processors(json_lines=True),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )
