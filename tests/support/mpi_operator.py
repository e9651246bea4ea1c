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
- discovery (``updateDiscoverHostsInConfigMap``): the ConfigMap ``<job>-config`` holds
  ``discover_hosts.sh``: ``#!/bin/sh`` then ``echo <pod>.<job>.<ns>.svc`` per worker whose phase
  is Running (Terminating ones too), sorted by pod name as strings.
- status (``updateMPIJobStatus``): ``Created`` on the first sync; ``Running`` once every worker
  pod is Running (it is not withdrawn when one is Pending again); ``Failed`` when a worker pod
  failed with reason ``Evicted`` (kubelet node-pressure eviction).

Not modelled: the launcher Job, the Service, the kubelet's delay in syncing the ConfigMap volume
(the real launcher sees a change up to a minute late). ``run_pending(nodes)`` stands in for the
scheduler and kubelet.
"""

from __future__ import annotations

import copy
from typing import Any

from .kube_api import KubeApiServer

Obj = dict[str, Any]
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"
INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def discover_hosts(job: str, namespace: str, running: list[str]) -> str:
    """The script the operator writes for these Running worker pods."""
    lines = [f"echo {pod}.{job}.{namespace}.svc\n" for pod in sorted(running)]
    return "#!/bin/sh\n" + "".join(lines)


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

    def run_pending(self, node: str) -> None:
        """The scheduler and kubelet: bind every Pending worker to `node` and start it."""
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
        self._workers(job, worker, replicas, bool(spec.get("runLauncherAsWorker")))
        pods = self.workers(name)
        running = [
            p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"
        ]
        self._config_map(name, running)
        self._status(job, pods)

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
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": worker_name(name, index),
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "kubeflow.org/v2beta1",
                        "kind": "MPIJob",
                        "name": name,
                        "uid": job["metadata"].get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pod_spec,
            "status": {"phase": "Pending"},
        }

    def _config_map(self, job: str, running: list[str]) -> None:
        """getOrCreateConfigMap + updateDiscoverHostsInConfigMap."""
        data = {"discover_hosts.sh": discover_hosts(job, self.namespace, running)}
        name = f"{job}-config"
        current = self.server.get("configmaps", name, self.namespace)
        if current is None:
            self.server.seed(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "data": data,
                    "metadata": {"name": name, "namespace": self.namespace},
                }
            )
        elif current.get("data") != data:
            self.server.patch("configmaps", name, {"data": data}, self.namespace)

    def _status(self, job: Obj, pods: list[Obj]) -> None:
        """updateMPIJobStatus (conditions only): setCondition replaces a type and appends it."""
        conditions = list((job.get("status") or {}).get("conditions") or [])

        def held(kind: str) -> bool:
            return any(c["type"] == kind and c["status"] == "True" for c in conditions)

        def add(kind: str, reason: str) -> None:
            conditions[:] = [c for c in conditions if c["type"] != kind]
            conditions.append({"type": kind, "status": "True", "reason": reason})

        before = list(conditions)
        if not held("Created"):
            add("Created", "MPIJobCreated")
        phases = [(p.get("status") or {}) for p in pods]
        if any(s.get("phase") == "Failed" and s.get("reason") == "Evicted" for s in phases):
            add("Failed", "MPIJobEvicted")
        elif pods and all(s.get("phase") == "Running" for s in phases) and not held("Running"):
            add("Running", "MPIJobRunning")
        if conditions != before:
            self.server.patch(
                "mpijobs",
                job["metadata"]["name"],
                {"status": {"conditions": conditions}},
                self.namespace,
            )
