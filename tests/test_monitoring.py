"""deploy/monitoring: the alert rules and the dashboard use only metrics and labels the daemon
exports, the ServiceMonitor finds the daemon's Service, and kustomize builds it into an install."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.kustomize import build, needs_kubectl

from autoscaler.core import (
    Action,
    CapacityType,
    Decision,
    GpuNode,
    Job,
    Reason,
    Worker,
)
from autoscaler.daemon.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "deploy" / "monitoring"
OURS = re.compile(r"\bspot_autoscaler_[a-z0-9_]+")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\b(spot_autoscaler_[a-z0-9_]+)\{([^}]*)\}")
# labels Prometheus itself adds or computes
PROMETHEUS_LABELS = {"instance", "le", "pod", "namespace", "service", "endpoint"}


def exported() -> dict[str, set[str]]:
    """Every sample name the daemon's registry exposes, with its labels (each series made once)."""
    m = Metrics()
    m.decided([Decision("ns/a", Action.DRAIN, Reason.PREEMPTION_NOTICE, "p", 2, 1, 1)])
    m.notices.labels("aws-sqs", "interruption").inc()
    m.notices_lost.labels("aws-sqs", "interruption").inc()
    m.reaction.observe(0.3)
    m.reconcile.observe(0.1)
    m.fast_path.labels("look").observe(0.01)
    m.set_workers([Job("ns", "a", 1, 4, workers=(Worker("w0", "n1", "w0"),))])
    m.set_nodes([GpuNode("n1", 8, 1, CapacityType.SPOT, price_per_hour=3.0)])
    m.error("reconcile")
    m.count_rejected(lambda: {("Pod", "bad_index"): 1})
    m.track_backends(lambda: {"et-operator": True})
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def rules() -> list[dict]:
    doc = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads((MONITORING / "dashboard.json").read_text())


def expressions() -> list[tuple[str, str]]:
    found = [(rule["alert"], rule["expr"]) for rule in rules()]
    for panel in dashboard()["panels"]:
        found += [(panel["title"], target["expr"]) for target in panel["targets"]]
    return found


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=lambda v: v[:40])
def test_every_metric_and_label_used_is_exported(where: str, expr: str) -> None:
    samples = exported()
    used = set(OURS.findall(expr))
    assert used, f"{where}: uses none of our metrics"
    assert used <= set(samples), f"{where}: not exported: {sorted(used - set(samples))}"
    labels = set().union(*(samples[name] for name in used)) | PROMETHEUS_LABELS
    grouped = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")}
    matched = {
        m.split("=")[0].rstrip("!~").strip()
        for _, body in MATCHERS.findall(expr)
        for m in body.split(",")
        if m.strip()
    }
    assert (grouped | matched) - {""} <= labels, f"{where}: unknown labels"


def test_no_series_of_ours_is_labelled_job() -> None:
    """Prometheus' own `job` label would rename ours to `exported_job`."""
    for name, labels in exported().items():
        assert "job" not in labels, name
    assert exported()["spot_autoscaler_build_info"] >= {"version", "python"}


def test_alerts_have_severity_and_a_summary_and_the_issue_list_is_covered() -> None:
    alerts = {rule["alert"]: rule for rule in rules()}
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"]["summary"], name
    # no leader, reconcile failing, a stuck scaler, workers lost before a drain, a notice
    # waiting, config rejected, objects rejected
    assert {
        "SpotAutoscalerNoLeader",
        "SpotAutoscalerReconcileFailing",
        "SpotAutoscalerScalerStuck",
        "SpotAutoscalerNoticedWorkersLost",
        "SpotAutoscalerNoticeUnanswered",
        "SpotAutoscalerConfigRejected",
        "SpotAutoscalerObjectsRejected",
    } <= set(alerts)


def test_the_service_monitor_selects_the_daemon_service_port() -> None:
    monitor = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    service = yaml.safe_load((ROOT / "deploy" / "service.yaml").read_text())
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_dashboard_panels_have_targets_and_a_datasource_variable() -> None:
    board = dashboard()
    assert board["uid"] and [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"


@needs_kubectl
def test_kustomize_builds_the_install_with_monitoring(tmp_path: Path) -> None:
    objects = build(tmp_path, "monitoring")
    names = {(d["kind"], d["metadata"]["name"]) for d in objects}
    assert {
        ("ServiceMonitor", "spot-autoscaler"),
        ("PrometheusRule", "spot-autoscaler"),
        ("ConfigMap", "spot-autoscaler-dashboard"),
        ("Deployment", "spot-autoscaler"),
    } <= names
    assert {d["metadata"].get("namespace") for d in objects} <= {"spot-autoscaler", None}
