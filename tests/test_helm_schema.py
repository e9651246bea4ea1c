"""The chart's values.schema.json takes its `config` part from the config model
(autoscaler/config/helm_schema.py): it must be current, and a duration's or a cron's text must
pass the schema in helm exactly when the daemon's parser takes it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.helm import CHART, Helm, helm_binary

from autoscaler.config.helm_schema import SCHEMA, render
from autoscaler.core.policy import CRON_PATTERN, DURATION_PATTERN, Window, parse_duration

REGENERATE = "python -m autoscaler.config.helm_schema"


def test_the_generated_schema_is_current() -> None:
    current = SCHEMA.read_text()
    assert current == render(json.loads(current)), f"{SCHEMA} is stale: run `{REGENERATE}`"


def test_every_text_the_duration_pattern_takes_parses() -> None:
    @settings(max_examples=300, deadline=None)
    @given(st.from_regex(DURATION_PATTERN, fullmatch=True))
    def parses(text: str) -> None:
        try:
            parse_duration(text)
        except ValueError as e:  # the one gap: beyond timedelta's range (KNOWN_GAPS)
            assert "out of range" in str(e), text

    parses()


def test_every_cron_the_pattern_takes_is_a_window_or_a_day_no_month_has() -> None:
    @settings(max_examples=100, deadline=None)  # 300: 15 s of `make test`
    @given(st.from_regex(CRON_PATTERN, fullmatch=True))
    def valid(text: str) -> None:
        assert croniter.is_valid(text), text
        try:
            Window.model_validate({"name": "w", "schedule": text, "duration": "1h"})
        except ValidationError:  # the one gap: `0 0 31 2 *` (KNOWN_GAPS)
            assert not croniter.is_valid(text, strict=True), text

    valid()


DURATIONS = {
    "good": [
        90, 1.5, 0, "90", "90s", "5m", "1.5h", "1h30m", "1h 30m", "90 s", "1d12h", "250ms",
        "PT1H30M", "pt1h", "P1D", "P1DT12H", "PT1.5H", " 90s\t", "P T1H",
    ],
    "bad": [
        "6 minutes", "", "s", "1.h", ".5h", "90S", "1h30", "-5s", "-5", "P", "PT", "P1DT",
        "PT1D", "1 0s", "5m s", "P1Y", "P1M", "٩٠s", "\u3000 90s", "1h\t30m", "PT1ſ", True,
    ],
}  # fmt: skip
CRONS = {
    "good": [
        "0 8 * * 1-5", "*/10 * * * *", "0 0 24 12 *", "0 9 * * mon-fri", "0 0 1 JAN-dec/2 MON",
        "5/15 * * * *", "0 0 * * 7", "0 0 * * sat-sun", "59-0 * * * *", "0,30 08 01 1 0",
        "0 0 29 2 *",
    ],
    "bad": [
        "61 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 8", "*/0 * * * *",
        "every day", "@hourly", "0 0 * *", "0 0 * * * *", "0 9 * * mon#2", "0 0 L * *",
        "0 0 ? * *", "0 0 1 jan mon-frii",
    ],
}  # fmt: skip
# What the schema takes and the daemon refuses (check-config names them; docs/configuration.md)
KNOWN_GAPS = {"duration": ["99999999999999d"], "cron": ["0 0 31 2 *", "0 0 30 2 *"]}


def parser_takes(kind: str, value: Any) -> bool:
    try:
        if kind == "duration":
            parse_duration(value)
        else:
            Window.model_validate({"name": "w", "schedule": value, "duration": "1h"})
    except (ValueError, ValidationError):
        return False
    return True


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm"))


def schema_refuses(helm: Helm, kind: str, values: list[Any]) -> set[int]:
    """Which of `values` helm's schema check refuses: one policy each, one `helm template`."""
    policies = [
        {"name": f"p{i}", "scale_out": {"timeout": v}}
        if kind == "duration"
        else {"name": f"p{i}", "windows": [{"name": "w", "schedule": v, "duration": "1h"}]}
        for i, v in enumerate(values)
    ]
    done = helm.run(
        "template", "x", str(CHART), "-f",
        str(helm.values_file({"config": {"policies": policies, "default_policy": None}})),
        check=False,
    )  # fmt: skip
    key = "scale_out/timeout" if kind == "duration" else "windows/0/schedule"
    return {int(i) for i in re.findall(rf"at '/config/policies/(\d+)/{key}'", done.stderr)}


@pytest.mark.parametrize("kind, table", [("duration", DURATIONS), ("cron", CRONS)])
def test_helm_takes_a_duration_or_a_cron_exactly_when_the_daemon_does(
    helm: Helm, kind: str, table: dict[str, list[Any]]
) -> None:
    values = [*table["good"], *table["bad"], *KNOWN_GAPS[kind]]
    assert [v for v in table["good"] if not parser_takes(kind, v)] == []
    assert [v for v in table["bad"] if parser_takes(kind, v)] == []
    refused = schema_refuses(helm, kind, values)
    verdicts = {repr(v): (i in refused, not parser_takes(kind, v)) for i, v in enumerate(values)}
    differ = {v: verdict for v, verdict in verdicts.items() if verdict[0] != verdict[1]}
    assert differ == {repr(g): (False, True) for g in KNOWN_GAPS[kind]}
