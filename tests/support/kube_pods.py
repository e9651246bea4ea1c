"""Pods as the real control plane handles them, for the API emulator: defaulting, graceful
deletion (Terminating for the grace period until the kubelet is done), the kubelet's pod phase
from container states, PodDisruptionBudget status (the disruption controller) and the eviction
subresource. The functions at the top are pure; ``PodWorkloads`` is the part of
``KubeApiServer`` that applies them to the store (it runs with the server's lock held).

Upstream sources, Kubernetes 1.30 (the emulator's version):
- pkg/registry/core/pod/strategy.go ``CheckGracefulDelete``; staging/.../registry/rest/delete.go
  ``BeforeDelete`` (deletionTimestamp = now + grace; only a shorter grace may follow);
- pkg/kubelet/kubelet_pods.go ``getPhase``; the kubelet stops native sidecars once the regular
  containers are done and, since 1.27, reports a terminal phase before a deleted pod goes;
- pkg/controller/disruption/disruption.go (``getExpectedPodCount``, ``countHealthyPods``,
  ``buildDisruptedPodMap``, ``failSafe``, ``updatePdbStatus``);
- pkg/registry/core/pod/storage/eviction.go (``EvictionREST.Create``, ``checkAndDecrement``,
  ``canIgnorePDB``, the DisruptionTarget condition of PodDisruptionConditions, on since 1.26).
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .kube_core import ApiError, Key, Obj, Resource, selector_test
from .kube_schema import FieldError

TERMINAL = ("Succeeded", "Failed")
DEFAULT_GRACE = 30  # pod defaulting: spec.terminationGracePeriodSeconds
DELETION_TIMEOUT = timedelta(minutes=2)  # disruption.go DeletionTimeout for disruptedPods
_EVICTION_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
# The DefaultTolerationSeconds admission plugin adds these to every pod that lacks them.
DEFAULT_TOLERATIONS = [
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# ---------------------------------------------------------------- defaulting
def default_pod(pod: Obj) -> None:
    """What API defaulting (pkg/apis/core/v1/defaults.go) and the default admission plugins add
    to a pod created through the API, in place. Seeded pods are taken as stored."""
    spec = pod.setdefault("spec", {})
    for k, v in (
        ("restartPolicy", "Always"),
        ("terminationGracePeriodSeconds", DEFAULT_GRACE),
        ("dnsPolicy", "ClusterFirst"),
        ("schedulerName", "default-scheduler"),
        ("securityContext", {}),
        ("enableServiceLinks", True),
        ("priority", 0),
    ):
        spec.setdefault(k, v)
    tolerations = spec.setdefault("tolerations", [])
    for t in DEFAULT_TOLERATIONS:
        if not any(
            x.get("key") == t["key"] and x.get("effect") in (None, t["effect"]) for x in tolerations
        ):
            tolerations.append(copy.deepcopy(t))
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        image = str(c.get("image", ""))
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")


def validate_pod(pod: Obj) -> list[FieldError]:
    """The part of pkg/apis/core/validation ValidatePodCreate the tests meet: every container
    has a name and an image (a regular one; an init container's image too)."""
    spec = pod.get("spec") or {}
    problems = []
    if not spec.get("containers"):
        problems.append(FieldError("Required", "spec.containers"))
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or ()):
            for key in ("name", "image"):
                if not c.get(key):
                    problems.append(FieldError("Required", f"spec.{field}[{i}].{key}"))
    return problems


# ---------------------------------------------------------------- graceful deletion
def grace_period(pod: Obj, options: Obj) -> int:
    """strategy.go CheckGracefulDelete: the request's gracePeriodSeconds, else the pod's
    terminationGracePeriodSeconds (30 when a seeded pod lacks it); 0 for a pod on no node or in
    a terminal phase (deleted at once); a negative value counts as 1 (BeforeDelete)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    given = options.get("gracePeriodSeconds")
    period = int(
        given if given is not None else spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)
    )
    if not spec.get("nodeName") or status.get("phase") in TERMINAL:
        period = 0
    return 1 if period < 0 else period


# ---------------------------------------------------------------- the kubelet's view
def _container_state(value: Any, now: str, old: Obj | None) -> tuple[Obj, bool]:
    """A test's shorthand as a ContainerState and readiness: "running" (ready),
    ("running", False) (not ready), "waiting", an exit code or ("terminated", code), or a state
    object as the kubelet writes it ({"running": {...}} etc.)."""
    started = ((old or {}).get("state") or {}).get("running", {}).get("startedAt", now)
    if isinstance(value, tuple) and value and value[0] == "running":
        return {"running": {"startedAt": started}}, bool(value[1:] and value[1])
    if isinstance(value, tuple) and value and value[0] == "terminated":
        value = value[1] if len(value) > 1 else 0
    if value == "running":
        return {"running": {"startedAt": started}}, True
    if value == "waiting":
        return {"waiting": {"reason": "ContainerCreating"}}, False
    if value == "terminated":
        value = 0
    if isinstance(value, int) and not isinstance(value, bool):
        return {
            "terminated": {
                "exitCode": value,
                "reason": "Completed" if value == 0 else "Error",
                "startedAt": started,
                "finishedAt": now,
            }
        }, False
    if (
        isinstance(value, dict)
        and len(value) == 1
        and next(iter(value)) in ("running", "waiting", "terminated")
    ):
        return copy.deepcopy(value), "running" in value
    raise ValueError(f"not a container state: {value!r}")


def _status_entry(name: str, image: str, state: Obj, ready: bool, old: Obj | None) -> Obj:
    entry: Obj = {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": ready,
        "restartCount": (old or {}).get("restartCount", 0),
        "started": "running" in state,
        "state": state,
    }
    previous = old or {}
    old_state = previous.get("state") or {}
    if "terminated" in old_state and "terminated" not in state:
        entry["lastState"] = {"terminated": old_state["terminated"]}
        entry["restartCount"] += 1
    elif previous.get("lastState"):
        entry["lastState"] = previous["lastState"]
    return entry


def is_sidecar(container: Obj) -> bool:
    """A native sidecar: an init container with restartPolicy Always (1.29+, beta on)."""
    return container.get("restartPolicy") == "Always"


def kubelet_phase(pod: Obj, terminal: bool = False) -> str:
    """kubelet_pods.go getPhase, from the pod's containerStatuses/initContainerStatuses.
    ``terminal``: the pod is being deleted and its containers will not be restarted."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    policy = spec.get("restartPolicy") or "Always"
    statuses = {
        s["name"]: s
        for s in [
            *(status.get("initContainerStatuses") or ()),
            *(status.get("containerStatuses") or ()),
        ]
    }
    pending_init = failed_init = 0
    unknown = running = waiting = stopped = succeeded = 0
    for c in spec.get("initContainers") or ():
        s = statuses.get(c["name"])
        state = (s or {}).get("state") or {}
        last = (s or {}).get("lastState") or {}
        if is_sidecar(c):
            if s is None:
                unknown += 1
            elif "running" in state:
                pending_init += 0 if s.get("started") else 1
                running += 1
            elif "waiting" in state and "terminated" not in last:
                pending_init += 1
                waiting += 1
            elif not state:
                pending_init += 1
                unknown += 1
            continue  # terminated restartable init containers are ignored
        if s is None or "running" in state or not state:
            pending_init += 1
        elif "terminated" in state:
            failed_init += state["terminated"].get("exitCode", 0) != 0
        elif "terminated" in last:
            failed_init += last["terminated"].get("exitCode", 0) != 0
        else:
            pending_init += 1
    regular_started = False
    for c in spec.get("containers") or ():
        s = statuses.get(c["name"])
        state = (s or {}).get("state") or {}
        if s is None or not state:
            unknown += 1
        elif "running" in state:
            running += 1
            regular_started = True
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"].get("exitCode", 0) == 0
            regular_started = True
        elif "terminated" in (s.get("lastState") or {}):
            stopped += 1
        else:
            waiting += 1
    if failed_init and policy == "Never":
        return "Failed"
    if (pending_init and not regular_started) or waiting:
        return "Pending"
    if running and not unknown:
        return "Running"
    if not running and stopped and not unknown:
        if terminal:
            return "Succeeded" if stopped == succeeded else "Failed"
        if policy == "Always":
            return "Running"  # all containers are being restarted
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if policy == "Never" else "Running"
    return "Pending"


def _set_condition(
    conditions: list[Obj], ctype: str, value: bool, now: str, reason: str | None = None
) -> None:
    text = "True" if value else "False"
    for c in conditions:
        if c.get("type") == ctype:
            if c.get("status") != text:
                c["lastTransitionTime"] = now
            c["status"] = text
            if reason:
                c["reason"] = reason
            else:
                c.pop("reason", None)
            return
    cond: Obj = {"type": ctype, "status": text, "lastProbeTime": None, "lastTransitionTime": now}
    if reason:
        cond["reason"] = reason
    conditions.append(cond)


def container_statuses(pod: Obj, states: dict[str, Any], now: str) -> Obj:
    """The pod's status after the kubelet reports ``states`` (see ``_container_state``).

    Containers not named keep their reported state; never reported ones start out as the
    kubelet would show them next to the named ones (regular init containers Completed and
    native sidecars running once a regular container has started, else waiting). Once every
    regular container has terminated and the pod will not restart them (Never, or OnFailure
    with all succeeded), the kubelet stops its native sidecars: they do not keep it Running."""
    spec = pod.get("spec") or {}
    status = copy.deepcopy(pod.get("status") or {})
    policy = spec.get("restartPolicy") or "Always"
    old = {
        s["name"]: s
        for s in [
            *(status.get("initContainerStatuses") or ()),
            *(status.get("containerStatuses") or ()),
        ]
    }
    unknown = [
        n
        for n in states
        if n
        not in {
            c["name"]
            for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
        }
    ]
    if unknown:
        raise ValueError(f"no such containers in the pod: {unknown}")
    regular, inits = spec.get("containers") or [], spec.get("initContainers") or []
    new: dict[str, Obj] = {}
    for c in [*inits, *regular]:
        if c["name"] in states:
            state, ready = _container_state(states[c["name"]], now, old.get(c["name"]))
            new[c["name"]] = _status_entry(
                c["name"], c.get("image", ""), state, ready, old.get(c["name"])
            )
        elif c["name"] in old:
            new[c["name"]] = old[c["name"]]
    began = any(
        "waiting" not in (new.get(c["name"], {}).get("state") or {"waiting": 1}) for c in regular
    )
    for c in inits:
        if c["name"] not in new:
            value: Any = ("running" if is_sidecar(c) else 0) if began else "waiting"
            state, ready = _container_state(value, now, None)
            new[c["name"]] = _status_entry(c["name"], c.get("image", ""), state, ready, None)
    for c in regular:
        if c["name"] not in new:
            state, ready = _container_state("waiting", now, None)
            new[c["name"]] = _status_entry(c["name"], c.get("image", ""), state, ready, None)
    done = [((new[c["name"]]["state"].get("terminated")) or {}) for c in regular]
    if (
        regular
        and all(done)
        and (
            policy == "Never"
            or (policy == "OnFailure" and all(t.get("exitCode") == 0 for t in done))
        )
    ):
        for c in inits:  # the kubelet terminates the native sidecars, last one first
            if is_sidecar(c) and "terminated" not in new[c["name"]]["state"]:
                state, _ = _container_state(0, now, new[c["name"]])
                new[c["name"]] = _status_entry(
                    c["name"], c.get("image", ""), state, False, new[c["name"]]
                )
    status["initContainerStatuses"] = [new[c["name"]] for c in inits]
    status["containerStatuses"] = [new[c["name"]] for c in regular]
    if not inits:
        del status["initContainerStatuses"]
    return _with_phase(pod, status, now, terminal=False)


def terminated_statuses(pod: Obj, exit_code: int, now: str) -> Obj:
    """The status once the kubelet has stopped a deleted pod's containers: every container
    that was not already terminated exits with ``exit_code``, and the phase is terminal
    (Succeeded only if every regular container exited 0)."""
    spec = pod.get("spec") or {}
    states = {}
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        s = next(
            (
                x
                for x in [
                    *((pod.get("status") or {}).get("initContainerStatuses") or ()),
                    *((pod.get("status") or {}).get("containerStatuses") or ()),
                ]
                if x.get("name") == c["name"]
            ),
            None,
        )
        terminated = ((s or {}).get("state") or {}).get("terminated")
        states[c["name"]] = terminated["exitCode"] if terminated else exit_code
    status = container_statuses(pod, states, now)
    return _with_phase({**pod, "status": status}, status, now, terminal=True)


def _with_phase(pod: Obj, status: Obj, now: str, terminal: bool) -> Obj:
    spec = pod.get("spec") or {}
    phase = kubelet_phase({"spec": spec, "status": status}, terminal=terminal)
    status["phase"] = phase
    status.setdefault("startTime", now)
    conditions = status.setdefault("conditions", [])
    regular = status.get("containerStatuses") or []
    sidecars = [
        s
        for s, c in zip(
            status.get("initContainerStatuses") or (),
            spec.get("initContainers") or (),
            strict=False,
        )
        if is_sidecar(c)
    ]
    initialized = all(
        "terminated" in (s.get("state") or {}) and s["state"]["terminated"].get("exitCode") == 0
        for s, c in zip(
            status.get("initContainerStatuses") or (),
            spec.get("initContainers") or (),
            strict=False,
        )
        if not is_sidecar(c)
    ) and all(s.get("started") for s in sidecars)
    ready = phase == "Running" and all(s.get("ready") for s in [*regular, *sidecars])
    reason = "PodCompleted" if phase in TERMINAL else (None if ready else "ContainersNotReady")
    if spec.get("nodeName"):
        _set_condition(conditions, "PodScheduled", True, now)
    _set_condition(
        conditions,
        "Initialized",
        initialized or phase in TERMINAL,
        now,
        "PodCompleted" if phase in TERMINAL else None,
    )
    _set_condition(conditions, "ContainersReady", ready, now, reason)
    _set_condition(conditions, "Ready", ready, now, reason)
    return status


def is_ready(pod: Obj) -> bool:
    """podutil.IsPodReady: the Ready condition is True."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


# ---------------------------------------------------------------- disruption budgets
def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, str):
        if not value.endswith("%") or not value[:-1].isdigit():
            raise ValueError(
                f"invalid value for IntOrString: invalid type: string is not a "
                f"percentage: {value!r}"
            )
        exact = int(value[:-1]) * total / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


def validate_pdb(pdb: Obj) -> list[FieldError]:
    """The checks of pkg/apis/policy/validation ValidatePodDisruptionBudgetSpec that matter
    here: not both minAvailable and maxUnavailable; each an integer >= 0 or a percentage."""
    spec = pdb.get("spec") or {}
    problems = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        problems.append(
            FieldError(
                "Invalid", "spec", "object", "minAvailable and maxUnavailable cannot be both set"
            )
        )
    for key in ("minAvailable", "maxUnavailable"):
        value = spec.get(key)
        if isinstance(value, str):
            try:
                ok = 0 <= scaled_value(value, 100, True) <= 100
            except ValueError:
                ok = False
            if not ok:
                problems.append(
                    FieldError(
                        "Invalid",
                        f"spec.{key}",
                        value,
                        "must be an integer or a percentage between 0% and 100%",
                    )
                )
        elif isinstance(value, int) and value < 0:
            problems.append(
                FieldError("Invalid", f"spec.{key}", value, "must be greater than or equal to 0")
            )
    return problems


def pdb_selects(pdb: Obj, pod: Obj, for_eviction: bool = False) -> bool:
    """The controller lists pods with metav1.LabelSelectorAsSelector (policy/v1: an empty
    selector selects every pod in the namespace, a nil one none); the eviction handler skips a
    budget with a nil or empty selector (eviction.go getPodDisruptionBudgets)."""
    if pdb["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    selector = (pdb.get("spec") or {}).get("selector")
    if (
        for_eviction
        and not (selector or {}).get("matchLabels")
        and not (selector or {}).get("matchExpressions")
    ):
        return False
    test = selector_test(selector)
    return test is not None and test(pod["metadata"].get("labels") or {})


def pdb_status(
    pdb: Obj, pods: list[Obj], expected_scale: Callable[[list[Obj]], int], now: datetime
) -> Obj:
    """disruption.go trySync + updatePdbStatus (or failSafe when the expected count cannot be
    worked out: raised as ValueError by ``expected_scale`` or the percentage)."""
    spec, old = pdb.get("spec") or {}, copy.deepcopy(pdb.get("status") or {})
    generation = pdb["metadata"].get("generation", 1)
    try:
        if spec.get("maxUnavailable") is not None:
            expected = expected_scale(pods)
            desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected, True))
        elif isinstance(spec.get("minAvailable"), str):
            expected = expected_scale(pods)
            desired = scaled_value(spec["minAvailable"], expected, True)
        else:
            expected, desired = len(pods), int(spec.get("minAvailable") or 0)
    except ValueError as e:  # failSafe: nothing else changes, observedGeneration included
        status = {**old, "disruptionsAllowed": 0}
        status.setdefault("currentHealthy", 0)
        status.setdefault("desiredHealthy", 0)
        status.setdefault("expectedPods", 0)
        _pdb_condition(status, False, "SyncFailed", str(e), now)
        return status
    disrupted: dict[str, str] = {}
    for pod in pods:  # buildDisruptedPodMap
        at = (old.get("disruptedPods") or {}).get(pod["metadata"]["name"])
        if (
            at
            and not pod["metadata"].get("deletionTimestamp")
            and parse_stamp(at) + DELETION_TIMEOUT >= now
        ):
            disrupted[pod["metadata"]["name"]] = at
    healthy = sum(  # countHealthyPods: Ready is healthy, whatever the phase says
        1
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["name"] not in disrupted
        and is_ready(p)
    )
    allowed = healthy - desired if expected > 0 and healthy > desired else 0
    status = {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": old.get("conditions") or [],
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    _pdb_condition(
        status, allowed > 0, "SufficientPods" if allowed > 0 else "InsufficientPods", "", now
    )
    return status


def _pdb_condition(status: Obj, allowed: bool, reason: str, message: str, now: datetime) -> None:
    """apimeta.SetStatusCondition of DisruptionAllowed, as in
    pdbhelper.UpdateDisruptionAllowedCondition."""
    text = "True" if allowed else "False"
    conditions = [dict(c) for c in status.get("conditions") or ()]
    current = next((c for c in conditions if c.get("type") == "DisruptionAllowed"), None)
    if current is None:
        current = {"type": "DisruptionAllowed", "lastTransitionTime": stamp(now)}
        conditions.append(current)
    elif current.get("status") != text:
        current["lastTransitionTime"] = stamp(now)
    current.update({"status": text, "reason": reason, "message": message})
    current.pop("observedGeneration", None)
    if status.get("observedGeneration"):  # metav1.Condition's is omitempty: never 0
        current["observedGeneration"] = status["observedGeneration"]
    status["conditions"] = conditions


def pod_rejected(name: str, why: str) -> ApiError:
    """admission.NewForbidden on a pod."""
    return ApiError(
        403,
        f'pods "{name}" is forbidden: pod rejected: {why}',
        "Forbidden",
        {"name": name, "kind": "pods"},
    )


def too_many_requests(message: str, retry_after: int = 0) -> ApiError:
    """errors.NewTooManyRequests with one DisruptionBudget cause (the eviction's 429)."""
    details: Obj = {"causes": [{"reason": "DisruptionBudget", "message": message}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    return ApiError(429, _EVICTION_MESSAGE, "TooManyRequests", details, headers)


# ---------------------------------------------------------------- the server part
class PodWorkloads:
    """Pods, kubelet and PodDisruptionBudgets inside ``KubeApiServer`` (mixed in)."""

    # provided by KubeApiServer
    _lock: threading.Condition
    _objects: dict[Key, Obj]
    _closing: bool
    now: Callable[[], datetime]
    resource: Callable[..., Resource]
    _existing: Callable[..., tuple[Key, Obj]]
    _commit: Callable[..., Obj]
    _remove: Callable[..., Obj]
    _keys: Callable[..., list[Key]]
    _timestamp: Callable[[], str]
    _check_preconditions: Callable[[Resource, Obj, Obj], None]

    def _init_pods(self) -> None:
        # Seconds the simulated kubelet takes to stop a Terminating pod's containers (at most
        # its grace period; then it kills them: exit 137). None: never by itself (a dead node):
        # finish_terminating() does it. 0: within the DELETE request.
        self.kubelet_delay: float | None = 0.0
        self.kubelet_exit_code = 143  # how the containers end on SIGTERM (128 + 15)
        # The disruption controller keeps every PodDisruptionBudget's status current after each
        # change of a pod or budget (the real one lags slightly). False: statuses stay as they
        # are until sync_pdbs().
        self.pdb_controller = True
        self._terminating: dict[Key, tuple[float, int]] = {}  # pod -> (monotonic start, grace)
        self._pdb_syncing = False
        self._kubelet = threading.Thread(target=self._kubelet_loop, daemon=True)

    # ------------------------------------------------------------ test controls
    def finish_terminating(
        self, name: str | None = None, namespace: str | None = None, exit_code: int | None = None
    ) -> list[str]:
        """The kubelet is done with Terminating pods (all, or those named): their containers
        end (``exit_code``, default ``kubelet_exit_code``), the phase turns terminal (a
        MODIFIED event), then the pod goes (DELETED; it stays, grace 0, while finalizers
        remain). Returns the pods finished."""
        done = []
        with self._lock:
            res = self.resource("pods")
            for key in self._keys(res):
                meta = self._objects[key]["metadata"]
                if (
                    meta.get("deletionTimestamp")
                    and name in (None, meta["name"])
                    and namespace in (None, meta.get("namespace"))
                ):
                    self._kubelet_finish(res, key, exit_code)
                    done.append(meta["name"])
        return done

    def _admit_pod(self, pod: Obj) -> None:
        """The RuntimeClass admission plugin (plugin/pkg/admission/runtimeclass/admission.go):
        a pod's overhead comes from its RuntimeClass; one set by the client must equal it, and
        without a RuntimeClass that defines one the pod is refused (403)."""
        spec, name = pod.setdefault("spec", {}), pod["metadata"].get("name", "")
        runtime_class = spec.get("runtimeClassName")
        fixed = None
        if runtime_class:
            found = self._objects.get(("runtimeclasses.node.k8s.io", "", runtime_class))
            if found is None:
                raise pod_rejected(name, f'RuntimeClass "{runtime_class}" not found')
            fixed = (found.get("overhead") or {}).get("podFixed")
        if fixed is not None:
            if spec.get("overhead") and spec["overhead"] != fixed:
                raise pod_rejected(
                    name, "Pod's Overhead doesn't match RuntimeClass's defined Overhead"
                )
            spec["overhead"] = copy.deepcopy(fixed)
        elif spec.get("overhead") is not None:
            raise pod_rejected(
                name, "Pod Overhead set without corresponding RuntimeClass defined Overhead"
            )

    def set_container_states(self, name: str, namespace: str | None, states: dict[str, Any]) -> Obj:
        """Report container states as the kubelet would (see ``container_statuses``): values
        are "running", ("running", False) for not ready, "waiting", an exit code (terminated)
        or a ContainerState object. status.phase follows like the kubelet's getPhase and the
        Ready condition like its status manager. Emits MODIFIED; returns the pod."""
        with self._lock:
            res = self.resource("pods")
            key, old = self._existing(res, namespace or "default", name)
            status = container_statuses(old, states, self._timestamp())
            return self._commit(res, key, old, {**old, "status": status})

    def run_pod(self, name: str, namespace: str | None = None, node: str = "node-0") -> Obj:
        """The scheduler binds the pod (if it is on no node) and the kubelet starts every
        container: Running and Ready."""
        with self._lock:
            res = self.resource("pods")
            key, old = self._existing(res, namespace or "default", name)
            if not (old.get("spec") or {}).get("nodeName"):
                old = self._commit(
                    res, key, old, {**old, "spec": {**old["spec"], "nodeName": node}}
                )
            names = [c["name"] for c in old["spec"].get("containers") or ()]
            return self.set_container_states(name, namespace, dict.fromkeys(names, "running"))

    def sync_pdbs(self, namespace: str | None = None) -> None:
        """Run the disruption controller once over every budget (of one namespace)."""
        with self._lock:
            self._sync_pdbs(namespace, None, force=True)

    # ------------------------------------------------------------ deletion
    def _graceful_delete(self, res: Resource, key: Key, old: Obj, options: Obj) -> Obj | None:
        """registry/rest BeforeDelete for pods. Returns the object to answer with while the pod
        is Terminating, or None when it goes at once."""
        meta = old["metadata"]
        now = self.now()
        if meta.get("deletionTimestamp"):
            held = meta.get("deletionGracePeriodSeconds")
            given = options.get("gracePeriodSeconds")
            if not held:
                return None  # a zero grace already: delete now
            if given is None or int(given) >= held:
                return copy.deepcopy(old)  # pending: only a shorter grace may be given
            period = max(int(given), 0)
            start = parse_stamp(meta["deletionTimestamp"]) - timedelta(seconds=held)
            when = max(start + timedelta(seconds=period), now.replace(microsecond=0))
            if period == 0:
                return None
        else:
            period = grace_period(old, options)
            if period == 0:
                return None
            when = now + timedelta(seconds=period)
        marked = copy.deepcopy(old)
        marked["metadata"]["deletionTimestamp"] = stamp(when)
        marked["metadata"]["deletionGracePeriodSeconds"] = period
        marked["metadata"]["generation"] = meta.get("generation", 1) + 1
        out = self._commit(res, key, old, marked, deleting=True)
        self._terminating[key] = (time.monotonic(), period)
        if self.kubelet_delay == 0:
            self._kubelet_finish(res, key, None)
        self._lock.notify_all()
        return out

    def _kubelet_finish(self, res: Resource, key: Key, exit_code: int | None) -> None:
        self._terminating.pop(key, None)
        pod = self._objects.get(key)
        if pod is None:
            return
        code = self.kubelet_exit_code if exit_code is None else exit_code
        status = terminated_statuses(pod, code, self._timestamp())
        pod = self._commit(res, key, pod, {**pod, "status": status})
        if pod["metadata"].get("finalizers"):  # the kubelet's final delete (grace 0) waits
            held = copy.deepcopy(pod)
            held["metadata"]["deletionGracePeriodSeconds"] = 0
            self._commit(res, key, pod, held, deleting=True)
        else:
            self._remove(res, key, pod)

    def _kubelet_loop(self) -> None:
        while True:
            with self._lock:
                if self._closing:
                    return
                wait = 0.05
                if self.kubelet_delay is not None:
                    now = time.monotonic()
                    for key, (start, grace) in list(self._terminating.items()):
                        due = start + min(self.kubelet_delay, grace)
                        if due <= now:
                            killed = self.kubelet_delay >= grace  # SIGKILL at the deadline
                            self._kubelet_finish(
                                self.resource("pods"), key, 137 if killed else None
                            )
                        else:
                            wait = min(wait, due - now)
                self._lock.wait(max(wait, 0.001))

    # ------------------------------------------------------------ eviction
    def _evict(self, namespace: str, name: str, body: Any) -> Obj:
        """EvictionREST.Create: 201 and a Success Status when the pod may go (it gets the
        DisruptionTarget condition and is deleted gracefully), 429 when a budget forbids it."""
        if (
            not isinstance(body, dict)
            or body.get("kind") != "Eviction"
            or body.get("apiVersion") not in ("policy/v1", "policy/v1beta1")
        ):
            raise ApiError(400, "the body of the request was not a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        options = dict(body.get("deleteOptions") or {})
        res = self.resource("pods")
        with self._lock:
            key, pod = self._existing(res, namespace, name)
            self._check_preconditions(res, pod, options)
            phase = (pod.get("status") or {}).get("phase")
            if phase not in (*TERMINAL, "Pending") and not pod["metadata"].get(
                "deletionTimestamp"
            ):  # canIgnorePDB otherwise
                self._check_budgets(pod, options)
            if not options.get("dryRun"):
                self._disruption_target(res, key)
                self._delete_pod(
                    res, key, {k: v for k, v in options.items() if k != "preconditions"}
                )
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    def _check_budgets(self, pod: Obj, options: Obj) -> None:
        pdb_res = self.resource("poddisruptionbudgets")
        pdbs = [
            self._objects[k]
            for k in self._keys(pdb_res, pod["metadata"]["namespace"])
            if pdb_selects(self._objects[k], pod, for_eviction=True)
        ]
        if len(pdbs) > 1:
            message = (
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support."
            )
            raise ApiError(
                500,
                message,
                body={
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": message,
                    "code": 500,
                },
            )
        if not pdbs:
            return
        pdb = pdbs[0]
        name, status = pdb["metadata"]["name"], pdb.get("status") or {}
        unhealthy = not is_ready(pod)
        if unhealthy and (
            (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
            or (status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0)
        ):
            return  # not counted as healthy anyway: it may go without a decrement
        if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            raise too_many_requests(
                f"The disruption budget {name} is still being processed by the server.",
                retry_after=10,
            )
        allowed = status.get("disruptionsAllowed", 0)
        if allowed < 0:
            raise ApiError(
                403,
                f'poddisruptionbudgets.policy "{name}" is forbidden: pdb '
                "disruptions allowed is negative",
                "Forbidden",
                {"name": name, "group": "policy", "kind": "poddisruptionbudgets"},
            )
        if allowed == 0:
            raise too_many_requests(
                f"The disruption budget {name} needs "
                f"{status.get('desiredHealthy', 0)} healthy pods and has "
                f"{status.get('currentHealthy', 0)} currently"
            )
        if options.get("dryRun") or []:
            return
        new = copy.deepcopy(pdb)
        new_status = new.setdefault("status", {})
        new_status["disruptionsAllowed"] = allowed - 1
        new_status.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = stamp(self.now())
        if allowed - 1 == 0:
            _pdb_condition(new_status, False, "InsufficientPods", "", self.now())
        self._commit(pdb_res, self._key_of(pdb_res, pdb), pdb, new)

    def _disruption_target(self, res: Resource, key: Key) -> None:
        pod = self._objects[key]
        new = copy.deepcopy(pod)
        conditions = new.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "DisruptionTarget"]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastProbeTime": None,
                "lastTransitionTime": self._timestamp(),
            }
        )
        self._commit(res, key, pod, new)

    def _delete_pod(self, res: Resource, key: Key, options: Obj) -> Obj:
        """A pod DELETE after preconditions: graceful, else removed (finalizers respected)."""
        old = self._objects[key]
        marked = self._graceful_delete(res, key, old, options)
        if marked is not None:
            return marked
        if old["metadata"].get("finalizers"):
            held = copy.deepcopy(old)
            held["metadata"].setdefault("deletionTimestamp", self._timestamp())
            held["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._commit(res, key, old, held, deleting=True)
        self._terminating.pop(key, None)
        return self._remove(res, key, old)

    # ------------------------------------------------------------ disruption controller
    def _pods_changed(self, res: Resource, obj: Obj, old: Obj | None) -> None:
        """Called on every stored change of a pod or budget (lock held)."""
        if self._pdb_syncing or not self.pdb_controller:
            return
        namespace = obj["metadata"].get("namespace", "")
        if res.plural == "poddisruptionbudgets":
            self._sync_pdbs(namespace, [obj["metadata"]["name"]])
            return
        pdb_res = self.resource("poddisruptionbudgets")
        names = [
            self._objects[k]["metadata"]["name"]
            for k in self._keys(pdb_res, namespace)
            if pdb_selects(self._objects[k], obj)
            or (old is not None and pdb_selects(self._objects[k], old))
        ]
        if names:
            self._sync_pdbs(namespace, names)

    def _sync_pdbs(
        self, namespace: str | None, names: list[str] | None, force: bool = False
    ) -> None:
        if self._pdb_syncing or not (self.pdb_controller or force):
            return
        pdb_res, pod_res = self.resource("poddisruptionbudgets"), self.resource("pods")
        self._pdb_syncing = True
        try:
            for key in self._keys(pdb_res, namespace):
                pdb = self._objects.get(key)
                if pdb is None or (names is not None and key[2] not in names):
                    continue
                pods = [
                    self._objects[k]
                    for k in self._keys(pod_res, key[1])
                    if pdb_selects(pdb, self._objects[k])
                ]
                status = pdb_status(pdb, pods, self._expected_scale, self.now())
                if status != (pdb.get("status") or {}):
                    self._commit(pdb_res, key, pdb, {**pdb, "status": status})
        finally:
            self._pdb_syncing = False

    def _expected_scale(self, pods: list[Obj]) -> int:
        """getExpectedScale: the sum of the scale of the pods' controllers. Pods without a
        controller are left out; a controller whose kind has no scale subresource fails the
        sync (failSafe): et-operator's TrainingJob has none."""
        scales: dict[str, int] = {}
        for pod in pods:
            ref = next(
                (r for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")),
                None,
            )
            if ref is None or ref.get("uid") in scales:
                continue
            owner, owner_res = self._owner(ref, pod["metadata"]["namespace"])
            if owner_res is not None and owner_res.kind == "ReplicaSet" and owner is not None:
                parent = next(
                    (
                        r
                        for r in owner["metadata"].get("ownerReferences") or ()
                        if r.get("controller") and r.get("kind") == "Deployment"
                    ),
                    None,
                )
                if parent is not None:
                    owner, owner_res = self._owner(parent, pod["metadata"]["namespace"])
            if owner_res is None:
                raise ValueError(
                    f'no matches for kind "{ref.get("kind")}" in version "{ref.get("apiVersion")}"'
                )
            if not owner_res.scale:
                raise ValueError(f"{owner_res.key} does not implement the scale subresource")
            if owner is None:
                raise ValueError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
            scales[owner["metadata"]["uid"]] = int((owner.get("spec") or {}).get("replicas", 1))
        return sum(scales.values())

    def _owner(self, ref: Obj, namespace: str) -> tuple[Obj | None, Resource | None]:
        try:
            res = self.resource(ref.get("kind", ""), ref.get("apiVersion"))
        except KeyError:
            return None, None
        obj = self._objects.get((res.key, namespace if res.namespaced else "", ref.get("name", "")))
        if obj is not None and ref.get("uid") and obj["metadata"].get("uid") != ref.get("uid"):
            obj = None
        return obj, res

    def _key_of(self, res: Resource, obj: Obj) -> Key:
        return (
            res.key,
            obj["metadata"].get("namespace", "") if res.namespaced else "",
            obj["metadata"]["name"],
        )
