"""The real helm (scripts/build-helm.sh) on deploy/helm/spot-autoscaler, for the chart tests.

`helm_binary()` finds the binary in env ``SPOT_AUTOSCALER_HELM`` or where ``build-helm.sh
--print-bin-dir`` says it is cached; without it the calling test is skipped with one line saying
how to build it, or fails with ``REQUIRE_REAL_CLUSTER=1`` (CI). `comparable()` puts the chart's
and kustomize's objects in one form, so a test compares them by kind and name.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "spot-autoscaler"
BUILD_SCRIPT = ROOT / "scripts" / "build-helm.sh"
BIN_ENV = "SPOT_AUTOSCALER_HELM"
Obj = dict[str, Any]

# Labels helm's convention adds and kustomize's objects lack: `comparable` drops them wherever
# labels are (metadata, selectors, pod templates, affinity terms).
HELM_LABELS = frozenset(
    {
        "helm.sh/chart",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
    }
)
# kustomize's `namespace:` also lands on these (it does not know FlowSchema is cluster-scoped);
# the API server drops it, so it is no difference.
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "FlowSchema",
        "PriorityLevelConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)


def helm_binary() -> Path:
    """The pinned helm; skips the test (fails it with REQUIRE_REAL_CLUSTER=1) when not built."""
    if override := os.environ.get(BIN_ENV):
        path, why = Path(override), f"{BIN_ENV}={override} is not an executable"
        if os.access(path, os.X_OK):
            return path
    else:
        found = subprocess.run(
            [str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, timeout=60
        )
        if found.returncode == 0:
            return Path(found.stdout.strip().splitlines()[-1]) / "helm"
        lines = found.stderr.strip().splitlines() or ["no output"]
        why = lines[-1].replace("[build-helm] ERROR: ", "")
    if os.environ.get("REQUIRE_REAL_CLUSTER") == "1":
        pytest.fail(f"no helm: {why}", pytrace=False)
    pytest.skip(f"no helm: {why}")


@dataclass
class Helm:
    binary: Path
    workdir: Path  # values files, and helm's own cache/config (never the user's)
    kubeconfig: Path | None = None

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        home = self.workdir / "helm-home"
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        cluster = ["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []
        done = subprocess.run(
            [str(self.binary), *args, *cluster],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
        return done

    def values_file(self, values: Mapping[str, Any], name: str = "values.yaml") -> Path:
        path = self.workdir / name
        path.write_text(yaml.safe_dump(dict(values), sort_keys=False))
        return path

    def template(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = "spot-autoscaler",
        namespace: str = "spot-autoscaler",
    ) -> list[Obj]:
        """`helm template` of the chart with `values`: its objects."""
        out = self.run("template", release, str(CHART), "-n", namespace, *self._values(values))
        return parse(out.stdout)

    def render_error(self, values: Mapping[str, Any]) -> str:
        """`helm template` that must fail: its error output."""
        done = self.run("template", "x", str(CHART), *self._values(values), check=False)
        assert done.returncode != 0, f"rendered: {values}"
        return done.stderr

    def _values(self, values: Mapping[str, Any] | None) -> list[str]:
        return ["-f", str(self.values_file(values))] if values else []


def parse(stream: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(stream) if d]


def config_of(objects: Iterable[Obj]) -> Obj:
    """The daemon's config in the objects' `*-config` ConfigMap, parsed."""
    [cm] = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config")
    ]
    config: Obj = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def _without_helm_labels(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_helm_labels(v) for k, v in value.items() if k not in HELM_LABELS}
    if isinstance(value, list):
        return [_without_helm_labels(v) for v in value]
    return value


def comparable(objects: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
    """Objects by (kind, name), without what may differ between helm and kustomize and does not
    matter: helm's labels (HELM_LABELS), a cluster-scoped object's metadata.namespace, and the
    config file's text (parsed instead: comments, key order and number spelling differ)."""
    out = {}
    for obj in objects:
        obj = _without_helm_labels(obj)
        meta = obj["metadata"]
        if obj["kind"] in CLUSTER_SCOPED:
            meta.pop("namespace", None)
        if not meta.get("labels"):
            meta.pop("labels", None)
        data = obj.get("data") or {}
        if obj["kind"] == "ConfigMap" and "config.yaml" in data:
            data["config.yaml"] = yaml.safe_load(data["config.yaml"])
        out[(obj["kind"], meta["name"])] = obj
    return out
