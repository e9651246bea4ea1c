"""The stand-in et-operator (tests/support/et_operator.py) against the API emulator, one test per
behaviour of the real operator. Each docstring names the Go function of
AliyunContainerService/et-operator (main @ 96806fb, pkg/controllers) the behaviour comes from:
these tests document what the autoscaler has to live with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.et_operator import KUBEXEC_ATTACH, SSH_ATTACH, EtOperator, OperatorPanic
from support.kube_api import KubeApiServer

NS = "default"
KAI = ("kai.alibabacloud.com", "v1alpha1")
T0 = datetime(2025, 3, 1, 8, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at

    def tick(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


@pytest.fixture
def clock(kube_api: KubeApiServer) -> Clock:
    kube_api.now = clock = Clock()
    return clock


@pytest.fixture
def crd(kube_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_client)


@pytest.fixture
def hostfile(tmp_path: Path) -> Path:
    return tmp_path / "hostfile"


@pytest.fixture
def operator(kube_api: KubeApiServer, hostfile: Path, clock: Clock) -> EtOperator:
    return EtOperator(kube_api, NS, hostfile)


def job_body(
    name: str = "bert",
    replicas: int = 2,
    *,
    gpus: int | None = None,
    restart: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "worker", "image": "horovod:0.28.1"}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    worker: dict[str, Any] = {
        "replicas": replicas,
        "template": {"spec": {"containers": [container]}},
    }
    if restart:
        worker["restartPolicy"] = restart
    launcher = {
        "replicas": 1,
        "template": {
            "spec": {
                "containers": [
                    {"name": "launcher", "image": "horovod:0.28.1", "command": ["horovodrun"]}
                ]
            }
        },
    }
    return {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"etReplicaSpecs": {"launcher": launcher, "worker": worker}, **spec},
    }


def running_job(
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    name: str = "bert",
    replicas: int = 2,
    **kw: Any,
) -> dict[str, Any]:
    crd.create_namespaced_custom_object(*KAI, NS, "trainingjobs", job_body(name, replicas, **kw))
    operator.step()
    job = job_of(operator, name)
    assert job["status"]["phase"] == "Running"
    return job


def job_of(operator: EtOperator, name: str = "bert") -> dict[str, Any]:
    job = operator.server.get("TrainingJob", name, NS)
    assert job is not None
    return job


def scaler(
    crd: client.CustomObjectsApi, kind: str, name: str, job: str = "bert", **spec: Any
) -> dict[str, Any]:
    plural = {"ScaleIn": "scaleins", "ScaleOut": "scaleouts"}[kind]
    body = {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"selector": {"name": job}, **spec},
    }
    made: dict[str, Any] = crd.create_namespaced_custom_object(*KAI, NS, plural, body)
    return made


def conditions(obj: dict[str, Any] | None) -> list[str]:
    return [c["type"] for c in ((obj or {}).get("status") or {}).get("conditions") or ()]


def workers(kube_api: KubeApiServer) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in kube_api.objects("Pod", NS)
        if p["metadata"]["labels"].get("training-job-role") == "worker"
    )


# ---------------------------------------------------------------- the job
def test_a_new_job_gets_workers_services_its_config_and_launcher_then_runs(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    hostfile: Path,
) -> None:
    """trainingjob_controller.go ReconcileJobs/doSteps (one step per reconcile): worker.go
    createTrainingJobWorkers (pods + headless Services, newWorker's labels and restartPolicy
    Never), waitWorkersRunning, launcher.go createLauncher (ConfigMap <job>-config, launcher
    pod), syncLauncherState (Running once the launcher runs)."""
    job = running_job(crd, operator, gpus=2)
    status = job["status"]
    assert conditions(job) == [
        "Created",
        "WorkersCreated",
        "WorkersReady",
        "LauncherCreated",
        "Running",
    ]
    assert status["targetWorkers"] == status["currentWorkers"] == ["bert-worker-0", "bert-worker-1"]
    assert status["replicaStatuses"] == {"Launcher": {"active": 1}, "Worker": {"active": 2}}
    pod = kube_api.get("Pod", "bert-worker-1", NS)
    assert pod is not None and pod["metadata"]["labels"] == {
        "group-name": "kai.alibabacloud.com",
        "training-job-name": "bert",
        "training-job-role": "worker",
        "replica-index": "1",
    }
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["command"] == ["sh", "-c", "/usr/sbin/sshd  && sleep 365d"]
    [owner] = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "TrainingJob",
        job["metadata"]["uid"],
        True,
    )
    service = kube_api.get("Service", "bert-worker-1", NS)
    assert service is not None and service["spec"]["clusterIP"] == "None"
    config = kube_api.get("ConfigMap", "bert-config", NS)
    # written once, when the launcher is made (after WorkersReady); never updated afterwards
    assert config is not None and config["data"]["hostfile"] == "bert-worker-0:2\nbert-worker-1:2\n"
    launcher = kube_api.get("Pod", "bert-launcher", NS)
    assert (
        launcher is not None and launcher["spec"]["initContainers"][-1]["name"] == "init-hostfile"
    )
    assert not hostfile.exists()  # nothing rewrote it yet: no scaler, no change since Running


def test_current_workers_are_the_running_ones_sorted_by_index(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    hostfile: Path,
) -> None:
    """worker.go handleWorkersFailed: currentWorkers = Running workers, sortPodNames (by the
    number: 2 before 10); a change rewrites the hostfile once the job has run."""
    running_job(crd, operator, replicas=3)
    kube_api.set_container_states("bert-worker-1", NS, {"worker": 1})  # Failed
    operator.step()
    assert job_of(operator)["status"]["currentWorkers"] == ["bert-worker-0", "bert-worker-2"]
    assert hostfile.read_text() == "bert-worker-0:1\nbert-worker-2:1\n\n"  # echo's newline
    assert job_of(operator)["status"]["replicaStatuses"]["Worker"] == {"active": 2, "failed": 1}


def test_a_worker_lost_without_a_scaler_comes_back_under_a_new_name_only_if_always(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """worker.go handleWorkersFailed + jobRestartPolicy (nil means Never): with Always a
    target worker that is gone is recreated as maxIndex+1 of targetWorkers and replaced
    there; with the default it stays in targetWorkers and just leaves currentWorkers."""
    running_job(crd, operator, "always", restart="Always")
    running_job(crd, operator, "never")
    kube_api.delete("Pod", "always-worker-0", NS)
    kube_api.delete("Pod", "never-worker-0", NS)
    operator.step()
    always, never = job_of(operator, "always")["status"], job_of(operator, "never")["status"]
    assert always["targetWorkers"] == ["always-worker-1", "always-worker-2"]
    assert always["currentWorkers"] == ["always-worker-1", "always-worker-2"]
    assert never["targetWorkers"] == ["never-worker-0", "never-worker-1"]
    assert never["currentWorkers"] == ["never-worker-1"]
    assert kube_api.get("Pod", "never-worker-2", NS) is None


def test_the_job_ends_with_its_launcher(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """launcher.go syncLauncherState (Succeeded/Failed from the launcher pod, reason Evicted
    -> TrainingJobEvicted) and trainingjob_controller.go cleanup (cleanPodPolicy nil =
    Running: every worker pod and Service deleted)."""
    running_job(crd, operator, "ok")
    running_job(crd, operator, "evicted")
    kube_api.set_container_states("ok-launcher", NS, {"launcher": 0})
    kube_api.patch(
        "Pod", "evicted-launcher", {"status": {"phase": "Failed", "reason": "Evicted"}}, NS
    )
    operator.step()
    ok, evicted = job_of(operator, "ok"), job_of(operator, "evicted")
    assert (ok["status"]["phase"], conditions(ok)[-1]) == ("Succeeded", "Succeeded")
    assert ok["status"]["completionTime"] == "2025-03-01T08:00:00Z"
    assert (evicted["status"]["phase"], evicted["status"]["conditions"][-1]["reason"]) == (
        "Failed",
        "TrainingJobEvicted",
    )
    assert workers(kube_api) == [] and kube_api.objects("Service", NS) == []


# ---------------------------------------------------------------- scalers: which one runs
def test_a_scaler_is_adopted_by_the_job_it_names_or_orphaned_for_good(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein_controller.go setScalingOwner: the named job becomes controller owner and the
    scaler gets Created; with no such job the scaler is left (and reconciled again only when
    it changes); one that already has an ownerReference is never adopted (scaler.go
    filterAvailableScaler: only scalers the job controls run)."""
    running_job(crd, operator)
    scaler(crd, "ScaleOut", "early", job="later", toAdd={"count": 1})
    foreign = scaler(crd, "ScaleOut", "foreign", toAdd={"count": 1})
    kube_api.patch(
        "ScaleOut",
        "foreign",
        {
            "metadata": {
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}
                ]
            }
        },
        NS,
    )
    operator.step()
    assert conditions(kube_api.get("ScaleOut", "early", NS)) == []
    assert conditions(kube_api.get("ScaleOut", "foreign", NS)) == []
    assert foreign and "currentScaler" not in job_of(operator)["status"]  # omitempty
    running_job(crd, operator, "later")  # the job comes too late for the scaler
    assert conditions(kube_api.get("ScaleOut", "early", NS)) == []
    kube_api.patch("ScaleOut", "early", {"metadata": {"labels": {"touched": "1"}}}, NS)
    operator.step()  # a change of the scaler reconciles it again
    early = kube_api.get("ScaleOut", "early", NS)
    assert early is not None and conditions(early)[:2] == ["Created", "Scaling"]
    assert early["metadata"]["ownerReferences"][0]["name"] == "later"


def test_the_newest_unfinished_scaler_runs_first_and_one_at_a_time(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    clock: Clock,
) -> None:
    """scaler.go updateLatestScaler: of the unfinished scalers the job controls, the one with
    the newest creationTimestamp (1 s resolution; on a tie the first listed: ScaleOuts before
    ScaleIns); only while the job is Running, so one at a time (LIFO)."""
    running_job(crd, operator, replicas=3)
    operator.pods_run = False  # the ScaleOuts' pods stay Pending: each stays in flight
    scaler(crd, "ScaleOut", "old", toAdd={"count": 1})
    clock.tick(1)
    scaler(crd, "ScaleOut", "new", toAdd={"count": 1})
    scaler(crd, "ScaleIn", "tie", toDelete={"podNames": ["bert-worker-0"]})
    operator.step()
    assert job_of(operator)["status"]["currentScaler"] == f"ScaleOut:{NS}/new"
    assert job_of(operator)["status"]["phase"] == "Scaling"
    assert conditions(kube_api.get("ScaleOut", "old", NS)) == ["Created"]
    assert conditions(kube_api.get("ScaleIn", "tie", NS)) == ["Created"]


def test_scalers_wait_until_the_job_runs(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """trainingjob_controller.go ReconcileJobs: scalers are picked only in phase Running
    (launcher.go reconcileJobRunning); a job whose launcher has not started stays Created."""
    operator.pods_run = False
    crd.create_namespaced_custom_object(*KAI, NS, "trainingjobs", job_body())
    scaler(crd, "ScaleOut", "s", toAdd={"count": 1})
    operator.step()
    assert job_of(operator)["status"]["phase"] == "Created"
    assert conditions(kube_api.get("ScaleOut", "s", NS)) == ["Created"]


def test_a_current_scaler_that_is_deleted_just_ends(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scaler.go executeScaling: the current scaler not found -> finishTrainingScaler (job
    Running, currentScaler empty). Its pods are not rolled back."""
    running_job(crd, operator)
    operator.pods_run = False
    scaler(crd, "ScaleOut", "s", toAdd={"count": 1})
    operator.step()
    assert job_of(operator)["status"]["currentScaler"] == f"ScaleOut:{NS}/s"
    crd.delete_namespaced_custom_object(*KAI, NS, "scaleouts", "s")
    operator.step()
    status = job_of(operator)["status"]
    assert (status["phase"], status.get("currentScaler")) == ("Running", None)
    assert "bert-worker-2" in workers(kube_api)  # left behind, Pending
    assert status["targetWorkers"] == ["bert-worker-0", "bert-worker-1"]


# ---------------------------------------------------------------- ScaleOut
def test_a_scale_out_names_pods_after_the_highest_target_index(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    hostfile: Path,
) -> None:
    """scaleout.go setScaleOutWorkers/getWorkerPodsMaxIndex (max of targetWorkers + 1),
    worker.go ScaleOutWorkers (label scaleout-name), executeScaleOut (all Running ->
    executeScaleScript rewrites the hostfile -> targetWorkers += addPods -> ScaleSucceeded)."""
    running_job(crd, operator, restart="Always", gpus=4)
    kube_api.delete("Pod", "bert-worker-0", NS)  # replaced by bert-worker-2: targets 1, 2
    operator.step()
    scaler(crd, "ScaleOut", "grow", toAdd={"count": 2})
    operator.step()
    grow = kube_api.get("ScaleOut", "grow", NS)
    assert grow is not None and grow["status"]["addPods"] == ["bert-worker-3", "bert-worker-4"]
    assert conditions(grow) == ["Created", "Scaling", "ScriptExecuted", "ScaleSucceeded"]
    assert grow["status"]["phase"] == "ScaleSucceeded"
    assert all(
        c["lastTransitionTime"] == "2025-03-01T08:00:00Z" for c in grow["status"]["conditions"]
    )
    added = kube_api.get("Pod", "bert-worker-4", NS)
    assert added is not None and added["metadata"]["labels"]["scaleout-name"] == "grow"
    status = job_of(operator)["status"]
    assert status["targetWorkers"] == [f"bert-worker-{i}" for i in (1, 2, 3, 4)]
    assert (status["phase"], status.get("currentScaler")) == ("Running", None)
    assert hostfile.read_text() == "".join(f"bert-worker-{i}:4\n" for i in (1, 2, 3, 4)) + "\n"


def test_a_scale_out_not_all_running_by_its_timeout_is_rolled_back_entirely(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    clock: Clock,
) -> None:
    """scaleout.go executeScaleOut + status.go IsScaleOutTimeout (the Scaling condition's
    lastTransitionTime + spec.timeout) + ScaleOutFailed: every added pod and Service is
    deleted, even those that run; targetWorkers unchanged."""
    running_job(crd, operator)
    operator.pods_run = False
    scaler(crd, "ScaleOut", "grow", toAdd={"count": 2}, timeout=30)
    operator.step()
    kube_api.run_pod("bert-worker-2", NS)  # one of the two runs
    clock.tick(30)
    operator.step()
    assert job_of(operator)["status"]["phase"] == "Scaling"  # not past the timeout yet
    clock.tick(1)
    operator.step()
    grow = kube_api.get("ScaleOut", "grow", NS)
    assert conditions(grow)[-1] == "ScaleFailed" and grow is not None
    assert grow["status"]["conditions"][-1]["reason"] == "ScalingOutFailed"
    assert (
        grow["status"]["conditions"][-1]["message"]
        == f"scaleout job ScaleOut:{NS}/grow execution timeout"
    )
    assert workers(kube_api) == ["bert-worker-0", "bert-worker-1"]
    assert {s["metadata"]["name"] for s in kube_api.objects("Service", NS)} == {
        "bert-worker-0",
        "bert-worker-1",
    }
    assert job_of(operator)["status"]["targetWorkers"] == ["bert-worker-0", "bert-worker-1"]


def test_a_scale_out_without_a_count_fails(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scaleout.go validateScaleOut: no spec.toAdd.count -> ScaleFailed."""
    running_job(crd, operator)
    scaler(crd, "ScaleOut", "empty")
    operator.step()
    empty = kube_api.get("ScaleOut", "empty", NS)
    assert conditions(empty)[-1] == "ScaleFailed" and empty is not None
    assert empty["status"]["conditions"][-1]["message"] == ".spec.toAdd.count shouldn't be empty"


# ---------------------------------------------------------------- ScaleIn
def test_a_scale_in_by_name_rewrites_the_hostfile_then_deletes_at_once(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    hostfile: Path,
) -> None:
    """scalein.go executeScaleIn: setsSaleInToDelete (frozen in status.toDeletePods),
    executeScaleScript (hostfile without the victims), checkWorkerShutdown, DeleteWorkers
    (pod and Service, grace 0: gone at once, whatever the kubelet), isWorkersDeleted ->
    targetWorkers without them -> ScaleSucceeded."""
    running_job(crd, operator, replicas=3)
    kube_api.kubelet_delay = None  # grace 0 needs no kubelet
    scaler(crd, "ScaleIn", "shrink", toDelete={"podNames": ["bert-worker-1", "bert-worker-9"]})
    operator.step()
    shrink = kube_api.get("ScaleIn", "shrink", NS)
    assert shrink is not None and shrink["status"]["toDeletePods"] == ["bert-worker-1"]
    assert conditions(shrink) == ["Created", "Scaling", "ScriptExecuted", "ScaleSucceeded"]
    assert workers(kube_api) == ["bert-worker-0", "bert-worker-2"]
    assert kube_api.get("Service", "bert-worker-1", NS) is None
    status = job_of(operator)["status"]
    assert status["targetWorkers"] == status["currentWorkers"] == ["bert-worker-0", "bert-worker-2"]
    assert hostfile.read_text() == "bert-worker-0:1\nbert-worker-2:1\n\n"
    scripts = [s for _, s in operator.execs]
    assert scripts == [
        "echo 'bert-worker-0:1\nbert-worker-2:1\n' > /etc/edl/hostfile",
        f"ps -ef | grep '{SSH_ATTACH}'",
    ]


def test_a_scale_in_names_terminating_pods_too(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein.go setsSaleInToDelete lists pods (GetWorkerPods): a Terminating pod is still
    there, so it is a victim, and its grace-0 delete ends it now."""
    running_job(crd, operator, replicas=3)
    kube_api.kubelet_delay = None
    client.CoreV1Api(operator.server.api_client()).delete_namespaced_pod(
        "bert-worker-2", NS, grace_period_seconds=30
    )  # a drain evicted it
    scaler(crd, "ScaleIn", "shrink", toDelete={"podNames": ["bert-worker-2"]})
    operator.step()
    shrink = kube_api.get("ScaleIn", "shrink", NS)
    assert shrink is not None and shrink["status"]["toDeletePods"] == ["bert-worker-2"]
    assert workers(kube_api) == ["bert-worker-0", "bert-worker-1"]


def test_a_scale_in_whose_named_pods_are_all_gone_deletes_every_worker(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein.go setsSaleInToDelete leaves toDeletePods empty, GetPodNames() is then nil and
    worker.go DeleteWorkerPods/DeleteWorkerServices(job, nil) delete ALL of them; with no
    victim left to wait for, isWorkersDeleted is true: ScaleSucceeded."""
    running_job(crd, operator, replicas=3)
    scaler(crd, "ScaleIn", "late", toDelete={"podNames": ["bert-worker-7"]})
    operator.step()
    assert workers(kube_api) == [] and kube_api.objects("Service", NS) == []
    assert conditions(kube_api.get("ScaleIn", "late", NS))[-1] == "ScaleSucceeded"
    assert job_of(operator)["status"]["targetWorkers"] == [
        "bert-worker-0",
        "bert-worker-1",
        "bert-worker-2",
    ]  # nothing to take out of it


def test_a_scale_in_without_to_delete_crashes_the_operator(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein.go setsSaleInToDelete dereferences spec.toDelete: nil panics, and
    controller-runtime v0.4 does not recover (the process restarts, and panics again)."""
    running_job(crd, operator)
    scaler(crd, "ScaleIn", "bare")
    with pytest.raises(OperatorPanic):
        operator.step()
    assert operator.panics == [
        "bare: runtime error: invalid memory address or nil pointer dereference"
    ]
    assert workers(kube_api) == ["bert-worker-0", "bert-worker-1"]


def test_a_scale_in_by_count_takes_the_highest_indices_and_must_leave_one(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein.go setsSaleInToDelete by count: getSortPodNames (numeric) and the last
    `count`; `count >= workers` fails the ScaleIn."""
    running_job(crd, operator, replicas=3, restart="Always")
    kube_api.delete("Pod", "bert-worker-1", NS)  # replaced by bert-worker-3
    operator.step()
    scaler(crd, "ScaleIn", "one", toDelete={"count": 1})
    operator.step()
    assert workers(kube_api) == ["bert-worker-0", "bert-worker-2"]  # 3 went, not 2
    scaler(crd, "ScaleIn", "all", toDelete={"count": 2})
    operator.step()
    failed = kube_api.get("ScaleIn", "all", NS)
    assert failed is not None and failed["status"]["conditions"][-1]["message"].endswith(
        ".spec.toDelete.count should be less than current replicas 2"
    )


def test_a_scale_in_waits_for_a_substring_in_ps_and_forever_without_ps(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein.go checkWorkerShutdown: `ps -ef | grep '<attach>'` in the launcher, a victim
    waits while strings.Contains(out, "<attach> <pod>") (worker-1 matches worker-10); an
    image without ps fails the exec and the ScaleIn is requeued with no end."""
    running_job(crd, operator, replicas=2)
    operator.processes = [
        f"root 42 1 0 08:00 ? 00:00:01 {SSH_ATTACH} bert-worker-10 orted --daemonize"
    ]
    scaler(crd, "ScaleIn", "shrink", toDelete={"podNames": ["bert-worker-1"]})
    operator.step()
    assert "bert-worker-1" in workers(kube_api)
    assert conditions(kube_api.get("ScaleIn", "shrink", NS))[-1] == "ScriptExecuted"
    operator.processes = []
    operator.has_ps = False
    operator.step()
    operator.step()
    assert "bert-worker-1" in workers(kube_api)  # stuck: Scaling, forever
    assert job_of(operator)["status"]["phase"] == "Scaling"
    assert any("exit code 1" in e for e in operator.errors)
    operator.has_ps = True
    operator.step()
    assert workers(kube_api) == ["bert-worker-0"]


def test_the_kubexec_attach_mode_greps_for_kubexec(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
) -> None:
    """scalein.go checkWorkerShutdown: attachCmd is getKubexecPath() in kubexec mode."""
    running_job(crd, operator, launcherAttachMode="kubexec")
    operator.processes = [f"root 7 1 0 08:00 ? 00:00:00 sh {KUBEXEC_ATTACH} bert-worker-1 x"]
    scaler(crd, "ScaleIn", "shrink", toDelete={"podNames": ["bert-worker-1"]})
    operator.step()
    assert "bert-worker-1" in workers(kube_api)
    assert operator.execs[-1][1] == f"ps -ef | grep '{KUBEXEC_ATTACH}'"


def test_without_a_launcher_pod_the_execs_do_nothing(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    operator: EtOperator,
    hostfile: Path,
) -> None:
    """launcher.go executeOnLauncher: a nil launcher pod returns no output and no error, so
    the hostfile is not written and no process is waited for."""
    running_job(crd, operator)
    kube_api.delete("Pod", "bert-launcher", NS)
    operator.processes = [f"x {SSH_ATTACH} bert-worker-1"]
    scaler(crd, "ScaleIn", "shrink", toDelete={"podNames": ["bert-worker-1"]})
    operator.step()
    assert workers(kube_api) == ["bert-worker-0"] and not hostfile.exists()


def test_the_hostfile_is_truncated_and_written_a_line_at_a_time(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    hostfile: Path,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scaleout_controller.go hostfileUpdateScript: `echo '...' > hostfile` truncates, then
    writes; resource.go getSlots: slotsPerWorker wins over the GPU limit."""
    seen: list[str] = []
    operator = EtOperator(kube_api, NS, hostfile, line_by_line=True)
    running_job(crd, operator, slotsPerWorker=8, gpus=1)
    real_open = Path.open

    def spying_open(self: Path, mode: str = "r", *a: Any, **kw: Any) -> Any:
        f = real_open(self, mode, *a, **kw)
        if self == hostfile and "w" in mode:
            seen.append(hostfile.read_text())  # what a reader sees right after the open
            write = f.write
            f.write = lambda text: (write(text), f.flush(), seen.append(hostfile.read_text()))[0]
        return f

    monkeypatch.setattr(Path, "open", spying_open)
    scaler(crd, "ScaleIn", "shrink", toDelete={"podNames": ["bert-worker-0"]})
    operator.step()
    assert seen == ["", "bert-worker-1:8\n", "bert-worker-1:8\n\n"]


def test_the_stand_in_runs_by_itself_in_a_thread(
    kube_api: KubeApiServer,
    crd: client.CustomObjectsApi,
    hostfile: Path,
) -> None:
    """controller-runtime reconciles on watch events: start() reacts to every change."""
    with EtOperator(kube_api, NS, hostfile) as operator:
        crd.create_namespaced_custom_object(*KAI, NS, "trainingjobs", job_body())
        kube_api.wait_until(
            lambda: (job_of(operator).get("status") or {}).get("phase") == "Running"
        )
        scaler(crd, "ScaleOut", "grow", toAdd={"count": 1})
        kube_api.wait_until(
            lambda: conditions(kube_api.get("ScaleOut", "grow", NS))[-1:] == ["ScaleSucceeded"]
        )
    assert workers(kube_api) == ["bert-worker-0", "bert-worker-1", "bert-worker-2"]
    with pytest.raises(ApiException):  # the CRD's schema still holds the operator's writes
        crd.patch_namespaced_custom_object_status(
            *KAI, NS, "trainingjobs", "bert", {"status": {"conditions": None}}
        )
