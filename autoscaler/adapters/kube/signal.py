"""The checkpoint signal on Kubernetes: tell a job that some of its hosts are doomed, before the
drain, without ever delaying it (the format: autoscaler.notice).

- The job's annotation goes out in the drain's own patch (one write, no extra latency).
- Its worker pods get the same annotation (a downwardAPI volume turns it into a file the training
  script polls) and, where the job asks for it with `spot-autoscaler.io/checkpoint-hook`
  ("PORT" or "PORT/PATH"), an HTTP POST of the JSON to each pod's IP. Both run on a small pool
  behind the drain; a pod that refuses, hangs or answers garbage costs one warning and a count,
  never the drain.
"""

from __future__ import annotations

import http.client
import re
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import structlog
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.kinds.base import JobKind
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import PODS, Obj, annotations_of
from autoscaler.core.model import Decision
from autoscaler.notice import ANNOTATION, DEFAULT_HOOK_PATH, HOOK_ANNOTATION, CheckpointNotice

log = structlog.get_logger()

HOOK_TIMEOUT = 2.0  # seconds for one POST: the signal is worth little later than that
_POOL = 4  # threads for pod annotations and POSTs (each bounded by its timeout)
_HOOK = re.compile(r"(\d{1,5})(/[!-~]*)?")


def hook_target(value: str) -> tuple[int, str] | None:
    """(port, path) from the hook annotation's "PORT" or "PORT/PATH"; None if it is neither."""
    match = _HOOK.fullmatch(value.strip())
    if match is None or not 0 < int(match.group(1)) < 65536:
        return None
    return int(match.group(1)), match.group(2) or DEFAULT_HOOK_PATH


class CheckpointSignal:
    def __init__(self, objects: ObjectApi, recorder: EventRecorder) -> None:
        self._objects = objects
        self._recorder = recorder
        self._pool = ThreadPoolExecutor(_POOL, thread_name_prefix="checkpoint-signal")
        self._lock = threading.Lock()
        self.failures = 0  # pods the signal did not reach (annotation or POST)
        self._waiting = 0  # pods' signals queued on the pool, not yet begun
        self._told_bad_hook: set[tuple[str, str]] = set()  # (job uid, annotation value)

    def annotations(self, job: Obj, decision: Decision, now: datetime) -> dict[str, str | None]:
        """The job annotation for the drain's patch."""
        return {ANNOTATION: _notice(job, decision, now).encode()}

    def tell_pods(self, kind: JobKind, job: Obj, decision: Decision, now: datetime) -> None:
        """Annotate the job's worker pods and POST to them, behind the caller."""
        body = _notice(job, decision, now).encode()
        target = self._hook(job, now)
        self._pool.submit(self._tell, kind, job, body, target, decision)

    def _hook(self, job: Obj, now: datetime) -> tuple[int, str] | None:
        value = annotations_of(job).get(HOOK_ANNOTATION)
        if value is None:
            return None
        target = hook_target(value)
        if target is None:
            told = (str(job["metadata"].get("uid") or ""), value)
            with self._lock:
                first = told not in self._told_bad_hook
                self._told_bad_hook.add(told)
            if first:  # once per job and value: a clear Event, nothing else changes
                message = f"{HOOK_ANNOTATION}={value!r} is not PORT or PORT/PATH: no POST is sent"
                self._recorder.record(job, "CheckpointHookInvalid", message, now, warning=True)
        return target

    def _tell(
        self,
        kind: JobKind,
        job: Obj,
        body: str,
        target: tuple[int, str] | None,
        decision: Decision,
    ) -> None:
        try:
            pods = self._pods(kind, job, decision)
        except Exception as exc:  # the pool's thread: log it, never lose it silently
            self._failed(decision.job, "", "list", exc)
            return
        # the doomed first, each pod on its own: one that hangs holds up no other
        doomed = set(decision.pods)
        for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name") not in doomed):
            with self._lock:
                self._waiting += 1
            try:
                self._pool.submit(self._tell_pod, decision.job, pod, body, target)
            except RuntimeError:  # closed meanwhile (shutdown): the rest are not told
                with self._lock:
                    self._waiting -= 1
                return

    def _tell_pod(self, job: str, pod: Obj, body: str, target: tuple[int, str] | None) -> None:
        with self._lock:
            self._waiting -= 1
        self._annotate(job, pod, body)
        if target is not None:
            self._post(job, pod, body, target)

    def _pods(self, kind: JobKind, job: Obj, decision: Decision) -> list[Obj]:
        meta = job["metadata"]
        if kind.guard_labels is None:  # no label finds the workers: the doomed ones, by name
            return [self._objects.get(PODS, meta["namespace"], p) for p in decision.pods]
        selector = ",".join(f"{k}={v}" for k, v in kind.guard_labels(meta["name"]).items())
        return self._objects.pods(meta["namespace"], selector)

    def _annotate(self, job: str, pod: Obj, body: str) -> None:
        meta = pod.get("metadata") or {}
        patch = {"metadata": {"annotations": {ANNOTATION: body}}}
        try:
            self._objects.merge_patch(PODS, meta.get("namespace", ""), meta.get("name", ""), patch)
        except ApiException as exc:
            if exc.status == 404:  # gone already (a doomed pod deleted meanwhile): nobody to tell
                log.info("checkpoint_signal_pod_gone", job=job, pod=meta.get("name", ""))
                return
            self._failed(job, meta.get("name", ""), "annotate", exc)
        except Exception as exc:
            self._failed(job, meta.get("name", ""), "annotate", exc)

    def _post(self, job: str, pod: Obj, body: str, target: tuple[int, str]) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            self._failed(job, name, "post", ValueError("the pod has no IP yet"))
            return
        host = f"[{ip}]" if ":" in ip else ip
        request = urllib.request.Request(
            f"http://{host}:{target[0]}{target[1]}",
            data=body.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=HOOK_TIMEOUT) as reply:
                reply.read(1024)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._failed(job, name, "post", exc)

    def _failed(self, job: str, pod: str, step: str, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
        log.warning("checkpoint_signal_failed", job=job, pod=pod, step=step, error=str(exc)[:200])

    def close(self) -> None:
        """At shutdown, before the Lease goes: the signals not begun are dropped, one line says
        how many (sent after the release they would each fail, NotLeader, with a warning: 1,226
        lines at the end of a 2,000-node benchmark run). The drains' own job annotation went out."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            dropped = self._waiting
        if dropped:
            log.info("checkpoint_signals_dropped", pods=dropped, why="the daemon is stopping")


def _notice(job: Obj, decision: Decision, now: datetime) -> CheckpointNotice:
    meta = job["metadata"]
    return CheckpointNotice(
        hosts=decision.hosts,
        deadline=decision.deadline,
        reason=decision.reason.value,
        job=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        issued=now,
    )
