"""Before an irreversible write, the server's word on what the cache says.

A ScaleIn (or a replicas decrease) cannot be taken back, and the watch cache may be behind: a
pod already deleted, a notice already withdrawn, a worker count that an earlier ScaleIn already
brought down. So the victims are read from the server first: a GET each where every victim is
on a node the view has a notice for (a pod's node never changes, so the cache may tell), or for a
kind without worker labels; otherwise one list of the job's workers by its labels (the count is
wanted). A list, even by node, cost the API server far more than a few GETs at 16,000 pods in a
namespace (py-spy of the daemon on the real plane: the largest wait on the notice path).
One named for a notice (its node had one in the view) goes if the node still carries it on the
server (or the cloud source's own record, the notice board, has it); any other goes only while
the job, as the server has it, still has more live workers than the decision aims at (a clamp
to max, an on-demand surplus).
Victims that are gone or already Terminating are dropped.
Drains are reversible and race the node's death: a notice the node view has received since its
last break (a re-list, a resumed watch) needs no read; one held from before it (or while the view
is behind) is confirmed first, one GET per node; a clamp's workers (on nodes without a notice)
are drained only as far as the job's live workers on the server are above the target (one list).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

import structlog
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.kinds.base import JobKind
from autoscaler.adapters.kube.nodes import node_notices
from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.pods import TERMINATED_PHASES
from autoscaler.adapters.kube.resources import NODES, PODS, Obj, Resource, labels_of
from autoscaler.adapters.kube.view import CacheView
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core.model import Decision, Notice, Reason

log = structlog.get_logger()

# the notices of the cloud sources (not on a Node yet), as the daemon's board has them now
BoardNotices = Callable[[datetime], tuple[Notice, ...]]
# the victims' GETs of every check (several ScaleIns may be checked at once)
_READS = ThreadPoolExecutor(16, thread_name_prefix="server-check")
# seconds a server check holds for the write that rests on it, counted from before the reads it
# rests on: the fault suite tolerates no write landing later than 1 s after its notice went
CONFIRMED_FOR = 1.0
# seconds of a check's hold a ScaleIn's create wants left: with less, what it rests on is read
# again first. Sent with 0.1-0.3 s left on a busy plane (2,000 nodes: the POST's server time
# p99 <= 0.6 s), creates timed out unanswered and their checks expired, two in a row (the
# ScaleIn then waited for its back-off and a new pass: 4-6 s after its notice)
SEND_BUDGET = 0.4


@dataclass(frozen=True)
class Checked:
    """A ScaleIn as the server supports it, and what that rests on."""

    decision: Decision  # with the victims that hold up (maybe none: then nothing is written)
    since: float  # time.monotonic() before the reads it rests on
    # each victim's node when every one goes for its node's notice: then those nodes are all it
    # rests on, and reading them again makes it current (`ServerCheck.again`); None: it rests
    # on the job's workers as the server counts them too
    nodes: Mapping[str, str] | None

    @property
    def until(self) -> float:
        """The time.monotonic() its hold (CONFIRMED_FOR) runs out."""
        return self.since + CONFIRMED_FOR

    def left(self) -> float:
        """Seconds of its hold still to run."""
        return self.until - time.monotonic()


class Freshness(Protocol):
    """Whether the watch cache's copy is as current as its watch (cache.KubeCache)."""

    def current(self, resource: Resource, key: str) -> bool: ...


class ServerCheck:
    def __init__(
        self,
        objects: ObjectApi,
        cache: CacheView,
        settings: KubernetesSettings,
        board: BoardNotices | None = None,
    ) -> None:
        self._objects = objects
        self._cache = cache
        self._settings = settings
        self._board = board
        # GETs begun for a check to come (`read_ahead`): ("node", name) or ("pod", ns, name) ->
        # (time.monotonic() before it was sent, its answer; None: 404)
        self._ahead: dict[tuple[str, ...], tuple[float, Future[Obj | None]]] = {}
        self._ahead_lock = threading.Lock()

    def read_ahead(self, namespace: str, pods: Iterable[str], now: datetime) -> None:
        """Begin the GETs a notice's ScaleIn's check will want: its victims on nodes the view
        has a notice for, and those nodes. Called as their drain is written (the ScaleIn
        follows it), they go beside the drain's PATCH instead of after it. A check takes an
        answer while enough of its hold is left (SEND_BUDGET), else reads again."""
        began = time.monotonic()
        wanted: list[tuple[tuple[str, ...], Callable[[], Obj | None]]] = []
        for pod in pods:
            if (node := self.node_of(namespace, pod)) and self._noticed_in_view(node, now):
                wanted.append(
                    (("pod", namespace, pod), functools.partial(self._pod, namespace, pod))
                )
                wanted.append((("node", node), functools.partial(self._node, node)))
        with self._ahead_lock:
            self._ahead = {k: v for k, v in self._ahead.items() if _usable(v[0], began)}
            for key, read in wanted:
                if key not in self._ahead:
                    self._ahead[key] = (began, _READS.submit(read))

    def _ahead_of(
        self, key: tuple[str, ...], since: float = float("-inf")
    ) -> tuple[float, Future[Obj | None]] | None:
        """A GET begun ahead (read_ahead), after `since`, with enough of its hold left to rest
        a create on."""
        with self._ahead_lock:
            found = self._ahead.get(key)
        if found is None or found[0] < since or not _usable(found[0], time.monotonic()):
            return None
        return found

    def _reads_ahead(
        self, nodes: set[str], since: float = float("-inf")
    ) -> dict[str, tuple[float, Future[Obj | None]]]:
        """The nodes' GETs begun ahead after `since`: when each began, and its answer."""
        found = {n: self._ahead_of(("node", n), since) for n in nodes}
        return {n: ahead for n, ahead in found.items() if ahead is not None}

    def scale_in(self, job: Obj, kind: JobKind, decision: Decision, now: datetime) -> Checked:
        """The ScaleIn the server supports: `decision` with the victims that hold up, and since
        when (the nodes' reads when a notice is among them, else the workers')."""
        since = time.monotonic()
        # the victims named for a notice: by the decision (its view's), or the view's now; a
        # notice withdrawn since does not make its victim a clamp's (the decision's target
        # counted it as leaving: its place is no room above the target)
        named = set(decision.for_notice)
        # their nodes (the cache may tell a pod's node) asked with the victims, not after them:
        # one round trip less between the notice and its ScaleIn on a busy server
        on = {p: self.node_of(job["metadata"]["namespace"], p) for p in decision.pods}
        asked = {n for n in self._meant(on, named, now).values() if n}
        nodes_read = _READS.submit(self._noticed_from, asked, now)
        pods, live = self._workers(job, kind, decision.pods, now)
        noticed, read_at = nodes_read.result()
        alive = {p: _node_of(pods[p]) for p in decision.pods if p in pods and _alive(pods[p])}
        meant = set(self._meant(alive, named, now))
        # a victim the cache did not place: its node read now
        noticed, read_at = self._read_more({alive[p] for p in meant} - asked, noticed, read_at, now)
        if meant and read_at is not None:  # what can change under a notice victim is its notice
            since = read_at
        by_notice = {p for p in meant if alive[p] in noticed}
        # the others only above the decision's target, counted on the server; a notice victim
        # that does not hold up stays, and the target with it
        plain = _within_room([p for p in alive if p not in meant], live, decision, len(meant))
        kept = _kept(decision, kind, by_notice | set(plain))
        _log_narrowed(decision, kept, set(alive))
        return Checked(narrowed(decision, kept), since, _rests_on_nodes(kept, by_notice, alive))

    def again(self, checked: Checked, job: Obj, kind: JobKind, now: datetime) -> Checked:
        """`checked` made current: only its nodes read again when they are all it rests on (a
        victim read alive stays a victim: what can change under it is its notice), else the
        whole check. A retry then costs one round trip, which a slow server's check fits in."""
        if checked.nodes is None:
            return self.scale_in(job, kind, checked.decision, now)
        noticed, began = self._noticed_from(set(checked.nodes.values()), now)
        holding = {p for p, n in checked.nodes.items() if n in noticed}
        kept = _kept(checked.decision, kind, holding)
        _log_narrowed(checked.decision, kept, set(checked.nodes))
        since = checked.since if began is None else began
        return Checked(narrowed(checked.decision, kept), since, {p: checked.nodes[p] for p in kept})

    def drain(
        self,
        decision: Decision,
        job: Obj,
        kind: JobKind,
        now: datetime,
        view: Freshness,
        since: float,
    ) -> Decision:
        """`decision` without the workers whose node's notice may be gone (a pod's node never
        changes, so the cache may tell it). A drain goes only for a notice the node view has
        received since its last break (`view.current`: after its last re-list or resumed
        watch, which may still be replaying a withdrawal) or one the server (or the board)
        confirms: one GET per node that needs it (or one `read_ahead` began after `since`).
        Decided on a stale view (`stale_view`), every worker it names is on a node the view had
        a notice for: one whose current copy has none now lost it. Otherwise a worker on a node
        without a notice is a clamp's: it needs no notice, only a job the server has above the
        decision's target (one list of its workers), as a ScaleIn's does: a view behind the
        server, still holding pods deleted since, would drain healthy workers."""
        meta = job["metadata"]
        node_of = {p: self.node_of(meta["namespace"], p) for p in decision.pods}
        named = {node_of[p] for p in decision.for_notice if p in node_of}
        keep, ask, clamp = self._sort_nodes(decision, now, view, named)
        keep |= self._noticed(ask, now, self._reads_ahead(ask, since)) if ask else set()
        pods = [p for p in decision.pods if node_of[p] in keep]
        clamped = [p for p in decision.pods if node_of[p] in clamp]
        if clamped:
            listed = functools.partial(self._job_pods, meta["namespace"], meta["name"], kind)
            clamped = _within_room(clamped, lambda: sum(map(_alive, listed())), decision, len(pods))
        kept = tuple(p for p in decision.pods if p in pods or p in clamped)
        if kept == decision.pods:
            return decision
        log.info(
            "drain_narrowed_by_server",
            job=decision.job,
            nodes=list(decision.nodes),
            without_notice=sorted(set(decision.nodes) - keep - clamp),
            clamp_not_above_target=sorted(set(decision.pods) - set(kept) - set(pods)),
        )
        return narrowed(decision, kept)

    def _sort_nodes(
        self, decision: Decision, now: datetime, view: Freshness, named: set[str]
    ) -> tuple[set[str], set[str], set[str]]:
        """The drain's nodes: those whose notice holds as the view has it, those whose notice
        the server must confirm, and those of a clamp's workers (no notice needed). A node the
        decision named for a notice is never a clamp's."""
        strict = Reason.STALE_VIEW in decision.tags
        board = self._board_nodes(now)
        keep, ask, clamp = set(), set(), set()
        for node in decision.nodes:
            noticed, current = self._noticed_in_cache(node), view.current(NODES, node)
            needs_notice = strict or node in named  # a current copy without one lost it
            if node in board or (noticed and current):
                keep.add(node)
            elif noticed or (needs_notice and not current):
                ask.add(node)
            elif not needs_notice:
                clamp.add(node)
        return keep, ask, clamp

    def _workers(
        self, job: Obj, kind: JobKind, victims: tuple[str, ...], now: datetime
    ) -> tuple[dict[str, Obj], Callable[[], int]]:
        """The victims as the server has them (by name), and the count of the job's live
        workers there (read when wanted: only a victim without a notice needs it)."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        nodes = {self.node_of(namespace, v) for v in victims}
        noticed = all(n and self._noticed_in_view(n, now) for n in nodes)
        if kind.guard_labels is not None and not noticed:
            listed = self._job_pods(namespace, name, kind)
            by_name = {p["metadata"]["name"]: p for p in listed}
            return by_name, lambda: sum(map(_alive, listed))
        # at once: one after another, the GETs were most of a ScaleIn's time on a busy server
        read = functools.partial(self._pod_ahead, namespace)
        got = _READS.map(read, victims) if len(victims) > 1 else map(read, victims)
        found = {v: obj for v, obj in zip(victims, got, strict=True) if obj is not None}
        return found, lambda: sum(map(_alive, self._job_pods(namespace, name, kind)))

    def _job_pods(self, namespace: str, name: str, kind: JobKind) -> list[Obj]:
        labels = kind.guard_labels(name) if kind.guard_labels is not None else {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        return [
            pod
            for pod in self._objects.pods(namespace, selector)
            if kind.worker_of(pod["metadata"], pod["metadata"]["name"], labels_of(pod)) == name
        ]

    def node_of(self, namespace: str, pod: str) -> str:
        """The pod's node as the cache has it ('' if unknown): a pod's node never changes."""
        return _node_of(self._cache.get(PODS, f"{namespace}/{pod}") or {})

    def _pod_ahead(self, namespace: str, pod: str) -> Obj | None:
        """The pod as a GET begun ahead has it, or as one now."""
        ahead = self._ahead_of(("pod", namespace, pod))
        return ahead[1].result() if ahead is not None else self._pod(namespace, pod)

    def _pod(self, namespace: str, pod: str) -> Obj | None:
        return self._get(PODS, namespace, pod)

    def _node(self, node: str) -> Obj | None:
        return self._get(NODES, "", node)

    def _get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """None: not found."""
        try:
            return self._objects.get(resource, namespace, name, urgent=True)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _board_nodes(self, now: datetime) -> set[str]:
        return {n.node for n in self._board(now)} if self._board is not None else set()

    def _noticed_in_view(self, node: str, now: datetime) -> bool:
        if self._board is not None and any(n.node == node for n in self._board(now)):
            return True
        return self._noticed_in_cache(node)

    def _noticed_in_cache(self, node: str) -> bool:
        obj = self._cache.get(NODES, node)
        return obj is not None and bool(node_notices(obj, self._settings))

    def _read_more(
        self, nodes: set[str], noticed: set[str], read_at: float | None, now: datetime
    ) -> tuple[set[str], float | None]:
        """`noticed` with `nodes` read too; when the first read began."""
        more, began = self._noticed_from(nodes, now)
        return noticed | more, began if read_at is None else min(read_at, began or read_at)

    def _meant(self, on: dict[str, str], named: set[str], now: datetime) -> dict[str, str]:
        """Of the victims (pod -> node), those that go for a notice: named so by the decision,
        or on a node the view has a notice for."""
        return {p: n for p, n in on.items() if p in named or (n and self._noticed_in_view(n, now))}

    def _noticed_from(self, nodes: set[str], now: datetime) -> tuple[set[str], float | None]:
        """`_noticed`, answers begun ahead (read_ahead) taken, and the time.monotonic() the
        oldest read it rests on began (None: no node to read): on a busy daemon a read waits
        for a thread first, and the wait is no part of how old the answer is."""
        if not nodes:
            return set(), None
        began = time.monotonic()
        ahead = self._reads_ahead(nodes)
        began = min([began, *(b for b, _ in ahead.values())])
        return self._noticed(nodes, now, ahead), began

    def _noticed(
        self,
        nodes: set[str],
        now: datetime,
        ahead: Mapping[str, tuple[float, Future[Obj | None]]] | None = None,
    ) -> set[str]:
        """Those of `nodes` the server (or the cloud source's record) says carry a notice; a
        node that is gone counts: its workers are no healthy ones. `ahead`: reads already
        begun."""
        board = self._board_nodes(now)
        out = set()
        for node in nodes:
            if node in board:
                out.add(node)
                continue
            found = ahead.get(node) if ahead else None
            obj = found[1].result() if found is not None else self._node(node)
            if obj is None or node_notices(obj, self._settings):
                out.add(node)
        return out


def _usable(began: float, now: float) -> bool:
    """A read begun at `began` leaves a create SEND_BUDGET of its hold at `now`."""
    return now - began < CONFIRMED_FOR - SEND_BUDGET


def _rests_on_nodes(
    kept: tuple[str, ...], by_notice: set[str], node_of: dict[str, str]
) -> dict[str, str] | None:
    """The victims' nodes when all `kept` go for their node's notice (Checked.nodes)."""
    return {p: node_of[p] for p in kept} if by_notice.issuperset(kept) else None


def _log_narrowed(decision: Decision, kept: tuple[str, ...], alive: set[str]) -> None:
    if kept != decision.pods:
        log.info(
            "scale_in_narrowed_by_server",
            job=decision.job,
            pods=list(decision.pods),
            kept=list(kept),
            gone=sorted(set(decision.pods) - alive),
        )


def _kept(decision: Decision, kind: JobKind, holding: set[str]) -> tuple[str, ...]:
    """The decision's victims that hold up, in its order; a replicas decrease names no victim:
    all of them hold up, or nothing goes."""
    kept = tuple(p for p in decision.pods if p in holding)
    return kept if kind.names_victims or kept == decision.pods else ()


def _within_room(
    pods: list[str], live: Callable[[], int], decision: Decision, others: int
) -> list[str]:
    """As many of `pods` as the job's live workers on the server (`live()`, asked only when
    there are any) are above the decision's target, besides `others` leaving with them."""
    if not pods:
        return pods
    return pods[: max(0, live() - decision.to_workers - others)]


def _alive(pod: Obj) -> bool:
    """Neither Terminating nor ended."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in TERMINATED_PHASES


def _node_of(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")  # '' while unscheduled


def narrowed(decision: Decision, pods: tuple[str, ...]) -> Decision:
    """`decision` removing only `pods`, a subset of its own (Kubernetes hosts are pod names)."""
    if pods == decision.pods:
        return decision
    return replace(
        decision,
        pods=pods,
        count=len(pods),
        to_workers=decision.from_workers - len(pods),
        hosts=tuple(h for h in decision.hosts if h in pods) or decision.hosts,
    )
