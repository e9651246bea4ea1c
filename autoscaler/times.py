"""Timestamps from outside (API objects, annotations, cloud events) as aware datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_utc(value: object) -> datetime | None:
    """An ISO 8601 time; one without a zone is taken as UTC (comparing it with aware times would
    raise inside the core). None for anything else, never an exception."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
