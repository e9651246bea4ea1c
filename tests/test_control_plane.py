"""The real control plane fixture (support/control_plane.py) does what a cluster does: the real
scheduler binds GPU pods to kwok nodes, the controller-manager collects garbage, fills PDB status
and runs Jobs, RBAC refuses a bare ServiceAccount token, and no process outlives the plane.

Needs the binaries of `make control-plane`; skipped (one line) without them, failed instead with
REQUIRE_REAL_CLUSTER=1.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException
from support.control_plane import (
    MPI_OPERATOR_HEALTH_PORT,
    POD_CIDR,
    ControlPlane,
    ControlPlaneError,
    port_in_use,
    wait_until,
)

pytestmark = pytest.mark.real_cluster

NS = "default"
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[ApiClient]:
    api = control_plane.api_client()
    yield api
    api.close()


def _pod(name: str, node: str, gpus: int, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "example.invalid/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def _condition(obj: Any, kind: str) -> Any:
    return next((c for c in (obj.status.conditions or []) if c.type == kind), None)


def _running(core: client.CoreV1Api, name: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, NS)
    ready = _condition(pod, "Ready")
    return pod if pod.status.phase == "Running" and ready and ready.status == "True" else None


def test_every_component_is_healthy_and_starts_fast(
    control_plane: ControlPlane, api: ApiClient
) -> None:
    health = control_plane.health()
    assert set(health) >= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    assert all(health.values()), health
    version = client.VersionApi(api).get_code()
    assert version.git_version.startswith("v1.37."), version.git_version  # ldflags stamp
    # --root-ca-file reached the root-ca-cert-publisher: pods would trust the apiserver
    root_ca = client.CoreV1Api(api).read_namespaced_config_map("kube-root-ca.crt", NS)
    assert root_ca.data["ca.crt"] == (control_plane.dir / "pki" / "ca.crt").read_text()
    print("start-up seconds:", {k: round(v, 2) for k, v in control_plane.startup_seconds.items()})
    assert control_plane.startup_seconds["total"] < 30


def test_a_gpu_pod_on_a_kwok_node_runs_via_the_real_scheduler(
    control_plane: ControlPlane, api: ApiClient
) -> None:
    control_plane.add_gpu_nodes(["gpu-run-1"], gpus=8, labels={"pool": "a100"})
    core = client.CoreV1Api(api)
    node = core.read_node("gpu-run-1")
    assert node.status.allocatable["nvidia.com/gpu"] == "8"  # kept by kwok's node stage
    assert node.metadata.labels["karpenter.sh/capacity-type"] == "spot"
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
    assert not node.spec.taints  # no kwok taint, and the not-ready one is gone

    core.create_namespaced_pod(NS, _pod("gpu-runs", "gpu-run-1", gpus=4))
    pod = wait_until(lambda: _running(core, "gpu-runs"), 30, "pod gpu-runs Running and Ready")
    assert pod.spec.node_name == "gpu-run-1"
    assert _condition(pod, "PodScheduled").status == "True"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(POD_CIDR)


def test_a_pod_asking_more_gpus_than_any_node_has_stays_unschedulable(
    control_plane: ControlPlane, api: ApiClient
) -> None:
    control_plane.add_gpu_nodes(["gpu-small-1"], gpus=8)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(NS, _pod("gpu-too-big", "gpu-small-1", gpus=16))

    def unschedulable() -> Any:
        scheduled = _condition(core.read_namespaced_pod("gpu-too-big", NS), "PodScheduled")
        return scheduled if scheduled and scheduled.reason == "Unschedulable" else None

    scheduled = wait_until(unschedulable, 30, "PodScheduled=False/Unschedulable")
    assert scheduled.status == "False"
    assert "nvidia.com/gpu" in scheduled.message
    time.sleep(2)
    pod = core.read_namespaced_pod("gpu-too-big", NS)
    assert pod.status.phase == "Pending" and not pod.spec.node_name


def test_the_garbage_collector_deletes_what_a_deleted_owner_owned(api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    owner = core.create_namespaced_config_map(
        NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="gc-owner"))
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="gc-owner", uid=owner.metadata.uid
    )
    core.create_namespaced_config_map(
        NS,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="gc-dependent", owner_references=[ref])
        ),
    )
    core.delete_namespaced_config_map("gc-owner", NS)

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("gc-dependent", NS)
        except ApiException as e:
            return e.status == 404
        return False

    wait_until(gone, 30, "the dependent ConfigMap to be garbage-collected", 0.2)


def test_the_disruption_controller_fills_a_pdb_status(
    control_plane: ControlPlane, api: ApiClient
) -> None:
    control_plane.add_gpu_nodes(["gpu-pdb-1"], gpus=8)
    core = client.CoreV1Api(api)
    for i in range(2):
        core.create_namespaced_pod(
            NS, _pod(f"pdb-worker-{i}", "gpu-pdb-1", gpus=1, labels={"app": "pdb-test"})
        )
    for i in range(2):
        wait_until(lambda i=i: _running(core, f"pdb-worker-{i}"), 30, f"pdb-worker-{i} Ready")
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(
        NS,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="pdb-test"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1, selector=client.V1LabelSelector(match_labels={"app": "pdb-test"})
            ),
        ),
    )

    def filled() -> Any:
        status = policy.read_namespaced_pod_disruption_budget("pdb-test", NS).status
        return status if status and status.observed_generation and status.expected_pods else None

    status = wait_until(filled, 30, "PDB status from the disruption controller")
    assert (status.expected_pods, status.current_healthy, status.desired_healthy) == (2, 2, 1)
    assert status.disruptions_allowed == 1


def test_a_service_account_token_without_rbac_is_authenticated_but_forbidden(
    control_plane: ControlPlane,
) -> None:
    token = control_plane.token_for("nobody", NS)
    api = control_plane.client_for_token(token)
    review = client.AuthenticationV1Api(api).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert review.status.user_info.username == f"system:serviceaccount:{NS}:nobody"
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).list_node()
    assert refused.value.status == 403
    api.close()


def test_a_job_pod_keeps_running_until_it_is_told_to_finish(
    control_plane: ControlPlane, api: ApiClient
) -> None:
    # kwok's own fast stages make every Running Job pod Succeeded at once; ours do not
    control_plane.add_gpu_nodes(["gpu-job-1"], gpus=8)
    batch = client.BatchV1Api(api)
    core = client.CoreV1Api(api)
    template = _pod("unused", "gpu-job-1", gpus=1)
    template["spec"]["restartPolicy"] = "Never"
    batch.create_namespaced_job(
        NS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "launcher-like"},
            "spec": {"backoffLimit": 0, "template": {"spec": template["spec"]}},
        },
    )

    def job_pod() -> Any:
        pods = core.list_namespaced_pod(NS, label_selector="job-name=launcher-like").items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    pod = wait_until(job_pod, 30, "the Job's pod Running")
    time.sleep(3)
    assert core.read_namespaced_pod(pod.metadata.name, NS).status.phase == "Running"
    assert batch.read_namespaced_job("launcher-like", NS).status.active == 1

    core.patch_namespaced_pod(
        pod.metadata.name,
        NS,
        {"metadata": {"annotations": {"spot-autoscaler.test/finish": "succeed"}}},
    )

    def complete() -> bool:
        return any(
            c.type == "Complete" and c.status == "True"
            for c in batch.read_namespaced_job("launcher-like", NS).status.conditions or []
        )

    wait_until(complete, 30, "the Job Complete")


MPIJOB = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "tiny"},
    "spec": {
        "slotsPerWorker": 8,
        "mpiReplicaSpecs": {
            "Launcher": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": "gpu-mpi-1"},
                        "containers": [{"name": "launcher", "image": "example.invalid/mpi:1"}],
                    }
                },
            },
            "Worker": {
                "replicas": 2,
                "template": {
                    "spec": {
                        "nodeSelector": {"pool": "mpi"},
                        "containers": [
                            {
                                "name": "worker",
                                "image": "example.invalid/mpi:1",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}},
                            }
                        ],
                    }
                },
            },
        },
    },
}


def test_mpi_operator_runs_an_mpijob_on_kwok_gpu_nodes(
    control_plane: ControlPlane, api: ApiClient
) -> None:
    if "mpi-operator" not in control_plane.processes and port_in_use(MPI_OPERATOR_HEALTH_PORT):
        pytest.skip(f"port {MPI_OPERATOR_HEALTH_PORT} is taken: mpi-operator cannot serve health")
    control_plane.start_mpi_operator()
    control_plane.add_gpu_nodes(["gpu-mpi-1", "gpu-mpi-2"], gpus=8, labels={"pool": "mpi"})
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", MPIJOB)
    core = client.CoreV1Api(api)

    def running() -> Any:
        job = custom.get_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", "tiny")
        conds = job.get("status", {}).get("conditions", [])
        return job if any(c["type"] == "Running" and c["status"] == "True" for c in conds) else None

    wait_until(running, 60, "MPIJob tiny Running", 0.5)
    workers = core.list_namespaced_pod(
        NS,
        label_selector="training.kubeflow.org/job-name=tiny,training.kubeflow.org/job-role=worker",
    ).items
    assert sorted(p.spec.node_name for p in workers) == ["gpu-mpi-1", "gpu-mpi-2"]
    assert all(p.status.phase == "Running" for p in workers)
    launcher = client.BatchV1Api(api).read_namespaced_job("tiny-launcher", NS)
    assert launcher.status.active == 1 and not launcher.status.succeeded


def test_a_component_that_fails_names_itself_with_its_log(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("etcd", "kube-controller-manager", "kube-scheduler", "kwok"):
        (bins / name).symlink_to(control_plane.bin_dir / name)
    broken = bins / "kube-apiserver"
    broken.write_text('#!/bin/sh\nfor i in $(seq 1 60); do echo "boom line $i"; done\nexit 3\n')
    broken.chmod(0o755)
    plane = ControlPlane(bins, workdir=tmp_path / "plane", timeout=20)
    with pytest.raises(ControlPlaneError) as failed:
        plane.start()
    message = str(failed.value)
    assert message.startswith("kube-apiserver exited with code 3")
    assert "boom line 60" in message and "boom line 21" in message
    assert "boom line 20\n" not in message  # the last 40 lines only
    assert plane.leftover_processes() == []  # etcd was stopped too


CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from support.control_plane import ControlPlane
    plane = ControlPlane(sys.argv[2]).start()
    print(json.dumps(sorted(p.popen.pid for p in plane.processes.values())), flush=True)
    time.sleep(600)
    """
)


# SIGINT takes SIGTERM's handler (support/control_plane.py `_hooks` hooks both alike): a plane
# started for it too cost 11 s of `make test`
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name
)
def test_no_process_outlives_the_python_process_that_started_it(
    control_plane: ControlPlane, signum: int
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(TESTS), str(control_plane.bin_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        if not line:  # the child's plane did not start: say why
            child.wait(timeout=30)
            pytest.fail(f"the child's plane did not start:\n{child.stderr.read()[-3000:]}")
        pids = json.loads(line)
        assert len(pids) == 5 and all(os.path.exists(f"/proc/{p}") for p in pids)
        child.send_signal(signum)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()

    def all_gone() -> bool:
        return not any(_alive(p) for p in pids)

    wait_until(all_gone, 10, f"the plane's processes to die after {signal.Signals(signum).name}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
