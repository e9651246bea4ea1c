"""YAML policies: the example is valid; every problem is reported with file, key path and line."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from structlog.testing import capture_logs

from autoscaler.cli import main
from autoscaler.config import (
    ConfigError,
    Prices,
    check_config,
    config_warnings,
    load_config,
    parse_config,
)
from autoscaler.core.policy import Policy, PolicySet, Quantum, ScaleOutRules, Window

ROOT = Path(__file__).resolve().parents[1]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "bad.yaml")
    return [str(p) for p in err.value.problems]


def test_example_config_is_valid_and_typed() -> None:
    config = load_config(ROOT / "config" / "example.yaml")
    research = config.policy_set.policies[0]
    assert research.scale_out.min_idle == timedelta(minutes=2)
    assert research.scale_out.quantum == Quantum(mode="power_of_two")
    assert config.policy_set.policies[2].scale_out.quantum == Quantum(mode="multiple_of", n=1)
    due = config.policy_set.policies[1]
    assert (due.on_demand.min_on_demand, due.on_demand.max_on_demand) == (1, 8)
    assert due.deadline is not None and due.deadline.rule == "uniform_progress"
    assert due.deadline.due(datetime(2026, 12, 1, tzinfo=UTC)) == datetime(2026, 12, 4, tzinfo=UTC)
    assert research.windows[0].duration == timedelta(hours=10)
    assert config.prices.for_node("p3.2xlarge", spot=False) == 3.06


def test_every_problem_is_listed_with_key_path_and_line() -> None:
    text = """\
default_policy: default
policies:
  - name: default
    scale_out:
      cooldwn: 5m
      min_idle: soon
    limits:
      min_workers: 5
      max_workers: 2
    cost:
      max_price_per_gpu_hour: -1
"""
    found = problems(text)
    assert "bad.yaml:5: policies[0].scale_out.cooldwn: unknown key" in found
    assert any(
        p.startswith("bad.yaml:6: policies[0].scale_out.min_idle: not a duration") for p in found
    )
    assert any(
        p.startswith("bad.yaml:7: policies[0].limits: min_workers 5 > max_workers 2") for p in found
    )
    assert any(p.startswith("bad.yaml:11: policies[0].cost.max_price_per_gpu_hour:") for p in found)
    assert len(found) == 4


def test_bad_yaml_reports_its_line() -> None:
    assert problems("policies:\n  - name: a\n   bad: [\n")[0].startswith(
        "bad.yaml:3: <top>: bad YAML"
    )


def test_duplicate_keys_and_names_and_wrong_types() -> None:
    found = problems(
        "policies:\n  - name: a\n    name: b\n  - name: b\ncluster_budget_per_hour: lots\n"
    )
    assert "bad.yaml:3: policies[0].name: duplicate key" in found
    found = problems(
        "policies:\n  - name: a\n  - name: a\ndefault_policy: a\ncluster_budget_per_hour: lots\n"
    )
    assert any("cluster_budget_per_hour" in p and ":5:" in p for p in found)
    assert any("duplicate policy names: a" in p for p in found)


def test_cron_and_unknown_default_policy() -> None:
    found = problems("""\
default_policy: nope
policies:
  - name: a
    windows:
      - {name: w, schedule: "every day", duration: 1h}
""")
    assert any(":5: policies[0].windows[0].schedule: not a 5-field cron" in p for p in found)
    assert any(
        p.startswith("bad.yaml:1: default_policy: 'nope' is not a defined policy") for p in found
    )


@pytest.mark.parametrize("path", sorted((ROOT / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path: Path) -> None:
    config, warnings = check_config(path)
    assert config.policy_set.policies and warnings == []


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(ROOT / "config" / "example.yaml")]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies:\n  - name: default\n    scale_out: {quantum: triangle}\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: policies[0].scale_out.quantum" in err and "1 problem(s)" in err
    assert main(["check-config", str(tmp_path / "missing.yaml")]) == 2


def test_check_config_rejects_a_deadline_in_the_past(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "late.yaml"
    path.write_text(
        "policies:\n  - name: default\n    deadline:\n      at: '2020-01-01T00:00:00Z'\n"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: policies[0].deadline.at: 2020-01-01T00:00:00+00:00 is in the past" in err
    assert load_config(path).policy_set.policies[0].deadline is not None  # the daemon runs it


def billion_laughs(levels: int = 6, width: int = 10) -> str:
    """A few hundred bytes whose aliases expand to width**levels values (a million)."""
    lines = ["a0: &a0 lol"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_its_line_within_a_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs())
    assert len(path.read_bytes()) < 400
    started = time.process_time()
    assert main(["check-config", str(path)]) == 2
    assert time.process_time() - started < 1.0  # it was 15 s of CPU, walking a million values
    err = capsys.readouterr().err
    # a5 expands to 111,111 values: the first collection over the cap
    assert f"{path}:6: <top>: bad YAML: more than 50,000 values with its aliases expanded" in err


def test_aliases_below_the_cap_still_work() -> None:
    text = (
        "policies:\n  - {name: default, limits: &n {min_workers: 2}}\n  - {name: b, limits: *n}\n"
    )
    assert parse_config(text).policy_set.policies[1].limits.min_workers == 2
    assert problems(billion_laughs(levels=4))[0].startswith("bad.yaml:1: a0: unknown key")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # nesting: flow and block, found by the composer at the line it happens (not a
        # RecursionError without one)
        ("a: 1\nb: " + "[" * 5000 + "]" * 5000, "bad.yaml:2: <top>: bad YAML: nested deeper"),
        ("a: 1\n" + "".join("  " * i + "k:\n" for i in range(100)), "bad.yaml:66: <top>: bad"),
        # the reader's position, turned into a line
        ("a: 1\nb: 2\nc: x\x02y\n", "bad.yaml:3: <top>: bad YAML: unacceptable character #x0002"),
        # explicit tags on values they cannot be: a config error, not a ValueError
        ("a: 1\nb: !!int x\n", "bad.yaml:2: b: bad YAML: 'x' is not a valid !!int"),
        ("b: !!float nope\n", "bad.yaml:1: b: bad YAML: 'nope' is not a valid !!float"),
        ("a: 1\nb: !!bool maybe\n", "bad.yaml:2: b: bad YAML: 'maybe' is not a valid !!bool"),
        ("\n\nb: !!timestamp 2020-13-45\n", "bad.yaml:3: b: bad YAML: '2020-13-45' is not"),
        # a key the file lacks points at line 1
        ("policies:\n  - name: x\n    limits: {min_workers: z}\n", "bad.yaml:1: default_policy:"),
    ],
)
def test_every_rejected_config_names_its_line(text: str, says: str) -> None:
    found = problems(text)
    assert any(p.startswith(says) for p in found), found


def test_a_tag_on_a_bad_value_is_a_config_error_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tagged.yaml"
    path.write_text("policies:\n  - name: default\n    limits: {min_workers: !!int x}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: policies[0].limits.min_workers: bad YAML: 'x' is not a valid !!int" in err


def test_bad_label_selector_is_a_config_problem() -> None:
    found = problems("kubernetes:\n  label_selector: 'team in (a,b), ==x'\n")
    assert any(
        p.startswith("bad.yaml:2: kubernetes.label_selector: not a label selector term")
        for p in found
    )


# --- prices per GPU-hour -------------------------------------------------------------------------
def test_unlisted_types_are_priced_per_gpu_hour_by_capacity_type() -> None:
    prices = Prices(
        spot={"p3.2xlarge": 0.91},
        default_spot_per_gpu_hour=0.9,
        default_on_demand_per_gpu_hour=3.0,
    )
    assert prices.for_node("p3.2xlarge", spot=True, gpus=1) == 0.91  # listed: per node-hour
    assert prices.for_node("x-unlisted-8", spot=False, gpus=8) == 24.0
    assert prices.for_node("x-unlisted-1", spot=True, gpus=1) == 0.9
    # without the node's GPUs a per-GPU default cannot apply: unknown
    assert prices.for_node("x-unlisted-8", spot=False) is None
    assert Prices().for_node("x-unlisted-8", spot=False, gpus=8) is None  # no default: unknown


def test_an_unlisted_type_is_logged_once_not_every_tick() -> None:
    prices = Prices(default_on_demand_per_gpu_hour=3.0)
    with capture_logs() as logs:
        for _ in range(3):
            prices.for_node("x-logged-once", spot=False, gpus=8)
            prices.for_node("x-logged-once-too", spot=False, gpus=8)
    warned = [e for e in logs if e["event"] == "instance_type_unpriced"]
    assert [e["instance_type"] for e in warned] == ["x-logged-once", "x-logged-once-too"]
    assert warned[0]["log_level"] == "warning" and warned[0]["default_per_gpu_hour"] == 3.0


def test_the_old_per_node_default_keys_name_their_replacement() -> None:
    found = problems("prices:\n  default_spot: 0.91\n  default_on_demand: 3.06\n")
    assert len(found) == 2
    assert found[0].startswith("bad.yaml:2: prices.default_spot: removed:")
    assert "use prices.default_spot_per_gpu_hour" in found[0]
    assert found[1].startswith("bad.yaml:3: prices.default_on_demand: removed:")
    assert "use prices.default_on_demand_per_gpu_hour" in found[1]


# --- timeouts within Horovod's elastic timeout ---------------------------------------------------
SLOW = """\
policies:
  - name: default
    scale_out:
      timeout: 5m
      backoff: 10m
  - name: long-horovod
    scale_out: {timeout: 5m, backoff: 10m}
    horovod:
      elastic_timeout: 30m
  - name: frozen
    scale_out: {enabled: false, timeout: 5m, backoff: 10m}
"""


def test_check_config_warns_when_a_failed_refill_outlasts_horovod(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text(SLOW)
    assert main(["check-config", str(path)]) == 0  # a warning, not a problem
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        f"{path}:4: policies[0].scale_out: warning: timeout (5m) + backoff (10m) + a pod's start"
        " (1m) = 16m exceeds horovod.elastic_timeout (10m): a refill below min whose first"
        " ScaleOut times"
        " out cannot be retried before Horovod stops the job; shorten timeout/backoff (or raise"
        " elastic_timeout to match the job's HOROVOD_ELASTIC_TIMEOUT)"
    ]
    assert "OK (3 policies: default, long-horovod, frozen), 1 warning(s)" in out.out


def test_defaults_leave_room_for_a_retry_within_horovods_timeout() -> None:
    config = parse_config("policies:\n  - name: default\n")
    policy = config.policy_set.policies[0]
    rules = policy.scale_out
    # the timeout covers a GPU node's provisioning (2-5 min) and the pod's start
    assert (rules.timeout, rules.backoff) == (timedelta(minutes=6), timedelta(minutes=2))
    assert policy.horovod.elastic_timeout == timedelta(seconds=600)
    assert config_warnings(config) == []
    assert policy.scalers.max_age > rules.timeout
    assert rules.shared_gpu is False and ScaleOutRules().shared_gpu is False


def test_the_example_documents_every_policy_and_price_key() -> None:
    text = (ROOT / "config" / "example.yaml").read_text()

    def keys(model: type[BaseModel]) -> Iterator[str]:
        for name, field in model.model_fields.items():
            yield name
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                yield from keys(field.annotation)

    removed = {"default_spot", "default_on_demand"}  # rejected, naming their replacements
    shorthand = {"mode", "n"}  # quantum is written `power_of_two` / `{multiple_of: N}`
    missing = [
        k
        for model in (PolicySet, Policy, Prices)
        for k in keys(model)
        if k not in removed | shorthand and not re.search(rf"\b{k}:", text)
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("250ms", 0.25),
        ("1.5h", 5400),
        ("1h30m", 5400),
        ("1d12h", 129600),
        ("PT1H30M", 5400),
        ("P1DT12H", 129600),
        ("pt90s", 90),
    ],
)
def test_durations_take_compound_and_iso_8601_forms(text: str, seconds: float) -> None:
    rules = PolicySet.model_validate(
        {"policies": [{"name": "p", "scale_out": {"cooldown": text}}], "default_policy": "p"}
    )
    assert rules.policies[0].scale_out.cooldown.total_seconds() == seconds


@pytest.mark.parametrize("text", ["1h30", "P", "PT", "PT1H30M5", "-5s", "soon"])
def test_a_bad_duration_says_which_forms_work(text: str) -> None:
    with pytest.raises(ValueError, match="use e.g. 30s, 5m, 1h30m or PT1H30M"):
        PolicySet.model_validate(
            {"policies": [{"name": "p", "scale_out": {"cooldown": text}}], "default_policy": "p"}
        )


def test_a_window_on_a_day_its_months_lack_is_refused() -> None:
    """`0 0 31 2 *` never fires: croniter finds no previous firing and `Window.active` raised on
    every pass; check-config refuses it instead."""
    with pytest.raises(ValidationError, match="not a 5-field cron"):
        Window.model_validate({"name": "w", "schedule": "0 0 31 2 *", "duration": "1h"})
    assert Window.model_validate({"name": "w", "schedule": "0 0 29 2 *", "duration": "1h"}).active(
        datetime(2028, 2, 29, 0, 30, tzinfo=UTC)
    )
