"""`kubectl kustomize` of deploy/ with components, as a user's overlay would build it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed"
)


def build(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """The objects of deploy/ with `components` (paths under deploy/); an overlay outside the
    tree, because kustomize refuses one inside its base."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copytree(ROOT / "deploy", overlay / "base")
    listed = ", ".join(f"base/{c}" for c in components)
    (overlay / "kustomization.yaml").write_text(f"resources: [base]\ncomponents: [{listed}]\n")
    built = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found
