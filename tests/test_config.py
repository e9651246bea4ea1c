"""YAML policies: the example is valid; every problem is reported with file, key path and line."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from autoscaler.cli import main
from autoscaler.config import ConfigError, load_config, parse_config
from autoscaler.core.policy import Quantum

ROOT = Path(__file__).resolve().parents[1]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "bad.yaml")
    return [str(p) for p in err.value.problems]


def test_example_config_is_valid_and_typed() -> None:
    config = load_config(ROOT / "config" / "example.yaml")
    research = config.policies[0]
    assert research.scale_out.min_idle == timedelta(minutes=2)
    assert research.scale_out.quantum == Quantum(mode="power_of_two")
    assert config.policies[1].scale_out.quantum == Quantum(mode="multiple_of", n=1)
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
    assert any(p.startswith("bad.yaml:1: default_policy: 'nope' is not a defined policy") for p in found)


@pytest.mark.parametrize("path", sorted((ROOT / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path: Path) -> None:
    assert load_config(path).policies


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(ROOT / "config" / "example.yaml")]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies:\n  - name: default\n    scale_out: {quantum: triangle}\n")
    assert main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3: policies[0].scale_out.quantum" in err and "1 problem(s)" in err
    assert main(["check-config", str(tmp_path / "missing.yaml")]) == 1


def test_bad_label_selector_is_a_config_problem() -> None:
    found = problems("kubernetes:\n  label_selector: 'team in (a,b), ==x'\n")
    assert any(
        p.startswith("bad.yaml:2: kubernetes.label_selector: not a label selector term")
        for p in found
    )
