"""docs/configuration.md is generated from the config model: it must be current, say what every
key does, and know every key the shipped example config uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autoscaler.config.reference import keys, render, undocumented

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "python -m autoscaler.config.reference > docs/configuration.md"


def test_the_reference_is_current() -> None:
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == render(), f"docs/configuration.md is stale: run `{REGENERATE}`"


def test_every_key_says_what_it_does() -> None:
    assert undocumented() == [], "add a comment next to (or above) each field in its model"


def paths(value: Any, prefix: str = "") -> set[str]:
    """`a.b`, `a[].c` for every key under `value` (a list's items share `[]`)."""
    found: set[str] = set()
    items = value.items() if isinstance(value, dict) else []
    for key, child in items:
        path = f"{prefix}{key}"
        found.add(path)
        if isinstance(child, dict):
            found |= paths(child, f"{path}.")
        for item in child if isinstance(child, list) else []:
            found |= paths(item, f"{path}[].")
    return found


# YAML shorthands the model takes before validation (documented with the key they stand for)
SHORTHANDS = {"policies[].scale_out.quantum.multiple_of"}


def test_every_key_of_the_example_config_is_in_the_reference() -> None:
    reference = list(keys())
    known = {key.path for key in reference}
    # free-form maps: their keys are data (instance types, label names), not settings
    maps = tuple(f"{key.path}." for key in reference if key.type.startswith("map "))
    example = yaml.safe_load((ROOT / "config" / "example.yaml").read_text())
    used = {p for p in paths(example) if not p.startswith(maps)} - SHORTHANDS
    assert used and used <= known, sorted(used - known)
