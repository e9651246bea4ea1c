"""The Kubeflow MPIJob backend against the API emulator (the real v2beta1 CRD) and a stand-in of
mpi-operator v0.8.2's controller (support/mpi_operator.py): read, scale out, scale in by the
highest indices only, drain a doomed worker in the middle and show it again once it runs
elsewhere under its old name."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_fixtures import (
    NS,
    Kube,
    container,
    node,
    now,
)
from kubernetes import client
from support.mpi_operator import MpiOperator, discover_hosts, overlay_hosts, worker_name
from support.rbac import role_grants
from support.sidecar import sidecar_thread
from support.waiting import wait_for

from autoscaler.adapters.kube.kinds.jobref import JobRef
from autoscaler.adapters.kube.kinds.mpi_operator import MAX_ANNOTATION, MIN_ANNOTATION, MPI_JOBS
from autoscaler.annotations import ASSIGNED_ANNOTATION, DRAINED_ANNOTATION, decode_drained
from autoscaler.core import Action, Decision, Reason

Obj = dict[str, Any]
NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "e", "effect": "NoSchedule"}


def mpi_job(
    name: str = "hvd", replicas: int = 2, lo: int | None = 1, hi: int | None = 4, **spec: Any
) -> Obj:
    annotations = {k: str(v) for k, v in ((MIN_ANNOTATION, lo), (MAX_ANNOTATION, hi)) if v}
    worker = {"replicas": replicas, "template": {"spec": {"containers": [container(1)]}}}
    launcher = {"replicas": 1, "template": {"spec": {"containers": [container()]}}}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {
            "slotsPerWorker": 1,
            "mpiReplicaSpecs": {"Launcher": launcher, "Worker": worker},
            **spec,
        },
    }


@pytest.fixture
def mpi(kube: Kube) -> MpiOperator:
    kube.server.install_crd("kubeflow.org_mpijobs.yaml")
    return MpiOperator(kube.server, NS)


def running(kube: Kube, mpi: MpiOperator, job: Obj, on: str) -> None:
    """Seed the job; the operator makes its workers; they run on `on`."""
    kube.server.seed(job)
    mpi.step()
    mpi.run_pending(on)
    mpi.step()


def replicas(kube: Kube, name: str = "hvd") -> int:
    job = kube.server.get("mpijobs", name, NS)
    return int(job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])


def scale_in(pod: str) -> Decision:
    """One worker of hvd's three out, by name (as a notice or a clamp to max decides it)."""
    return Decision(
        "ml/hvd", Action.SCALE_IN, Reason.PREEMPTION_NOTICE, "default", 3, 2, count=1, pods=(pod,)
    )


def drained(kube: Kube, name: str = "hvd") -> frozenset[str]:
    job = kube.server.get("mpijobs", name, NS)
    return decode_drained((job["metadata"].get("annotations") or {}).get(DRAINED_ANNOTATION))


def test_the_stand_in_writes_discovery_as_the_operator_does(kube: Kube, mpi: MpiOperator) -> None:
    running(kube, mpi, mpi_job(replicas=3), on="a")
    # updateDiscoverHostsInConfigMap: Running workers only, sorted as strings, no slots
    assert mpi.script("hvd") == (
        "#!/bin/sh\necho hvd-worker-0.hvd.ml.svc\necho hvd-worker-1.hvd.ml.svc\n"
        "echo hvd-worker-2.hvd.ml.svc\n"
    )
    assert discover_hosts("j", "ns", ["j-worker-10", "j-worker-2"]).splitlines()[1] == (
        "echo j-worker-10.j.ns.svc"
    )
    # newConfigMap: the hostfile has every index with its slots, whatever runs; the ConfigMap
    # is the job's (as tests/test_real_mpi_operator.py sees the real operator write it)
    cm = kube.server.get("configmaps", "hvd-config", NS)
    assert cm["data"]["hostfile"] == "".join(
        f"hvd-worker-{i}.hvd.ml.svc slots=1\n" for i in range(3)
    )
    assert [(o["kind"], o["name"]) for o in cm["metadata"]["ownerReferences"]] == [
        ("MPIJob", "hvd")
    ]
    kube.server.patch(
        "mpijobs", "hvd", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 1}}}}, NS
    )
    mpi.step()  # getOrCreateWorker: the highest indices go
    assert [p["metadata"]["name"] for p in mpi.workers("hvd")] == ["hvd-worker-0"]


def test_the_stand_in_runs_the_job_only_with_its_launcher_and_ends_it_with_its_success(
    kube: Kube, mpi: MpiOperator
) -> None:
    """updateMPIJobStatus: Running needs the launcher's pod Running too; the launcher's success
    makes the job Succeeded (Running turned False) and the operator leaves its workers alone
    (default cleanPodPolicy None), as on the real control plane."""
    kube.server.seed(node("a"), mpi_job(replicas=1))
    mpi.step()
    kube.server.patch("pods", "hvd-worker-0", {"status": {"phase": "Running"}}, NS)
    mpi.step()
    assert _conditions(kube) == {"Created": "True"}  # the launcher is still Pending
    mpi.run_pending("a")
    mpi.step()
    assert _conditions(kube) == {"Created": "True", "Running": "True"}
    launcher = mpi.launcher("hvd")
    assert launcher is not None and launcher["metadata"]["ownerReferences"][0]["kind"] == "Job"
    kube.server.patch("pods", launcher["metadata"]["name"], {"status": {"phase": "Succeeded"}}, NS)
    mpi.step()
    assert _conditions(kube) == {"Created": "True", "Running": "False", "Succeeded": "True"}
    assert "hvd" not in {j.name for j in kube.observer(kube.cache()).snapshot(now()).jobs}
    kube.server.patch(
        "mpijobs", "hvd", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2}}}}, NS
    )
    mpi.step()  # done: no worker made, none removed
    assert [p["metadata"]["name"] for p in mpi.workers("hvd")] == ["hvd-worker-0"]


def _conditions(kube: Kube, name: str = "hvd") -> dict[str, str]:
    job = kube.server.get("mpijobs", name, NS)
    return {c["type"]: c["status"] for c in (job.get("status") or {}).get("conditions") or []}


def test_an_mpijob_is_read_as_an_elastic_job(kube: Kube, mpi: MpiOperator) -> None:
    kube.server.seed(node("a"))
    running(kube, mpi, mpi_job(replicas=2), on="a")
    kube.server.seed(mpi_job("fixed", replicas=1, lo=None, hi=None))  # no bounds: stays as is
    mpi.step()
    jobs = {j.name: j for j in kube.observer(kube.cache()).snapshot(now()).jobs}
    hvd = jobs["hvd"]
    assert (hvd.backend, hvd.min_workers, hvd.max_workers, hvd.running) == (
        "mpi-operator",
        1,
        4,
        True,
    )
    assert [(w.pod, w.host, w.index, w.pending) for w in hvd.workers] == [
        ("hvd-worker-0", "hvd-worker-0", 0, False),
        ("hvd-worker-1", "hvd-worker-1", 1, False),
    ]
    assert hvd.next_pod_names(1) == ("hvd-worker-2",) and hvd.reuses_names
    assert (jobs["fixed"].min_workers, jobs["fixed"].max_workers) == (1, 1)
    assert not jobs["fixed"].running  # its one worker is Pending: no Running condition yet

    kube.server.patch(
        "mpijobs",
        "hvd",
        {
            "status": {
                "conditions": [
                    {"type": "Created", "status": "True"},
                    {"type": "Succeeded", "status": "True"},
                ]
            }
        },
        NS,
    )
    cache = kube.cache()
    assert "hvd" not in {j.name for j in kube.observer(cache).snapshot(now()).jobs}


def test_idle_gpus_raise_the_worker_replicas(kube: Kube, mpi: MpiOperator) -> None:
    kube.server.seed(node("a", gpus=4))
    running(kube, mpi, mpi_job(replicas=2), on="a")
    rec = kube.reconciler()
    [out] = [d for d in rec.tick(now()) if d.action is Action.SCALE_OUT]
    assert (out.from_workers, out.to_workers) == (2, 4)
    assert replicas(kube) == 4
    assert [e["reason"] for e in kube.events()] == ["ScaleOutRequested"]
    # until the operator has made the pods, the scale is in flight: no second patch
    assert not [d for d in rec.tick(now()) if d.action is Action.SCALE_OUT]
    mpi.step()
    assert [p["metadata"]["name"] for p in mpi.workers("hvd")][-1] == worker_name("hvd", 3)


def test_a_worker_pod_that_ended_is_no_scale_in_flight_and_the_job_grows_around_it(
    kube: Kube, mpi: MpiOperator
) -> None:
    """mpi-operator never makes a Failed (or Succeeded) worker pod again while it exists
    (getOrCreateWorker finds it by name), and the pod watch leaves ended pods out: the index is
    dead, counted in status.replicaStatuses.Worker.failed (updateMPIJobStatus). It is not a
    scale-out in flight (that one would never finish: the job was frozen, as seen on the real
    control plane), and a scale counts it: replicas = live workers + dead ones."""
    kube.server.seed(node("a", gpus=4))
    running(kube, mpi, mpi_job(replicas=3, hi=4), on="a")
    uid = kube.server.get("pods", "hvd-worker-1", NS)["metadata"]["uid"]
    kube.server.patch("pods", "hvd-worker-1", {"status": {"phase": "Failed"}}, NS)
    mpi.step()
    dead = kube.server.get("pods", "hvd-worker-1", NS)
    assert (dead["metadata"]["uid"], dead["status"]["phase"]) == (uid, "Failed")  # kept as is
    status = kube.server.get("mpijobs", "hvd", NS)["status"]["replicaStatuses"]["Worker"]
    assert status == {"active": 2, "failed": 1}
    rec = kube.reconciler()
    [out] = [d for d in rec.tick(now()) if d.action is Action.SCALE_OUT]
    assert (out.from_workers, out.to_workers) == (2, 4)  # two live workers, two idle GPUs
    assert replicas(kube) == 5  # ... and the dead index
    mpi.step()
    mpi.run_pending("a")
    mpi.step()
    assert {p["metadata"]["name"]: p["status"]["phase"] for p in mpi.workers("hvd")} == {
        "hvd-worker-0": "Running",
        "hvd-worker-1": "Failed",
        "hvd-worker-2": "Running",
        "hvd-worker-3": "Running",
        "hvd-worker-4": "Running",
    }
    assert not [d for d in rec.tick(now()) if d.action is not Action.NOOP]  # at max: settled


def test_a_notice_on_the_highest_index_drains_it_and_lowers_the_replicas(
    kube: Kube, mpi: MpiOperator
) -> None:
    kube.server.seed(node("a", gpus=2), node("b", gpus=1))
    running(kube, mpi, mpi_job(replicas=2, lo=1, hi=3), on="a")
    kube.server.seed(mpi_job(replicas=3, lo=1, hi=3))
    mpi.step()
    mpi.run_pending("b")  # hvd-worker-2 on b
    mpi.step()
    kube.server.patch("nodes", "b", {"spec": {"taints": [NTH_ITN]}})
    actions = {d.action for d in kube.reconciler().tick(now())}
    assert {Action.DRAIN, Action.SCALE_IN} <= actions
    assert drained(kube) == {"hvd-worker-2"} and replicas(kube) == 2
    mpi.step()
    assert [p["metadata"]["name"] for p in mpi.workers("hvd")] == ["hvd-worker-0", "hvd-worker-1"]


def test_a_doomed_worker_in_the_middle_is_drained_never_replaced_by_a_healthy_ones_removal(
    kube: Kube, mpi: MpiOperator
) -> None:
    """Lowering replicas would delete hvd-worker-2 (healthy) for hvd-worker-1 (doomed): the
    worker is only hidden from discovery; its node dies, the operator makes it again under the
    same name, and once it runs on a healthy node the host is shown (whether the daemon undrained
    it when the old pod went, or only now)."""
    kube.server.seed(node("a", gpus=2), node("b", gpus=1))
    running(kube, mpi, mpi_job(replicas=1, lo=1, hi=3), on="a")
    kube.server.seed(mpi_job(replicas=2, lo=1, hi=3))
    mpi.step()
    mpi.run_pending("b")  # hvd-worker-1 on b
    kube.server.seed(mpi_job(replicas=3, lo=1, hi=3))
    mpi.step()
    mpi.run_pending("a")  # hvd-worker-2 on a
    mpi.step()
    kube.server.patch("nodes", "b", {"spec": {"taints": [NTH_ITN]}})
    rec = kube.reconciler()
    actions = {d.action for d in rec.tick(now())}
    assert Action.DRAIN in actions and Action.SCALE_IN not in actions  # the core knows
    assert drained(kube) == {"hvd-worker-1"} and replicas(kube) == 3

    kube.server.delete("pods", "hvd-worker-1", NS)  # the reclaim
    kube.server.delete("nodes", "b")
    mpi.step()  # made again, Pending, same name (the operator's script lists Running pods only)
    rec.tick(now())
    kube.server.seed(node("c", gpus=1))
    mpi.run_pending("c")
    mpi.step()

    # the next passes, once the cache has seen it Running on c
    def shown_again() -> bool:
        rec.tick(now())
        return drained(kube) == frozenset()

    wait_for(shown_again, what="the undrain")
    assert drained(kube) == frozenset() and replicas(kube) == 3


def test_a_scale_in_naming_anything_but_the_top_indices_is_refused(
    kube: Kube, mpi: MpiOperator
) -> None:
    kube.server.seed(node("a"))
    running(kube, mpi, mpi_job(replicas=3), on="a")
    actuator = kube.actuator(kube.cache())
    actuator.apply(scale_in("hvd-worker-1"), now())
    assert replicas(kube) == 3
    actuator.apply(scale_in("hvd-worker-2"), now())
    assert replicas(kube) == 2


def test_with_the_launcher_as_a_worker_a_scale_in_is_refused(kube: Kube, mpi: MpiOperator) -> None:
    """The index label is then i + 1 (workerReplicaIndexLabel) but getOrCreateWorker compares it
    with replicas: lowering replicas to n also deletes worker n - 1 (made again at once), an
    abrupt loss of a healthy worker."""
    kube.server.seed(node("a"))
    running(kube, mpi, mpi_job(replicas=3, runLauncherAsWorker=True), on="a")
    kube.server.patch(
        "mpijobs", "hvd", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2}}}}, NS
    )
    uid = kube.server.get("pods", "hvd-worker-1", NS)["metadata"]["uid"]
    mpi.step()  # the stand-in shows the quirk
    assert kube.server.get("pods", "hvd-worker-1", NS)["metadata"]["uid"] != uid
    kube.server.patch(
        "mpijobs", "hvd", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 3}}}}, NS
    )
    mpi.step()
    actuator = kube.actuator(kube.cache())
    actuator.apply(scale_in("hvd-worker-2"), now())
    assert replicas(kube) == 3


# --- the shipped example: the launcher's side, against the emulator ------------------------------
EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "mpijob-example.yaml"


def test_the_example_job_is_accepted_and_keeps_its_native_sidecar(kube: Kube) -> None:
    kube.server.install_crd("kubeflow.org_mpijobs.yaml")
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (job,) = [d for d in docs if d["kind"] == "MPIJob"]
    made = client.CustomObjectsApi(kube.server.api_client()).create_namespaced_custom_object(
        "kubeflow.org", "v2beta1", "default", "mpijobs", job
    )
    launcher = made["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    sidecar = next(c for c in launcher["initContainers"] if c["name"] == "discovery-sidecar")
    assert sidecar["restartPolicy"] == "Always"  # not pruned, unlike et-operator's schema
    env = {e["name"]: e.get("value") for e in launcher["containers"][0]["env"]}
    assert env["SPOT_SLOTS"] == str(job["spec"]["slotsPerWorker"])
    assert f"--slots {env['SPOT_SLOTS']}" in launcher["containers"][0]["args"][0]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert {("kubeflow.org", "mpijobs", v) for v in ("list", "watch", "patch")} <= role_grants(role)


def test_the_launcher_hides_a_drained_worker_from_the_operators_discovery(
    kube: Kube, mpi: MpiOperator, tmp_path: Path
) -> None:
    """Daemon annotation -> sidecar -> drain file -> our script over the operator's script."""
    kube.server.seed(node("a"))
    running(kube, mpi, mpi_job(replicas=3), on="a")
    base = tmp_path / "discover_hosts.sh"
    base.write_text(mpi.script("hvd"))
    stop = threading.Event()
    job = JobRef(NS, "hvd", MPI_JOBS)
    drain, assigned = tmp_path / "drained-hosts", tmp_path / "assigned-hosts"
    sidecar = sidecar_thread(kube.server.api_client(), job, drain, stop, assigned)
    sidecar.start()
    try:
        kube.server.patch(
            "mpijobs",
            "hvd",
            {"metadata": {"annotations": {DRAINED_ANNOTATION: '["hvd-worker-1"]'}}},
            NS,
        )
        wait_for(
            lambda: (
                (tmp_path / "drained-hosts").exists()
                and "hvd-worker-1" in (tmp_path / "drained-hosts").read_text()
            ),
            what="the drain file",
        )
        assert (
            overlay_hosts(base, tmp_path)
            == "hvd-worker-0.hvd.ml.svc:1\nhvd-worker-2.hvd.ml.svc:1\n"
        )
        # what Horovod runs on, published by pod name (as the daemon names hosts)
        (tmp_path / "assigned-hosts").write_text("hvd-worker-0.hvd.ml.svc\n")
        wait_for(
            lambda: (
                (
                    kube.server.get("mpijobs", "hvd", NS)["metadata"]["annotations"].get(
                        ASSIGNED_ANNOTATION
                    )
                )
                == '["hvd-worker-0"]'
            ),
            what="the assigned hosts published",
        )
    finally:
        stop.set()
