"""The chart and kustomize render the same objects for the same choices (issue 37).

Compared by kind and name after `support.helm.comparable`, which ignores only helm's own labels
(helm.sh/chart, app.kubernetes.io/managed-by, /instance, /version: kustomize has none), a
cluster-scoped object's metadata.namespace (kustomize sets it on FlowSchemas; the server drops
it) and the config file's text (compared parsed). Some objects are in one install only:
- the release's Namespace is kustomize's (deploy/namespace.yaml); `helm install
  --create-namespace` makes it and the chart does not own it (so ACK's namespace label is the
  user's to set);
- the Lease is the chart's (so that `helm uninstall` removes it); under kustomize the daemon
  creates it;
- the check-config hook's ConfigMap and Job are the chart's (`helm install` and `upgrade` run
  them first, then delete them); kustomize has no hooks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helm import CHART, Helm, comparable, helm_binary
from support.kustomize import ROOT, build, needs_kubectl

pytestmark = needs_kubectl

DEPLOY = ROOT / "deploy"
ONLY_KUSTOMIZE = {("Namespace", "spot-autoscaler")}
HOOK = {("ConfigMap", "spot-autoscaler-config-check"), ("Job", "spot-autoscaler-config-check")}
ONLY_CHART = {("Lease", "spot-autoscaler"), *HOOK}


# chart value -> the component's config key, per component (and its config section)
COMPONENT_VALUES = {
    "eks": ("aws", {"region": "region", "queueUrl": "queue_url", "prices": "prices"}),
    "ack": ("alibaba", {"region": "region", "pollInterval": "poll_interval", "prices": "prices"}),
}
ROLE_VALUE = {"eks": "roleArn", "ack": "roleName"}


def component_values(component: str) -> dict[str, Any]:
    """The chart's values for deploy/components/<component>: its placeholders (role, region,
    queue) read from the component itself."""
    config = yaml.safe_load((DEPLOY / "components" / component / "config.yaml").read_text())
    patch = yaml.safe_load((DEPLOY / "components" / component / "kustomization.yaml").read_text())
    [[role]] = [
        list(yaml.safe_load(p["patch"])[0]["value"].values())
        for p in patch["patches"]
        if p["target"]["kind"] == "ServiceAccount"
    ]
    section, keys = COMPONENT_VALUES[component]
    source = config[section]
    values = {"enabled": True, ROLE_VALUE[component]: role}
    values |= {value: source[key] for value, key in keys.items()}
    if "cloudmonitor" in source:
        values["cloudMonitor"] = source["cloudmonitor"]["enabled"]
    return {component: values}


def node_agent_file() -> list[dict[str, Any]]:
    """deploy/node-agent-daemonset.yaml (applied on its own, not through the kustomization)."""
    text = (DEPLOY / "node-agent-daemonset.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    yield Helm(helm_binary(), tmp_path_factory.mktemp("helm"))


# (values, kustomize components, extra files, objects left out of the kustomize build)
CHOICES = {
    "defaults": ({}, (), False, set()),
    "monitoring": ({"monitoring": {"enabled": True}}, ("monitoring",), False, set()),
    "eks": (component_values("eks"), ("components/eks",), False, set()),
    "ack": (component_values("ack"), ("components/ack",), False, set()),
    "node agent": ({"nodeAgent": {"enabled": True}}, (), True, set()),
    "no FlowSchemas": (
        {"flowSchema": {"enabled": False}},
        (),
        False,
        {("FlowSchema", "spot-autoscaler"), ("FlowSchema", "spot-autoscaler-leader-election")},
    ),
    "no leader fence": (
        {"leaderFence": {"enabled": False}},
        (),
        False,
        {
            ("ValidatingAdmissionPolicy", "spot-autoscaler-leader-fence"),
            ("ValidatingAdmissionPolicyBinding", "spot-autoscaler-leader-fence"),
        },
    ),
}


@pytest.mark.parametrize("choice", CHOICES)
def test_chart_and_kustomize_render_the_same_objects(
    helm: Helm, tmp_path: Path, choice: str
) -> None:
    values, components, node_agent, left_out = CHOICES[choice]
    kustomized = build(tmp_path, *components) + (node_agent_file() if node_agent else [])
    want = {k: v for k, v in comparable(kustomized).items() if k not in left_out}
    got = comparable(helm.template(values))
    assert set(want) - set(got) == ONLY_KUSTOMIZE
    assert set(got) - set(want) == ONLY_CHART
    for key in set(want) & set(got):
        assert got[key] == want[key], key


def test_the_charts_copies_of_the_monitoring_files_are_deploys() -> None:
    """The chart reads the alert rules and the dashboard from files/ (a chart cannot read outside
    its directory): copies of deploy/monitoring's, kept equal here (the comparison above checks
    them rendered)."""
    for name in ("prometheusrule.yaml", "dashboard.json"):
        assert (CHART / "files" / name).read_bytes() == (
            DEPLOY / "monitoring" / name
        ).read_bytes(), name
    json.loads((CHART / "files" / "dashboard.json").read_text())
