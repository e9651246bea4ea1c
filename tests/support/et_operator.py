"""A stand-in for et-operator, unkind parts included, that tests run against the API emulator.

It does through the API server what AliyunContainerService/et-operator (main @ 96806fb,
``pkg/controllers``; controller-runtime v0.4) does, read from its source; each method names the
Go function it follows. Its three controllers:

- ScaleIn/ScaleOut controllers (scalein_controller.go / scaleout_controller.go
  ``setScalingOwner``): a scaler with no ownerReferences whose ``spec.selector.name`` names a
  TrainingJob of its namespace gets that job as controller owner and a ``Created`` condition;
  if the job does not exist the scaler is orphaned for good (reconciled again only when it
  changes). A scaler that already has any ownerReference is never adopted, so never runs.
- the TrainingJob controller (trainingjob_controller.go ``ReconcileJobs``): creates workers
  ``<job>-worker-<i>`` and a headless Service each (worker.go), then the ``<job>-config``
  ConfigMap and the ``<job>-launcher`` pod (launcher.go); keeps ``status`` (phase,
  currentWorkers = Running workers by index, targetWorkers, replicaStatuses, conditions); runs
  ONE scaler at a time, the unfinished one it controls with the NEWEST creationTimestamp (ties:
  the first listed, ScaleOuts before ScaleIns, by namespace/name), and only while the job is
  Running (scaler.go ``updateLatestScaler``); a scaler deleted meanwhile just ends
  (``executeScaling``: ``scaleIn == nil`` -> ``finishTrainingScaler``). Scalers go
  ``Created`` -> ``Scaling`` -> (``ScriptExecuted``) -> ``ScaleSucceeded`` | ``ScaleFailed``.

Its unkind behaviours: a ScaleIn whose named pods are all gone deletes EVERY worker with grace 0
(scalein.go ``setsSaleInToDelete`` + worker.go ``DeleteWorkerPods(job, nil)``); a ScaleIn with no
``spec.toDelete`` panics the operator (nil dereference; controller-runtime v0.4 does not
recover): recorded in ``panics`` and raised from ``step()``; the victims' processes are awaited
with ``ps -ef | grep '<attach>'`` in the launcher and ``strings.Contains`` (``worker-1`` matches
``worker-10``), with no timeout, and a launcher without ``ps`` fails that exec forever
(``checkWorkerShutdown``); new pods are named from the highest index in status.targetWorkers + 1
(scaleout.go ``getWorkerPodsMaxIndex``: -1 for an empty list, else starting from 0); a ScaleOut
whose pods are not all Running by ``spec.timeout`` (60 s) deletes them all (``ScaleOutFailed``);
the hostfile is rewritten IN PLACE by ``echo '<lines>' > /etc/edl/hostfile`` (truncate, then
write; echo adds a newline, so the file ends with a blank line) on every scaler and whenever the
Running worker set changes once the job has run (worker.go ``handleWorkersFailed``); a worker
lost without a scaler is recreated under a NEW index only with worker ``restartPolicy: Always``
(nil means Never, ``jobRestartPolicy``).

The launcher container is the test's: ``hostfile`` (the local file standing for
/etc/edl/hostfile), ``processes`` (its ``ps -ef`` lines), ``has_ps``; ``execs`` records every
script run. A job without a launcher pod makes every exec a silent no-op (``executeOnLauncher``
returns nothing for a nil launcher); one whose launcher is not Running fails the exec.

Not modelled: the informer cache's lag (the real one reads a cache), ServiceAccount/Role/
RoleBinding/Secret (not served by the emulator), Events (kept in ``events`` instead), the
ssh-key volume. ``pods_run`` stands in for the scheduler and kubelet: pending pods of the
operator's jobs are bound and started at the next pass.

Drive it with ``step()`` (reconcile until nothing changes: deterministic) or ``start()`` (a
thread reconciling on every change of the emulator and every ``interval``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from . import raw_api
from .kube_api import KubeApiServer

Obj = dict[str, Any]
GROUP, VERSION = "kai.alibabacloud.com", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
SSH_ATTACH = "ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no"
KUBEXEC_ATTACH = "/etc/mpi/kubexec.sh"  # getKubexecPath()
HOSTFILE_PATH = "/etc/edl/hostfile"  # getHostfilePath()
SCALE_OUT_LABEL = "scaleout-name"  # scaleout_controller.go scaleOutName
GPU = "nvidia.com/gpu"
_PATHS = {
    "TrainingJob": f"/apis/{API_VERSION}/namespaces/{{ns}}/trainingjobs",
    "ScaleIn": f"/apis/{API_VERSION}/namespaces/{{ns}}/scaleins",
    "ScaleOut": f"/apis/{API_VERSION}/namespaces/{{ns}}/scaleouts",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
}
_CLUSTER = {
    "TrainingJob": f"/apis/{API_VERSION}/trainingjobs",
    "ScaleIn": f"/apis/{API_VERSION}/scaleins",
    "ScaleOut": f"/apis/{API_VERSION}/scaleouts",
    "Pod": "/api/v1/pods",
}
_SCALE_TYPE = {"ScaleIn": "ScalingIn", "ScaleOut": "ScalingOut"}  # GetScaleType()


class OperatorPanic(Exception):
    """The Go process would have crashed here (and restarted, to crash again)."""


class _Requeue(Exception):  # noqa: N818 - Go's RequeueError: try again after PollInterval
    pass


class _GoError(Exception):  # noqa: N818 - an error returned up the reconcile
    pass


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"  # getWorkerName


def worker_index(job: str, name: str) -> int | None:
    """getWorkerIndex: TrimPrefix(name, "<job>-worker-") parsed as an integer."""
    tail = name.removeprefix(f"{job}-worker-")
    try:
        return int(tail)
    except ValueError:
        return None


def max_index(pods: list[str]) -> int:
    """scaleout.go getWorkerPodsMaxIndex: -1 for none, else the largest trailing number, from 0
    (a name that does not parse counts as 0)."""
    if not pods:
        return -1
    best = 0
    for pod in pods:
        with contextlib.suppress(ValueError):  # strconv.Atoi's error: index 0
            best = max(best, int(pod.split("-")[-1]))
    return best


def sort_pod_names(job: str, names: list[str]) -> list[str]:
    """scalein.go sortPodNames: by index, names rebuilt from it (unparsable ones dropped)."""
    indices = sorted(i for n in names if (i := worker_index(job, n)) is not None)
    return [worker_name(job, i) for i in indices]


def gen_labels(job: str) -> dict[str, str]:  # trainingjob_controller.go GenLabels
    return {"group-name": GROUP, "training-job-name": job}


def slots_of(job: Obj) -> int:
    """resource.go getSlots: slotsPerWorker, else the worker container[0]'s nvidia.com/gpu
    limit (Quantity.AsInt64: 0 when not a whole number), else 1."""
    spec = job.get("spec") or {}
    if spec.get("slotsPerWorker") is not None:
        return int(spec["slotsPerWorker"])
    containers = (
        (((spec.get("etReplicaSpecs") or {}).get("worker") or {}).get("template") or {}).get("spec")
        or {}
    ).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits")
    if limits is not None and GPU in limits:
        value = str(limits[GPU])
        return int(value) if value.isdigit() else 0
    return 1


def hostfile_content(workers: list[str], slots: int) -> str:  # getHostfileContent
    return "".join(f"{w}:{slots}\n" for w in workers)


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _rv_of(obj: Obj) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _job_status(raw: Obj | None, extra: tuple[str, ...] = ()) -> Obj:
    """A status as the Go operator holds it after decoding (common.JobStatus + the kind's own
    list fields): unknown fields dropped, conditions/replicaStatuses/restartCount always."""
    raw = raw or {}
    status: Obj = {
        "phase": raw.get("phase") or "",
        "conditions": copy.deepcopy(raw.get("conditions")) or [],
        "replicaStatuses": {
            k: {f: v.get(f, 0) for f in ("active", "succeeded", "failed")}
            for k, v in (raw.get("replicaStatuses") or {}).items()
            if isinstance(v, dict)
        },
        "restartCount": raw.get("restartCount") or 0,
        "currentScaler": raw.get("currentScaler") or "",
    }
    for key in ("startTime", "completionTime", "lastReconcileTime"):
        status[key] = raw.get(key)
    for key in ("targetWorkers", "currentWorkers", *extra):
        status[key] = list(raw.get(key) or [])
    return status


def _wire(status: Obj) -> Obj:
    """The JSON encoding of a Go status: omitempty fields dropped when empty."""
    out: Obj = {}
    for k, v in status.items():
        if k == "replicaStatuses":
            out[k] = {r: {f: n for f, n in c.items() if n} for r, c in v.items()}
        elif k == "conditions":  # reason and message are omitempty
            out[k] = [
                {f: x for f, x in c.items() if x != "" or f not in ("reason", "message")} for c in v
            ]
        elif k == "restartCount" or v not in ("", None, []):
            out[k] = v
    return out


class EtOperator:
    def __init__(
        self,
        server: KubeApiServer,
        namespace: str | None = None,
        hostfile: Path | Callable[[str], Path | None] | None = None,
        *,
        line_by_line: bool = False,
        pods_run: bool = True,
        node: str = "node-0",
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.server = server
        self.namespace = namespace  # None: every namespace, as the real one watches
        self.hostfile = hostfile  # the launcher's /etc/edl/hostfile (or one per job name)
        self.line_by_line = line_by_line  # the write(2)s of the echo: one per line
        self.pods_run = pods_run  # pending pods of its jobs are bound and started next pass
        self.node = node
        self.clock = clock or server.now
        self.processes: list[str] = []  # the launcher's `ps -ef` lines
        self.has_ps = True  # False: the launcher image has no `ps`
        self.script_ok = True  # False: a scaler's spec.script exits non-zero
        self.execs: list[tuple[str, str]] = []  # (launcher pod, script) as run
        self.events: list[Obj] = []  # what its EventRecorder would have recorded
        self.errors: list[str] = []  # errors the reconciles returned (requeued)
        self.panics: list[str] = []
        self._client = server.api_client()
        self._writes = 0
        self._orphans: dict[tuple[str, str, str], str] = {}  # scaler -> rv when orphaned
        self._ns = namespace or "default"  # the namespace of the job being reconciled
        self._mutex = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------ driving it
    def step(self, max_passes: int = 50) -> int:
        """Reconcile until a whole pass writes nothing (what the watch-driven controllers do
        right away); returns the passes run. Waits (a ps wait, pods not yet Running, a
        timeout not reached) end it. Raises OperatorPanic where the real one would crash."""
        for n in range(1, max_passes + 1):
            if not self.reconcile_once():
                return n
        raise AssertionError(f"et-operator stand-in did not settle in {max_passes} passes")

    def reconcile_once(self) -> bool:
        """One pass: the scheduler/kubelet stand-in, the two scaler controllers, then every
        TrainingJob. True if anything was written."""
        with self._mutex:
            before = self._writes
            for kind in ("ScaleOut", "ScaleIn"):
                for scaler in self._list(kind):
                    self._set_scaling_owner(kind, scaler)
            for job in self._list("TrainingJob"):
                self._ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
                if self.pods_run:
                    self._start_pending(name)
                    self._start_launcher(name)
                self._reconcile_job(self._ns, name)
            return self._writes != before

    def start(self, interval: float = 0.05) -> EtOperator:
        """Reconcile in a thread on every change of the emulator (and every ``interval``, for
        timeouts); errors and panics are recorded, not raised."""

        def run() -> None:
            seen = -1
            while not self._stop.is_set():
                try:
                    self.reconcile_once()
                except OperatorPanic:
                    pass  # recorded in panics; the real one restarts and goes on
                except Exception as e:  # keep going, like a requeue
                    self.errors.append(repr(e))
                seen = self.server.wait_for_change(
                    max(seen, self.server.resource_version), interval
                )

        self._stop.clear()
        self._thread = threading.Thread(target=run, daemon=True, name="et-operator")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> EtOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def workers(self, job: str, namespace: str | None = None) -> list[Obj]:
        """The job's worker pods as GetWorkerPods lists them (Terminating ones included)."""
        ns = namespace or self.namespace or "default"
        return self._list("Pod", ns, {**gen_labels(job), "training-job-role": "worker"})

    # ------------------------------------------------------------ the API (as the Go client)
    def _path(self, kind: str, ns: str | None, name: str | None = None, sub: str = "") -> str:
        base = _PATHS[kind].format(ns=ns) if ns is not None else _CLUSTER[kind]
        return base + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def _call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, Any]] | None = None
    ) -> Obj:
        response = raw_api.send(self._client, method, path, body, query=query or (), timeout=10)
        data: Obj = json.loads(response.data)
        if method != "GET":
            self._writes += 1
        return data

    def _get(self, kind: str, ns: str, name: str) -> Obj | None:
        try:
            return self._call("GET", self._path(kind, ns, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _list(
        self, kind: str, ns: str | None = None, labels: dict[str, str] | None = None
    ) -> list[Obj]:
        ns = ns if ns is not None else self.namespace
        query = (
            [("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items()))] if labels else []
        )
        try:
            items: list[Obj] = self._call("GET", self._path(kind, ns), query=query)["items"]
        except ApiException as e:
            if e.status == 404:  # the CRD is not installed: nothing to reconcile
                return []
            raise
        return items

    def _create(self, kind: str, ns: str, body: Obj) -> Obj:
        return self._call("POST", self._path(kind, ns), body)

    def _delete(self, kind: str, ns: str, name: str) -> None:
        """client.DeleteOptions{GracePeriodSeconds: 0}; NotFound is fine."""
        try:
            self._call(
                "DELETE",
                self._path(kind, ns, name),
                {"gracePeriodSeconds": 0},
                query=[("gracePeriodSeconds", 0)],
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def _update_status(self, kind: str, obj: Obj, status: Obj) -> Obj | None:
        """updateObjectStatus: Status().Update of the object as read (its resourceVersion);
        a conflict is logged and the change is lost until the next reconcile."""
        body = {**obj, "status": _wire(status)}
        meta = obj["metadata"]
        try:
            return self._call(
                "PUT", self._path(kind, meta["namespace"], meta["name"], "status"), body
            )
        except ApiException as e:
            self.errors.append(f"update {kind} {meta['name']} status: {e.status} {e.reason}")
            return None

    def _event(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        self.events.append(
            {
                "object": f"{obj['kind']}/{obj['metadata']['name']}",
                "type": type_,
                "reason": reason,
                "message": message,
            }
        )

    # ------------------------------------------------------------ conditions (status.go)
    def _condition(self, ctype: str, reason: str, message: str) -> Obj:
        now = _stamp(self.clock())
        return {
            "type": ctype,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }

    @staticmethod
    def _has(status: Obj, ctype: str) -> bool:  # hasCondition
        return any(
            c.get("type") == ctype and c.get("status") == "True" for c in status["conditions"]
        )

    def _set_condition(self, status: Obj, cond: Obj) -> None:
        """setCondition: nothing once Failed; same status keeps lastTransitionTime; appended
        last (filterOutCondition drops the old one, and Running on Succeeded/Failed)."""
        if self._has(status, "Failed"):
            return
        current = next((c for c in status["conditions"] if c.get("type") == cond["type"]), None)
        if current is not None and all(
            (current.get(k) or "") == (cond.get(k) or "") for k in ("status", "reason", "message")
        ):
            return
        if current is not None and current.get("status") == cond["status"]:
            cond["lastTransitionTime"] = current.get("lastTransitionTime")
        kept = []
        for c in status["conditions"]:
            if c.get("type") == cond["type"] or {c.get("type"), cond["type"]} == {
                "Running",
                "Restarting",
            }:
                continue
            if cond["type"] in ("Failed", "Succeeded") and c.get("type") == "Running":
                c = {**c, "status": "False"}
            kept.append(c)
        status["conditions"] = [*kept, cond]

    def _update_conditions(self, status: Obj, ctype: str, reason: str, message: str) -> None:
        self._set_condition(status, self._condition(ctype, reason, message))

    def _update_status_phase(self, status: Obj, ctype: str, reason: str, message: str) -> None:
        self._update_conditions(status, ctype, reason, message)  # updateStatus
        status["phase"] = ctype

    @staticmethod
    def _init_status(status: Obj, *replicas: str) -> None:  # initializeJobStatus(es)
        for r in replicas:
            status["replicaStatuses"][r] = {"active": 0, "succeeded": 0, "failed": 0}

    # ------------------------------------------------------------ scaler controllers
    def _set_scaling_owner(self, kind: str, scaler: Obj) -> None:
        """scalein_controller.go setScalingOwner (the ScaleOut one is the same)."""
        meta = scaler["metadata"]
        status = _job_status(scaler.get("status"), ("toDeletePods", "addPods"))
        if meta.get("deletionTimestamp") or self._finished(status) or meta.get("ownerReferences"):
            return
        ref = (kind, meta["namespace"], meta["name"])
        if self._orphans.get(ref) == _rv_of(scaler):
            return  # reconciled again only when the scaler changes
        job_name = ((scaler.get("spec") or {}).get("selector") or {}).get("name", "")
        job = self._get("TrainingJob", meta["namespace"], job_name) if job_name else None
        if job is None:
            self._orphans[ref] = _rv_of(scaler)
            return
        self._orphans.pop(ref, None)
        msg = (
            f"Scaling job {kind}:{meta['namespace']}/{meta['name']} created, match the "
            f"training job {meta['namespace']}/{job_name}"
        )
        self._update_conditions(status, "Created", "", msg)
        owner = self._owner(job)
        updated = self._update_status(kind, scaler, status)
        if updated is None:
            return
        updated["metadata"]["ownerReferences"] = [owner]
        try:
            self._call("PUT", self._path(kind, meta["namespace"], meta["name"]), updated)
        except ApiException as e:
            self.errors.append(f"update {kind} {meta['name']}: {e.status}")

    def _finished(self, status: Obj) -> bool:  # isScaleFinished
        return self._has(status, "ScaleSucceeded") or self._has(status, "ScaleFailed")

    # ------------------------------------------------------------ the TrainingJob controller
    def _reconcile_job(self, ns: str, name: str) -> None:
        """Reconcile + ReconcileJobs, with its deferred status write against the latest job."""
        job = self._get("TrainingJob", ns, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        status = _job_status(job.get("status"))
        old = copy.deepcopy(status)
        job["status"] = status
        try:
            self._reconcile_jobs(job, status)
        except _Requeue:
            pass
        except _GoError as e:
            self.errors.append(f"{ns}/{name}: {e}")
        finally:
            if status != old:
                latest = self._get("TrainingJob", ns, name) or job
                self._update_status("TrainingJob", latest, status)

    def _reconcile_jobs(self, job: Obj, status: Obj) -> None:
        name = job["metadata"]["name"]
        if (job["metadata"].get("annotations") or {}).get(
            "job-supervisor.kube-ai.io/job-suspended"
        ) == "true":
            self._update_conditions(
                status,
                "Suspended",
                "WaitingResourceTimeout",
                f"TrainingJob {name} is waiting resource timeout.",
            )
            status["phase"] = "Suspended"
        phase = status["phase"]
        if phase == "Succeeded":
            self._cleanup(job)
        elif phase == "Failed":
            self._restart_job(job, status)
        elif phase == "Suspended":
            self._delete_workers(job, None)
            self._delete_launcher(job)
        elif phase in ("", "Created"):
            self._initialize_job(job, status)
            self._reconcile_resource(job, status)
        elif phase == "Running":
            self._sync_launcher_state(job, status)
            self._sync_workers_state(job, status)
            if status["phase"] == "Running":
                self._set_training_job_scaler(job, status)
        elif phase == "Scaling":
            self._execute_scaling(job, status)

    def _initialize_job(self, job: Obj, status: Obj) -> None:
        if not status["conditions"]:
            self._init_created(job, status)
        if not status["startTime"]:
            status["startTime"] = _stamp(self.clock())

    def _init_created(self, job: Obj, status: Obj) -> None:
        """Fresh replica statuses and phase Created: a new job's start, and a restart's."""
        self._init_status(status, "Launcher", "Worker")
        self._update_status_phase(
            status,
            "Created",
            "TrainingJobCreated",
            f"TrainingJob {job['metadata']['name']} is created.",
        )

    def _reconcile_resource(self, job: Obj, status: Obj) -> None:
        """doSteps: the first step whose condition is missing, one per reconcile."""
        steps = (
            ("WorkersCreated", self._create_training_job_workers),
            ("WorkersReady", self._wait_workers_running),
            ("LauncherCreated", self._create_launcher),
            ("Running", self._sync_launcher_state),
        )
        for condition, action in steps:
            if not self._has(status, condition):
                action(job, status)
                return

    def _cleanup(self, job: Obj) -> None:
        """cleanup: CleanPodPolicy nil means Running, which (like All) deletes every worker."""
        if (job.get("spec") or {}).get("cleanPodPolicy", "Running") in ("Running", "All"):
            self._delete_workers(job, None)

    def _restart_job(self, job: Obj, status: Obj) -> None:
        """restartJob/needRestartJob: spec.restartPolicy OnFailure below backoffLimit starts
        the job over; otherwise cleanup."""
        spec = job.get("spec") or {}
        if spec.get("restartPolicy") == "OnFailure" and status["restartCount"] < spec.get(
            "backoffLimit", 6
        ):
            status["restartCount"] += 1
            status.update(conditions=[], currentWorkers=[], targetWorkers=[])
            self._init_created(job, status)
            self._delete_workers(job, None)
            self._delete_launcher(job)
            self._reconcile_resource(job, status)
        else:
            self._cleanup(job)

    # --- workers (worker.go) ---------------------------------------------------------------
    def _worker_spec(self, job: Obj) -> Obj:
        return ((job.get("spec") or {}).get("etReplicaSpecs") or {}).get("worker") or {}

    def _attach_mode(self, job: Obj) -> str:  # GetAttachMode: ssh unless set
        return (job.get("spec") or {}).get("launcherAttachMode") or "ssh"

    def _create_training_job_workers(self, job: Obj, status: Obj) -> None:
        name = job["metadata"]["name"]
        workers = status["targetWorkers"] or [
            worker_name(name, i) for i in range(int(self._worker_spec(job).get("replicas", 1)))
        ]
        status["targetWorkers"] = list(workers)
        try:
            self._create_workers(job, workers)
        except ApiException as e:
            self._update_status_phase(
                status,
                "Failed",
                "TrainingJobFailed",
                f"job({job['metadata']['namespace']}/{name}) create "
                f"workerPods failed, error: {e.reason}",
            )
            return
        self._update_conditions(
            status,
            "WorkersCreated",
            "",
            f"create trainingjob({job['metadata']['namespace']}/{name}) workers",
        )

    def _wait_workers_running(self, job: Obj, status: Obj) -> None:
        self._sync_workers_state(job, status)
        if len(status["currentWorkers"]) >= int(self._worker_spec(job).get("replicas", 1)):
            self._update_conditions(
                status,
                "WorkersReady",
                "",
                f"trainingjob("
                f"{job['metadata']['namespace']}/{job['metadata']['name']})"
                f" all workers ({len(status['currentWorkers'])}) are running",
            )

    def _create_workers(self, job: Obj, names: list[str], scale_out: str | None = None) -> None:
        """createWorkers/createWorker: a pod unless it exists, and its Service."""
        ns, job_name = job["metadata"]["namespace"], job["metadata"]["name"]
        for pod in names:
            index = worker_index(job_name, pod)
            if index is None:
                raise _GoError(f"invalid worker name {pod}")
            if self._get("Pod", ns, pod) is None:
                self._create("Pod", ns, self._new_worker(job, pod, index, scale_out))
            if self._get("Service", ns, pod) is None:
                self._create("Service", ns, self._new_service(job, pod, index))

    def _owner(self, job: Obj) -> Obj:  # metav1.NewControllerRef(job, TrainingJob)
        return {
            "apiVersion": API_VERSION,
            "kind": "TrainingJob",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _new_worker(self, job: Obj, name: str, index: int, scale_out: str | None) -> Obj:
        """resource.go newWorker: the template, GenLabels + role + replica-index (+ the
        ScaleOut's name), restartPolicy Never, a default command for container[0]."""
        template = copy.deepcopy(self._worker_spec(job).get("template") or {})
        tmeta, spec = template.get("metadata") or {}, template.get("spec") or {}
        labels = {
            **(tmeta.get("labels") or {}),
            **gen_labels(job["metadata"]["name"]),
            "training-job-role": "worker",
            "replica-index": str(index),
        }
        if scale_out:
            labels[SCALE_OUT_LABEL] = scale_out
        spec["restartPolicy"] = "Never"
        containers = spec.setdefault("containers", [{"name": "worker", "image": "worker"}])
        if not containers[0].get("command"):
            containers[0]["command"] = [
                "sh",
                "-c",
                "/usr/sbin/sshd  && sleep 365d"
                if self._attach_mode(job) == "ssh"
                else "sleep 365d",
            ]
        meta: Obj = {
            "name": name,
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "ownerReferences": [self._owner(job)],
        }
        if tmeta.get("annotations"):
            meta["annotations"] = tmeta["annotations"]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def _new_service(self, job: Obj, name: str, index: int) -> Obj:  # resource.go newService
        labels = {
            **gen_labels(job["metadata"]["name"]),
            "training-job-role": "worker",
            "replica-index": str(index),
        }
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "ownerReferences": [self._owner(job)],
            },
            "spec": {
                "clusterIP": "None",
                "selector": labels,
                "ports": [
                    {"name": "ssh-port", "port": 22},
                    {"name": "kubeai-service-port", "port": 9009},
                ],
            },
        }

    def _sync_workers_state(self, job: Obj, status: Obj) -> None:
        """syncWorkersState: replica counts, then handleWorkersFailed."""
        pods = self.workers(job["metadata"]["name"], job["metadata"]["namespace"])
        status["replicaStatuses"]["Worker"] = self._replica_counts(pods)
        self._handle_workers_failed(job, status, pods)

    @staticmethod
    def _replica_counts(pods: list[Obj]) -> Obj:  # workerReplicaStatuses
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        return {
            "active": phases.count("Running"),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
        }

    def _handle_workers_failed(self, job: Obj, status: Obj, pods: list[Obj]) -> None:
        """worker.go handleWorkersFailed: currentWorkers = the Running workers by index; the
        hostfile rewritten when that set changes (once the job has run); a target worker
        that is gone (or failed, per restartPolicy) replaced under a NEW index."""
        job_name = job["metadata"]["name"]
        by_name = {p["metadata"]["name"]: p for p in pods}
        last = set(status["currentWorkers"])
        running = []
        for name, pod in by_name.items():
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Running":
                running.append(name)
            elif phase in ("Failed", "Unknown", "Succeeded") and name in last:
                self._event(
                    job, "Warning", "TrainingJobWorkerFailed", f"worker {name} phase is {phase}."
                )
        running = sort_pod_names(job_name, running)
        if running != status["currentWorkers"] and self._has(status, "Running"):
            self._write_hostfile(job, running)  # an exec error returns before the updates
        if not status["targetWorkers"]:
            status["targetWorkers"] = list(running)
        status["currentWorkers"] = running
        policy = self._worker_spec(job).get("restartPolicy") or "Never"  # jobRestartPolicy
        restart = []
        for name in status["targetWorkers"]:
            pod = by_name.get(name)
            if pod is None:
                if policy == "Always":
                    restart.append(name)
                self._event(
                    job, "Warning", "TrainingJobWorkerFailed", f"worker {name} phase is Deleted."
                )
            elif self._needs_restart(policy, pod):
                restart.append(name)
        if restart:
            top = max_index(status["targetWorkers"])
            fresh = [worker_name(job_name, top + 1 + i) for i in range(len(restart))]
            self._create_workers(job, fresh)
            status["targetWorkers"] = [
                n for n in status["targetWorkers"] if n not in restart
            ] + fresh

    @staticmethod
    def _needs_restart(policy: str, pod: Obj) -> bool:  # podNeedRestart
        status = pod.get("status") or {}
        phase = status.get("phase")
        if policy == "Always":
            return phase in ("Failed", "Unknown", "Succeeded")
        if policy == "OnFailure":
            return phase == "Failed"
        if policy == "ExitCode" and phase == "Failed":
            for s in status.get("containerStatuses") or ():
                terminated = (s.get("state") or {}).get("terminated")
                if terminated is not None:
                    return 128 < terminated.get("exitCode", 0) < 255
        return False

    def _delete_workers(self, job: Obj, names: list[str] | None) -> None:
        """DeleteWorkers: services then pods, grace 0; ``None`` means EVERY worker
        (DeleteWorkerPods/DeleteWorkerServices filter only a non-nil list)."""
        ns, job_name = job["metadata"]["namespace"], job["metadata"]["name"]
        labels = {**gen_labels(job_name), "training-job-role": "worker"}
        for kind in ("Service", "Pod"):
            for obj in self._list(kind, ns, labels):
                if names is None or obj["metadata"]["name"] in names:
                    self._delete(kind, ns, obj["metadata"]["name"])
                    self._event(
                        job,
                        "Normal",
                        "TrainingJobSucceeded",
                        f"Deleted {kind.lower()} {obj['metadata']['name']}",
                    )

    # --- launcher (launcher.go) ------------------------------------------------------------
    def _create_launcher(self, job: Obj, status: Obj) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if self._get("ConfigMap", ns, f"{name}-config") is None:
            self._create("ConfigMap", ns, self._new_config_map(job, status))
        if self._get("Pod", ns, f"{name}-launcher") is None:
            self._create("Pod", ns, self._new_launcher(job))
        self._update_conditions(
            status, "LauncherCreated", "", f"create trainingjob({ns}/{name}) launcher"
        )

    def _new_config_map(self, job: Obj, status: Obj) -> Obj:  # newHostfileConfigMap
        name = job["metadata"]["name"]
        containers = (self._worker_spec(job).get("template") or {}).get("spec", {}).get(
            "containers"
        ) or []
        kubexec = "#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n/opt/kube/kubectl exec ${POD_NAME}"
        if containers:
            kubexec += f" --container {containers[0].get('name', '')}"
        kubexec += ' -- /bin/sh -c "$*"'
        slots = slots_of(job)
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{name}-config",
                "namespace": job["metadata"]["namespace"],
                "labels": {"app": name},
                "ownerReferences": [self._owner(job)],
            },
            "data": {
                "kubexec.sh": kubexec,
                "hostfile": hostfile_content(status["currentWorkers"], slots),
                "discover_hosts.sh": "#!/bin/bash\nwhile read line\ndo\necho $line\n"
                f"done < {HOSTFILE_PATH}\n",
                "deepspeed-hostfile": "".join(
                    f"{w} slots={slots}\n" for w in status["currentWorkers"]
                ),
            },
        }

    def _new_launcher(self, job: Obj) -> Obj:
        """resource.go newLauncher (the volumes' kubectl/deepspeed parts kept short)."""
        name = job["metadata"]["name"]
        launcher = ((job.get("spec") or {}).get("etReplicaSpecs") or {}).get("launcher") or {}
        template = copy.deepcopy(launcher.get("template") or {})
        tmeta, spec = template.get("metadata") or {}, template.get("spec") or {}
        labels = {
            **(tmeta.get("labels") or {}),
            **gen_labels(name),
            "training-job-role": "launcher",
        }
        containers = spec.setdefault("containers", [{"name": "launcher", "image": "launcher"}])
        containers[0].setdefault("volumeMounts", []).extend(
            [
                {"name": "training-job-hostfile", "mountPath": "/etc/edl"},
                {"name": "training-job-config", "mountPath": "/etc/mpi"},
            ]
        )
        if self._attach_mode(job) == "kubexec":
            containers[0].setdefault("env", []).append(
                {"name": "OMPI_MCA_plm_rsh_agent", "value": KUBEXEC_ATTACH}
            )
        spec.setdefault("initContainers", []).append(
            {
                "name": "init-hostfile",
                "image": "alpine:3.10",
                "command": [
                    "sh",
                    "-c",
                    "cp /etc/mpi/hostfile /etc/edl/hostfile && chmod 600 "
                    "/etc/edl/hostfile && cp /etc/mpi/discover_hosts.sh /etc/edl/discover_hosts.sh"
                    " && chmod +x /etc/edl/discover_hosts.sh",
                ],
                "volumeMounts": [
                    {"name": "training-job-hostfile", "mountPath": "/etc/edl"},
                    {"name": "training-job-config", "mountPath": "/etc/mpi"},
                ],
            }
        )
        spec.setdefault("volumes", []).extend(
            [
                {"name": "training-job-hostfile", "emptyDir": {}},
                {"name": "training-job-config", "configMap": {"name": f"{name}-config"}},
            ]
        )
        spec["serviceAccountName"] = f"{name}-launcher"
        spec["restartPolicy"] = "Never"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-launcher",
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "ownerReferences": [self._owner(job)],
            },
            "spec": spec,
        }

    def _delete_launcher(self, job: Obj) -> None:
        self._delete("Pod", job["metadata"]["namespace"], f"{job['metadata']['name']}-launcher")

    def _sync_launcher_state(self, job: Obj, status: Obj) -> None:
        """syncLauncherState: the job's phase from its launcher pod."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        launcher = self._get("Pod", ns, f"{name}-launcher")
        counts = status["replicaStatuses"].setdefault(
            "Launcher", {"active": 0, "succeeded": 0, "failed": 0}
        )
        if launcher is None:
            policy = (
                ((job.get("spec") or {}).get("etReplicaSpecs") or {}).get("launcher") or {}
            ).get("restartPolicy")
            if policy == "Always":
                self._create("Pod", ns, self._new_launcher(job))
            elif policy == "Never":
                counts["failed"] = 1
                status["completionTime"] = status["completionTime"] or _stamp(self.clock())
                self._update_status_phase(
                    status, "Failed", "TrainingJobFailed", f"job({ns}/{name}) has failed"
                )
            return
        phase = (launcher.get("status") or {}).get("phase")
        if phase == "Succeeded":
            counts["succeeded"] = 1
            status["completionTime"] = status["completionTime"] or _stamp(self.clock())
            self._update_status_phase(
                status,
                "Succeeded",
                "TrainingJobSucceeded",
                f"job({ns}/{name}) successfully completed.",
            )
        elif phase == "Failed":
            counts["failed"] = 1
            reason = (launcher.get("status") or {}).get("reason") or "TrainingJobFailed"
            if reason == "Evicted":
                reason = "TrainingJobEvicted"
            elif not status["completionTime"]:
                status["completionTime"] = _stamp(self.clock())
            self._update_status_phase(status, "Failed", reason, f"job({ns}/{name}) has failed")
        elif phase == "Running":
            counts["active"] = 1
            if not self._has(status, "Running"):
                self._update_status_phase(
                    status, "Running", "TrainingJobRunning", f"job({ns}/{name}) is running."
                )

    # --- the launcher container: exec ---------------------------------------------------------
    def _exec_on_launcher(self, job: Obj, script: str) -> str:
        """executeOnLauncher + kubectlOnPod (`/bin/sh -c <script>` in container[0])."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        launcher = self._get("Pod", ns, f"{name}-launcher")
        if launcher is None:
            return ""  # a nil launcher: nothing runs, nothing fails
        self.execs.append((launcher["metadata"]["name"], script))
        if (launcher.get("status") or {}).get("phase") != "Running":
            raise _GoError("execute script failed: container not found (not running)")
        return ""

    def _hostfile_for(self, job: str) -> Path | None:
        return self.hostfile(job) if callable(self.hostfile) else self.hostfile

    def _write_hostfile(self, job: Obj, workers: list[str]) -> None:
        """hostfileUpdateScript: `echo '<content>' > /etc/edl/hostfile` through exec:
        truncated, then written (a reader can see it empty or partial); echo's newline
        leaves a blank last line."""
        content = hostfile_content(workers, slots_of(job))
        launcher = self._get(
            "Pod", job["metadata"]["namespace"], f"{job['metadata']['name']}-launcher"
        )
        self._exec_on_launcher(job, f"echo '{content}' > {HOSTFILE_PATH}")
        path = self._hostfile_for(job["metadata"]["name"])
        if path is None or launcher is None:
            return
        with path.open("w") as f:  # O_TRUNC first
            if self.line_by_line:
                for line in (content + "\n").splitlines(keepends=True):
                    f.write(line)
                    f.flush()
            else:
                f.write(content + "\n")

    def _check_worker_shutdown(self, job: Obj, workers: list[str] | None) -> list[str]:
        """scalein.go checkWorkerShutdown: the victims with no `<attach> <pod>` in the
        launcher's `ps -ef | grep '<attach>'` (a substring test)."""
        attach = KUBEXEC_ATTACH if self._attach_mode(job) == "kubexec" else SSH_ATTACH
        self._exec_on_launcher(job, f"ps -ef | grep '{attach}'")
        launcher = self._get(
            "Pod", job["metadata"]["namespace"], f"{job['metadata']['name']}-launcher"
        )
        if launcher is not None and not self.has_ps:  # sh: ps: not found; grep exits 1
            raise _GoError("execute script failed: command terminated with exit code 1")
        out = (
            "\n".join(
                [
                    *(p for p in self.processes if attach in p),
                    f"root 99 1 0 00:00 ? 00:00:00 grep {attach}",
                ]
            )
            if launcher
            else ""
        )
        return [w for w in workers or () if f"{attach} {w}" not in out]

    def _execute_scale_script(self, job: Obj, scaler: Obj, status: Obj, workers: list[str]) -> None:
        """scaler.go executeScaleScript: once per scaler (ScriptExecuted): spec.script if set,
        else the hostfile rewrite."""
        if self._has(status, "ScriptExecuted"):
            return
        full = f"{scaler['kind']}:{scaler['metadata']['namespace']}/{scaler['metadata']['name']}"
        msg = (
            f"trainingjob({job['metadata']['namespace']}/{job['metadata']['name']}): execute "
            f"script on launcher for {full}"
        )
        spec = scaler.get("spec") or {}
        if spec.get("script"):
            pods = ",".join(f"{w}:{slots_of(job)}" for w in self._pod_names(scaler, status))
            self._exec_on_launcher(
                job, f"timeout {spec.get('timeout', 60)} sh {spec['script']} {pods}"
            )
            if not self.script_ok:
                raise _GoError("execute script failed: command terminated with exit code 1")
        else:
            self._write_hostfile(job, workers)
        self._update_conditions(status, "ScriptExecuted", "", msg)

    # --- scalers (scaler.go) ------------------------------------------------------------------
    @staticmethod
    def _pod_names(scaler: Obj, status: Obj) -> list[str]:  # GetPodNames
        return list(status["toDeletePods"] if scaler["kind"] == "ScaleIn" else status["addPods"])

    def _workers_after(self, workers: list[str], scaler: Obj, status: Obj) -> list[str]:
        pods = self._pod_names(scaler, status)  # workersAfterScaler
        if scaler["kind"] == "ScaleOut":
            return [*workers, *pods]
        return [w for w in workers if w not in pods]

    def _set_training_job_scaler(self, job: Obj, status: Obj) -> None:
        """setTrainingJobScaler + updateLatestScaler: among every unfinished scaler the job
        controls (all namespaces are listed), the newest by creationTimestamp; on a tie the
        first listed (ScaleOuts first, then ScaleIns, by namespace/name)."""
        latest: Obj | None = None
        for kind in ("ScaleOut", "ScaleIn"):
            try:
                scalers = self._call("GET", _CLUSTER[kind])["items"]
            except ApiException:  # logged by the real one; nothing of that kind then
                scalers = []
            for scaler in scalers:
                st = _job_status(scaler.get("status"), ("toDeletePods", "addPods"))
                refs = scaler["metadata"].get("ownerReferences") or ()
                controlled = any(
                    r.get("controller") and r.get("uid") == job["metadata"]["uid"] for r in refs
                )
                if self._finished(st) or not controlled:
                    continue
                if latest is None or _parse(latest["metadata"]["creationTimestamp"]) < _parse(
                    scaler["metadata"]["creationTimestamp"]
                ):
                    latest = scaler
        if latest is None:
            return
        full = f"{latest['kind']}:{latest['metadata']['namespace']}/{latest['metadata']['name']}"
        scaler_status = _job_status(latest.get("status"), ("toDeletePods", "addPods"))
        msg = (
            f"trainingJobob({job['metadata']['namespace']}/{job['metadata']['name']}) "
            f"execute {full}"
        )
        self._update_scaler_state(latest, scaler_status, status, "Scaling", "ScalingStart", msg)
        status["currentScaler"] = full
        self._update_status(latest["kind"], latest, scaler_status)

    def _update_scaler_state(
        self, scaler: Obj, scaler_status: Obj, job_status: Obj, ctype: str, reason: str, msg: str
    ) -> None:
        """updateScalerState: the condition on the job and the scaler; the job Scaling (or
        Running again, currentScaler cleared, once the scaler is done)."""
        done = ctype in ("ScaleSucceeded", "ScaleFailed")
        cond = self._condition(ctype, reason, msg)
        self._set_condition(job_status, copy.deepcopy(cond))
        job_status["phase"] = "Running" if done else "Scaling"
        job_status["currentScaler"] = (
            ""
            if done
            else (
                f"{scaler['kind']}:{scaler['metadata']['namespace']}/{scaler['metadata']['name']}"
            )
        )
        self._set_condition(scaler_status, cond)
        scaler_status["phase"] = ctype

    def _scaler_failed(
        self, scaler: Obj, scaler_status: Obj, job_status: Obj, msg: str
    ) -> None:  # updateScalerFailed
        self._event(scaler, "Warning", "", msg)
        self._update_scaler_state(
            scaler,
            scaler_status,
            job_status,
            "ScaleFailed",
            f"{_SCALE_TYPE[scaler['kind']]}Failed",
            msg,
        )

    def _scaler_succeeded(self, scaler: Obj, scaler_status: Obj, job_status: Obj) -> None:
        full = f"{scaler['kind']}:{scaler['metadata']['namespace']}/{scaler['metadata']['name']}"
        msg = f"{full} has Succeeded"
        self._event(scaler, "Normal", "", msg)
        self._update_scaler_state(
            scaler,
            scaler_status,
            job_status,
            "ScaleSucceeded",
            f"{_SCALE_TYPE[scaler['kind']]}Succeeded",
            msg,
        )

    def _execute_scaling(self, job: Obj, status: Obj) -> None:
        """executeScaling: the current scaler, read again; gone or finished ends it."""
        self._sync_launcher_state(job, status)
        if not status["currentScaler"]:
            status["phase"] = "Running"
            return
        if self._has(status, "Succeeded") or self._has(status, "Failed"):
            return
        kind, _, ref = status["currentScaler"].partition(":")
        ns, _, name = ref.rpartition("/")
        if kind not in ("ScaleIn", "ScaleOut"):
            return
        scaler = self._get(kind, ns or job["metadata"]["namespace"], name)
        scaler_status = _job_status((scaler or {}).get("status"), ("toDeletePods", "addPods"))
        if scaler is None or self._finished(scaler_status):
            status["currentScaler"], status["phase"] = "", "Running"  # finishTrainingScaler
            return
        old = copy.deepcopy(scaler_status)
        try:
            if kind == "ScaleIn":
                self._execute_scale_in(job, status, scaler, scaler_status)
            else:
                self._execute_scale_out(job, status, scaler, scaler_status)
        finally:  # defer r.updateObjectStatus(scaler, oldStatus)
            if scaler_status != old:
                self._update_status(kind, scaler, scaler_status)

    def _execute_scale_in(self, job: Obj, status: Obj, scaler: Obj, st: Obj) -> None:
        """scalein.go executeScaleIn."""
        if scaler["metadata"].get("deletionTimestamp") or self._finished(st):
            return
        try:
            self._set_scale_in_to_delete(job, scaler, st)
        except _GoError as e:
            self._scaler_failed(
                scaler,
                st,
                status,
                f"{scaler['kind']}:"
                f"{scaler['metadata']['namespace']}/{scaler['metadata']['name']}"
                f" get to delete workers name failed, error: {e}",
            )
            return
        current = self._workers_after(status["currentWorkers"], scaler, st)
        try:
            self._execute_scale_script(job, scaler, st, current)
        except _GoError as e:
            self._scaler_failed(scaler, st, status, f"execute script failed, error: {e}")
            return
        # GetPodNames() is the status list: nil when empty, and nil means EVERY worker below
        victims: list[str] | None = list(st["toDeletePods"]) or None
        remain = False
        if not (scaler.get("spec") or {}).get("script"):
            shut_down = self._check_worker_shutdown(job, victims)  # an error requeues
            if len(victims or ()) != len(shut_down):
                remain, victims = True, shut_down
        self._delete_workers(job, victims)
        if self._workers_deleted(job, st["toDeletePods"]):
            status["targetWorkers"] = self._workers_after(status["targetWorkers"], scaler, st)
            status["currentWorkers"] = current
            self._scaler_succeeded(scaler, st, status)
            return
        if remain:
            raise _Requeue("wait for workers process shutdown")

    def _set_scale_in_to_delete(self, job: Obj, scaler: Obj, st: Obj) -> None:
        """setsSaleInToDelete: frozen once set; else the named pods that exist now (Terminating
        ones included), or by count the highest indices (count < workers)."""
        if st["toDeletePods"]:
            return
        pods = self.workers(job["metadata"]["name"], job["metadata"]["namespace"])
        to_delete = (scaler.get("spec") or {}).get("toDelete")
        if to_delete is None:
            msg = "runtime error: invalid memory address or nil pointer dereference"
            self.panics.append(f"{scaler['metadata']['name']}: {msg}")
            raise OperatorPanic(msg)  # toDelete.PodNames on a nil *ToDeleteSpec
        names = [p["metadata"]["name"] for p in pods]
        if to_delete.get("podNames") is not None:
            chosen = [n for n in names if n in to_delete["podNames"]]
        elif (to_delete.get("count") or 0) > 0:
            count = to_delete["count"]
            if count >= len(pods):
                raise _GoError(
                    f".spec.toDelete.count should be less than current replicas {len(pods)}"
                )
            ordered = sort_pod_names(job["metadata"]["name"], names)
            chosen = [n for n in names if n in ordered[len(pods) - count :]]
        else:
            raise _GoError(
                ".spec.toDelete.count or .spec.toDelete.podNames, only one of them should be set"
            )
        st["toDeletePods"] = [*st["toDeletePods"], *chosen]

    def _workers_deleted(self, job: Obj, names: list[str]) -> bool:  # isWorkersDeleted
        return all(self._get("Pod", job["metadata"]["namespace"], n) is None for n in names)

    def _execute_scale_out(self, job: Obj, status: Obj, scaler: Obj, st: Obj) -> None:
        """scaleout.go executeScaleOut."""
        if scaler["metadata"].get("deletionTimestamp"):
            return
        spec = scaler.get("spec") or {}
        count = (spec.get("toAdd") or {}).get("count")
        if count is None or count <= 0:  # validateScaleOut
            msg = (
                ".spec.toAdd.count shouldn't be empty"
                if count is None
                else ".spec.toAdd.count shouldn be greater than 0"
            )
            self._scaler_failed(scaler, st, status, msg)
            raise _GoError(msg)
        if not st["addPods"]:  # setScaleOutWorkers
            top = max_index(status["targetWorkers"])
            st["addPods"] = [
                worker_name(job["metadata"]["name"], top + 1 + i) for i in range(count)
            ]
        try:
            self._create_workers(job, st["addPods"], scale_out=scaler["metadata"]["name"])
        except (ApiException, _GoError) as e:
            self._scale_out_failed(
                job, status, scaler, st, f"create scaleout workers failed, error: {e}"
            )
            raise _GoError(str(e)) from None
        labels = {
            **gen_labels(job["metadata"]["name"]),
            "training-job-role": "worker",
            SCALE_OUT_LABEL: scaler["metadata"]["name"],
        }
        added = self._list("Pod", job["metadata"]["namespace"], labels)
        st["replicaStatuses"]["Worker"] = self._replica_counts(added)
        if st["replicaStatuses"]["Worker"]["active"] < count:
            if self._scale_out_timed_out(scaler, st):
                self._scale_out_failed(
                    job,
                    status,
                    scaler,
                    st,
                    f"scaleout job {scaler['kind']}"
                    f":{scaler['metadata']['namespace']}/"
                    f"{scaler['metadata']['name']} execution timeout",
                )
            raise _Requeue("wait for workers running")
        hosts = self._workers_after(status["currentWorkers"], scaler, st)
        try:
            self._execute_scale_script(job, scaler, st, hosts)
        except _GoError as e:
            self._scale_out_failed(job, status, scaler, st, f"execute script failed, error: {e}")
            raise
        status["targetWorkers"] = self._workers_after(status["targetWorkers"], scaler, st)
        self._scaler_succeeded(scaler, st, status)

    def _scale_out_timed_out(self, scaler: Obj, st: Obj) -> bool:
        """IsScaleOutTimeout: the Scaling condition (reason ScalingStart) is older than
        spec.timeout (60 s by default)."""
        timeout = (scaler.get("spec") or {}).get("timeout")
        timeout = 60 if timeout is None else timeout
        for c in st["conditions"]:
            if c.get("type") == "Scaling" and c.get("reason") == "ScalingStart":
                return _parse(c["lastTransitionTime"]) + timedelta(seconds=timeout) < self.clock()
        return False

    def _scale_out_failed(self, job: Obj, status: Obj, scaler: Obj, st: Obj, msg: str) -> None:
        """ScaleOutFailed: ScaleFailed, and every pod it added deleted (all or nothing)."""
        self._scaler_failed(scaler, st, status, msg)
        self._delete_workers(job, list(st["addPods"]))

    # ------------------------------------------------------------ the scheduler and kubelet
    def _start_pending(self, job: str) -> None:
        """The scheduler and kubelet, kindly: the job's pending workers are bound to ``node``
        and run. Override to schedule otherwise (``self._ns`` is the job's namespace)."""
        for pod in self.workers(job, self._ns):
            self._start(pod)

    def _start_launcher(self, job: str) -> None:
        launcher = self.server.get("Pod", f"{job}-launcher", self._ns)
        if launcher is not None:
            self._start(launcher)

    def _start(self, pod: Obj) -> None:
        if (pod.get("status") or {}).get("phase") == "Pending" and not pod["metadata"].get(
            "deletionTimestamp"
        ):
            self.server.run_pod(pod["metadata"]["name"], pod["metadata"]["namespace"], self.node)
            self._writes += 1
