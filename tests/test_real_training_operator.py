"""PyTorchJob (kubeflow.org/v1) with the REAL Kubeflow training-operator v1.9.3 on the real control
plane (support/control_plane.py, `start_training_operator`): kube-apiserver, controller-manager,
kube-scheduler and kwok GPU nodes. Workers are bound by the real scheduler and run on kwok; the
operator does what it does. These pin the behaviours a PyTorchJob backend of the product would
rely on: pod names and labels, the torchrun env, what a replicas change creates and deletes, and
what happens to a worker deleted in the middle.

Upstream source read for every expectation (module github.com/kubeflow/training-operator@v1.9.3):
pkg/controller.v1/common/pod.go `ReconcilePods`/`createNewPod`, pkg/core/pod.go `GetPodSlices`,
pkg/core/status.go `UpdateJobReplicaStatuses`, pkg/controller.v1/pytorch/ (pytorchjob_controller.go
`UpdateJobStatus`, `IsMasterRole`; elastic.go; envvar.go), function named in each comment.

Isolation in a session shared with other real-cluster tests: one namespace of our own, our nodes
carry a taint that only our pods tolerate and a pool label our pods select, and each test deletes
its PyTorchJobs, their pods and Services, and its nodes.
"""

from __future__ import annotations

import base64

import pytest
from support.control_plane import TRAINING_OPERATOR_NAMESPACE, TRAINING_OPERATOR_SECRET
from support.pytorch_cluster import (
    GROUP,
    LABEL,
    NS,
    PLURAL,
    SETTLE,
    VERSION,
    Cluster,
    cluster,
    pod_events,
    pytorch_job,
)
from support.waiting import wait_for

pytestmark = pytest.mark.real_cluster

HOLD = "spot-autoscaler.test/hold"  # our finalizer: keeps a deleted pod Terminating
__all__ = ["cluster"]  # the fixture


# --- the tests ------------------------------------------------------------------------------------
def test_the_rotator_keeps_the_webhook_certificates_it_was_given(cluster: Cluster) -> None:
    """The start-up workaround (ControlPlane.start_training_operator): cert-controller's rotator
    found our Secret valid ("no cert refresh needed", rotator.go `refreshCertIfNeeded`) and left
    it as written, so the pair the webhook server reads is the Secret's."""
    plane = cluster.plane
    secret = cluster.core.read_namespaced_secret(
        TRAINING_OPERATOR_SECRET, TRAINING_OPERATOR_NAMESPACE
    )
    assert (
        base64.b64decode(secret.data["tls.crt"])
        == (plane.training_operator_cert_dir / "tls.crt").read_bytes()
    )
    assert sorted(secret.data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    log = plane.processes["training-operator"].log.read_text(errors="replace")
    assert "no cert refresh needed" in log and "refreshing CA and server certs" not in log
    # no ValidatingWebhookConfiguration: the rotator logs it missing and carries on
    assert "Webhook not found. Unable to update certificate." in log
    assert "CA certs are injected to webhooks" in log


def test_workers_run_on_kwok_gpu_nodes_with_the_operators_labels_and_torchrun_env(
    cluster: Cluster,
) -> None:
    nodes = cluster.add_nodes("lab", 3)
    cluster.create(pytorch_job("lab", "lab", replicas=2))
    cluster.wait_settled("lab", 2)

    workers = cluster.workers("lab")
    assert sorted(workers) == ["lab-worker-0", "lab-worker-1"]  # GenGeneralName
    assert len({p.spec.node_name for p in workers.values()}) == 2
    assert {p.spec.node_name for p in workers.values()} <= set(nodes)
    for i in range(2):
        pod = workers[f"lab-worker-{i}"]
        # createNewPod: GenLabels (operator-name, job-name) + replica-type/-index; job-role=master
        # on Worker-0 when there is no Master (IsMasterRole)
        expected = {
            f"{LABEL}operator-name": "pytorchjob-controller",
            f"{LABEL}job-name": "lab",
            f"{LABEL}replica-type": "worker",
            f"{LABEL}replica-index": str(i),
        }
        if i == 0:
            expected[f"{LABEL}job-role"] = "master"
        assert pod.metadata.labels == expected
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("PyTorchJob", "lab", True)
        assert pod.spec.restart_policy == "OnFailure"  # SetRestartPolicy: the replica's policy
        assert not pod.spec.init_containers  # the master-waiting init container: Master only
        [container] = pod.spec.containers
        assert container.resources.limits == {"nvidia.com/gpu": "1"}
        assert [(p.name, p.container_port) for p in container.ports] == [("pytorchjob-port", 23456)]
        assert container.command == ["torchrun", "train.py"]  # never touched
        # setPodEnv + ElasticEnvVarGenerator, in this order: torchrun's PET_* defaults, min:max
        # as PET_NNODES, the rendezvous on Worker-0's Service at the pytorchjob-port, nprocPerNode
        # defaulted to "auto" (setDefaultNprocPerNode); no MASTER_ADDR/WORLD_SIZE/RANK
        assert [(e.name, e.value) for e in container.env] == [
            ("PYTHONUNBUFFERED", "1"),
            ("PET_NPROC_PER_NODE", "auto"),
            ("PET_RDZV_ENDPOINT", "lab-worker-0:23456"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_NNODES", "1:4"),
            ("PET_MAX_RESTARTS", "100"),
        ]
        assert (pod.spec.hostname, pod.spec.subdomain) == (None, None)

    # one headless Service per index, named like the pod (CreateNewService)
    assert cluster.services("lab") == ["lab-worker-0", "lab-worker-1"]
    svc = cluster.core.read_namespaced_service("lab-worker-0", NS)
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.selector[f"{LABEL}replica-index"] == "0"

    # the scale subresource: spec from Worker.replicas, status from the active count, the
    # selector of every worker (UpdateJobStatus writes replicaStatuses.Worker.selector)
    scale = cluster.custom.get_namespaced_custom_object_scale(GROUP, VERSION, NS, PLURAL, "lab")
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == (
        f"{LABEL}job-name=lab,{LABEL}operator-name=pytorchjob-controller,{LABEL}replica-type=worker"
    )


def test_replicas_up_create_the_next_index_and_down_delete_the_highest(cluster: Cluster) -> None:
    """ReconcilePods with GetPodSlices: an index in [0, replicas) without a pod is created, a pod
    with index >= replicas deleted (its Service too). The operator does not clamp to the
    elasticPolicy (maxReplicas 4 here): the product must."""
    cluster.add_nodes("scale", 4)
    cluster.create(pytorch_job("scale", "scale", replicas=2))
    cluster.wait_settled("scale", 2)
    first = cluster.uids("scale")

    cluster.set_replicas("scale", 3)
    cluster.wait_settled("scale", 3)
    assert {k: v for k, v in cluster.uids("scale").items() if k in first} == first
    env = {
        e.name: e.value for e in cluster.workers("scale")["scale-worker-2"].spec.containers[0].env
    }
    assert env["PET_NNODES"] == "1:4"  # from elasticPolicy, not from replicas

    # the scale subresource moves the same field
    cluster.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, NS, PLURAL, "scale", {"spec": {"replicas": 4}}
    )
    cluster.wait_settled("scale", 4)
    assert {k: v for k, v in cluster.uids("scale").items() if k in first} == first

    # above maxReplicas: made all the same (Pending: no free GPU in the pool)
    cluster.set_replicas("scale", 5)
    fifth = wait_for(
        lambda: cluster.workers("scale").get("scale-worker-4"), SETTLE, "scale-worker-4"
    )
    assert fifth.metadata.labels[f"{LABEL}replica-index"] == "4"
    assert fifth.status.phase == "Pending"

    # down to 2: the three highest go (two Running, one Pending); 0 and 1 stay as they were
    cluster.set_replicas("scale", 2)
    cluster.wait_settled("scale", 2)
    assert cluster.uids("scale") == first
    wait_for(
        lambda: cluster.services("scale") == ["scale-worker-0", "scale-worker-1"],
        SETTLE,
        "the Services of indices 2-4 deleted",
    )


def test_a_deleted_middle_worker_comes_back_under_its_name_once_the_old_pod_is_gone(
    cluster: Cluster,
) -> None:
    """A worker deleted in the middle (its node reclaimed) is made again under the same name, by
    index (GetPodSlices), once its old Pod object is gone: while it is Terminating it is still
    listed, counted as failed (UpdateJobReplicaStatuses: Running with a deletionTimestamp), and
    the job is Restarting (UpdateJobStatus: failed > 0, replicas > running)."""
    nodes = cluster.add_nodes("mid", 4)
    cluster.create(pytorch_job("mid", "mid", replicas=3))
    cluster.wait_settled("mid", 3)
    before = cluster.uids("mid")
    victim = "mid-worker-1"
    doomed = cluster.workers("mid")[victim].spec.node_name

    # our finalizer keeps the deleted pod Terminating until we let it go (kwok's delete stage
    # does not clear finalizers)
    cluster.core.patch_namespaced_pod(victim, NS, {"metadata": {"finalizers": [HOLD]}})
    with pod_events(cluster, "mid") as events:
        cluster.core.delete_namespaced_pod(victim, NS)
        cluster.core.patch_node(doomed, {"spec": {"unschedulable": True}})
        wait_for(
            lambda: (
                cluster.worker_status("mid").get("failed") == 1
                and cluster.condition("mid", "Restarting")
            ),
            SETTLE,
            "the Terminating worker counted as failed, the job Restarting",
        )
        status = cluster.worker_status("mid")
        assert status.get("active") == 2
        assert not cluster.condition("mid", "Running")  # filterOutCondition: one or the other
        assert cluster.uids("mid") == before  # still listed: no new pod under its name yet

        cluster.core.patch_namespaced_pod(victim, NS, {"metadata": {"finalizers": None}})
        cluster.wait_settled("mid", 3)
        after = cluster.uids("mid")
        assert after[victim] != before[victim]
        assert {k: v for k, v in after.items() if k != victim} == {
            k: v for k, v in before.items() if k != victim
        }
        gone = events.first(lambda s: s.type == "DELETED" and s.uid == before[victim])
        made = events.first(lambda s: s.name == victim and s.uid == after[victim])
        assert gone is not None and made is not None
        assert gone.rv < made.rv  # made again only after the old object was gone
    pod = cluster.workers("mid")[victim]
    assert pod.metadata.labels[f"{LABEL}replica-index"] == "1"
    assert pod.spec.node_name not in (doomed, None)
    assert pod.spec.node_name in nodes
    assert not cluster.condition("mid", "Restarting")
