"""A stand-in for Kubeflow mpi-operator's MPIJob controller, as far as the autoscaler depends on it.

It does through the API server what kubeflow/mpi-operator v0.8.2 does
(pkg/controller/mpi_job_controller.go), each method naming the Go function it follows:

- workers (``getOrCreateWorker``): when there are more worker pods than
  ``spec.mpiReplicaSpecs.Worker.replicas``, every pod whose ``training.kubeflow.org/replica-index``
  label is >= replicas is deleted: the HIGHEST indices, whoever they are. Then every index below
  replicas without a pod gets one, under the same name as before (``workerName``:
  ``<job>-worker-<i>``), labelled (``defaultLabels``), owned by the MPIJob, Pending. With
  ``runLauncherAsWorker`` the index label is i + 1 (``workerReplicaIndexLabel``), so a scale-in
  also deletes worker ``replicas - 1``, which the same pass creates again.
- discovery (``getOrCreateConfigMap``, ``newConfigMap``, ``updateDiscoverHostsInConfigMap``):
  the ConfigMap ``<job>-config``, controller-owned by the MPIJob and labelled ``app: <job>``,
  holds ``discover_hosts.sh``: ``#!/bin/sh`` then ``echo <pod>.<job>.<ns>.svc`` per worker whose
  phase is Running (Terminating ones too), sorted by pod name as strings; and ``hostfile``: one
  ``<pod>.<job>.<ns>.svc slots=<slotsPerWorker>`` line per index 0..replicas-1, whatever runs
  (OpenMPI, the default mpiImplementation). With ``runLauncherAsWorker`` both start with the
  launcher's name (``<job>-launcher``), listed whether it runs or not.
- the launcher (``newLauncherJob``): at the first sync (launcherCreationPolicy AtStartup, the
  default), a batch/v1 Job ``<job>-launcher`` whose pod the Job controller makes. The emulator
  has no Job controller: the stand-in makes the pod itself, ``<job>-launcher-<5 chars>``,
  labelled ``job-role: launcher`` and controller-owned by the Job (never a worker).
- status (``updateMPIJobStatus``): ``Created`` on the first sync; ``Running`` once the launcher
  pod AND every worker pod are Running (it is not withdrawn when one is Pending again);
  ``Failed`` when a worker pod failed with reason ``Evicted`` (kubelet node-pressure eviction);
  ``Succeeded`` (and ``Running`` turned False, ``filterOutCondition``) once the launcher pod
  succeeded, after which the job's workers and ConfigMap are left alone (``syncHandler``: done);
  ``replicaStatuses`` counts the active (Running) launcher and the active, failed and succeeded
  worker pods of indices below replicas. A worker pod that ended (Failed, Succeeded) is never
  made again while it exists (``getOrCreateWorker`` finds it by name).

Not modelled: the Service, the SSH Secret, the Events (the real one sends ``MPIJobRunning`` at
every sync of a running job), the kubelet's delay in syncing the ConfigMap volume (the real
launcher sees a change up to a minute late). ``run_pending(nodes)`` stands in for the scheduler
and kubelet (the launcher's pod included); docs/mpi-operator.md lists what the real operator was
seen to do on the real control plane (tests/test_real_mpi_operator.py).
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

from autoscaler.adapters.discovery.scripts import OVERLAY_SCRIPT, script_path

from .kube_api import KubeApiServer

Obj = dict[str, Any]
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"
INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
# status.replicaStatuses.Worker's counts (ReplicaStatus) and the pod phase each counts
WORKER_COUNTS = {"active": "Running", "failed": "Failed", "succeeded": "Succeeded"}


def _controller_ref(api_version: str, kind: str, name: str, uid: str) -> Obj:
    """metav1.NewControllerRef: the garbage collector deletes the object with its owner."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(job: Obj) -> Obj:
    """The controller reference to an MPIJob its workers and ConfigMap carry."""
    return _controller_ref(
        "kubeflow.org/v2beta1", "MPIJob", job["metadata"]["name"], job["metadata"].get("uid", "")
    )


def overlay_hosts(base: Path, files: Path, slots: int = 1) -> str:
    """What our discover_hosts.sh prints over the operator's script `base`, as the launcher runs
    it (deploy/mpijob-example.yaml: SPOT_BASE_SCRIPT=/etc/mpi/discover_hosts.sh), its drain,
    cache and assigned-hosts files in `files`."""
    env = {
        "PATH": os.environ["PATH"],
        "SPOT_BASE_SCRIPT": str(base),
        "SPOT_SLOTS": str(slots),
        "SPOT_DRAIN_FILE": str(files / "drained-hosts"),
        "SPOT_CACHE_FILE": str(files / "last-hosts"),
        "SPOT_ASSIGNED_FILE": str(files / "assigned-hosts"),
        "SPOT_PROC_DIR": str(files / "no-proc"),
    }
    done = subprocess.run(
        ["sh", str(script_path(OVERLAY_SCRIPT))],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return done.stdout


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def discover_hosts(job: str, namespace: str, running: list[str], launcher_too: bool = False) -> str:
    """The script the operator writes for these Running worker pods."""
    first = [f"{job}-launcher"] if launcher_too else []
    lines = [f"echo {pod}.{job}.{namespace}.svc\n" for pod in [*first, *sorted(running)]]
    return "#!/bin/sh\n" + "".join(lines)


def hostfile(
    job: str, namespace: str, replicas: int, slots: int, launcher_too: bool = False
) -> str:
    """newConfigMap's hostfile (OpenMPI format): every index, running or not."""
    first = [f"{job}-launcher"] if launcher_too else []
    names = [*first, *(worker_name(job, i) for i in range(replicas))]
    return "".join(f"{name}.{job}.{namespace}.svc slots={slots}\n" for name in names)


class MpiOperator:
    def __init__(self, server: KubeApiServer, namespace: str) -> None:
        self.server = server
        self.namespace = namespace

    def step(self) -> None:
        for job in self.server.objects("mpijobs", self.namespace):
            self._sync(job)

    def workers(self, job: str) -> list[Obj]:
        return [
            p
            for p in self.server.objects("pods", self.namespace)
            if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == job
            and p["metadata"]["labels"].get(ROLE_LABEL) == "worker"
        ]

    def launcher(self, job: str) -> Obj | None:
        """The launcher Job's pod (the newest, if the Job made several)."""
        pods = [
            p
            for p in self.server.objects("pods", self.namespace)
            if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == job
            and p["metadata"]["labels"].get(ROLE_LABEL) == "launcher"
        ]
        return pods[-1] if pods else None

    def run_pending(self, node: str) -> None:
        """The scheduler and kubelet: bind every Pending worker (and launcher) to `node` and
        start it."""
        for pod in self.server.objects("pods", self.namespace):
            labels = pod["metadata"].get("labels") or {}
            if ROLE_LABEL in labels and (pod.get("status") or {}).get("phase") == "Pending":
                self.server.patch(
                    "pods",
                    pod["metadata"]["name"],
                    {
                        "spec": {"nodeName": node},
                        "status": {
                            "phase": "Running",
                            "conditions": [{"type": "Ready", "status": "True"}],
                        },
                    },
                    self.namespace,
                )

    def script(self, job: str) -> str:
        cm = self.server.get("configmaps", f"{job}-config", self.namespace) or {}
        return str((cm.get("data") or {}).get("discover_hosts.sh", ""))

    # --- syncHandler ---------------------------------------------------------------------------
    def _sync(self, job: Obj) -> None:
        name = job["metadata"]["name"]
        spec = job.get("spec") or {}
        worker = (spec.get("mpiReplicaSpecs") or {}).get("Worker") or {}
        replicas = int(worker.get("replicas", 1))
        launcher_too = bool(spec.get("runLauncherAsWorker"))
        launcher = self.launcher(name)
        indexed: list[Obj] = []  # getOrCreateWorker's answer: the pods of indices < replicas
        if _phase(launcher) not in ("Succeeded", "Failed"):  # syncHandler: not done
            self._workers(job, worker, replicas, launcher_too)
            pods = self.workers(name)
            running = [p["metadata"]["name"] for p in pods if _phase(p) == "Running"]
            slots = int(spec.get("slotsPerWorker", 1))
            self._config_map(job, running, replicas, slots, launcher_too)
            if launcher is None:  # AtStartup: made at the first sync, whatever the workers do
                launcher = self._new_launcher(job)
            names = {worker_name(name, i) for i in range(replicas)}
            indexed = [p for p in pods if p["metadata"]["name"] in names]
        self._status(job, launcher, indexed)

    def _workers(self, job: Obj, worker: Obj, replicas: int, launcher_too: bool) -> None:
        """getOrCreateWorker."""
        name = job["metadata"]["name"]
        pods = self.workers(name)
        if len(pods) > replicas:
            for pod in pods:
                index = pod["metadata"]["labels"].get(INDEX_LABEL, "")
                if index.isdigit() and int(index) >= replicas:
                    self.server.delete("pods", pod["metadata"]["name"], self.namespace)
        have = {p["metadata"]["name"] for p in self.workers(name)}
        for i in range(replicas):
            if worker_name(name, i) not in have:
                self.server.seed(self._new_worker(job, worker, i, launcher_too))

    def _new_worker(self, job: Obj, worker: Obj, index: int, launcher_too: bool) -> Obj:
        """newWorker."""
        name = job["metadata"]["name"]
        template = copy.deepcopy(worker.get("template") or {})
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            OPERATOR_LABEL: "mpi-operator",
            JOB_LABEL: name,
            ROLE_LABEL: "worker",
            INDEX_LABEL: str(index + 1 if launcher_too else index),
        }
        pod_spec = {
            **(template.get("spec") or {"containers": [{"name": "worker", "image": "x"}]}),
            "hostname": worker_name(name, index),
            "subdomain": name,
            "restartPolicy": "Never",  # setRestartPolicy: the Worker's default (constants.go)
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": worker_name(name, index),
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [_owned_by(job)],
            },
            "spec": pod_spec,
            "status": {"phase": "Pending"},
        }

    def _new_launcher(self, job: Obj) -> Obj:
        """newLauncherJob, and the pod the Job controller makes of it."""
        name = job["metadata"]["name"]
        template = copy.deepcopy((job["spec"].get("mpiReplicaSpecs") or {}).get("Launcher") or {})
        pod_template = template.get("template") or {}
        labels = {
            **(pod_template.get("metadata") or {}).get("labels", {}),
            OPERATOR_LABEL: "mpi-operator",
            JOB_LABEL: name,
            ROLE_LABEL: "launcher",
            "job-name": f"{name}-launcher",  # the Job controller's
        }
        spec = pod_template.get("spec") or {"containers": [{"name": "launcher", "image": "x"}]}
        suffix = (job["metadata"].get("uid") or "00000").replace("-", "")[:5]
        made: Obj = self.server.seed(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-launcher-{suffix}",
                    "namespace": self.namespace,
                    "labels": labels,
                    "ownerReferences": [
                        _controller_ref("batch/v1", "Job", f"{name}-launcher", f"job-{suffix}")
                    ],
                },
                "spec": {
                    **spec,
                    "hostname": f"{name}-launcher",
                    "subdomain": name,
                    "restartPolicy": "OnFailure",  # DefaultLauncherRestartPolicy
                },
                "status": {"phase": "Pending"},
            }
        )[0]
        return made

    def _config_map(
        self, job: Obj, running: list[str], replicas: int, slots: int, launcher_too: bool
    ) -> None:
        """getOrCreateConfigMap: newConfigMap + updateDiscoverHostsInConfigMap."""
        name = job["metadata"]["name"]
        data = {
            "hostfile": hostfile(name, self.namespace, replicas, slots, launcher_too),
            "discover_hosts.sh": discover_hosts(name, self.namespace, running, launcher_too),
        }
        cm_name = f"{name}-config"
        current = self.server.get("configmaps", cm_name, self.namespace)
        if current is None:
            meta = {"name": cm_name, "namespace": self.namespace, "labels": {"app": name}}
            self.server.seed(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "data": data,
                    "metadata": {**meta, "ownerReferences": [_owned_by(job)]},
                }
            )
        elif current.get("data") != data:
            self.server.patch("configmaps", cm_name, {"data": data}, self.namespace)

    def _status(self, job: Obj, launcher: Obj | None, pods: list[Obj]) -> None:
        """updateMPIJobStatus (conditions and replicaStatuses): setCondition replaces a type and
        appends it; filterOutCondition turns Running False when the job finishes."""
        status = job.get("status") or {}
        conditions = [dict(c) for c in status.get("conditions") or []]

        def held(kind: str) -> bool:
            return any(c["type"] == kind and c["status"] == "True" for c in conditions)

        def add(kind: str, reason: str) -> None:
            conditions[:] = [c for c in conditions if c["type"] != kind]
            if kind in ("Succeeded", "Failed"):
                for c in conditions:
                    if c["type"] in ("Running", "Failed"):
                        c["status"] = "False"
            conditions.append({"type": kind, "status": "True", "reason": reason})

        if not held("Created"):
            add("Created", "MPIJobCreated")
        if _phase(launcher) == "Succeeded" and not held("Succeeded"):
            add("Succeeded", "MPIJobSucceeded")
        phases = [_phase(p) for p in pods]
        if any(_phase(p) == "Failed" and p["status"].get("reason") == "Evicted" for p in pods):
            add("Failed", "MPIJobEvicted")
        finished = held("Succeeded") or held("Failed")
        running = _phase(launcher) == "Running" and all(ph == "Running" for ph in phases)
        if not finished and running and not held("Running"):
            add("Running", "MPIJobRunning")
        counts = {k: phases.count(ph) for k, ph in WORKER_COUNTS.items()}
        replica_statuses = {  # omitempty: a zero count is left out
            "Launcher": {"active": 1} if _phase(launcher) == "Running" else {},
            "Worker": {k: n for k, n in counts.items() if n},
        }
        if launcher is None:
            del replica_statuses["Launcher"]
        new = {"conditions": conditions, "replicaStatuses": replica_statuses}
        if {k: status.get(k) for k in new} != new:
            self.server.patch("mpijobs", job["metadata"]["name"], {"status": new}, self.namespace)


def _phase(pod: Obj | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase") or "")
