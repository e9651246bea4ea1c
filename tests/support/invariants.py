"""Invariants of the autoscaler, checked on the API server's own event stream.

`RecordingServer` is the API emulator that also keeps every event it emits (in commit order,
with a monotonic timestamp), unbounded by the watch history and untouched by compaction; on a
real kube-apiserver `watch_record.WatchRecorder` reads the same record from the server's
watches (ordered by resourceVersion). `check()` replays that stream and reports every violation
of:

- ``over_max``: a job has more worker pods (not Terminating) than its maxReplicas;
- ``under_min``: a worker removed by anyone but the spot reclaim (the operator, for a scaler)
  leaves its job below minReplicas, unless the pod's node had a notice (preemption) then or
  when our ScaleIn named it (or lost it less than ``race`` seconds before);
- ``two_scalers``: more than one of our unfinished scalers (ScaleIn/ScaleOut labelled
  ``app.kubernetes.io/managed-by=spot-autoscaler``) for one job at once;
- ``pod_in_two_scaleins``: one pod (name and uid) named by two of our ScaleIns;
- ``undrained_at_reclaim``: a pod the reclaim kills whose host is not in its job's
  ``spot-autoscaler.io/drained-hosts`` annotation at that moment, unless it was kept as its
  job's last host: its job had no other worker that stays (on a node without a notice, not
  drained) and had settled (Running ``join_grace`` seconds, or as long as the killed pod): the
  daemon keeps such a host in discovery until a replacement settles (its fate is then
  ``kept_at_reclaim``);
- ``drained_after_healthy``: a host still drained ``settle`` seconds after its pod's node is
  healthy again (notice taint gone) and the pod still runs there (counted from the later of the
  two, and from the pod's arrival on the node: a replacement that took the name of a drained
  worker gone since is judged from when it came, not from the drain of the pod before it);
- ``write_by_non_leader``: a write (not to the Lease) from a replica (User-Agent
  ``spot-autoscaler/<identity>``) that the Lease does not name as its holder when the request
  reaches the server (on kube-apiserver: one the server did not refuse with a 4xx, such as the
  leader fence's 403: deploy/leader-fence.yaml);
- ``removed_healthy``: one of our ScaleIns names more live workers on healthy nodes (no notice
  taint, node still there) than its job then has above max;
- ``drained_without_notice``: a host enters its job's drained hosts while its pod's node has no
  notice taint and the job is not above max.

The last two are judged on the server's record at the moment the write lands, with a tolerance of
``race`` seconds: a notice withdrawn that recently may have been seen, rightly, on a view that
was current (such writes are counted in ``Report.raced``, not as violations). What a view behind
the server decides (issue 26) lands long after.

It also measures, per notice (a node gaining the notice taint), the seconds until every worker on
the node then is in its job's drained hosts, and how each of those workers left.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from autoscaler.adapters.kube.server_fence import FENCE_MARK

from .kube_api import KubeApiServer, Resource
from .kube_core import ApiError

Obj = dict[str, Any]
MANAGED_BY = "app.kubernetes.io/managed-by"
DRAINED = "spot-autoscaler.io/drained-hosts"
NTH_ITN = "aws-node-termination-handler/spot-itn"
_FINISHED = ("ScaleSucceeded", "ScaleFailed")
_WRITES = ("POST", "PUT", "PATCH", "DELETE")
AGENT = "spot-autoscaler/"  # the daemon's User-Agent: spot-autoscaler/<identity>
LEASE = ("spot-autoscaler", "default")  # the daemon's Lease (name, namespace) in these runs
_KINDS = {
    "nodes": "Node",
    "pods": "Pod",
    "trainingjobs.kai.alibabacloud.com": "TrainingJob",
    "scaleins.kai.alibabacloud.com": "ScaleIn",
    "scaleouts.kai.alibabacloud.com": "ScaleOut",
}


@dataclass(frozen=True)
class Event:
    t: float  # time.monotonic() at commit
    wall: float  # time.time() at commit: to find the moment in the daemon's log
    type: str  # ADDED / MODIFIED / DELETED
    kind: str  # Node, Pod, TrainingJob, ScaleIn, ScaleOut
    obj: Obj


@dataclass(frozen=True)
class Write:
    t: float
    identity: str  # from the User-Agent
    method: str
    path: str
    holder: str | None  # the Lease's holderIdentity when the request arrived


class RecordingServer(KubeApiServer):
    """The emulator, also keeping every event of the kinds the invariants read, and every write
    a replica sends (with the Lease holder at that moment).

    With ``leader_fence``, it also refuses what deploy/leader-fence.yaml refuses on kube-apiserver
    (tests/test_real_leader_fence.py): a replica's write, other than to the Lease or an Event,
    while the Lease names another holder; 403 with the policy's message, and nothing written.
    A client-side fence cannot close the gap between its check and its bytes leaving (a replica
    SIGSTOPped there sends when resumed): deployed, the server closes it, and so does this one.
    The replica is known by its User-Agent here, by its pod-bound token there; and this one reads
    the Lease as committed, where the policy reads its informer's copy (a watch event later)."""

    def __init__(self, *args: Any, leader_fence: bool = False, **kwargs: Any) -> None:
        self.events: list[Event] = []
        self.writes: list[Write] = []
        self.reclaimed: set[str] = set()  # uids of pods the spot reclaim killed
        self.fence_refusals = 0
        self._leader_fence = leader_fence
        self._record_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _emit(self, res: Resource, type_: str, obj: Obj, old: Obj | None = None) -> None:
        super()._emit(res, type_, obj, old)  # lock held: events are in commit order
        kind = _KINDS.get(res.key)
        if kind is not None:
            obj = self._history[-1].obj
            self.events.append(Event(time.monotonic(), time.time(), type_, kind, obj))

    def _serve(self, h: Any) -> None:
        agent = h.headers.get("User-Agent") or ""
        if h.command in _WRITES and agent.startswith(AGENT) and "/leases" not in h.path:
            identity, path = agent[len(AGENT) :], h.path.split("?")[0]
            with self._lock:
                lease = self.get("leases", *LEASE)
                holder = lease["spec"].get("holderIdentity") if lease else None
                refused = self._refuses(identity, holder, path)
                if refused:
                    self.fence_refusals += 1
                else:
                    self.writes.append(Write(time.monotonic(), identity, h.command, path, holder))
            if refused:
                self._refuse(h, identity)
                return
        super()._serve(h)

    def _refuses(self, identity: str, holder: str | None, path: str) -> bool:
        # parameterNotFoundAction: Allow (no Lease: nobody leads, the daemon's own fence is shut)
        return (
            self._leader_fence
            and holder is not None
            and identity != holder
            and "/events" not in path
        )

    @staticmethod
    def _refuse(h: Any, identity: str) -> None:
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        message = (
            "ValidatingAdmissionPolicy 'spot-autoscaler-leader-fence' denied request: "
            f"{FENCE_MARK}: pod {identity} does not hold Lease {LEASE[0]}"
        )
        with contextlib.suppress(OSError):  # the client may have gone away
            h.send_json(403, ApiError(403, message, reason="Forbidden").status(), {}, [])

    def record(self) -> tuple[list[Event], set[str], list[Write]]:
        """What `check` replays: the events in commit order, the reclaimed pods, the writes."""
        with self._lock:
            return list(self.events), set(self.reclaimed), list(self.writes)

    def reclaim_pod(self, name: str, namespace: str) -> bool:
        """The spot reclaim kills a pod (recorded as preemption, not as an operator's act)."""
        with self._lock:
            pod = self.get("Pod", name, namespace)
            if pod is None:
                return False
            self.reclaimed.add(pod["metadata"]["uid"])
            self.delete("Pod", name, namespace)
            return True


@dataclass
class Violation:
    t: float
    kind: str
    detail: str
    # a write of ours that broke it: to find the daemon's decision line (decision_line)
    action: str = ""  # the decision's action: drain / scale_in
    job: str = ""
    hosts: tuple[str, ...] = ()
    wall: float = 0.0


@dataclass
class Notice:
    node: str
    t: float
    wall: float
    pods: dict[str, str]  # pod uid -> job
    names: dict[str, str]  # pod uid -> pod name (the host)
    drained_at: dict[str, float] = field(default_factory=dict)
    named_at: dict[str, float] = field(default_factory=dict)  # uid -> first named by a ScaleIn
    # a job of its workers had a scaler of ours unfinished when the notice came: its ScaleIn
    # waits for that one (et-operator runs one scaler per job at a time)
    queued: bool = False
    fate: dict[str, str] = field(default_factory=dict)  # uid -> removed / drained_reclaim / ...
    # when its taint went (a false alarm): a drain or ScaleIn after that answers a later notice
    # on the node, not this one (seed 12: a withdrawn notice's "ScaleIn" 55 s late was the next
    # notice's)
    withdrawn: float | None = None
    # workers that were their job's last hosts off noticed nodes: the daemon keeps such a host
    # visible until a replacement runs (Horovod must not lose its whole host set), so their
    # drain waits for the replacement and is not a notice -> drain latency
    kept: set[str] = field(default_factory=set)

    @property
    def timed(self) -> set[str]:
        return set(self.pods) - self.kept

    @property
    def latency(self) -> float | None:
        """Notice -> every timed worker drained; None if none is timed or one never was."""
        timed = self.timed
        if not timed or not timed <= self.drained_at.keys():
            return None
        return max(self.drained_at[uid] for uid in timed) - self.t

    @property
    def scale_in_latency(self) -> float | None:
        """Notice -> every timed worker named by a ScaleIn of ours; None if one never was (the
        reclaim came first, or the notice was withdrawn)."""
        timed = self.timed
        if not timed or not timed <= self.named_at.keys():
            return None
        return max(self.named_at[uid] for uid in timed) - self.t


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


@dataclass
class Report:
    violations: list[Violation]
    notices: list[Notice]
    stale_drained: int  # hosts still drained at the end whose pod no longer exists
    raced: int = 0  # removals/drains that landed within `race` s of their notice's withdrawal

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for v in self.violations:
            out[v.kind] += 1
        return dict(out)

    def latencies(self) -> list[float]:
        return sorted(n.latency for n in self.notices if n.latency is not None)

    def scale_in_latencies(self) -> list[float]:
        return sorted(n.scale_in_latency for n in self.notices if n.scale_in_latency is not None)

    def percentile(self, q: float) -> float | None:
        return percentile(self.latencies(), q)

    def median(self) -> float | None:
        xs = self.latencies()
        return statistics.median(xs) if xs else None

    def fates(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for n in self.notices:
            for uid in n.pods:
                out[n.fate.get(uid, "survived")] += 1
        return dict(out)


def _labels(obj: Obj) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def _tainted(node: Obj) -> bool:
    return any(t.get("key") == NTH_ITN for t in (node.get("spec") or {}).get("taints") or ())


def _finished(scaler: Obj) -> bool:
    conditions = (scaler.get("status") or {}).get("conditions") or []
    return bool(conditions) and conditions[-1].get("type") in _FINISHED


def _summary(scaler: Obj) -> str:
    spec, status = scaler.get("spec") or {}, scaler.get("status") or {}
    conditions = status.get("conditions") or []
    what = spec.get("toAdd") or (spec.get("toDelete") or {}).get("podNames")
    state = conditions[-1].get("type") if conditions else "new"
    return f"{what}->{state}"


def _drained(job: Obj) -> frozenset[str]:
    raw = (job["metadata"].get("annotations") or {}).get(DRAINED)
    try:
        data = json.loads(raw) if raw else []
    except ValueError:
        return frozenset()
    return (
        frozenset(h for h in data if isinstance(h, str)) if isinstance(data, list) else frozenset()
    )


def _utc(wall: float) -> str:
    """A wall time as the daemon's log lines write it: to find the decision line."""
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")


class _State:
    def __init__(
        self, reclaimed: set[str], settle: float, race: float = 1.0, join_grace: float = 30.0
    ) -> None:
        self.reclaimed, self.settle, self.race = reclaimed, settle, race
        self.join_grace = join_grace
        self.raced = 0
        self.ready_since: dict[str, float] = {}  # pod uid -> when it was first seen Running
        self.placed_at: dict[str, float] = {}  # pod uid -> when it was first seen on a node
        self.nodes: dict[str, Obj] = {}
        self.healthy_since: dict[str, float] = {}  # node -> when it last lost the notice taint
        self.pods: dict[str, Obj] = {}  # uid -> pod
        self.jobs: dict[str, Obj] = {}
        self.drained: dict[str, frozenset[str]] = defaultdict(frozenset)
        self.drained_since: dict[tuple[str, str], float] = {}
        self.scalers: dict[tuple[str, str], Obj] = {}
        self.named: dict[tuple[str, str | None], str] = {}  # (pod, uid) -> first ScaleIn
        self.resolved: dict[str, dict[str, str | None]] = {}  # ScaleIn -> pod name -> uid
        self.violations: list[Violation] = []
        self.notices: list[Notice] = []
        self.named_noticed: set[str] = set()  # uids our ScaleIns named while under a notice
        self._seen: set[tuple[str, ...]] = set()

    def flag(
        self,
        t: float,
        kind: str,
        detail: str,
        key: tuple[str, ...] | None = None,
        **write: Any,
    ) -> None:
        if key is not None:
            if (kind, *key) in self._seen:
                return
            self._seen.add((kind, *key))
        self.violations.append(Violation(t, kind, detail, **write))

    # --- helpers --------------------------------------------------------------------------------
    def workers(self, job: str) -> list[Obj]:
        return [
            p
            for p in self.pods.values()
            if _labels(p).get("training-job-role") == "worker"
            and _labels(p).get("training-job-name") == job
            and not p["metadata"].get("deletionTimestamp")
        ]

    def bounds(self, job: str) -> tuple[int, int]:
        spec = ((self.jobs.get(job) or {}).get("spec") or {}).get("etReplicaSpecs", {})
        w = spec.get("worker") or {}
        return int(w.get("minReplicas") or 0), int(w.get("maxReplicas") or 10**9)

    def context(self, job: str) -> str:
        """Evidence: where the job's workers are and its scalers (ours) so far."""
        ws = self.workers(job)
        doomed = [
            p["metadata"]["name"]
            for p in ws
            if _tainted(self.nodes.get((p.get("spec") or {}).get("nodeName") or "", {}))
        ]
        pending = sum((p.get("status") or {}).get("phase") == "Pending" for p in ws)
        drained = sorted(self.drained[job])
        scalers = [
            f"{k}/{n}:{_summary(s)}"
            for (k, n), s in self.scalers.items()
            if ((s.get("spec") or {}).get("selector") or {}).get("name") == job
        ][-4:]
        return (
            f"on noticed nodes {doomed}, pending {pending}, drained {drained}, "
            f"last scalers {scalers}"
        )

    def pod_named(self, name: str) -> Obj | None:
        return next((p for p in self.pods.values() if p["metadata"]["name"] == name), None)

    def noticed(self, pod: Obj) -> bool:
        """Its node is there with a notice now."""
        node = (pod.get("spec") or {}).get("nodeName") or ""
        return node in self.nodes and _tainted(self.nodes[node])

    def noticed_within_race(self, pod: Obj, t: float) -> bool:
        """Its node has a notice at `t`, or lost it no more than `race` seconds before (what
        the daemon's server check read may have been withdrawn since: it lands within
        CONFIRMED_FOR of that read)."""
        node = (pod.get("spec") or {}).get("nodeName") or ""
        withdrawn = self.healthy_since.get(node)
        recent = withdrawn is not None and t - withdrawn <= self.race
        return self.noticed(pod) or (node in self.nodes and recent)

    def healthy(self, pod: Obj, t: float) -> bool:
        """Its node is there without a notice at `t`, and was for longer than `race` (a notice
        withdrawn more recently counts as still there, and the write as raced)."""
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if node not in self.nodes or _tainted(self.nodes[node]):
            return False
        if t - self.healthy_since.get(node, float("-inf")) <= self.race:
            self.raced += 1
            return False
        return True

    def settled_survivor(self, pod: Obj, job: str, t: float) -> bool:
        """Whether, at `t`, `pod`'s job has another worker that stays (on a node there without
        a notice, not drained) and is settled: Running since `join_grace` before `t`, or since
        no later than `pod` (core/departures.py `_last_host_to_keep`: without one the daemon
        keeps its last host in discovery until a replacement settles)."""
        mine = self.ready_since.get(pod["metadata"]["uid"])
        by = max(t - self.join_grace, mine if mine is not None else float("-inf"))
        for w in self.workers(job):
            node = (w.get("spec") or {}).get("nodeName") or ""
            since = self.ready_since.get(w["metadata"]["uid"])
            if (
                w["metadata"]["uid"] != pod["metadata"]["uid"]
                and node in self.nodes
                and not _tainted(self.nodes[node])
                and w["metadata"]["name"] not in self.drained[job]
                and since is not None
                and since <= by
            ):
                return True
        return False

    def above_max(self, job: str) -> int:
        return max(0, len(self.workers(job)) - self.bounds(job)[1])

    def check_removal(self, e: Event, job: str, names: list[str]) -> None:
        """A new ScaleIn of ours: healthy victims only as far as the job is above max."""
        live = [p for n in names if (p := self.pod_named(n)) and p in self.workers(job)]
        healthy = [p["metadata"]["name"] for p in live if self.healthy(p, e.t)]
        allowed = max(0, self.above_max(job) - (len(live) - len(healthy)))
        if len(healthy) > allowed:
            self.flag(
                e.t,
                "removed_healthy",
                f"{job}: ScaleIn {e.obj['metadata']['name']} at {_utc(e.wall)} names healthy "
                f"{healthy} ({len(self.workers(job))} workers, max {self.bounds(job)[1]}); "
                f"{self.context(job)}",
                action="scale_in",
                job=job,
                hosts=tuple(healthy),
                wall=e.wall,
            )

    def check_drain(self, e: Event, job: str, hosts: frozenset[str]) -> None:
        if self.above_max(job):
            return
        for host in sorted(hosts):
            pod = next((p for p in self.workers(job) if p["metadata"]["name"] == host), None)
            if pod is not None and self.healthy(pod, e.t):
                node = (pod.get("spec") or {}).get("nodeName")
                self.flag(
                    e.t,
                    "drained_without_notice",
                    f"{job}: host {host} drained at {_utc(e.wall)} on {node}, which has no "
                    f"notice; {self.context(job)}",
                    action="drain",
                    job=job,
                    hosts=(host,),
                    wall=e.wall,
                )

    # --- replay ---------------------------------------------------------------------------------
    def apply(self, e: Event) -> None:
        getattr(self, f"_{e.kind.lower()}")(e)
        self.check_settled(e.t)

    def _node(self, e: Event) -> None:
        name = e.obj["metadata"]["name"]
        before = self.nodes.get(name)
        if e.type == "DELETED":
            self.nodes.pop(name, None)
            self.healthy_since.pop(name, None)
            return
        self.nodes[name] = e.obj
        was, now = before is not None and _tainted(before), _tainted(e.obj)
        if now and not was:
            on = [
                p
                for p in self.pods.values()
                if (p.get("spec") or {}).get("nodeName") == name
                and _labels(p).get("training-job-role") == "worker"
            ]
            n = Notice(
                name,
                e.t,
                e.wall,
                {p["metadata"]["uid"]: _labels(p)["training-job-name"] for p in on},
                {p["metadata"]["uid"]: p["metadata"]["name"] for p in on},
            )
            n.kept = {
                uid
                for uid, job in n.pods.items()
                if not any(
                    not _tainted(self.nodes.get((w.get("spec") or {}).get("nodeName") or "", {}))
                    and (w.get("spec") or {}).get("nodeName") not in (None, name)
                    for w in self.workers(job)
                )
            }
            for uid, job in n.pods.items():
                if n.names[uid] in self.drained[job]:
                    n.drained_at[uid] = e.t
            n.queued = any(
                not _finished(sc)
                and ((sc.get("spec") or {}).get("selector") or {}).get("name") == j
                for sc in self.scalers.values()
                for j in set(n.pods.values())
            )
            self.notices.append(n)
            self.healthy_since.pop(name, None)
        elif was and not now:
            self.healthy_since[name] = e.t
            for n in self.notices:
                if n.node == name and n.withdrawn is None:
                    n.withdrawn = e.t

    def _pod(self, e: Event) -> None:
        uid, name = e.obj["metadata"]["uid"], e.obj["metadata"]["name"]
        job = _labels(e.obj).get("training-job-name", "")
        is_worker = _labels(e.obj).get("training-job-role") == "worker"
        if e.type != "DELETED":
            self.pods[uid] = e.obj
            if (e.obj.get("spec") or {}).get("nodeName"):
                self.placed_at.setdefault(uid, e.t)
            if (e.obj.get("status") or {}).get("phase") == "Running":
                self.ready_since.setdefault(uid, e.t)
            lo, hi = self.bounds(job)
            if is_worker and len(self.workers(job)) > hi:
                self.flag(
                    e.t,
                    "over_max",
                    f"{job}: {len(self.workers(job))} workers > max {hi} "
                    f"when {name} appeared; {self.context(job)}",
                    (job, str(len(self.workers(job)))),
                )
            return
        pod = self.pods.pop(uid, e.obj)
        if not is_worker:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        notices = [n for n in self.notices if uid in n.pods]
        if uid in self.reclaimed:
            drained = name in self.drained[job]
            # its job's last host off noticed nodes: the daemon keeps it in discovery until a
            # replacement runs (core/departures.py _last_host_to_keep); none ran in time
            kept = any(uid in n.kept for n in notices) or (
                not drained and not self.settled_survivor(pod, job, e.t)
            )
            if kept and not drained:
                for n in notices:
                    n.kept.add(uid)
            if not drained and not kept:
                self.flag(
                    e.t,
                    "undrained_at_reclaim",
                    f"{job}: pod {name} on {node} killed by the reclaim, not drained",
                )
            fate = (
                "drained_at_reclaim"
                if drained
                else "kept_at_reclaim"
                if kept
                else "killed_undrained"
            )
            for n in notices:
                n.fate.setdefault(uid, fate)
            return
        for n in notices:
            n.fate.setdefault(uid, "removed_by_name")
        lo, _ = self.bounds(job)
        # a ScaleIn cannot be taken back: one that named the pod under a notice withdrawn
        # since (a false alarm) is still a removal for that notice when et-operator runs it
        noticed = self.noticed(pod) or uid in self.named_noticed
        ran = (pod.get("status") or {}).get("phase") == "Running"
        left = len(self.workers(job))
        if left < lo and ran and not noticed:
            self.flag(
                e.t,
                "under_min",
                f"{job}: {name} on healthy node {node} removed, {left} workers left < min {lo}",
            )

    def _trainingjob(self, e: Event) -> None:
        name = e.obj["metadata"]["name"]
        if e.type == "DELETED":
            self.jobs.pop(name, None)
            return
        self.jobs[name] = e.obj
        now, before = _drained(e.obj), self.drained[name]
        self.check_drain(e, name, now - before)
        self.drained[name] = now
        for host in now - before:
            self.drained_since[(name, host)] = e.t
            for n in self.notices:
                if n.withdrawn is not None:
                    continue
                for uid, job in n.pods.items():
                    if job == name and n.names[uid] == host and uid not in n.drained_at:
                        n.drained_at[uid] = e.t
        for host in before - now:
            self.drained_since.pop((name, host), None)

    def _scale(self, e: Event) -> None:
        key = (e.kind, e.obj["metadata"]["name"])
        if _labels(e.obj).get(MANAGED_BY) != "spot-autoscaler":
            return
        if e.type == "DELETED":
            self.scalers.pop(key, None)
            return
        self.scalers[key] = e.obj
        job = ((e.obj.get("spec") or {}).get("selector") or {}).get("name", "")
        open_ = sorted(
            f"{k}/{n}"
            for (k, n), s in self.scalers.items()
            if not _finished(s) and ((s.get("spec") or {}).get("selector") or {}).get("name") == job
        )
        if len(open_) > 1:
            self.flag(e.t, "two_scalers", f"{job}: unfinished {open_}", (job, *open_))
        if e.kind != "ScaleIn":
            return
        if e.type == "ADDED":
            self.check_removal(e, job, (e.obj["spec"].get("toDelete") or {}).get("podNames") or [])
        resolved = self.resolved.setdefault(key[1], {})
        for pod_name in ((e.obj.get("spec") or {}).get("toDelete") or {}).get("podNames") or ():
            if pod_name in resolved:  # the pod it meant when it first named it
                continue
            pod = self.pod_named(pod_name)
            resolved[pod_name] = pod["metadata"]["uid"] if pod else None
            for n in self.notices:
                if pod and pod["metadata"]["uid"] in n.pods and n.withdrawn is None:
                    n.named_at.setdefault(pod["metadata"]["uid"], e.t)
            if pod and self.noticed_within_race(pod, e.t):
                self.named_noticed.add(pod["metadata"]["uid"])
            ident = (pod_name, pod["metadata"]["uid"] if pod else None)
            first = self.named.setdefault(ident, key[1])
            if first != key[1]:
                self.flag(
                    e.t,
                    "pod_in_two_scaleins",
                    f"{pod_name} (uid {ident[1]}) in ScaleIns {first} and {key[1]}",
                    (pod_name, str(ident[1]), key[1]),
                )

    _scalein = _scaleout = _scale

    def check_settled(self, t: float) -> None:
        for (job, host), since in list(self.drained_since.items()):
            pod = next((p for p in self.workers(job) if p["metadata"]["name"] == host), None)
            node = (pod.get("spec") or {}).get("nodeName") if pod else None
            if pod is None or node is None or node not in self.healthy_since:
                continue
            # et-operator's names come back: a pod named as a drained host gone since is new
            placed = self.placed_at.get(pod["metadata"]["uid"], since)
            healthy = max(self.healthy_since[node], since, placed)
            if t - healthy > self.settle:
                self.flag(
                    t,
                    "drained_after_healthy",
                    f"{job}: host {host} still drained {t - healthy:.1f} s after node "
                    f"{node} lost its notice",
                    (job, host, f"{healthy:.3f}"),
                )


class Record(Protocol):
    """A server's record: `RecordingServer` (the emulator's own), or `watch_record.WatchRecorder`
    (a real server's watches, the fault proxy's writes)."""

    def record(self) -> tuple[list[Event], set[str], list[Write]]: ...


def check(
    source: Record,
    settle: float = 10.0,
    end: float | None = None,
    race: float = 1.0,
    join_grace: float = 30.0,
) -> Report:
    """Replay everything the server recorded; ``end`` (default now) closes the settle checks.
    ``join_grace``: the daemon's `preemption.join_grace` (when a replacement counts as settled)."""
    events, reclaimed, writes = source.record()
    state = _State(reclaimed, settle, race, join_grace)
    for e in events:
        state.apply(e)
    for w in writes:
        if w.identity != w.holder:
            state.flag(
                w.t,
                "write_by_non_leader",
                f"{w.method} {w.path} by {w.identity} while {w.holder} held the Lease",
            )
    state.check_settled(time.monotonic() if end is None else end)
    stale = sum(
        1
        for job, hosts in state.drained.items()
        for h in hosts
        if not any(p["metadata"]["name"] == h for p in state.workers(job))
    )
    return Report(state.violations, state.notices, stale, state.raced)


def decision_line(violation: Violation, lines: list[str]) -> str | None:
    """The daemon's decision line (JSON) behind a write that broke an invariant: the last one of
    its action and job naming one of its hosts, logged before the write landed."""
    found = None
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict) or d.get("action") != violation.action:
            continue
        named = set(d.get("pods") or ()) | set(d.get("hosts") or ())
        at = datetime.fromisoformat(str(d.get("ts", "")).replace("Z", "+00:00")).timestamp()
        if (
            str(d.get("job", "")).endswith(f"/{violation.job}")
            and named & set(violation.hosts)
            and at <= violation.wall + 0.05
        ):
            found = line.strip()
    return found
