"""The Helm chart (deploy/helm/spot-autoscaler, issue 37) with the real helm (build-helm.sh).

- `helm lint` and `helm template` for each option set (every switch on and off): the objects,
  the per-kind RBAC trimmed to the daemon's own kind registry, and the rendered config accepted
  by the daemon's `check-config`;
- bad values (an unknown key, a wrong type, a bad value in a policy: values.schema.json, its
  `config` generated from the config model; a rule across keys: the templates) fail naming the
  key, and on the real plane leave nothing installed;
- the pre-install/pre-upgrade hook (templates/check-config-hook.yaml): it carries the release's
  config byte for byte, and its command (the daemon's `check-config`, run here as its pod would)
  rejects what the schema and the templates cannot check, naming the key; on the real plane a
  rejecting hook fails `helm install` before any release object exists (the test plays the
  hook pod's kubelet: kwok runs no containers);
- on the real control plane (support/real_cluster.py): `helm install`, then the real daemon
  (`spot-autoscaler run`) with the token of the chart's ServiceAccount and the config of the
  chart's ConfigMap, projected into a directory as the kubelet does a ConfigMap volume (there is
  no kubelet: the Deployment's own pods are kwok's), Ready and growing an et-operator job under
  the chart's RBAC; `helm upgrade` with another policy, picked up by the daemon's live reload
  without a rollout; `helm uninstall` removes every object the chart made and no user's job.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from kubernetes import client
from pydantic import BaseModel
from support.control_plane import ControlPlane, free_port
from support.helm import CHART, Helm, Obj, config_of, helm_binary, parse
from support.rbac import Grant, role_grants
from support.real_daemon import daemon, forbidden, json_lines, write_kubeconfig
from support.waiting import wait_for
from test_daemon_support import http_get
from test_real_daemon import ET_CRDS, KUBECTL, MONITORING_CRDS, World, succeeded

from autoscaler.adapters.kube.kinds import KINDS
from autoscaler.cli import main
from autoscaler.config import Config
from autoscaler.config.daemon import DaemonSettings, LeaderElectionSettings
from autoscaler.core.policy import Policy, PolicySet, Window

EKS = {"enabled": True, "roleArn": "arn:aws:iam::1:role/x", "queueUrl": "https://sqs/q"}
ACK = {"enabled": True, "roleName": "spot-autoscaler", "region": "cn-hangzhou"}
KINDS_OFF = {"etOperator": False, "cce": False, "mpiJob": False, "pytorchJob": False}
OPTION_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything on": {
        "image": {"repository": "registry.example/spot-autoscaler", "tag": "9.9.9"},
        "imagePullSecrets": [{"name": "regcred"}],
        "commonLabels": {"team": "ml"},
        "commonAnnotations": {"owner": "ml-platform"},
        "podLabels": {"tier": "control"},
        "podAnnotations": {"note": "x"},
        "priorityClassName": "spot-autoscaler-critical",
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "system", "operator": "Exists"}],
        "serviceAccount": {"annotations": {"extra": "yes"}},
        "monitoring": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "eks": EKS,
        "nodeAgent": {"enabled": True, "provider": "aws"},
    },
    "ack": {"ack": ACK},
    "everything off": {
        "replicaCount": 1,
        "priorityClassName": "",
        "affinity": {},
        "jobKinds": KINDS_OFF,
        "flowSchema": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "checkConfigHook": {"enabled": False},
        "config": {"daemon": {"leader_election": {"enabled": False}}},
    },
    "another release name": {"fullnameOverride": "sa", "nodeAgent": {"enabled": True}},
    "node agent in an existing namespace": {
        "nodeAgent": {"enabled": True, "createNamespace": False, "namespace": "kube-system"}
    },
}
# Each jobKinds switch -> the daemon's backend (its kind module), whose resources it grants.
SWITCHES = {
    "etOperator": "et-operator",
    "cce": "cce",
    "mpiJob": "mpi-operator",
    "pytorchJob": "training-operator",
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm"))


def check_config(config: Obj, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`spot-autoscaler check-config` on `config`: its report (0 asserted on an OK)."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["check-config", str(path)])
    captured = capsys.readouterr()
    report = captured.out + captured.err
    assert code == (0 if "OK" in report else 2), report
    return report


def one(objects: list[Obj], kind: str, suffix: str = "") -> Obj:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def daemon_role(objects: list[Obj]) -> set[Grant]:
    [role] = [
        o
        for o in objects
        if o["kind"] == "ClusterRole" and not o["metadata"]["name"].endswith("-node-agent")
    ]
    return role_grants(role)


# --- rendering: no cluster --------------------------------------------------------------------
@pytest.mark.parametrize("option_set", OPTION_SETS)
def test_each_option_set_lints_renders_and_its_config_passes_check_config(
    helm: Helm, option_set: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = OPTION_SETS[option_set]
    linted = helm.run("lint", "--strict", str(CHART), "-f", str(helm.values_file(values)))
    assert "[WARNING]" not in linted.stdout and "[ERROR]" not in linted.stdout, linted.stdout
    objects = helm.template(values, release="rel", namespace="ns")
    for obj in objects:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        assert labels["app.kubernetes.io/instance"] == "rel", meta
        assert labels.items() >= values.get("commonLabels", {}).items(), meta
        assert (meta.get("annotations") or {}).items() >= values.get(
            "commonAnnotations", {}
        ).items(), meta
    assert "OK" in check_config(config_of(objects), tmp_path, capsys)


def test_switches_add_and_remove_their_objects(helm: Helm) -> None:
    def kinds(values: Obj) -> set[str]:
        return {o["kind"] for o in helm.template(values)}

    base = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment"}
    base |= {"Service"}
    assert kinds(OPTION_SETS["everything off"]) == base
    assert kinds({}) == base | {
        *{"Role", "RoleBinding", "Lease", "FlowSchema", "PodDisruptionBudget", "Job"},
        *{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"},
    }
    assert kinds({"monitoring": {"enabled": True}}) - kinds({}) == {
        "ServiceMonitor",
        "PrometheusRule",
    }
    agent = kinds({"nodeAgent": {"enabled": True}}) - kinds({})
    assert agent == {"Namespace", "DaemonSet"}
    assert "Namespace" not in kinds(OPTION_SETS["node agent in an existing namespace"])


def test_the_leader_fence_names_the_releases_account_and_lease(helm: Helm) -> None:
    """The policy admits the release's own ServiceAccount's writes only from the pod its Lease
    names (the Lease the daemon's config is given, in its namespace)."""
    values = {"config": {"daemon": {"leader_election": {"lease_namespace": "leases"}}}}
    objects = helm.template(values, release="rel", namespace="ml")
    policy = one(objects, "ValidatingAdmissionPolicy")
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    [who, _] = policy["spec"]["matchConditions"]
    assert (
        who["expression"]
        == "request.userInfo.username == 'system:serviceaccount:ml:rel-spot-autoscaler'"
    )
    lease = config_of(objects)["daemon"]["leader_election"]["lease_name"]
    assert binding["spec"]["paramRef"] == {
        "name": lease,
        "namespace": "leases",
        "parameterNotFoundAction": "Allow",
    }
    assert (
        binding["spec"]["policyName"]
        == policy["metadata"]["name"]
        == "rel-spot-autoscaler-leader-fence"
    )
    off = {"config": {"daemon": {"leader_election": {"enabled": False}}}}
    assert not [o for o in helm.template(off) if o["kind"].startswith("ValidatingAdmission")]


def test_everything_on_reaches_the_pods_and_the_service_account(helm: Helm) -> None:
    values = OPTION_SETS["everything on"]
    objects = helm.template(values)
    for kind in ("Deployment", "DaemonSet", "Job"):
        pod = one(objects, kind)["spec"]["template"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}], kind
        [container] = pod["spec"]["containers"]
        assert container["image"] == "registry.example/spot-autoscaler:9.9.9", kind
        assert pod["metadata"]["labels"]["team"] == "ml", kind
    hook = one(objects, "Job")["spec"]["template"]["spec"]
    assert (hook["nodeSelector"], hook["tolerations"]) == (
        {"pool": "system"},
        values["tolerations"],
    )
    pod = one(objects, "Deployment")["spec"]["template"]
    assert pod["metadata"]["labels"]["tier"] == "control"
    assert pod["metadata"]["annotations"] == {"note": "x"}
    assert pod["spec"]["priorityClassName"] == "spot-autoscaler-critical"
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert one(objects, "ServiceAccount", "autoscaler")["metadata"]["annotations"] == {
        "extra": "yes",
        "eks.amazonaws.com/role-arn": EKS["roleArn"],
        "owner": "ml-platform",
    }
    assert one(objects, "ServiceMonitor")["metadata"]["labels"]["release"] == (
        "kube-prometheus-stack"
    )
    aws = config_of(objects)["aws"]
    assert aws == {"enabled": True, "queue_url": EKS["queueUrl"], "prices": aws["prices"]}
    off = one(helm.template(OPTION_SETS["everything off"]), "Deployment")["spec"]["template"]
    assert "priorityClassName" not in off["spec"] and off["spec"]["affinity"] == {}


def test_each_job_kind_switch_trims_the_cluster_role_to_that_kinds_resources(
    helm: Helm,
) -> None:
    full = daemon_role(helm.template({}))
    backends = {k.backend: {(r.group, r.plural) for r in k.resources} for k in KINDS}
    assert set(SWITCHES.values()) == set(backends)  # a new kind needs its switch
    for switch, backend in SWITCHES.items():
        trimmed = daemon_role(helm.template({"jobKinds": {switch: False}}))
        removed = full - trimmed
        assert {(g, r) for g, r, _ in removed if r != "pods"} == backends[backend], switch
        # a PyTorchJob's victims are deleted by name: pods/delete is that kind's
        assert (("", "pods", "delete") in removed) == (switch == "pytorchJob"), switch
    # the watches every kind needs stay; budgets are written for et-operator and PyTorchJob jobs
    assert daemon_role(helm.template({"jobKinds": KINDS_OFF})) == {
        *{("", "nodes", v) for v in ("get", "list", "watch", "patch")},
        *{("", "pods", v) for v in ("get", "list", "watch", "patch")},
        ("", "events", "create"),
        ("policy", "poddisruptionbudgets", "list"),
        ("policy", "poddisruptionbudgets", "watch"),
    }
    only_pytorch = {**KINDS_OFF, "pytorchJob": True}
    assert ("policy", "poddisruptionbudgets", "create") in daemon_role(
        helm.template({"jobKinds": only_pytorch})
    )


WINDOW = {"name": "w", "schedule": "0 8 * * 1-5", "duration": "1h"}


def policy_values(policy: Obj) -> Obj:
    """Values whose config has one policy `a` with `policy`'s sections."""
    return {"config": {"policies": [{"name": "a", **policy}], "default_policy": "a"}}


BAD_VALUES: dict[str, tuple[Obj, str]] = {  # values -> what the error names
    "unknown key": ({"replicaCont": 3}, "additional properties 'replicaCont' not allowed"),
    "unknown policy key": (
        {"config": {"policies": [{"name": "a", "scale_ot": {}}], "default_policy": "a"}},
        "at '/config/policies/0': additional properties 'scale_ot' not allowed",
    ),
    "unknown key in a policy section": (
        {"config": {"policies": [{"name": "a", "scale_out": {"min_idel": "60s"}}]}},
        "at '/config/policies/0/scale_out': additional properties 'min_idel' not allowed",
    ),
    "unknown config section": (
        {"config": {"kubernets": {}}},
        "at '/config': additional properties 'kubernets' not allowed",
    ),
    "wrong type": ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
    "wrong type in config": (
        {"config": {"daemon": {"metrics_port": "http"}}},
        "at '/config/daemon/metrics_port': got string, want integer",
    ),
    "a standalone daemon": (
        {"config": {"daemon": {"mode": "standalone"}}},
        "at '/config/daemon/mode'",
    ),
    "default_policy naming no policy": (
        {"config": {"default_policy": "spot"}},
        'config.default_policy: "spot" names no policy in config.policies',
    ),
    "two policies of one name": (
        {"config": {"policies": [{"name": "a"}, {"name": "a"}], "default_policy": "a"}},
        'config.policies[1].name: "a" names two policies',
    ),
    "min above max": (
        {
            "config": {
                "policies": [{"name": "a", "limits": {"min_workers": 5, "max_workers": 2}}],
                "default_policy": "a",
            }
        },
        "config.policies[0].limits: min_workers 5 > max_workers 2",
    ),
    "on_demand min above max": (
        policy_values({"on_demand": {"min_on_demand": 3, "max_on_demand": 1}}),
        "config.policies[0].on_demand: min_on_demand 3 > max_on_demand 1",
    ),
    "a window's min above max": (
        policy_values({"windows": [{**WINDOW, "limits": {"min_workers": 4, "max_workers": 1}}]}),
        "config.policies[0].windows[0].limits: min_workers 4 > max_workers 1",
    ),
    "a deadline with neither at nor within": (
        policy_values({"deadline": {"margin": "1h"}}),
        "config.policies[0].deadline: set exactly one of deadline.at and deadline.within",
    ),
    # values inside a policy's sections: the schema generated from the config model
    "a duration in words": (
        policy_values({"scale_out": {"timeout": "6 minutes"}}),
        "at '/config/policies/0/scale_out/timeout': '6 minutes' does not match pattern",
    ),
    "a negative minimum": (
        policy_values({"limits": {"min_workers": -1}}),
        "at '/config/policies/0/limits/min_workers': minimum: got -1, want 0",
    ),
    "a bad cron": (
        policy_values({"windows": [{**WINDOW, "schedule": "61 * * * *"}]}),
        "at '/config/policies/0/windows/0/schedule': '61 * * * *' does not match pattern",
    ),
    "an unknown enum value": (
        policy_values({"preemption": {"rebalance": "evict"}}),
        "at '/config/policies/0/preemption/rebalance': value must be one of 'avoid', 'drain'",
    ),
    "a deadline without a time zone": (
        policy_values({"deadline": {"at": "2026-12-01T18:00:00"}}),
        "at '/config/policies/0/deadline/at': '2026-12-01T18:00:00' is not valid date-time",
    ),
    "a non-positive daemon interval": (
        {"config": {"daemon": {"tick_interval": 0}}},
        "at '/config/daemon/tick_interval': exclusiveMinimum: got 0, want 0",
    ),
    "an unknown key in another section": (
        {"config": {"kubernetes": {"namespace": ["ml"]}}},
        "at '/config/kubernetes': additional properties 'namespace' not allowed",
    ),
    "a fixed identity under the leader fence": (
        {"config": {"daemon": {"leader_election": {"identity": "me"}}}},
        "config.daemon.leader_election.identity: the leader fence (leaderFence.enabled)",
    ),
    "eks without its queue": ({"eks": {"enabled": True}}, "eks.queueUrl: required"),
    "ack without its region": ({"ack": {"enabled": True}}, "ack.region: required"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_bad_values_fail_to_render_naming_the_key(helm: Helm, case: str) -> None:
    values, named = BAD_VALUES[case]
    assert named in helm.render_error(values)


HOOK = "-config-check"  # the hook ConfigMap's and Job's name: the full name, then this
HOOK_WEIGHTS = {"ConfigMap": "-10", "Job": "-5"}  # the config exists before the Job runs
SPOT_AUTOSCALER = Path(sys.executable).parent / "spot-autoscaler"  # the image's ENTRYPOINT


def run_hook(pod: Obj, config_map: Obj, volume: Path) -> subprocess.CompletedProcess[str]:
    """The hook pod's one container as its kubelet would run it, here: its config map's data
    written into `volume` (its mount path), then the image's entrypoint with its args."""
    [container] = pod["containers"]
    [mount] = container["volumeMounts"]
    for key, text in config_map["data"].items():
        (volume / key).write_text(text)
    args = [a.replace(mount["mountPath"], str(volume)) for a in container["args"]]
    return subprocess.run([str(SPOT_AUTOSCALER), *args], capture_output=True, text=True, timeout=60)


def test_the_hook_runs_check_config_on_the_releases_config_before_install_and_upgrade(
    helm: Helm, tmp_path: Path
) -> None:
    objects = helm.template(OPTION_SETS["everything on"])
    release_config = one(objects, "ConfigMap", "-config")["data"]["config.yaml"]
    for kind, weight in HOOK_WEIGHTS.items():
        hook = one(objects, kind, HOOK)
        assert (
            hook["metadata"]["annotations"].items()
            >= {
                "helm.sh/hook": "pre-install,pre-upgrade",
                "helm.sh/hook-weight": weight,
                "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
            }.items()
        ), kind
    assert one(objects, "ConfigMap", HOOK)["data"]["config.yaml"] == release_config  # bytes
    job = one(objects, "Job", HOOK)
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 180
    pod = job["spec"]["template"]["spec"]
    daemon_pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == daemon_pod["securityContext"]
    [container], [daemon_container] = pod["containers"], daemon_pod["containers"]
    assert container["securityContext"] == daemon_container["securityContext"]
    assert container["image"] == daemon_container["image"]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": f"spot-autoscaler{HOOK}"}}]
    assert "serviceAccountName" not in pod  # the release's is not made yet at pre-install
    report = run_hook(pod, one(objects, "ConfigMap", HOOK), tmp_path)
    assert report.returncode == 0 and ": OK (2 policies" in report.stdout, report
    assert "Job" not in {o["kind"] for o in helm.template({"checkConfigHook": {"enabled": False}})}


CAUGHT_BY_THE_HOOK: dict[
    str, tuple[Obj, str]
] = {  # values the schema and the templates take -> what the hook's check-config names
    "a rule between two durations": (
        policy_values({"scale_out": {"timeout": "20m"}}),
        "scalers.max_age (0:15:00) must exceed scale_out.timeout",
    ),
    "the leader election's timing order": (
        {"config": {"daemon": {"leader_election": {"lease_duration": "5s"}}}},
        "daemon.leader_election: need lease_duration > renew_deadline > retry_period",
    ),
    "a day no month of the window has": (
        policy_values({"windows": [{**WINDOW, "schedule": "0 0 31 2 *"}]}),
        "policies[0].windows[0].schedule: not a 5-field cron expression",
    ),
    "a duration's text beyond its bound": (
        {"config": {"daemon": {"tick_interval": "0s"}}},
        "daemon.tick_interval: Input should be greater than",
    ),
    "a label selector's syntax": (
        {"config": {"kubernetes": {"label_selector": "a=b=c"}}},
        "kubernetes.label_selector: not a label selector term",
    ),
    "a cross-key rule of the alibaba section": (
        {"config": {"alibaba": {"webhook": {"path": "cloudmonitor"}}}},
        "alibaba.webhook.path: must start with /",
    ),
}


@pytest.mark.parametrize("case", CAUGHT_BY_THE_HOOK)
def test_what_only_check_config_catches_renders_and_the_hook_rejects_naming_the_key(
    helm: Helm, case: str, tmp_path: Path
) -> None:
    """What neither JSON Schema nor the templates can check (the chart's README) renders; the
    hook's command on the hook's config exits non-zero naming the key (the daemon, too, would
    refuse it: at start, or keeping its previous config on a reload)."""
    values, named = CAUGHT_BY_THE_HOOK[case]
    objects = helm.template(values)
    pod = one(objects, "Job", HOOK)["spec"]["template"]["spec"]
    report = run_hook(pod, one(objects, "ConfigMap", HOOK), tmp_path)
    assert report.returncode == 2 and named in report.stderr, report


def test_the_schema_knows_the_config_keys_the_daemon_knows() -> None:
    """values.schema.json lists the config's sections, a policy's and the daemon section's keys
    (additionalProperties: false): exactly the daemon's config model's."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    config = schema["properties"]["config"]["properties"]
    sections = set(Config.model_fields) - {"policy_set"} | set(PolicySet.model_fields)
    assert set(config) == sections
    policy = config["policies"]["items"]["properties"]
    assert set(policy) == set(Policy.model_fields)
    for name, field in Policy.model_fields.items():  # each section's keys, typos refused
        model = next(
            (t for t in (field.annotation, *get_args(field.annotation)) if _is_model(t)), None
        )
        if name == "windows":
            assert set(policy[name]["items"]["properties"]) == set(Window.model_fields)
        elif model is not None:
            assert policy[name]["additionalProperties"] is False
            assert set(policy[name]["properties"]) == set(model.model_fields), name
    daemon_keys = config["daemon"]["properties"]
    assert set(daemon_keys) == set(DaemonSettings.model_fields)
    assert set(daemon_keys["leader_election"]["properties"]) == set(
        LeaderElectionSettings.model_fields
    )


def _is_model(t: object) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def test_the_chart_ships_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == metadata.version("spot-autoscaler")


# --- on the real control plane -----------------------------------------------------------------
NAMESPACE = "helm-sa"  # the release's (test_real_daemon.py uses spot-autoscaler)
RELEASE = "helm-sa"
FULLNAME = f"{RELEASE}-spot-autoscaler"
JOBS = "helm-jobs"  # the users' namespace


def plane_values(port: int, *more_policies: Obj) -> Obj:
    """What a user sets, with this machine's port and quick clocks: et-operator jobs of one
    namespace, spot-elastic growing at once."""
    quick = {
        "name": "spot-elastic",
        "scale_out": {"min_idle": "0s", "cooldown": "0s"},
        "preemption": {"join_grace": "1s"},
    }
    return {
        "monitoring": {"enabled": True},
        # kwok runs no containers: the hook's Job would never finish (the test of the hook plays
        # its kubelet, test_a_config_the_hook_rejects_fails_the_install_and_leaves_no_object)
        "checkConfigHook": {"enabled": False},
        "config": {
            "kubernetes": {"namespaces": [JOBS], "discovery_interval": "1s"},
            "policies": [quick, {"name": "preemption-only"}, *more_policies],
            "daemon": {
                "metrics_port": port,
                "metrics_bind_address": "127.0.0.1",
                "tick_interval": "2s",
                "config_reload_interval": "0.5s",
                "leader_election": {
                    "lease_duration": "4s",
                    "renew_deadline": "3s",
                    "retry_period": "0.25s",
                },
            },
        },
    }


def project(volume: Path, config_map: Obj) -> None:
    """Write a ConfigMap's data into `volume` as the kubelet projects a ConfigMap volume
    (pkg/volume/util/atomic_writer.go): a timestamped directory, `..data` pointing at it and
    swapped by a rename, each key a link through `..data`."""
    stamp = volume / datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    stamp.mkdir()
    for key, text in config_map["data"].items():
        (stamp / key).write_text(text)
        link = volume / key
        if not link.is_symlink():
            link.symlink_to(Path("..data") / key)
    (volume / "..data_tmp").symlink_to(stamp.name)
    (volume / "..data_tmp").rename(volume / "..data")


def config_map(admin: client.ApiClient) -> Obj:
    cm = client.CoreV1Api(admin).read_namespaced_config_map(f"{FULLNAME}-config", NAMESPACE)
    return {"data": dict(cm.data)}


def kubectl(plane: ControlPlane, *args: str) -> str:
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", str(plane.kubeconfig_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Released:
    plane: ControlPlane
    helm: Helm
    admin: client.ApiClient
    volume: Path  # the daemon's config "volume" and kubeconfig
    port: int
    world: World
    log: Path
    proc: subprocess.Popen[str]

    def logged(self, event: str) -> list[Obj]:
        return [e for e in json_lines(self.log) if e.get("event") == event]

    def readyz(self) -> tuple[int, str]:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return http_get(self.port, "/readyz")
        except OSError:
            return 0, ""


CHART_KINDS = (  # every kind the chart can make, for sweeps by the release's label
    "serviceaccount,clusterrole,clusterrolebinding,role,rolebinding,flowschema,configmap,"
    "deployment,service,poddisruptionbudget,lease,daemonset,namespace,servicemonitor,"
    "prometheusrule,job"
)


def left_behind(plane: ControlPlane, release: str) -> str:
    """Whatever still carries the release's label, in any namespace."""
    label = f"app.kubernetes.io/instance={release}"
    return kubectl(plane, "get", CHART_KINDS, "-A", "-l", label, "-o", "name").strip()


@pytest.fixture(scope="class")
def released(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Released]:
    """`helm install` on the real plane, then the daemon as the chart's Deployment runs it, and
    an et-operator job of two workers (max 3) on three 1-GPU nodes for it to grow."""
    tmp = tmp_path_factory.mktemp("helm-release")
    helm = Helm(helm_binary(), tmp, kubeconfig=control_plane.kubeconfig_path)
    admin = control_plane.api_client()
    for crd in [*ET_CRDS, *MONITORING_CRDS]:
        control_plane.apply_crd(admin, crd)
    port = free_port()
    values = helm.values_file(plane_values(port))
    world = World(control_plane, JOBS, "helm", ["helm-gpu-0", "helm-gpu-1", "helm-gpu-2"])
    try:
        helm.run(
            "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f", str(values)
        )
        volume = tmp / "volume"  # the Deployment's config volume (and our kubeconfig)
        volume.mkdir()
        # the chart's ServiceAccount's token, bound to the pod the daemon runs as (its kubelet's)
        token = control_plane.token_for(FULLNAME, NAMESPACE, pod="helm-0")
        write_kubeconfig(control_plane, volume / "kubeconfig", token, NAMESPACE)
        log = tmp / "daemon.log"
        with open(log, "w") as out, pytest.MonkeyPatch.context() as env:
            env.setenv("POD_NAMESPACE", NAMESPACE)  # the Deployment's downward API
            project(volume, config_map(admin))
            with daemon(volume, out, out, identity="helm-0") as proc:
                world.start(workers=2, maximum=3)  # the daemon starts meanwhile
                yield Released(control_plane, helm, admin, volume, port, world, log, proc)
    finally:
        world.stop()
        helm.run("uninstall", RELEASE, "-n", NAMESPACE, "--wait", check=False)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(admin).delete_namespace(NAMESPACE)
        admin.close()


class TestInstalledWithHelm:
    def test_the_daemon_is_ready_and_leads_under_the_charts_rbac(self, released: Released) -> None:
        wait_for(lambda: released.readyz()[0] == 200, 60, "the daemon ready")
        assert "et-operator=live" in released.readyz()[1]
        lease = client.CoordinationV1Api(released.admin).read_namespaced_lease(FULLNAME, NAMESPACE)
        assert lease.metadata.labels["app.kubernetes.io/instance"] == RELEASE  # the chart's
        wait_for(lambda: released.logged("leader_elected"), 30, "the daemon leading")
        lease = client.CoordinationV1Api(released.admin).read_namespaced_lease(FULLNAME, NAMESPACE)
        assert lease.spec.holder_identity == "helm-0"
        assert not forbidden(released.log)

    def test_it_grows_a_job_under_the_charts_rbac(self, released: Released) -> None:
        world = released.world
        wait_for(
            lambda: (
                len(world.running_workers()) == 3
                and world.scalers("ScaleOut")
                and all(succeeded(s) for s in world.scalers("ScaleOut"))
            ),
            60,
            "the daemon's ScaleOut carried out (3 workers Running)",
        )
        assert not forbidden(released.log)

    def test_an_upgrade_with_another_policy_is_reloaded_live(self, released: Released) -> None:
        apps = client.AppsV1Api(released.admin)
        generation = apps.read_namespaced_deployment(FULLNAME, NAMESPACE).metadata.generation
        values = plane_values(released.port, {"name": "upgraded", "scale_out": {"enabled": False}})
        released.helm.run(
            "upgrade", RELEASE, str(CHART), "-n", NAMESPACE,
            "-f", str(released.helm.values_file(values, "upgrade.yaml")),
        )  # fmt: skip
        cm = config_map(released.admin)
        assert [p["name"] for p in yaml.safe_load(cm["data"]["config.yaml"])["policies"]] == [
            "spot-elastic", "preemption-only", "upgraded"
        ]  # fmt: skip
        project(released.volume, cm)  # the kubelet's sync of the volume
        reloaded = wait_for(
            lambda: [e for e in released.logged("config_reloaded") if "upgraded" in e["policies"]],
            30,
            "the daemon's live reload of the upgraded policies",
        )
        assert reloaded[0]["file"].endswith("config.yaml")
        assert released.proc.poll() is None and released.readyz()[0] == 200
        # no rollout: the pods keep running, the volume changes under them
        assert (
            apps.read_namespaced_deployment(FULLNAME, NAMESPACE).metadata.generation == generation
        )

    def test_uninstall_removes_every_object_of_the_chart_and_no_users_job(
        self, released: Released
    ) -> None:
        manifest = released.helm.run("get", "manifest", RELEASE, "-n", NAMESPACE).stdout
        made = {(o["kind"], o["metadata"]["name"]) for o in parse(manifest)}
        assert {k for k, _ in made} >= {"Deployment", "ClusterRole", "Lease", "ServiceMonitor"}
        path = released.volume.parent / "manifest.yaml"
        path.write_text(manifest)
        scalers = {s["metadata"]["name"] for s in released.world.scalers("ScaleOut")}
        released.proc.terminate()  # as the Deployment's pod is stopped
        released.proc.wait(30)
        released.helm.run("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
        assert kubectl(released.plane, "get", "-f", str(path), "--ignore-not-found") == ""
        assert left_behind(released.plane, RELEASE) == ""
        job = released.world.training_job()
        assert not job["metadata"].get("deletionTimestamp")
        assert {s["metadata"]["name"] for s in released.world.scalers("ScaleOut")} == scalers


REFUSED_ON_INSTALL = (
    "unknown key",
    "wrong type in config",
    "default_policy naming no policy",
    "min above max",  # a rule across keys: the templates
    "a duration in words",  # a value in a policy's section: the generated schema
    "a bad cron",
)


def test_bad_values_fail_the_install_and_leave_nothing(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    helm = Helm(helm_binary(), tmp_path, kubeconfig=control_plane.kubeconfig_path)
    with control_plane.api_client() as admin:
        for crd in MONITORING_CRDS:  # the kinds left_behind looks for
            control_plane.apply_crd(admin, crd)
    ns = "helm-bad"
    for case in REFUSED_ON_INSTALL:
        values, named = BAD_VALUES[case]
        done = helm.run(
            "install", "bad", str(CHART), "-n", ns, "--create-namespace",
            "-f", str(helm.values_file(values)), check=False,
        )  # fmt: skip
        assert done.returncode != 0 and named in done.stderr, (case, done.stderr)
        assert helm.run("list", "-n", ns, "-a", "-q").stdout.strip() == "", case
    assert left_behind(control_plane, "bad") == ""
    assert kubectl(control_plane, "get", "namespace", ns, "--ignore-not-found") == ""  # not even


def play_the_hook_pods_kubelet(admin: client.ApiClient, namespace: str, job: str) -> str:
    """kwok runs no containers and leaves a Job's pod Running (support/kwok_stages.yaml): do what
    the kubelet would. Run the pod's container (run_hook) on its ConfigMap, then report it as
    the pod's status: terminated with its exit code, the log's tail as the termination message
    (FallbackToLogsOnError), the pod Failed or Succeeded. Returns the pod's name."""
    core = client.CoreV1Api(admin)

    def running() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    pod = wait_for(running, 60, f"the pod of hook {job} Running (kwok)")
    spec = admin.sanitize_for_serialization(pod.spec)
    [volume] = spec["volumes"]
    config = core.read_namespaced_config_map(volume["configMap"]["name"], namespace)
    with tempfile.TemporaryDirectory() as mounted:
        done = run_hook(spec, {"data": config.data}, Path(mounted))
    now = datetime.now(UTC).isoformat()
    [container] = spec["containers"]
    terminated = {
        "exitCode": done.returncode,
        "reason": "Error" if done.returncode else "Completed",
    }
    terminated |= {
        "message": (done.stdout + done.stderr)[-4096:],
        "startedAt": now,
        "finishedAt": now,
    }
    core.patch_namespaced_pod_status(
        pod.metadata.name,
        namespace,
        {
            "status": {
                "phase": "Failed" if done.returncode else "Succeeded",
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
    )
    return str(pod.metadata.name)


def test_a_config_the_hook_rejects_fails_the_install_and_leaves_no_release_object(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The schema and the templates take `tick_interval: 0s`; the hook's check-config does not:
    the Job fails, `helm install` fails naming the hook, and no object of the release was made.
    Left: the failed Job (its pod's log and status name the key) until the next install or
    upgrade replaces it; its ConfigMap is gone (a hook that succeeded)."""
    helm = Helm(helm_binary(), tmp_path, kubeconfig=control_plane.kubeconfig_path)
    with control_plane.api_client() as admin:
        for crd in MONITORING_CRDS:  # the kinds left_behind looks for
            control_plane.apply_crd(admin, crd)
    [node] = control_plane.add_gpu_nodes(["helm-hook"], gpus=0)
    ns, release = "helm-hook", "bad-hook"
    job = f"{release}-spot-autoscaler{HOOK}"
    values, named = CAUGHT_BY_THE_HOOK["a duration's text beyond its bound"]
    values = {**values, "nodeSelector": {"kubernetes.io/hostname": node}}  # the hook's pod, too
    admin = control_plane.api_client()
    try:
        with ThreadPoolExecutor(1) as pool:
            install = pool.submit(
                helm.run,
                "install", release, str(CHART), "-n", ns, "--create-namespace", "--timeout", "90s",
                "-f", str(helm.values_file(values)), check=False,
            )  # fmt: skip
            pod = play_the_hook_pods_kubelet(admin, ns, job)
            done = install.result(timeout=120)
        assert done.returncode != 0, done.stdout
        assert f"failed pre-install: 1 error occurred:\n\t* job {job} failed" in done.stderr
        # helm asks for the failed pod's log to print it (hook-output-log-policy); kwok has none
        assert f"Failed to stream pod logs for pod: {pod}" in done.stderr
        status = client.CoreV1Api(admin).read_namespaced_pod(pod, ns).status
        assert named in status.container_statuses[0].state.terminated.message
        assert left_behind(control_plane, release) == f"job.batch/{job}"
        assert helm.run("status", release, "-n", ns).stdout.count("STATUS: failed") == 1
    finally:
        helm.run("uninstall", release, "-n", ns, check=False)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(admin).delete_namespace(ns)
        client.CoreV1Api(admin).delete_node(node)
        admin.close()
