"""A namespace, kwok GPU nodes and PyTorchJobs on the real control plane with the real
training-operator v1.9.3 (support/control_plane.py, `start_training_operator`), for the tests of
the operator itself (test_real_training_operator.py) and of the product driving it
(test_real_pytorchjob.py).

Isolation in a session shared with other real-cluster tests: one namespace of our own, our nodes
carry a taint that only our pods tolerate and a pool label our pods select, and each test deletes
its PyTorchJobs, their pods and Services, and its nodes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from support.control_plane import ControlPlane
from support.real_namespace import POOL, SETTLE, RealNamespace, isolated
from support.waiting import wait_for

Obj = dict[str, Any]
NS = "pytorch-e2e"
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
ISOLATED = isolated(NS)
LABEL = "training.kubeflow.org/"
WORKER_SELECTOR = f"{LABEL}job-name={{}},{LABEL}replica-type=worker"
MANAGED = "spot-autoscaler.io/enabled"  # the label selector of the product's test config
POLICY_LABEL = "spot-autoscaler.io/policy"


# --- a test's cluster: namespace, nodes, jobs; cleaned up after -------------------------------
@dataclass
class Cluster(RealNamespace):
    def set_replicas(self, name: str, replicas: int) -> None:
        self.patch_job(name, {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": replicas}}}})

    def worker_status(self, name: str) -> Obj:
        status = self.job(name).get("status") or {}
        worker: Obj = (status.get("replicaStatuses") or {}).get("Worker") or {}
        return worker

    def condition(self, name: str, kind: str) -> bool:
        conditions = (self.job(name).get("status") or {}).get("conditions") or []
        return any(c["type"] == kind and c["status"] == "True" for c in conditions)

    def workers(self, job: str) -> dict[str, client.V1Pod]:
        pods = self.core.list_namespaced_pod(NS, label_selector=WORKER_SELECTOR.format(job))
        return {p.metadata.name: p for p in pods.items}

    def uids(self, job: str) -> dict[str, str]:
        return {name: pod.metadata.uid for name, pod in self.workers(job).items()}

    def services(self, job: str) -> list[str]:
        found = self.core.list_namespaced_service(NS, label_selector=WORKER_SELECTOR.format(job))
        return sorted(s.metadata.name for s in found.items)

    def settled(self, job: str, count: int) -> bool:
        """Exactly workers 0..count-1, all Running and none Terminating, and the operator's
        status counting them (`UpdateJobReplicaStatuses`) with the job Running."""
        pods = self.workers(job)
        return (
            sorted(pods) == sorted(f"{job}-worker-{i}" for i in range(count))
            and all(
                p.status.phase == "Running" and not p.metadata.deletion_timestamp
                for p in pods.values()
            )
            and self.worker_status(job).get("active") == count
            and self.condition(job, "Running")
        )

    def wait_settled(self, job: str, count: int) -> None:
        wait_for(lambda: self.settled(job, count), SETTLE, f"{job}: {count} workers Running")

    def cleanup(self) -> None:
        for name in self.jobs:
            with contextlib.suppress(ApiException):
                self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, NS, PLURAL, name, propagation_policy="Background"
                )

        # The garbage collector picks up a CRD installed after its start only at its next
        # discovery resync (up to 30 s later): the pods and Services are deleted here.
        def gone() -> bool:
            pods = self.core.list_namespaced_pod(NS).items
            for pod in pods:
                if pod.metadata.finalizers:
                    with contextlib.suppress(ApiException):
                        self.core.patch_namespaced_pod(
                            pod.metadata.name, NS, {"metadata": {"finalizers": None}}
                        )
                if not pod.metadata.deletion_timestamp:
                    with contextlib.suppress(ApiException):
                        self.core.delete_namespaced_pod(pod.metadata.name, NS)
            for svc in self.core.list_namespaced_service(NS).items:
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_service(svc.metadata.name, NS)
            return not pods

        wait_for(gone, SETTLE, f"the pods of {NS} gone")
        for node in self.nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(node)


@pytest.fixture
def cluster(training_operator: ControlPlane) -> Iterator[Cluster]:
    try:
        wait_for(lambda: training_operator.health().get("training-operator"), SETTLE, "healthy")
    except AssertionError as e:
        pytest.fail(f"{e}; its log:\n{training_operator.processes['training-operator'].tail()}")
    api = training_operator.api_client()
    c = Cluster(training_operator, api, NS, (GROUP, VERSION, PLURAL), node_prefix="pt-")
    with contextlib.suppress(ApiException):  # 409: made by an earlier test
        c.core.create_namespace({"metadata": {"name": NS}})
    try:
        yield c
    finally:
        c.cleanup()
        api.close()


def pytorch_job(
    name: str,
    pool: str,
    *,
    replicas: int,
    lo: int = 1,
    hi: int = 4,
    policy: str | None = None,
    annotations: dict[str, str] | None = None,
    elastic: bool = True,
) -> Obj:
    """An elastic PyTorchJob with Workers only (no Master, as torchrun elastic jobs run): one
    GPU per worker, restartPolicy OnFailure, on our pool. With `policy`, labelled to be managed
    by the product under that policy; `elastic=False` leaves elasticPolicy out."""
    container = {
        "name": "pytorch",  # the operator's default container: ports and env are set on it
        "image": "example.invalid/torch:1",
        "command": ["torchrun", "train.py"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {MANAGED: "true", POLICY_LABEL: policy} if policy else {},
            "annotations": annotations or {},
        },
        "spec": {
            **({"elasticPolicy": _elastic(lo, hi)} if elastic else {}),
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": replicas,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "spec": {
                            "nodeSelector": {POOL: pool},
                            "tolerations": [{**ISOLATED, "operator": "Equal"}],
                            "containers": [container],
                        }
                    },
                }
            },
        },
    }


def _elastic(lo: int, hi: int) -> Obj:
    return {"minReplicas": lo, "maxReplicas": hi, "rdzvBackend": "c10d", "maxRestarts": 100}


# --- recording every version of the job's worker pods -------------------------------------------
@dataclass(frozen=True)
class Seen:
    rv: int  # one etcd: resourceVersions order writes across objects
    type: str
    name: str
    uid: str
    deleting: bool


class PodEvents:
    """Every version of the job's worker pods a watch delivers, from a thread."""

    def __init__(self, cluster: Cluster, job: str) -> None:
        self.seen: list[Seen] = []
        self.error: Exception | None = None
        self._stopped = False
        self._watch = watch.Watch()
        args = (cluster.core.list_namespaced_pod, NS)
        kwargs = {"label_selector": WORKER_SELECTOR.format(job), "timeout_seconds": 120}
        self._thread = threading.Thread(target=self._run, args=(args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            for event in self._watch.stream(*args, **kwargs):
                pod = event["object"]
                self.seen.append(
                    Seen(
                        int(pod.metadata.resource_version),
                        event["type"],
                        pod.metadata.name,
                        pod.metadata.uid,
                        pod.metadata.deletion_timestamp is not None,
                    )
                )
        except Exception as e:  # a broken watch would leave versions out: the test must know
            if not self._stopped:
                self.error = e

    def first(self, predicate: Callable[[Seen], bool]) -> Seen | None:
        assert self.error is None, f"the watch broke: {self.error!r}"
        return next((s for s in self.seen if predicate(s)), None)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


@contextlib.contextmanager
def pod_events(cluster: Cluster, job: str) -> Iterator[PodEvents]:
    events = PodEvents(cluster, job)
    try:
        wait_for(lambda: events.seen, SETTLE, "the watch's initial list")
        yield events
    finally:
        events.stop()
