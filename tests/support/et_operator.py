"""A stand-in for et-operator's TrainingJob controller, unkind parts included, for tests.

It reproduces what AliyunContainerService/et-operator (main @ 96806fb, `pkg/controllers/`) does
with the objects the autoscaler writes, as read from its source:

- one scaler at a time per job, the unfinished one with the NEWEST creationTimestamp
  (scaler.go `updateLatestScaler`), only while the job is Running; a scaler deleted before it
  finishes just ends (scaler.go `executeScaling`: `scaleIn == nil` -> `finishTrainingScaler`);
- a ScaleIn freezes its victims in `status.toDeletePods` from the named pods that still exist,
  Terminating ones included (scalein.go `setsSaleInToDelete`); when none exists the list stays
  empty, and an empty list means EVERY worker: all worker pods are deleted with grace 0
  (worker.go `DeleteWorkers` / `DeleteWorkerPods(job, nil)`);
- before deleting victims it runs `ps -ef | grep '<attach>'` in the launcher and waits while a
  line contains `<attach> <pod>` (a substring: `worker-1` matches `worker-10`), and a launcher
  without `ps` fails the step forever (scalein.go `checkWorkerShutdown`);
- a ScaleOut names its pods from the highest index in `status.targetWorkers` + 1, the maximum
  starting at 0 (scaleout.go `setScaleOutWorkers`, `getWorkerPodsMaxIndex`), and deletes them
  all if they are not Running by `spec.timeout` (`ScaleOutFailed`);
- the hostfile is rewritten IN PLACE (`echo '...' > hostfile`: truncate, then write) on every
  scaler and whenever the Running worker set changes (worker.go `handleWorkersFailed`);
- a worker that disappears without a scaler is recreated under a new index only with worker
  `restartPolicy: Always`; unset means Never (worker.go `jobRestartPolicy`).

`step()` runs one reconcile of every TrainingJob, so tests decide exactly when the operator acts.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from .kube_api import KubeApiServer

Obj = dict[str, Any]
SSH_ATTACH = "ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no"
_FINISHED = ("ScaleSucceeded", "ScaleFailed")


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class EtOperator:
    def __init__(self, server: KubeApiServer, namespace: str, hostfile: Path | None = None,
                 *, line_by_line: bool = False, pods_run: bool = True) -> None:
        self.server = server
        self.namespace = namespace
        self.hostfile = hostfile
        self.line_by_line = line_by_line  # write the hostfile a line per write() call
        self.pods_run = pods_run  # new workers become Running at the next step
        self.processes: list[str] = []  # the launcher's `ps -ef` lines
        self.has_ps = True  # False: the launcher image has no `ps`

    # --- the reconcile loop --------------------------------------------------------------------
    def step(self) -> None:
        for job in self.server.objects("TrainingJob", self.namespace):
            self._reconcile(job)

    def _reconcile(self, job: Obj) -> None:
        name = job["metadata"]["name"]
        status = job.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        if not status.get("targetWorkers") and not self.workers(name):
            self._create_initial(job)
            return
        self._start_pending(name)
        self._sync_workers(job)
        job = self._job(name)
        scaler = self._current_scaler(job)
        if scaler is None:
            self._set_status(name, {"phase": "Running", "currentScaler": ""})
            return
        kind, obj = scaler
        pointer = f"{kind}:{self.namespace}/{obj['metadata']['name']}"
        self._set_status(name, {"phase": "Scaling", "currentScaler": pointer})
        if kind == "ScaleIn":
            self._scale_in(self._job(name), obj)
        else:
            self._scale_out(self._job(name), obj)

    # --- workers -------------------------------------------------------------------------------
    def workers(self, job: str) -> list[Obj]:
        return [p for p in self.server.objects("Pod", self.namespace)
                if (p["metadata"].get("labels") or {}).get("training-job-name") == job
                and (p["metadata"].get("labels") or {}).get("training-job-role") == "worker"]

    def _create_initial(self, job: Obj) -> None:
        name = job["metadata"]["name"]
        replicas = job["spec"]["etReplicaSpecs"]["worker"].get("replicas", 1)
        names = [f"{name}-worker-{i}" for i in range(replicas)]
        self._create_pods(job, names)
        self._set_status(name, {"phase": "Running", "targetWorkers": names,
                                "currentWorkers": [], "currentScaler": ""})

    def _create_pods(self, job: Obj, names: list[str], scaler: str | None = None) -> None:
        template = job["spec"]["etReplicaSpecs"]["worker"].get("template") or {}
        for pod in names:
            if self.server.get("Pod", pod, self.namespace) is not None:
                continue
            labels = {"group-name": "kai.alibabacloud.com", "training-job-name":
                      job["metadata"]["name"], "training-job-role": "worker",
                      "replica-index": str(_index(pod))}
            if scaler:
                labels["scale-out-name"] = scaler
            self.server.seed({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": self.namespace, "labels": labels,
                             "ownerReferences": [{"apiVersion": job["apiVersion"],
                                                  "kind": "TrainingJob",
                                                  "name": job["metadata"]["name"],
                                                  "uid": job["metadata"].get("uid", ""),
                                                  "controller": True}]},
                "spec": {**(template.get("spec") or {"containers": [{"name": "worker"}]})},
                "status": {"phase": "Pending"},
            })

    def _start_pending(self, job: str) -> None:
        """The scheduler and kubelet, kindly: pending workers run (if `pods_run`)."""
        if not self.pods_run:
            return
        for pod in self.workers(job):
            if pod["status"].get("phase") == "Pending" and \
                    not pod["metadata"].get("deletionTimestamp"):
                self.server.patch("Pod", pod["metadata"]["name"], {"spec": {"nodeName": "n0"},
                                  "status": {"phase": "Running", "conditions": [
                                      {"type": "Ready", "status": "True"}]}}, self.namespace)

    def _sync_workers(self, job: Obj) -> None:
        """worker.go `handleWorkersFailed`: Running workers, the hostfile, lost workers."""
        name, status = job["metadata"]["name"], job.get("status") or {}
        pods = {p["metadata"]["name"]: p for p in self.workers(name)}
        running = sorted((n for n, p in pods.items() if p["status"].get("phase") == "Running"),
                         key=_index)
        if running != status.get("currentWorkers"):
            self._write_hostfile(job, running)
        target = list(status.get("targetWorkers") or running)
        always = job["spec"]["etReplicaSpecs"]["worker"].get("restartPolicy") == "Always"
        gone = [n for n in target if n not in pods]
        if gone and always:
            top = max([0, *map(_index, target)])
            fresh = [f"{name}-worker-{top + 1 + i}" for i in range(len(gone))]
            self._create_pods(job, fresh)
            target = [n for n in target if n not in gone] + fresh
        self._set_status(name, {"currentWorkers": running, "targetWorkers": target})

    # --- scalers -------------------------------------------------------------------------------
    def _current_scaler(self, job: Obj) -> tuple[str, Obj] | None:
        if (job.get("status") or {}).get("phase") not in ("Running", "Scaling"):
            return None
        mine = [(kind, s) for kind in ("ScaleIn", "ScaleOut")
                for s in self.server.objects(kind, self.namespace)
                if (s.get("spec") or {}).get("selector", {}).get("name") == job["metadata"]["name"]
                and self._outcome(s) is None]
        if not mine:
            return None
        return max(mine, key=lambda ks: ks[1]["metadata"]["creationTimestamp"])

    @staticmethod
    def _outcome(scaler: Obj) -> str | None:
        conditions = (scaler.get("status") or {}).get("conditions") or []
        last = conditions[-1]["type"] if conditions else None
        return last if last in _FINISHED else None

    def _scale_in(self, job: Obj, scaler: Obj) -> None:
        name, status = scaler["metadata"]["name"], scaler.get("status") or {}
        victims = status.get("toDeletePods")
        if not victims:  # setsSaleInToDelete: named pods that exist now (Terminating included)
            existing = {p["metadata"]["name"] for p in self.workers(job["metadata"]["name"])}
            victims = [p for p in scaler["spec"]["toDelete"].get("podNames") or ()
                       if p in existing]
            self._scaler_status("ScaleIn", name, {"toDeletePods": victims}, "Scaling")
        running = [p for p in (job.get("status") or {}).get("currentWorkers") or ()
                   if p not in victims]
        self._write_hostfile(job, running)
        if not self.has_ps:  # executeOnLauncher fails: requeued, forever
            return
        waiting = [p for p in victims
                   if any(f"{SSH_ATTACH} {p}" in line for line in self.processes)]
        if waiting:
            return
        # DeleteWorkerPods(job, victims or nil): an empty list deletes every worker
        doomed = victims or [p["metadata"]["name"] for p in self.workers(job["metadata"]["name"])]
        for pod in doomed:
            if self.server.get("Pod", pod, self.namespace) is not None:
                self.server.delete("Pod", pod, self.namespace)
        target = [p for p in (job.get("status") or {}).get("targetWorkers") or ()
                  if p not in victims]
        self._set_status(job["metadata"]["name"], {"targetWorkers": target})
        self._scaler_status("ScaleIn", name, {}, "ScaleSucceeded")

    def _scale_out(self, job: Obj, scaler: Obj) -> None:
        name, status = scaler["metadata"]["name"], scaler.get("status") or {}
        added = status.get("addPods")
        target = list((job.get("status") or {}).get("targetWorkers") or ())
        if not added:
            top = max(map(_index, target)) if target else -1
            added = [f"{job['metadata']['name']}-worker-{top + 1 + i}"
                     for i in range(scaler["spec"]["toAdd"]["count"])]
            self._scaler_status("ScaleOut", name, {"addPods": added}, "Scaling")
            self._create_pods(job, added, scaler=name)
            return
        pods = [self.server.get("Pod", p, self.namespace) for p in added]
        if all(p is not None and p["status"].get("phase") == "Running" for p in pods):
            running = (job.get("status") or {}).get("currentWorkers") or []
            self._write_hostfile(job, sorted({*running, *added}, key=_index))
            self._set_status(job["metadata"]["name"], {"targetWorkers": target + added})
            self._scaler_status("ScaleOut", name, {}, "ScaleSucceeded")
            return
        timeout = timedelta(seconds=scaler["spec"].get("timeout", 60))
        if self.server.now() - _time(scaler["metadata"]["creationTimestamp"]) > timeout:
            for pod in added:  # all-or-nothing rollback
                if self.server.get("Pod", pod, self.namespace) is not None:
                    self.server.delete("Pod", pod, self.namespace)
            self._scaler_status("ScaleOut", name, {}, "ScaleFailed")

    # --- writes --------------------------------------------------------------------------------
    def _job(self, name: str) -> Obj:
        job = self.server.get("TrainingJob", name, self.namespace)
        assert job is not None
        return job

    def _set_status(self, job: str, status: Obj) -> None:
        self.server.patch("TrainingJob", job, {"status": status}, self.namespace)

    def _scaler_status(self, kind: str, name: str, status: Obj, condition: str) -> None:
        scaler = self.server.get(kind, name, self.namespace)
        conditions = list((scaler or {}).get("status", {}).get("conditions") or [])
        if not conditions or conditions[-1]["type"] != condition:
            conditions.append({"type": condition, "status": "True",
                               "lastTransitionTime": self.server.now().strftime(
                                   "%Y-%m-%dT%H:%M:%SZ")})
        self.server.patch(kind, name, {"status": {**status, "conditions": conditions}},
                          self.namespace)

    def _write_hostfile(self, job: Obj, workers: list[str]) -> None:
        """scaleout_controller.go `hostfileUpdateScript`: `echo '...' > hostfile`."""
        if self.hostfile is None:
            return
        spec = job["spec"]
        slots = spec.get("slotsPerWorker") or 1
        lines = [f"{w}:{slots}\n" for w in workers]
        with self.hostfile.open("w") as f:  # truncates first: a reader may see it empty
            if self.line_by_line:
                for line in lines:
                    f.write(line)
                    f.flush()
            else:
                f.write("".join(lines))
