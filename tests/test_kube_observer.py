"""KubeObserver over the API emulator: nodes, idle GPUs, notices, capacity types, jobs, scalers.
The tests marked BOTH run on the real kube-apiserver too; the rest need the emulator's controls
(dropped watches, compaction, request counts)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from kube_fixtures import (
    ET_API,
    FAST,
    GPU,
    NS,
    Kube,
    ai_training_job,
    container,
    node,
    now,
    pod,
    scaler,
    trainer,
    training_job,
    worker,
)
from kubernetes import client
from structlog.testing import capture_logs
from support.waiting import wait_for
from test_deploy_manifests import embedded_config_text

from autoscaler.adapters.kube.nodes import node_facts
from autoscaler.adapters.kube.resources import NODES
from autoscaler.annotations import (
    DRAINED_ANNOTATION,
    NOTICE_ANNOTATION,
    encode_drained,
    encode_notice,
)
from autoscaler.config import Prices, parse_config
from autoscaler.core import (
    Action,
    CapacityType,
    Notice,
    NoticeKind,
    PolicySet,
    ScalerKind,
    Snapshot,
    decide,
)
from autoscaler.core import Job as CoreJob

BOTH = pytest.mark.servers("emulator", "real")  # Kubernetes-facing: pinned on both


def snap(k: Kube) -> Snapshot:
    return k.observer(k.cache()).snapshot(now())


def by_name(items, attr: str = "name") -> dict:  # noqa: ANN001
    return {getattr(i, attr): i for i in items}


def unschedulable(made: dict) -> dict:
    """A pod no node will take: it stays unbound on a real cluster's scheduler too."""
    made["spec"]["nodeSelector"] = {"spot-autoscaler.test/no-such-node": "true"}
    return made


@pytest.fixture
def gpu_overhead(kube: Kube) -> Iterator[str]:
    """A RuntimeClass whose pods carry one GPU of overhead: a real server sets a pod's overhead
    from its RuntimeClass (and refuses one set without it). Cluster-wide: removed after."""
    api = kube.server.api_client()
    kube.clients.append(api)
    node_api = client.NodeV1Api(api)
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "gpu-overhead"},
        "handler": "runc",
        "overhead": {"podFixed": {GPU: "1"}},
    }
    node_api.create_runtime_class(body)
    yield "gpu-overhead"
    node_api.delete_runtime_class("gpu-overhead")


@BOTH
def test_idle_gpus_follow_the_scheduler_rules(kube: Kube, gpu_overhead: str) -> None:
    with_overhead = pod("h", "overhead", 1, overhead={GPU: "1"})
    with_overhead["spec"]["runtimeClassName"] = gpu_overhead
    kube.server.seed(
        node("limits"),
        node("init"),
        node("pending"),
        node("done"),
        node("overhead"),
        node("sidecar"),
        pod("a", "limits", 2),  # limits only: requests default to the limit
        pod("b", "limits", containers=[container(1, limits_only=False), container(1, name="x")]),
        # init containers: max(init) vs sum(app)
        pod("c", "init", containers=[container(1)], init_containers=[container(3, name="i")]),
        pod("d", "pending", 4, phase="Pending"),  # bound but not running: holds its GPUs
        unschedulable(pod("e", None, 4, phase="Pending")),  # unbound: holds nothing
        pod("f", "done", 4, phase="Succeeded"),
        pod("g", "done", 2, phase="Failed"),
        with_overhead,
        # a sidecar (restartable init container) runs next to the app: it adds up
        pod(
            "i",
            "sidecar",
            containers=[container(2)],
            init_containers=[
                container(1, name="s", restartPolicy="Always"),
                container(2, name="j"),
            ],
        ),
        pod(
            "cpu-only",
            "limits",
            0,
            containers=[container(name="c", resources={"requests": {"cpu": "2"}})],
        ),
    )
    nodes = by_name(snap(kube).nodes)
    assert {n: nodes[n].gpus_requested for n in nodes} == {
        "limits": 4,
        "init": 3,
        "pending": 4,
        "done": 0,
        "overhead": 2,
        "sidecar": 3,
    }
    assert nodes["limits"].idle_gpus == 4 and nodes["limits"].gpus_allocatable == 8


@BOTH
def test_a_scale_out_before_its_pods_holds_their_room(kube: Kube) -> None:
    """bert's ScaleOut of 2 exists, its pods do not yet (et-operator makes them, then records
    status.addPods): the two idle GPUs on b are theirs, and gpt is not given them (the fault
    suite's seed 12: both ScaleOuts' pods Pending, one rolled back at its timeout). Once one is
    made (unbound), one GPU is still held."""
    out = scaler("ScaleOut", "bert-out-1", "bert", pods=["bert-worker-2", "bert-worker-3"])
    kube.server.seed(
        node("a", gpus=3),
        node("b", gpus=2),
        training_job("bert", max_workers=8),
        training_job("gpt", max_workers=8),
        worker("bert", 0, "a"),
        worker("bert", 1, "a"),
        worker("gpt", 0, "a"),
        out,
    )
    jobs = {j.name: j for j in snap(kube).jobs}
    assert jobs["bert"].scaler is not None and jobs["bert"].scaler.unborn == 2
    grown = [d for d in decide(snap(kube), kube.config.policy_set, now()) if d.job == f"{NS}/gpt"]
    assert all(d.action is not Action.SCALE_OUT for d in grown), grown

    kube.server.seed(worker("bert", 2, None, phase="Pending"))
    kube.server.patch(
        "ScaleOut", "bert-out-1", {"status": {"addPods": ["bert-worker-2", "bert-worker-3"]}}, NS
    )

    def unborn() -> int | None:
        bert = next(j for j in snap(kube).jobs if j.name == "bert")
        return bert.scaler.unborn if bert.scaler is not None else None

    wait_for(lambda: unborn() == 1, 10, "one of bert's pods made")


@BOTH
def test_a_rolled_back_scale_out_says_how_many_of_its_workers_ran(kube: Kube) -> None:
    """et-operator's failed ScaleOut keeps the Running count it failed with
    (status.replicaStatuses.Worker.active): the job's `failed_with`, until a later one succeeds."""
    t0 = now() - timedelta(minutes=10)
    failed = scaler("ScaleOut", "bert-out-1", "bert", outcome="ScaleFailed", at=t0)
    failed["status"]["replicaStatuses"] = {"Worker": {"active": 2}}
    kube.server.seed(node("a"), training_job("bert", max_workers=8), worker("bert", 0, "a"), failed)
    [bert] = snap(kube).jobs
    assert bert.failed_with == 2
    later = scaler(
        "ScaleOut", "bert-out-2", "bert", outcome="ScaleSucceeded", at=t0 + timedelta(minutes=5)
    )
    kube.server.seed(later)
    wait_for(lambda: snap(kube).jobs[0].failed_with is None, 10, "the later success seen")


@BOTH
def test_node_schedulability_and_kubernetes_side_notices(kube: Kube) -> None:
    nth = {
        "key": "aws-node-termination-handler/spot-itn",
        "value": "evt-1",
        "effect": "NoSchedule",
        "timeAdded": "2026-03-02T12:00:00Z",
    }
    persisted = Notice(
        "annotated",
        NoticeKind.REBALANCE,
        "aws-sqs",
        "m-7",
        received_at=now() - timedelta(seconds=5),
    )
    expired = {
        "type": "InstanceExpired",
        "status": "True",
        "lastTransitionTime": "2026-03-02T12:00:00Z",
    }
    kube.server.seed(
        node("ok"),
        node("cordoned", unschedulable=True),
        node("notready", ready=False),
        node("nth", taints=[nth]),
        node(
            "gpu-taint",  # GPU nodes often carry this one: it is no notice
            taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        ),
        node("annotated", annotations={NOTICE_ANNOTATION: encode_notice(persisted)}),
        node("expired", conditions=[expired]),
        node("garbage", annotations={NOTICE_ANNOTATION: "{not json"}),
    )
    kube.board.post(Notice("ok", NoticeKind.INTERRUPTION, "alibaba-ecs", "r-1", received_at=now()))
    s = snap(kube)
    nodes = by_name(s.nodes)
    unschedulable = {n for n, v in nodes.items() if not v.schedulable}
    assert unschedulable == {"cordoned", "notready", "nth", "expired"}
    notices = {(n.node, n.kind, n.source) for n in s.notices}
    assert notices == {
        ("nth", NoticeKind.INTERRUPTION, "k8s-taint"),
        ("annotated", NoticeKind.REBALANCE, "aws-sqs"),
        ("expired", NoticeKind.INTERRUPTION, "k8s-condition"),
        ("ok", NoticeKind.INTERRUPTION, "alibaba-ecs"),
        # guard_evictions (default): a drain waits on our budget, so its cordon must make us act
        ("cordoned", NoticeKind.MAINTENANCE, "k8s-cordon"),
    }
    taint_notice = next(n for n in s.notices if n.source == "k8s-taint")
    assert taint_notice.id.endswith("evt-1") and taint_notice.received_at is not None


@BOTH
@pytest.mark.parametrize(
    "kube", [{"cordon_is_notice": True, "guard_evictions": False}], indirect=True
)
def test_cordon_counts_as_a_notice_when_configured(kube: Kube) -> None:
    kube.server.seed(node("cordoned", unschedulable=True))
    assert [(n.node, n.kind) for n in snap(kube).notices] == [("cordoned", NoticeKind.MAINTENANCE)]


@BOTH
@pytest.mark.parametrize("kube", [{"guard_evictions": False}], indirect=True)
def test_without_eviction_guards_a_cordon_alone_is_no_notice(kube: Kube) -> None:
    kube.server.seed(node("cordoned", unschedulable=True))
    assert snap(kube).notices == ()


@BOTH
@pytest.mark.parametrize(
    "kube", [{"capacity_type_override": {"reserved-*": "on-demand"}}], indirect=True
)
def test_capacity_types_and_prices_from_labels(kube: Kube) -> None:
    def labelled(name: str, labels: dict[str, str]) -> dict:
        n = node(name, labels=labels)
        n["metadata"]["labels"].pop("karpenter.sh/capacity-type")
        return n

    kube.server.seed(
        node("karpenter-spot"),
        node("karpenter-od", labels={"karpenter.sh/capacity-type": "on-demand"}),
        labelled("eks", {"eks.amazonaws.com/capacityType": "SPOT"}),
        labelled("eks-od", {"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
        labelled("ack", {"node.alibabacloud.com/spot-strategy": "SpotAsPriceGo"}),
        labelled("ack-od", {"node.alibabacloud.com/spot-strategy": "NoSpot"}),
        labelled("gke", {"cloud.google.com/gke-spot": "true"}),
        labelled("aks", {"kubernetes.azure.com/scalesetpriority": "spot"}),
        labelled("aks-od", {"kubernetes.azure.com/scalesetpriority": "regular"}),
        labelled("plain", {}),
        node("reserved-1"),  # spot label, but the override wins
    )
    kube.price_book.update({("p3.16xlarge", "us-east-1a"): 6.5}, now())
    nodes = by_name(snap(kube).nodes)
    spot = {n for n, v in nodes.items() if v.capacity_type is CapacityType.SPOT}
    assert spot == {"karpenter-spot", "eks", "ack", "gke", "aks"}
    assert nodes["karpenter-spot"].price_per_hour == 6.5  # live spot price by type and zone
    assert nodes["plain"].price_per_hour == 24.48  # on-demand: from the config
    assert nodes["karpenter-spot"].zone == "us-east-1a"
    assert nodes["karpenter-spot"].instance_type == "p3.16xlarge"


@BOTH
def test_shared_gpu_nodes_count_memory_as_gpu_equivalents(kube: Kube) -> None:
    shared = node(
        "share",
        0,
        labels={"ack.node.gpu.schedule": "share"},
        allocatable={"aliyun.com/gpu-mem": "64", "aliyun.com/gpu-count": "4"},
    )
    limits = {"limits": {"aliyun.com/gpu-mem": "24"}}
    mem_pod = pod("p", "share", 0, containers=[container(name="m", resources=limits)])
    job = training_job("small", gpus=0)
    template = job["spec"]["etReplicaSpecs"]["worker"]["template"]
    template["spec"]["containers"][0]["resources"] = limits
    kube.server.seed(node("cpu", 0), shared, mem_pod, job)
    s = snap(kube)
    nodes = by_name(s.nodes)
    assert set(nodes) == {"share"}  # nodes without GPUs are not GpuNodes
    assert (nodes["share"].gpus_allocatable, nodes["share"].gpus_requested) == (4, 1.5)
    assert s.jobs[0].gpus_per_worker == 1.5  # 24 GiB of 16 GiB GPUs


def test_only_shared_gpu_nodes_are_marked_shared(kube: Kube) -> None:
    shared = node(
        "share",
        0,
        labels={"ack.node.gpu.schedule": "share"},
        allocatable={"aliyun.com/gpu-mem": "64", "aliyun.com/gpu-count": "4"},
    )
    assert node_facts(shared, kube.settings).shared_gpu
    assert not node_facts(node("whole"), kube.settings).shared_gpu


@BOTH
def test_shared_gpu_nodes_reach_the_core_marked(kube: Kube) -> None:
    # every ACK sharing mode of ack.node.gpu.schedule (cgpu, core_mem, share, mps) is shared
    modes = ("cgpu", "core_mem", "share", "mps")
    kube.server.seed(
        node("whole"),
        *(
            node(
                mode.replace("_", "-"),
                0,
                labels={"ack.node.gpu.schedule": mode},
                allocatable={"aliyun.com/gpu-mem": "64", "aliyun.com/gpu-count": "4"},
            )
            for mode in modes
        ),
    )
    nodes = by_name(snap(kube).nodes)
    assert all(nodes[m.replace("_", "-")].shared_gpu for m in modes)
    assert not nodes["whole"].shared_gpu


def unknown_type_nodes(tag: str) -> list[dict]:
    """An 8-GPU on-demand node and a 1-GPU spot node, of instance types no price table lists
    (named after `tag`: each type is logged once per process)."""
    return [
        node(
            "od-8",
            8,
            labels={
                "karpenter.sh/capacity-type": "on-demand",
                "node.kubernetes.io/instance-type": f"x-od-{tag}.8gpu",
            },
        ),
        node("spot-1", 1, labels={"node.kubernetes.io/instance-type": f"x-spot-{tag}.1gpu"}),
    ]


@BOTH
def test_unknown_types_with_the_shipped_prices_the_spot_node_gets_the_worker_first(
    kube: Kube,
) -> None:
    # the deploy ConfigMap's prices (it used to give every unknown type one per-node figure,
    # 3.06/8 per GPU-hour for the on-demand node against 0.91 for the spot node)
    shipped = parse_config(embedded_config_text(), "configmap.yaml").prices
    kube.config = kube.config.model_copy(update={"prices": shipped})
    kube.server.seed(*unknown_type_nodes("shipped"))
    observed = snap(kube)
    idle = {n.name: now() - timedelta(hours=1) for n in observed.nodes}
    bert = CoreJob("ml", "bert", 0, 1)
    world = replace(observed, jobs=(bert,), idle_since=idle)
    decisions = decide(world, PolicySet(policies=[FAST]), now())
    [out] = [d for d in decisions if d.action is Action.SCALE_OUT]
    assert out.nodes == ("spot-1",)


@BOTH
def test_an_unknown_type_is_logged_once_not_every_snapshot(kube: Kube) -> None:
    tag = f"once-{type(kube.server).__name__.lower()}"  # a type each server run logs anew
    kube.server.seed(*unknown_type_nodes(tag))
    observer = kube.observer(kube.cache())
    with capture_logs() as logs:
        for _ in range(3):
            observer.snapshot(now())
    warned = sorted(e["instance_type"] for e in logs if e["event"] == "instance_type_unpriced")
    assert warned == [f"x-od-{tag}.8gpu", f"x-spot-{tag}.1gpu"]


@BOTH
def test_unknown_types_are_priced_per_gpu_hour_times_their_gpus(kube: Kube) -> None:
    kube.config = kube.config.model_copy(
        update={
            "prices": Prices(default_spot_per_gpu_hour=0.91, default_on_demand_per_gpu_hour=3.06)
        }
    )
    kube.server.seed(*unknown_type_nodes("priced"))
    nodes = by_name(snap(kube).nodes)
    assert nodes["od-8"].price_per_gpu_hour == pytest.approx(3.06)
    assert nodes["spot-1"].price_per_gpu_hour == pytest.approx(0.91)


@BOTH
def test_training_jobs_become_core_jobs(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        node("b"),
        training_job(
            "bert",
            min_workers=2,
            max_workers=8,
            gpus=2,
            labels={"spot-autoscaler.io/policy": "default", "spot-autoscaler.io/priority": "5"},
            annotations={DRAINED_ANNOTATION: encode_drained({"bert-worker-1"})},
        ),
        training_job("gpt", min_workers=None, max_workers=None, replicas=3, gpus=0, slots=4),
        training_job("old", phase="Succeeded"),
        worker("bert", 0, "a", gpus=2),
        worker("bert", 10, "b", gpus=2),
        worker("bert", 1, "b", phase="Pending", gpus=2),  # bound, still starting
        unschedulable(worker("bert", 2, None, phase="Pending", gpus=2)),  # not scheduled yet
        worker("bert", 3, "a", phase="Failed", gpus=2),  # gone from the job
        pod(
            "bert-launcher",
            "a",
            0,
            labels={"training-job-name": "bert", "training-job-role": "launcher"},
        ),
        # no operator labels: the controller reference and the name say it is a worker
        pod(
            "bert-worker-11",
            "a",
            2,
            owner={
                "apiVersion": ET_API,
                "kind": "TrainingJob",
                "name": "bert",
                "uid": "u",
                "controller": True,
            },
        ),
    )
    jobs = by_name(snap(kube).jobs)
    assert set(jobs) == {"bert", "gpt"}
    bert = jobs["bert"]
    assert (bert.min_workers, bert.max_workers, bert.gpus_per_worker) == (2, 8, 2)
    assert bert.backend == "et-operator" and bert.running and bert.scaler is None
    assert [(w.pod, w.node, w.index, w.pending) for w in bert.workers] == [
        ("bert-worker-0", "a", 0, False),
        ("bert-worker-1", "b", 1, True),
        ("bert-worker-2", None, 2, True),
        ("bert-worker-10", "b", 10, False),
        ("bert-worker-11", "a", 11, False),
    ]
    assert bert.workers[0].host == "bert-worker-0"
    assert bert.priority == 5 and bert.labels["spot-autoscaler.io/policy"] == "default"
    assert bert.drained_hosts == {"bert-worker-1"}
    gpt = jobs["gpt"]
    assert (gpt.min_workers, gpt.max_workers, gpt.gpus_per_worker) == (3, 3, 4)  # replicas, slots


@BOTH
def test_scalers_in_flight_finished_and_failed(kube: Kube) -> None:
    t0 = now() - timedelta(minutes=30)
    kube.server.seed(
        training_job("a"),
        training_job("b"),
        training_job("c", current_scaler="ScaleIn:ml/c-in-x"),
        training_job("d", phase="Scaling", current_scaler="ScaleOut:ml/d-out-1"),
        scaler("ScaleOut", "a-out-1", "a", outcome="ScaleFailed", at=t0),
        scaler(
            "ScaleIn",
            "a-in-1",
            "a",
            outcome="ScaleSucceeded",
            at=t0 + timedelta(minutes=5),
            pods=["a-worker-3"],
        ),
        scaler("ScaleOut", "b-out-1", "b", at=t0),
        scaler("ScaleOut", "b-out-2", "b", at=t0 + timedelta(seconds=5)),  # newest runs first
        scaler("ScaleOut", "d-out-1", "d", outcome="ScaleSucceeded", at=t0),  # stale pointer
    )
    jobs = by_name(snap(kube).jobs)
    a = jobs["a"]
    assert a.scaler is None
    # the failed ScaleOut starts the backoff; neither it nor the ScaleIn starts the cooldown
    assert a.last_failed_scale_out_at == t0.replace(microsecond=0) and a.last_scale_out_at is None
    assert jobs["b"].scaler is not None and jobs["b"].scaler.name == "b-out-2"
    # status.currentScaler names a scaler this cache does not hold: still in flight
    assert jobs["c"].scaler is not None and jobs["c"].scaler.kind is ScalerKind.SCALE_IN
    assert jobs["d"].scaler is None and not jobs["d"].running


@BOTH
def test_cce_jobs_only_when_fault_tolerant(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        ai_training_job("ernie", replicas=2, min_workers=1, max_workers=6),
        ai_training_job("rigid", fault_tolerant=False),
        ai_training_job("moving", phase="Scaling", replicas=3),
        trainer("ernie", 0, "a"),
        trainer("ernie", 1, "a"),
        trainer("moving", 0, "a"),
    )
    jobs = by_name(snap(kube).jobs)
    assert set(jobs) == {"ernie", "moving"}
    ernie = jobs["ernie"]
    assert ernie.backend == "cce" and (ernie.min_workers, ernie.max_workers) == (1, 6)
    assert [w.pod for w in ernie.workers] == ["ernie-trainer-0", "ernie-trainer-1"]
    assert jobs["moving"].scaler is not None and jobs["moving"].scaler.kind is ScalerKind.SCALE_OUT


@pytest.mark.parametrize("kube", [{"namespaces": [NS], "label_selector": "team=ml"}], indirect=True)
def test_namespaces_and_label_selector_scope_jobs_but_not_pods(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        training_job("mine", labels={"team": "ml"}),
        training_job("unlabelled"),
        training_job("elsewhere", namespace="other", labels={"team": "ml"}),
        pod("someone-else", "a", 3, namespace="other"),  # still uses GPUs on a shared node
    )
    s = snap(kube)
    assert [j.name for j in s.jobs] == ["mine"]
    assert s.nodes[0].gpus_requested == 3


@BOTH
def test_node_for_instance_reads_provider_ids(kube: Kube) -> None:
    kube.server.seed(
        node("ip-10-0-0-1.ec2.internal", provider_id="aws:///us-east-1a/i-0abc"),
        node("cn-hangzhou.10.0.0.2", provider_id="cn-hangzhou.i-bp1xyz"),
    )
    cache = kube.cache()
    assert cache.node_for_instance("i-0abc") == "ip-10-0-0-1.ec2.internal"
    assert cache.node_for_instance("i-bp1xyz") == "cn-hangzhou.10.0.0.2"
    assert cache.node_for_instance("i-missing") is None


@BOTH
def test_workers_lost_with_their_node_while_in_discovery_are_remembered(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        node("b"),
        node("c"),
        training_job(
            "bert",
            max_workers=8,
            annotations={DRAINED_ANNOTATION: encode_drained({"bert-worker-2"})},
        ),
        worker("bert", 0, "a"),
        worker("bert", 1, "b"),
        worker("bert", 2, "c"),
    )
    cache = kube.cache()
    observer = kube.observer(cache)
    assert by_name(observer.snapshot(now()).jobs)["bert"].failed_hosts == frozenset()
    # b dies with worker-1 still in discovery; c dies too, but worker-2 had been drained first
    for name in ("b", "c"):
        kube.server.patch(
            "nodes", name, {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
        )
    job = wait_for(
        lambda: (j := by_name(observer.snapshot(now()).jobs)["bert"]).failed_hosts and j,
        what="the lost worker",
    )
    assert job.failed_hosts == {"bert-worker-1"}


@BOTH
# --- one observer over many snapshots: what it memoises follows every change -------------------
def test_pod_node_and_job_changes_reach_the_next_snapshot(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        node("b"),
        training_job("bert", max_workers=8),
        worker("bert", 0, "a"),
        worker("bert", 1, "b", phase="Pending"),
        pod("cpu", "b", 0),
    )
    observer = kube.observer(kube.cache())
    before = observer.snapshot(now())
    assert {n.name: n.gpus_requested for n in before.nodes} == {"a": 1, "b": 1}
    nth = {"key": "aws-node-termination-handler/spot-itn", "value": "e", "effect": "NoSchedule"}
    kube.server.patch("Node", "a", {"spec": {"taints": [nth]}})
    kube.server.patch("Pod", "bert-worker-1", {"status": {"phase": "Running"}}, NS)
    kube.server.delete("Pod", "bert-worker-0", NS)
    kube.server.seed(worker("bert", 2, "b", gpus=2))
    drained = {"metadata": {"annotations": {DRAINED_ANNOTATION: encode_drained({"x"})}}}
    kube.server.patch("TrainingJob", "bert", drained, NS)

    def caught_up() -> Snapshot | None:
        s = observer.snapshot(now())
        bert = s.jobs[0]
        workers = [(w.pod, w.node, w.pending) for w in bert.workers]
        nodes = {n.name: (n.gpus_requested, n.schedulable) for n in s.nodes}
        done = (
            nodes == {"a": (0, False), "b": (3, True)}
            and bert.drained_hosts == {"x"}
            and workers == [("bert-worker-1", "b", False), ("bert-worker-2", "b", False)]
        )
        return s if done else None

    after = wait_for(caught_up, what="every change in a snapshot")
    assert [(n.node, n.source) for n in after.notices] == [("a", "k8s-taint")]


@BOTH
def test_the_fast_path_view_holds_the_noticed_jobs_as_the_whole_one_does(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        node("b"),
        node("c"),
        training_job("bert", max_workers=8),
        training_job("gpt", max_workers=8),
        training_job("t5", max_workers=8),
        worker("bert", 0, "a"),
        worker("gpt", 0, "b"),
        worker("t5", 0, "b"),
        worker("t5", 1, "c"),
    )
    observer = kube.observer(kube.cache())
    assert observer.noticed(now()).jobs == ()  # no notice: no job to read
    kube.board.post(Notice("c", NoticeKind.INTERRUPTION, "aws-sqs", "m-1", received_at=now()))
    fast = observer.noticed(now())
    whole = observer.snapshot(now())
    assert [j.name for j in fast.jobs] == ["t5"]
    assert fast.jobs[0] == by_name(whole.jobs)["t5"]
    assert (fast.nodes, fast.notices, fast.stale) == (whole.nodes, whole.notices, whole.stale)
    assert sorted(j.name for j in whole.jobs) == ["bert", "gpt", "t5"]  # the memo kept them all
    assert sorted(j.name for j in observer.snapshot(now()).jobs) == ["bert", "gpt", "t5"]


@BOTH
def test_prices_and_board_notices_are_read_afresh_and_unchanged_jobs_reused(kube: Kube) -> None:
    kube.server.seed(node("a"), training_job("bert"), worker("bert", 0, "a"))
    observer = kube.observer(kube.cache())
    first = observer.snapshot(now())
    assert first.nodes[0].price_per_hour == 7.34 and first.notices == ()
    kube.price_book.update({("p3.16xlarge", "us-east-1a"): 5.5}, now())
    kube.board.post(Notice("a", NoticeKind.INTERRUPTION, "aws-sqs", "m-1", received_at=now()))
    second = observer.snapshot(now())  # no object changed: only what is not cached did
    assert second.nodes[0].price_per_hour == 5.5
    assert [n.id for n in second.notices] == ["m-1"]
    assert second.jobs[0] is first.jobs[0]  # nothing of the job changed: built once


@BOTH
def test_workers_on_a_deleted_node_while_in_discovery_are_remembered(kube: Kube) -> None:
    kube.server.seed(
        node("a"), node("b"), training_job("bert"), worker("bert", 0, "a"), worker("bert", 1, "b")
    )
    observer = kube.observer(kube.cache())
    assert observer.snapshot(now()).jobs[0].failed_hosts == frozenset()
    kube.server.delete("Node", "b")  # gone at once; its pod object lingers a while
    job = wait_for(
        lambda: (j := observer.snapshot(now()).jobs[0]).failed_hosts and j, what="the lost worker"
    )
    assert job.failed_hosts == {"bert-worker-1"}


def test_a_relist_reaches_the_next_snapshot(kube: Kube) -> None:
    kube.server.seed(
        node("a"), training_job("bert"), worker("bert", 0, "a"), worker("bert", 1, "a")
    )
    observer = kube.observer(kube.cache())
    assert observer.snapshot(now()).nodes[0].gpus_requested == 2
    kube.server.wait_until(lambda: kube.server.watch_count >= 6)
    kube.server.latency = 0.2  # the re-watch arrives after the changes below
    kube.server.drop_watches()
    kube.server.delete("Pod", "bert-worker-1", NS)
    kube.server.seed(worker("bert", 5, "a", gpus=3))
    kube.server.compact()  # resuming is 410 Gone: the pods are listed again
    s = wait_for(
        lambda: (s := observer.snapshot(now())).nodes[0].gpus_requested == 4 and s,
        what="the relisted pods",
    )
    assert [w.pod for w in s.jobs[0].workers] == ["bert-worker-0", "bert-worker-5"]
    assert kube.server.count("GET", "pods", watch=False) >= 2


@BOTH
def test_a_refill_to_min_does_not_start_the_cooldown(kube: Kube) -> None:
    t0 = now() - timedelta(minutes=1)
    refill = scaler("ScaleOut", "a-out-1", "a", outcome="ScaleSucceeded", at=t0)
    refill["metadata"]["annotations"] = {"spot-autoscaler.io/reason": "below_min"}
    growth = scaler("ScaleOut", "b-out-1", "b", outcome="ScaleSucceeded", at=t0)
    growth["metadata"]["annotations"] = {"spot-autoscaler.io/reason": "idle_capacity"}
    kube.server.seed(training_job("a"), training_job("b"), refill, growth)
    jobs = by_name(snap(kube).jobs)
    assert jobs["a"].last_scale_out_at is None
    assert jobs["b"].last_scale_out_at is not None


@BOTH
def test_karpenter_v1_and_pre_v1_disruption_taints_are_notices(kube: Kube) -> None:
    """v1's taint on a Node not being deleted is the disruption controller's (consolidation,
    drift: a voluntary disruption); on a deleting Node it is a termination (tests/
    test_real_karpenter*.py see both from the real Karpenter)."""
    v1 = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    pre_v1 = {"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"}
    kube.server.seed(node("v1", taints=[v1]), node("v1beta1", taints=[pre_v1]))
    notices = {(n.node, n.kind) for n in snap(kube).notices}
    assert notices == {("v1", NoticeKind.DISRUPTION), ("v1beta1", NoticeKind.INTERRUPTION)}


@BOTH
def test_a_jobs_progress_annotation_and_start_reach_the_core_with_a_measured_pace(
    kube: Kube,
) -> None:
    from autoscaler.annotations import PROGRESS_ANNOTATION

    def bert(progress: str) -> dict:
        return training_job("bert", annotations={PROGRESS_ANNOTATION: progress})

    kube.server.seed(node("a"), bert("0.10"), worker("bert", 0, "a"), worker("bert", 1, "a"))
    observer = kube.observer(kube.cache())
    first = observer.snapshot(now()).jobs[0]
    assert first.progress == pytest.approx(0.10) and first.progress_rate is None
    assert first.started_at is not None and first.started_at <= now()
    progress = {"metadata": {"annotations": {PROGRESS_ANNOTATION: "1200/10000"}}}
    kube.server.patch("TrainingJob", "bert", progress, NS)  # 2% more by two workers in 10 min
    later = now() + timedelta(minutes=10)
    wait_for(lambda: observer.snapshot(later).jobs[0].progress == pytest.approx(0.12))
    assert observer.snapshot(later).jobs[0].progress_rate == pytest.approx(0.06, rel=1e-3)
    garbage = {"metadata": {"annotations": {PROGRESS_ANNOTATION: "garbage"}}}
    kube.server.patch("TrainingJob", "bert", garbage, NS)
    wait_for(lambda: observer.snapshot(later).jobs[0].progress is None)


@BOTH
def test_unchanged_nodes_keep_their_objects_and_a_change_replaces_only_its_node(
    kube: Kube,
) -> None:
    """The node table reads a node again only when it or its pods changed (nodetable.py): the
    core's memo relies on an unchanged node being the same object."""
    kube.server.seed(node("a"), node("b"), training_job("bert"), worker("bert", 0, "a"))
    cache = kube.cache()
    observer = kube.observer(cache)
    first = observer.snapshot(now())
    assert observer.snapshot(now()).nodes is first.nodes  # nothing changed: the very tuple
    version = cache.get(NODES, "a")["metadata"]["resourceVersion"]
    heartbeat = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "hb"}]}}
    kube.server.patch("Node", "a", heartbeat)  # a new object, nothing read from it changed
    kube.server.seed(worker("bert", 1, "b"))
    wait_for(
        lambda: cache.get(NODES, "a")["metadata"]["resourceVersion"] != version,
        what="the patched node in the cache",
    )
    second = wait_for(
        lambda: (s := observer.snapshot(now())).nodes[1].gpus_requested == 1 and s,
        what="the new worker's GPU on b",
    )
    a, b = by_name(first.nodes), by_name(second.nodes)
    assert b["a"] is a["a"]
    assert b["b"] is not a["b"] and a["b"].gpus_requested == 0
