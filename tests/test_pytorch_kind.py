"""The PyTorchJob kind's reading of its objects, on plain dicts: bounds from elasticPolicy (as
training-operator v1.9.3 defaults them), why a job cannot be scaled, which victims a replicas
decrease may take, the scale in flight, and the checkpoint hook's annotation."""

from __future__ import annotations

from typing import Any

import pytest

from autoscaler.adapters.kube.kinds import pytorch
from autoscaler.adapters.kube.signal import hook_target
from autoscaler.core.model import ScalerKind, Worker
from autoscaler.notice import DEFAULT_HOOK_PATH


def pytorch_job(replicas: int = 3, elastic: dict[str, Any] | None = None, **worker: Any) -> dict:
    spec: dict[str, Any] = {
        "pytorchReplicaSpecs": {"Worker": {"replicas": replicas, "template": {}, **worker}}
    }
    if elastic is not None:
        spec["elasticPolicy"] = elastic
    return {"metadata": {"name": "bert", "namespace": "ml"}, "spec": spec}


@pytest.mark.parametrize(
    ("elastic", "bounds"),
    [
        ({"minReplicas": 1, "maxReplicas": 4}, (1, 4)),
        ({"minReplicas": 2}, (2, 2)),  # setElasticPolicy: one bound alone stands for both
        ({"maxReplicas": 5}, (5, 5)),
        ({}, (3, 3)),  # neither: the replicas
    ],
)
def test_bounds_come_from_elastic_policy_as_the_operator_defaults_them(
    elastic: dict, bounds: tuple[int, int]
) -> None:
    assert pytorch._worker_spec(pytorch_job(3, elastic)).bounds() == bounds


def test_jobs_the_operator_or_torchrun_would_break_are_unscalable_with_a_reason() -> None:
    assert pytorch._unscalable(pytorch_job(3, {"minReplicas": 1, "maxReplicas": 4})) == ""
    assert "no spec.elasticPolicy" in pytorch._unscalable(pytorch_job(3))
    hpa = pytorch_job(3, {"minReplicas": 1, "maxReplicas": 4, "metrics": [{"type": "Resource"}]})
    assert "HPA" in pytorch._unscalable(hpa)
    never = pytorch_job(3, {"minReplicas": 1, "maxReplicas": 4}, restartPolicy="Never")
    assert "restartPolicy Never" in pytorch._unscalable(never)


def test_replicas_drop_only_past_victims_at_the_top_and_never_below_min() -> None:
    spec = pytorch._worker_spec(pytorch_job(4, {"minReplicas": 1, "maxReplicas": 4}))
    top, middle = "bert-worker-3", "bert-worker-1"
    assert pytorch._replicas_after(spec, (top,)) == 3
    assert pytorch._replicas_after(spec, (middle,)) == 4  # made again: the replacement
    assert pytorch._replicas_after(spec, (middle, top)) == 3
    assert pytorch._replicas_after(spec, ("bert-worker-2", top)) == 2
    at_min = pytorch._worker_spec(pytorch_job(2, {"minReplicas": 2, "maxReplicas": 4}))
    assert pytorch._replicas_after(at_min, ("bert-worker-1",)) == 2  # torchrun waits for 2


def test_in_flight_is_what_the_pods_do_not_match_yet() -> None:
    job = pytorch_job(3, {"minReplicas": 1, "maxReplicas": 4})

    def w(i: int, terminating: bool = False) -> Worker:
        name = f"bert-worker-{i}"
        return Worker(name, "n", name, i, terminating=terminating)

    assert pytorch.in_flight(job, (w(0), w(1), w(2))) is None
    growing = pytorch.in_flight(job, (w(0),))
    # the operator has two to make: their room is held (core/decide.py `_idle_capacity`)
    assert growing.kind is ScalerKind.SCALE_OUT and growing.unborn == 2
    # a deleted middle index counts until the operator has made it again
    again = pytorch.in_flight(job, (w(0), w(1, True), w(2)))
    assert again.kind is ScalerKind.SCALE_OUT and again.unborn == 1
    going = pytorch.in_flight(job, (w(0), w(1), w(2), w(3)))
    assert going.kind is ScalerKind.SCALE_IN and going.pods == ("bert-worker-3",)


def test_workers_are_recognised_by_owner_and_replica_type() -> None:
    owned = {"ownerReferences": [{"kind": "PyTorchJob", "name": "bert", "controller": True}]}
    labels = {pytorch.JOB_LABEL: "bert", pytorch.TYPE_LABEL: "worker"}
    assert pytorch._worker_of(owned, "bert-worker-0", labels) == "bert"
    master = {**labels, pytorch.TYPE_LABEL: "master"}
    assert pytorch._worker_of(owned, "bert-master-0", master) is None
    mpi = {"ownerReferences": [{"kind": "MPIJob", "name": "bert", "controller": True}]}
    assert pytorch._worker_of(mpi, "bert-worker-0", labels) is None


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("8099", (8099, DEFAULT_HOOK_PATH)),
        ("8099/ckpt", (8099, "/ckpt")),
        (" 80/a/b?x=1 ", (80, "/a/b?x=1")),
        ("0", None),
        ("70000", None),
        ("http", None),
        ("8099 /x", None),
        ("", None),
    ],
)
def test_the_hook_annotation_is_port_or_port_and_path(value: str, target: Any) -> None:
    assert hook_target(value) == target
