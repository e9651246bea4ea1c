"""deploy/ and the Dockerfile, read as a reviewer would (no cluster, no docker engine here).

The RBAC test also runs the daemon against the API emulator and checks that every request it
made is allowed by deploy/rbac.yaml: least privilege that is still enough.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.kube_api import KubeApiServer
from support.kustomize import build, find, needs_kubectl
from support.rbac import request_rights, role_grants
from support.waiting import wait_for
from test_daemon_support import JOB, KUBE_CONFIG, node, wired_daemon, worker

from autoscaler.adapters.kube.kinds import KINDS
from autoscaler.adapters.kube.server_fence import FENCE_MARK
from autoscaler.adapters.sources import SOURCES
from autoscaler.cli import main
from autoscaler.config import parse_config
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core import CapacityType, Notice, NoticeKind
from autoscaler.core.policy import POLICY_LABEL
from autoscaler.notices_and_prices import NoticeWake

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
NAMESPACE = "spot-autoscaler"
Doc = dict[str, Any]


# The daemon's manifests (deploy/ also holds the node agent's and the launcher sidecar's).
DAEMON_FILES = (
    "namespace.yaml",
    "serviceaccount.yaml",
    "rbac.yaml",
    "flowschema.yaml",
    "leader-fence.yaml",
    "configmap.yaml",
    "deployment.yaml",
    "service.yaml",
    "pdb.yaml",
    "example-trainingjob.yaml",
)


def docs(files: Iterable[Path] | None = None) -> list[Doc]:
    paths = files if files is not None else [DEPLOY / f for f in DAEMON_FILES]
    return [d for f in paths for d in yaml.safe_load_all(f.read_text()) if d is not None]


def one(kind: str, name: str | None = None) -> Doc:
    [doc] = [d for d in docs() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def embedded_config_text() -> str:
    return one("ConfigMap", "spot-autoscaler-config")["data"]["config.yaml"]


def test_every_manifest_parses_and_is_named() -> None:
    all_docs = docs(sorted(set(DEPLOY.glob("*.yaml")) - {KUSTOMIZATION}))
    assert all_docs
    for d in all_docs:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
    kinds = {d["kind"] for d in docs()}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "TrainingJob",
    } <= kinds


def test_kustomization_lists_existing_files_and_installs_no_example() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["namespace"] == NAMESPACE
    for resource in kustomization["resources"]:
        assert (DEPLOY / resource).is_file(), resource
    assert "example-trainingjob.yaml" not in kustomization["resources"]
    assert set(DAEMON_FILES) - {"example-trainingjob.yaml"} <= set(kustomization["resources"])


def test_the_configmap_config_passes_the_loader_and_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = parse_config(embedded_config_text(), "configmap.yaml")
    assert config.daemon.mode == "kubernetes" and config.daemon.leader_election.enabled
    path = tmp_path / "config.yaml"
    path.write_text(embedded_config_text())
    assert main(["check-config", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_the_leader_fence_names_the_shipped_account_lease_and_identity() -> None:
    """deploy/leader-fence.yaml admits the writes of deployment.yaml's ServiceAccount only from
    the pod the config's Lease names, and the daemon's identity is that pod's name; its refusal
    says what the daemon reads as NotLeader (server_fence.FENCE_MARK)."""
    policy = one("ValidatingAdmissionPolicy", "spot-autoscaler-leader-fence")
    binding = one("ValidatingAdmissionPolicyBinding", "spot-autoscaler-leader-fence")
    pod = one("Deployment", "spot-autoscaler")["spec"]["template"]["spec"]
    account = f"system:serviceaccount:{NAMESPACE}:{pod['serviceAccountName']}"
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert conditions["the-daemons-serviceaccount"] == f"request.userInfo.username == '{account}'"
    election = parse_config(embedded_config_text(), "configmap.yaml").daemon.leader_election
    assert election.identity is None and election.lease_namespace is None
    [env] = [e for e in pod["containers"][0]["env"] if e["name"] == "POD_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert binding["spec"]["paramRef"] == {
        "name": election.lease_name,
        "namespace": NAMESPACE,  # the pod's own (POD_NAMESPACE)
        "parameterNotFoundAction": "Allow",  # Deny would refuse every write without the Lease
    }
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    [validation] = policy["spec"]["validations"]
    assert validation["messageExpression"].startswith(f"'{FENCE_MARK}: ")
    assert validation["reason"] == "Forbidden"


RULES = {  # (apiGroup, resource) -> verbs, exactly what the daemon does
    ("", "nodes"): {"get", "list", "watch", "patch"},
    ("", "pods"): {"get", "list", "watch", "patch"},  # patch: the checkpoint signal
    ("", "events"): {"create"},  # each Event is created once, never patched
    # kubernetes.guard_evictions: our own budgets only, read from the watch cache (no get)
    ("policy", "poddisruptionbudgets"): {"list", "watch", "create", "patch", "delete"},
}
for _kind in KINDS:  # and what each job kind declares it needs (adapters/kube/kinds)
    for _r, _verbs in _kind.rbac.items():
        RULES.setdefault((_r.group, _r.plural), set()).update(_verbs)


def granted(kind: str) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in role_grants(one(kind)):
        out.setdefault((group, resource), set()).add(verb)
    return out


def test_rbac_is_least_privilege() -> None:
    assert granted("ClusterRole") == RULES
    role = one("Role")
    assert role["metadata"]["namespace"] == NAMESPACE  # the Lease, in our namespace only
    assert granted("Role") == {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
    for binding in (one("ClusterRoleBinding"), one("RoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "spot-autoscaler", "namespace": NAMESPACE}
        ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert one("ClusterRoleBinding")["roleRef"]["name"] == one("ClusterRole")["metadata"]["name"]


# The bootstrap API Priority and Fairness objects of kube-apiserver v1.37 that matter here
# (k8s.io/apiserver pkg/apis/flowcontrol/bootstrap/default.go): every ServiceAccount outside
# kube-system falls to `service-accounts` at precedence 9000 (priority level workload-low), the
# controllers' Leases to `system-leader-election` at 100.
BOOTSTRAP_LEVELS = {"exempt", "catch-all", "system", "node-high", "leader-election"}
BOOTSTRAP_LEVELS |= {"workload-high", "workload-low", "global-default"}
SERVICE_ACCOUNTS_PRECEDENCE = 9000


def test_the_flowschemas_take_the_daemons_requests_out_of_workload_low() -> None:
    """deploy/flowschema.yaml: the daemon's Lease to `leader-election`, everything else to
    `workload-high` (as Karpenter's chart does), both matching before the bootstrap
    `service-accounts`, for exactly the ServiceAccount deploy/rbac.yaml binds; no priority level
    of our own."""
    schemas = {d["metadata"]["name"]: d for d in docs() if d["kind"] == "FlowSchema"}
    assert set(schemas) == {"spot-autoscaler", "spot-autoscaler-leader-election"}
    assert not [d for d in docs() if d["kind"] == "PriorityLevelConfiguration"]
    account = one("ClusterRoleBinding")["subjects"]
    for fs in schemas.values():
        assert fs["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
        assert "namespace" not in fs["metadata"]  # cluster-scoped
        spec = fs["spec"]
        assert spec["priorityLevelConfiguration"]["name"] in BOOTSTRAP_LEVELS
        assert spec["distinguisherMethod"] == {"type": "ByUser"}
        assert 100 < spec["matchingPrecedence"] < SERVICE_ACCOUNTS_PRECEDENCE
        [rule] = spec["rules"]
        assert [
            {"kind": "ServiceAccount", **s["serviceAccount"]} for s in rule["subjects"]
        ] == account
        assert [s["kind"] for s in rule["subjects"]] == ["ServiceAccount"]
    lease, rest = schemas["spot-autoscaler-leader-election"], schemas["spot-autoscaler"]
    assert lease["spec"]["matchingPrecedence"] < rest["spec"]["matchingPrecedence"]
    assert lease["spec"]["priorityLevelConfiguration"]["name"] == "leader-election"
    [lease_rule] = lease["spec"]["rules"][0]["resourceRules"]
    assert (lease_rule["apiGroups"], lease_rule["resources"]) == (
        ["coordination.k8s.io"],
        ["leases"],
    )
    assert set(lease_rule["verbs"]) == granted("Role")[("coordination.k8s.io", "leases")]
    assert rest["spec"]["priorityLevelConfiguration"]["name"] == "workload-high"
    [everything] = rest["spec"]["rules"][0]["resourceRules"]
    assert everything == {
        "apiGroups": ["*"],
        "resources": ["*"],
        "verbs": ["*"],
        "clusterScope": True,
        "namespaces": ["*"],
    }


def test_every_request_of_a_working_daemon_is_allowed_by_rbac(tmp_path: Path) -> None:
    allowed = {**granted("ClusterRole"), **granted("Role")}
    with KubeApiServer() as api:
        workers = [worker(i, f"node-{i % 2}") for i in range(4)]
        api.seed(node(0), node(1), *workers, {**JOB, "status": {"phase": "Running"}})
        api.kubeconfig(str(tmp_path / "kubeconfig"))
        cfg = parse_config(
            KUBE_CONFIG.replace("retry_period: 0.1s}", "retry_period: 0.1s, identity: r}")
        )
        d, _ = wired_daemon(cfg, tmp_path / "kubeconfig")
        d.start()
        try:
            wait_for(lambda: d.loop.passes >= 1, timeout=10, what="a first pass")
            now = datetime.now(UTC)
            notice = Notice(
                "node-0",
                NoticeKind.INTERRUPTION,
                "aws-sqs",
                "e-1",
                deadline=now + timedelta(minutes=2),
                received_at=now,
            )
            # what a cloud source does through the board: persist on the Node, then wake
            assert d.parts.actuator.persist_notice("node-0", notice)  # type: ignore[attr-defined]
            d.wake(NoticeWake("aws-sqs: interruption on node-0"))
            api.wait_until(lambda: api.objects("scaleins"), timeout=5)
        finally:
            d.stop()
        requests = {(r.method, r.path, r.watch) for r in api.request_log}
    used = {rights for request in requests if (rights := request_rights(*request))}
    verbs = {v for _, _, v in used}
    assert {"list", "watch", "create", "patch", "update", "get"} <= verbs  # a real workout
    denied = sorted(u for u in used if u[2] not in allowed.get((u[0], u[1]), set()))
    assert denied == []


def test_deployment_runs_two_safe_replicas_with_probes_on_the_metrics_port() -> None:
    deployment = one("Deployment")
    config = parse_config(embedded_config_text())
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.daemon.metrics_port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # sized from the scale benchmark: the limit holds 20,000 nodes' 538 MB peak, the request 5,000's
    assert mebibytes(container["resources"]["limits"]["memory"]) * 2**20 > 538e6 * 1.5
    assert mebibytes(container["resources"]["requests"]["memory"]) * 2**20 > 200e6 * 1.2
    assert pod["priorityClassName"] == "system-cluster-critical"  # not preempted by training pods
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    # the config file the args name is the ConfigMap's key, mounted where the args look
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "spot-autoscaler-config"
    assert config_path.name in one("ConfigMap", "spot-autoscaler-config")["data"]

    service = one("Service")
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]


def mebibytes(quantity: str) -> float:
    assert quantity.endswith(("Mi", "Gi")), quantity
    return float(quantity[:-2]) * (1024 if quantity.endswith("Gi") else 1)


def test_the_example_job_is_managed_by_the_shipped_config() -> None:
    job = one("TrainingJob")
    config = parse_config(embedded_config_text())
    assert job["apiVersion"] == "kai.alibabacloud.com/v1alpha1"
    labels = job["metadata"]["labels"]
    key, _, value = config.kubernetes.label_selector.partition("=")
    assert labels[key] == value  # selected by kubernetes.label_selector
    assert labels[POLICY_LABEL] in {p.name for p in config.policy_set.policies}
    worker_spec = job["spec"]["etReplicaSpecs"]["worker"]
    assert 1 <= worker_spec["minReplicas"] <= worker_spec["replicas"] <= worker_spec["maxReplicas"]


def test_the_dockerfile_builds_a_non_root_daemon_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f.startswith("python:3.11-slim") for f in froms)
    assert re.search(r"^USER (?!0\b|root\b)\S+", text, re.M)
    assert 'ENTRYPOINT ["spot-autoscaler"]' in text
    assert 'CMD ["run", "--config", "/etc/spot-autoscaler/config.yaml"]' in text
    assert "horovod" not in text.lower().replace("horovod is not needed", "")
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for source in copied.split():
            assert (ROOT / source).exists(), source


def test_the_docs_table_lists_every_job_kind() -> None:
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    table = docs[docs.index("## Job kinds") : docs.index("## Backends")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(KINDS)
    for kind, row in zip(KINDS, rows, strict=True):
        jobs = kind.jobs
        assert row.startswith(f"| `{kind.backend}` | `{jobs.kind}` ({jobs.group}/{jobs.version})")
        assert all(helper.kind in row for helper in kind.helpers)
        assert kind.docs in row


def configs_but(text: str, *sections: str) -> dict[str, Any]:
    dumped = parse_config(text).model_dump(mode="json")
    return {k: v for k, v in dumped.items() if k not in sections}


@needs_kubectl
@pytest.mark.parametrize(
    ("cloud", "sources", "identity"),
    [
        ("eks", ["aws-sqs", "aws-prices"], ("ServiceAccount", "eks.amazonaws.com/role-arn")),
        (
            "ack",
            ["alibaba-ecs", "alibaba-cloudmonitor", "alibaba-prices"],
            ("ServiceAccount", "pod-identity.alibabacloud.com/role-name"),
        ),
    ],
)
def test_a_cloud_component_turns_on_its_sources_and_its_workload_identity(
    tmp_path: Path, cloud: str, sources: list[str], identity: tuple[str, str]
) -> None:
    objects = build(tmp_path, f"components/{cloud}")
    text = find(objects, "ConfigMap", "spot-autoscaler-config")["data"]["config.yaml"]
    config = parse_config(text, f"components/{cloud}/config.yaml")
    assert [s.name for s in SOURCES if s.wanted(config)] == sources
    # the base config everywhere else: the component only turns a cloud on
    assert configs_but(text, "aws", "alibaba") == configs_but(
        embedded_config_text(), "aws", "alibaba"
    )
    kind, annotation = identity
    [account] = [o for o in objects if o["kind"] == kind]
    assert annotation in account["metadata"]["annotations"]
    if cloud == "ack":  # RRSA's webhook injects only into labelled namespaces
        namespace = find(objects, "Namespace", NAMESPACE)
        assert namespace["metadata"]["labels"]["pod-identity.alibabacloud.com/injection"] == "on"
    deployment = find(objects, "Deployment", "spot-autoscaler")
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == "spot-autoscaler-config"  # no hash suffix to chase


def test_the_image_pins_every_runtime_dependency() -> None:
    """constraints.txt (scripts/lock.sh) covers the package's runtime closure with [all]."""
    pinned = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    needed: set[str] = set()
    todo = [Requirement(r) for r in metadata.requires("spot-autoscaler") or []]
    while todo:
        req = todo.pop()
        extras = {"all", "aws", "alibaba"}
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        if name in needed or name == "spot-autoscaler":
            continue
        needed.add(name)
        todo += [
            Requirement(r)
            for r in metadata.requires(req.name) or []
            if "extra ==" not in r  # a dependency's own extras are not installed
        ]
    assert needed - pinned == set(), "run scripts/lock.sh"
    assert "-c constraints.txt" in (ROOT / "Dockerfile").read_text()


def test_the_node_agent_runs_on_every_spot_label_the_daemon_reads_at_its_providers_poll() -> None:
    """Its affinity selects each spot label of the daemon's default capacity rules (GKE and AKS
    included), and it is given no --interval: GCE's 1 s long poll and Azure's 1 s poll, not a
    5 s one for all (docs/cloud.md); the chart renders the same (test_helm_kustomize.py)."""
    [agent] = [d for d in docs([DEPLOY / "node-agent-daemonset.yaml"]) if d["kind"] == "DaemonSet"]
    pod = agent["spec"]["template"]["spec"]
    assert "--interval" not in pod["containers"][0]["args"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    selected = {
        (e["key"], value)
        for term in terms["nodeSelectorTerms"]
        for e in term["matchExpressions"]
        for value in e["values"]
    }
    spot_labels = {
        (rule.label, rule.equals)
        for rule in KubernetesSettings().capacity_type_labels
        if rule.type is CapacityType.SPOT and rule.equals is not None
    }
    assert spot_labels <= selected
    assert {
        ("karpenter.sh/capacity-type", "spot"),
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("cloud.google.com/gke-provisioning", "spot"),
        ("kubernetes.azure.com/scalesetpriority", "spot"),
    } <= selected
