"""A view behind the server never removes a healthy worker (issue 26), over real HTTP against
the API emulator: its fault injection is what keeps a watch from reopening on demand.

The cache knows which kinds are behind (a broken watch until the next one opens, a re-list), the
core holds what can wait (core/freshness.py), and a removal asks the server first
(adapters/kube/confirm.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kube_fixtures import (
    NS,
    Kube,
    ai_training_job,
    node,
    now,
    scaler,
    stamp,
    trainer,
    training_job,
    worker,
)
from support.waiting import wait_for

from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.kinds.et_operator import SCALE_INS, SCALE_OUTS
from autoscaler.adapters.kube.kinds.et_operator_scalers import scaler_facts
from autoscaler.adapters.kube.resources import NODES, PODS
from autoscaler.annotations import DRAINED_ANNOTATION
from autoscaler.core import Action, Decision, Reason, decide

NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-1", "effect": "NoSchedule"}
POD_WATCH = "/api/v1/pods?allowWatchBookmarks"  # the pod watch; lists carry no bookmarks
NODE_WATCH = "/api/v1/nodes?allowWatchBookmarks"


def bert(*placement: str, max_workers: int = 4) -> list[dict]:
    return [training_job("bert", max_workers=max_workers)] + [
        worker("bert", i, where) for i, where in enumerate(placement)
    ]


# bert's two workers on node a leave for a's notice, as the core decides it (3 -> 1)
NOTICE_ON_A = Decision(
    "ml/bert", Action.SCALE_IN, Reason.PREEMPTION_NOTICE, "default", 3, 1, count=2,
    pods=("bert-worker-0", "bert-worker-1"), hosts=("bert-worker-0", "bert-worker-1"),
    nodes=("a",), for_notice=("bert-worker-0", "bert-worker-1"),
)  # fmt: skip


def cut(kube: Kube, watch: str) -> None:
    """Break every watch and keep `watch` from opening again (until the test ends)."""
    kube.server.fail_next(1_000_000, 500, path_contains=watch)
    kube.server.drop_watches()


def drained(kube: Kube) -> str:
    job = kube.server.get("TrainingJob", "bert", NS)
    return (job["metadata"].get("annotations") or {}).get(DRAINED_ANNOTATION, "")


def test_a_broken_watch_makes_its_kind_behind_until_it_opens_again(kube: Kube) -> None:
    kube.server.seed(node("a"), *bert("a"))
    cache = kube.cache()
    assert cache.behind() == frozenset()
    cut(kube, POD_WATCH)
    # the others resume at once; the pod watch stays broken
    wait_for(lambda: cache.behind() == {PODS}, 5, "only the pod view should be behind")
    snap = kube.observer(cache).snapshot(now())
    assert snap.stale == frozenset({"Pod"})


def test_a_relist_after_410_is_behind_until_it_lands(kube: Kube) -> None:
    kube.server.seed(node("a"), *bert("a"))
    cache = kube.cache()
    kube.server.fail_next(1_000_000, 500, path_contains="limit=")  # every re-list
    # a change the pod watch does not carry: its resourceVersion is now older than the store's
    kube.server.patch("Node", "a", {"metadata": {"labels": {"touched": "yes"}}})
    kube.server.compact()
    kube.server.drop_watches()
    wait_for(lambda: PODS in cache.behind(), 5, "the pod view never fell behind")


def test_ghosts_of_a_finished_scale_in_are_not_clamped_to_max(kube: Kube) -> None:
    """The 28 -> 24 of issue 26: the pod view still holds pods a ScaleIn deleted while the job's
    max came down; a clamp on that view would remove healthy workers."""
    kube.server.seed(node("a"), node("b"), *bert("a", "a", "b", "b"))
    cache = kube.cache()
    rec = kube.reconciler(cache)
    assert not [d for d in rec.tick(now()) if d.action is Action.SCALE_IN]
    cut(kube, POD_WATCH)
    wait_for(lambda: PODS in cache.behind(), 5, "the pod view never fell behind")
    for i in (2, 3):  # an earlier ScaleIn's victims, gone on the server
        kube.server.delete("Pod", f"bert-worker-{i}", NS)
    kube.server.patch(
        "TrainingJob", "bert", {"spec": {"etReplicaSpecs": {"worker": {"maxReplicas": 2}}}}, NS
    )
    wait_for(
        lambda: kube.observer(cache).snapshot(now()).jobs[0].max_workers == 2, 5, "max not seen"
    )
    decisions = rec.tick(now())
    assert not [d for d in decisions if d.action in (Action.SCALE_IN, Action.DRAIN)]
    assert any(Reason.CLAMP_MAX in d.tags for d in decisions if d.reason is Reason.STALE_VIEW)
    assert kube.objects("ScaleIn") == [] and drained(kube) == ""


def test_a_clamp_the_server_no_longer_supports_writes_nothing(kube: Kube) -> None:
    """The actuator's own check: the server's live workers are the decision's target already."""
    kube.server.seed(node("a"), *bert("a", "a", max_workers=2))
    cache = kube.cache()
    clamp = Decision(
        "ml/bert", Action.SCALE_IN, Reason.CLAMP_MAX, "default", 3, 2, count=1,
        pods=("bert-worker-1",), hosts=("bert-worker-1",), nodes=("a",),
    )  # fmt: skip
    kube.actuator(cache).apply(clamp, now())
    assert kube.objects("ScaleIn") == []
    over = Decision(
        "ml/bert", Action.SCALE_IN, Reason.CLAMP_MAX, "default", 2, 1, count=1,
        pods=("bert-worker-1",), hosts=("bert-worker-1",), nodes=("a",),
    )  # fmt: skip
    kube.actuator(cache).apply(over, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-1"]


def test_a_scale_in_naming_a_pod_gone_on_the_server_names_only_the_live_ones(kube: Kube) -> None:
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    cut(kube, POD_WATCH)
    wait_for(lambda: PODS in cache.behind(), 5, "the pod view never fell behind")
    kube.server.delete("Pod", "bert-worker-0", NS)
    kube.actuator(cache).apply(NOTICE_ON_A, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-1"]


def test_a_notices_scale_in_reads_only_its_victims(kube: Kube) -> None:
    """The server check GETs the victims on noticed nodes, and lists no pods (a list costs the
    API server every pod of the namespace); a clamp still lists the job's workers
    (test_a_clamp_the_server_no_longer_supports_writes_nothing)."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    kube.server.clear_requests()
    kube.actuator(cache).apply(NOTICE_ON_A, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-0", "bert-worker-1"]
    reads = [r.path for r in kube.server.requests("GET", f"/namespaces/{NS}/pods", watch=False)]
    assert sorted(reads) == [f"/api/v1/namespaces/{NS}/pods/bert-worker-{i}" for i in (0, 1)]


def victim_reads(kube: Kube) -> int:
    return len(kube.server.requests("GET", f"/namespaces/{NS}/pods/bert-worker-0", watch=False))


def test_a_scale_in_that_outlives_its_check_is_checked_again_and_sent_once(kube: Kube) -> None:
    """Three 500s on the create take it past CONFIRMED_FOR (retries at 0.2, 0.6 and 1.4 s): it
    is not sent on that check; the victims' node is read again (a victim read alive stays one:
    what can change under it is its notice) and the ScaleIn goes out in the same apply, not a
    back-off later."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    kube.server.fail_next(3, 500, path_contains="/scaleins", method="POST")
    kube.server.clear_requests()
    kube.actuator(cache).apply(NOTICE_ON_A, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-0", "bert-worker-1"]
    assert (victim_reads(kube), node_gets(kube)) == (1, 2)
    assert len(kube.server.requests("POST", "/scaleins")) == 4  # three refused, one made


def test_a_notices_scale_in_takes_the_reads_begun_beside_its_drain(kube: Kube) -> None:
    """A notice's first drain begins its ScaleIn's GETs (the victims and their node) as it is
    written; the ScaleIn's check takes their answers instead of reading again."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    decisions = decide(kube.observer(cache).snapshot(now()), kube.config.policy_set, now())
    [drain] = [d for d in decisions if d.action is Action.DRAIN]
    [scale_in] = [d for d in decisions if d.action is Action.SCALE_IN]
    actuator = kube.actuator(cache)
    kube.server.clear_requests()
    actuator.apply(drain, now())
    wait_for(lambda: (victim_reads(kube), node_gets(kube)) == (1, 1), 5, "no reads begun ahead")
    actuator.apply(scale_in, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-0", "bert-worker-1"]
    assert (victim_reads(kube), node_gets(kube)) == (1, 1)


SLOW_CHECK = 0.75  # a victim's GET this late leaves less of the check's hold than SEND_BUDGET


def test_a_check_that_left_the_create_too_little_time_reads_the_nodes_again_first(
    kube: Kube,
) -> None:
    """The victims' GETs came back late (a busy server): rather than send a create that may
    time out unanswered, the ScaleIn reads its nodes again and goes out once, on that read."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    kube.server.slow_next(1, SLOW_CHECK, path_contains="/pods/bert-worker-0", method="GET")
    kube.server.clear_requests()
    kube.actuator(cache).apply(NOTICE_ON_A, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-0", "bert-worker-1"]
    assert (victim_reads(kube), node_gets(kube)) == (1, 2)
    assert len(kube.server.requests("POST", "/scaleins")) == 1


def test_a_notice_withdrawn_while_the_check_was_slow_removes_nobody(kube: Kube) -> None:
    """The node was read with its notice; while a victim's GET was slow the notice went. The
    second read of the node finds it gone: no ScaleIn."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    kube.server.slow_next(1, SLOW_CHECK, path_contains="/pods/bert-worker-0", method="GET")
    kube.server.clear_requests()
    withdraw = threading.Thread(
        target=lambda: (
            wait_for(lambda: node_answers(kube) == [200], 5, "the check's node read answered"),
            kube.server.patch("Node", "a", {"spec": {"taints": []}}),
        )
    )
    withdraw.start()
    kube.actuator(cache).apply(NOTICE_ON_A, now())
    withdraw.join()
    assert kube.objects("ScaleIn") == [] and node_gets(kube) == 2


@pytest.mark.parametrize("cut_nodes", [True, False], ids=["node-watch-cut", "all-fresh"])
def test_a_notice_withdrawn_before_the_cut_removes_and_drains_nobody(
    kube: Kube, cut_nodes: bool
) -> None:
    """Every watch is cut between a withdrawn notice and the next pass: the stale node view still
    shows the notice, the server does not. Nothing irreversible goes out, and no drain either."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "b"))
    cache = kube.cache()
    rec = kube.reconciler(cache)
    if cut_nodes:
        cut(kube, NODE_WATCH)
        wait_for(lambda: NODES in cache.behind(), 5, "the node view never fell behind")
    kube.server.patch("Node", "a", {"spec": {"taints": []}})  # the cloud withdrew it
    if cut_nodes:
        assert kube.observer(cache).snapshot(now()).notices  # the view still has it
        decisions = rec.tick(now())
        assert [d.action for d in decisions if d.action is not Action.NOOP] == [
            Action.DRAIN,
            Action.SCALE_IN,
        ]  # decided on the notice the view still holds, then the server said no
    else:
        wait_for(lambda: not kube.observer(cache).snapshot(now()).notices, 5, "taint not seen")
        rec.tick(now())
    assert kube.objects("ScaleIn") == [] and drained(kube) == ""


def test_a_finished_scale_in_ahead_of_the_pod_view_takes_its_pods_out(kube: Kube) -> None:
    """Expectations: a ScaleIn that succeeded at a resourceVersion newer than the pod view's
    counts its pods as gone, whatever the pod view still holds."""
    kube.server.seed(node("a"), *bert("a", "a", "a", max_workers=2))
    cache = kube.cache()
    cut(kube, POD_WATCH)
    wait_for(lambda: PODS in cache.behind(), 5, "the pod view never fell behind")
    kube.server.delete("Pod", "bert-worker-2", NS)
    done = scaler("ScaleIn", "bert-in-1", "bert", outcome="ScaleSucceeded", at=now(),
                  pods=["bert-worker-2"])  # fmt: skip
    kube.server.seed(done)
    wait_for(lambda: cache.items(SCALE_INS), 5, "ScaleIn not seen")
    [job] = kube.observer(cache).snapshot(now()).jobs
    assert sorted(w.pod for w in job.workers) == ["bert-worker-0", "bert-worker-1"]


# --- issue 34: a drain only for a notice the view is sure of; never a ScaleOut above max --------
BOTH = pytest.mark.servers("emulator", "real")
NODE_GETS = "/api/v1/nodes/a"


def node_gets(kube: Kube) -> int:
    return len(node_answers(kube))


def node_answers(kube: Kube) -> list[int]:
    """The statuses of node a's GETs (0: not answered yet)."""
    return [r.status for r in kube.server.requests("GET", NODE_GETS, watch=False)]


HELD = 3.0  # seconds: a drain takes milliseconds on the emulator


def drain_waits_for_no_node_read(kube: Kube, cache: KubeCache, drain: Decision) -> None:
    """Apply `drain` while the server holds node a's GETs for HELD s: none is answered as it
    lands (a drain that waited for one would have taken that long), and one is begun: the
    ScaleIn's, read ahead (`read_ahead`) beside the drain."""
    kube.server.slow_next(1, HELD, path_contains=NODE_GETS, method="GET")
    kube.server.clear_requests()
    kube.actuator(cache).apply(drain, now())
    statuses = node_answers(kube)
    assert statuses in ([], [0]), statuses  # [] : the read ahead has not reached the server yet
    wait_for(lambda: node_gets(kube) == 1, 5, "the ScaleIn's read begun ahead")


def test_a_drain_decided_on_a_stale_view_is_confirmed_after_the_view_caught_up(kube: Kube) -> None:
    """The drain was decided while the node view was behind (a withdrawn notice still in it);
    by the time it is applied the watch is open again and the withdrawal has arrived, so the
    node view is not behind any more. The decision says it rests on a stale view (`stale_view`):
    a node whose current copy has no notice lost it, and nobody is drained (no read needed)."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    observer = kube.observer(cache)
    kube.server.fail_next(1_000_000, 500, path_contains=NODE_WATCH)
    kube.server.drop_watches()
    wait_for(lambda: NODES in cache.behind(), 5, "the node view never fell behind")
    kube.server.patch("Node", "a", {"spec": {"taints": []}})  # withdrawn: the view has not seen it
    snap = observer.snapshot(now())
    assert snap.notices and "Node" in snap.stale
    [drain] = [d for d in decide(snap, kube.config.policy_set, now()) if d.action is Action.DRAIN]
    assert Reason.STALE_VIEW in drain.tags
    kube.server.clear_faults()
    wait_for(lambda: NODES not in cache.behind(), 5, "the node watch never opened again")
    wait_for(lambda: not observer.snapshot(now()).notices, 5, "the withdrawal never arrived")
    kube.actuator(cache).apply(drain, now())
    assert drained(kube) == "" and node_gets(kube) == 0


def test_a_notice_held_from_before_a_break_is_confirmed_on_the_server(
    kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node watch broke, the notice was withdrawn, and the watch is open again but its
    replay of the withdrawal has not been read yet (the view is live from the moment the server
    answers): the node the view holds is from before the break. The snapshot counts the node
    view as behind, its drain says so, and the actuator asks the server, which says no."""
    monkeypatch.setattr("autoscaler.adapters.kube.reflector.SETTLE", 60.0)
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    observer = kube.observer(cache)
    reflector = cache._reflectors[NODES][None]
    apply, replayed = reflector._apply, threading.Event()

    def slow_replay(kind: str, obj: dict, report: bool = True) -> None:
        if obj["metadata"]["name"] == "a" and not obj["spec"].get("taints"):
            replayed.wait(10)  # the withdrawal, read late
        apply(kind, obj, report)

    reflector._apply = slow_replay  # type: ignore[method-assign]
    try:
        cut(kube, NODE_WATCH)
        wait_for(lambda: NODES in cache.behind(), 5, "the node view never fell behind")
        kube.server.patch("Node", "a", {"spec": {"taints": []}})
        kube.server.clear_faults()
        wait_for(lambda: cache.behind() == frozenset(), 5, "the watches never opened again")
        assert not cache.current(NODES, "a")
        snap = observer.snapshot(now())
        assert snap.notices and snap.stale == frozenset({"Node"})
        [drain] = [
            d for d in decide(snap, kube.config.policy_set, now()) if d.action is Action.DRAIN
        ]
        assert Reason.STALE_VIEW in drain.tags
        kube.server.clear_requests()
        kube.actuator(cache).apply(drain, now())
        assert drained(kube) == "" and node_gets(kube) == 1
    finally:
        replayed.set()
    wait_for(lambda: not observer.snapshot(now()).notices, 5, "the withdrawal never arrived")


def test_a_notice_seen_since_the_last_break_drains_without_a_read(kube: Kube) -> None:
    """The common case stays one PATCH: a notice that arrived on the open watch needs no GET."""
    kube.server.seed(node("a"), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    observer = kube.observer(cache)
    kube.server.drop_watches()  # a break before the notice: the notice comes after it
    kube.server.patch("Node", "a", {"spec": {"taints": [NTH_ITN]}})
    wait_for(lambda: observer.snapshot(now()).notices, 5, "the notice never arrived")
    wait_for(lambda: cache.behind() == frozenset(), 5, "the watches never opened again")
    assert cache.current(NODES, "a")
    snap = observer.snapshot(now())
    assert snap.stale == frozenset()
    [drain] = [d for d in decide(snap, kube.config.policy_set, now()) if d.action is Action.DRAIN]
    assert Reason.STALE_VIEW not in drain.tags
    drain_waits_for_no_node_read(kube, cache, drain)
    assert drained(kube) != ""


@BOTH
def test_a_scale_out_sized_on_a_view_missing_pods_is_refused(kube: Kube) -> None:
    """The server has the last ScaleOut's pods, the view did not when the ScaleOut was sized:
    the server's count of live workers plus the ScaleOut's would pass the target (max), so no
    ScaleOut goes. One that fits the server's count goes as decided."""
    kube.server.seed(node("a"), node("b"), *bert("a", "a", "b", "b"))
    cache = kube.cache()
    actuator = kube.actuator(cache)
    # sized on a view with workers 0 and 1 only: 2 -> 4, but the job has 4 already
    blind = Decision(
        "ml/bert", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 2, 4, count=2
    )  # fmt: skip
    actuator.apply(blind, now())
    assert kube.objects("ScaleOut") == []
    kube.server.delete("Pod", "bert-worker-3", NS)
    fits = Decision(
        "ml/bert", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 3, 4, count=1
    )  # fmt: skip
    actuator.apply(fits, now())
    [made] = kube.objects("ScaleOut")
    assert made["spec"]["toAdd"]["count"] == 1


@BOTH
def test_our_scaler_the_cache_lost_is_asked_of_the_server(kube: Kube) -> None:
    """Expectations for our own writes: a re-list served before our create replaces what the
    cache held, our ScaleOut with it, until its watch event comes. The next ScaleOut of the job
    waits for the first to finish on the server, not for the cache to show it."""
    kube.server.seed(node("a"), node("b"), *bert("a", "b", max_workers=6))
    cache = kube.cache()
    actuator = kube.actuator(cache)
    first = Decision("ml/bert", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 2, 3, count=1)
    actuator.apply(first, now())
    [made] = kube.objects("ScaleOut")
    version = int(made["metadata"]["resourceVersion"])
    wait_for(lambda: cache.seen_rv(SCALE_OUTS) >= version, 10, "the ScaleOut's watch event")
    cache.forget(SCALE_OUTS, made)  # as a re-list served before the create leaves it
    second = Decision("ml/bert", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 2, 4, count=2)
    actuator.apply(second, now())
    assert [s["metadata"]["name"] for s in kube.objects("ScaleOut")] == [made["metadata"]["name"]]
    # it ran: its pod is there and it succeeded; the cache sees it finish, the next one goes
    kube.server.seed(worker("bert", 2, "a"))
    done = {
        "conditions": [{"type": "ScaleSucceeded", "status": "True", "lastTransitionTime": stamp()}],
        "addPods": ["bert-worker-2"],
        "replicaStatuses": {},
        "restartCount": 0,
    }
    kube.server.patch("ScaleOut", made["metadata"]["name"], {"status": done}, NS)

    def finished() -> bool:
        return any(scaler_facts(SCALE_OUTS, o).outcome for o in cache.items(SCALE_OUTS))

    wait_for(finished, 10, "the finished ScaleOut never reached the cache")
    third = Decision("ml/bert", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 3, 4, count=1)
    actuator.apply(third, now())
    assert len(kube.objects("ScaleOut")) == 2


def test_a_relist_landing_mid_snapshot_does_not_hide_a_scale_outs_pods(kube: Kube) -> None:
    """The pod view catches up between the read of the pod index and the read of its freshness
    (a re-list, a resumed watch): read afterwards, the view would count as fresh and complete
    past the finished ScaleOut while the index lacks its pods, and the core would size a
    ScaleOut past max. Read before, the snapshot holds growth (or counts the pods as pending)."""
    kube.server.seed(node("a"), node("b"), *bert("a", "a"))
    cache = kube.cache()
    rec = kube.reconciler(cache)
    kube.server.fail_next(1_000_000, 500, path_contains=POD_WATCH)
    kube.server.drop_watches()
    wait_for(lambda: PODS in cache.behind(), 5, "the pod view never fell behind")
    kube.server.seed(worker("bert", 2, "b"), worker("bert", 3, "b"))
    out = scaler("ScaleOut", "bert-out-1", "bert", outcome="ScaleSucceeded", at=now(),
                 pods=["bert-worker-2", "bert-worker-3"])  # fmt: skip
    out["status"]["addPods"] = ["bert-worker-2", "bert-worker-3"]
    kube.server.seed(out)
    # and a pod changes after it: the pod view, once caught up, is complete past the ScaleOut
    kube.server.patch("Pod", "bert-worker-0", {"metadata": {"labels": {"touched": "yes"}}}, NS)
    wait_for(lambda: cache.items(SCALE_OUTS), 5, "ScaleOut not seen")
    index = rec.observer._pods
    refresh = index.refresh

    def then_catch_up() -> set[str | None]:
        held = refresh()
        kube.server.clear_faults()  # the pod watch opens again, after the index was read
        wait_for(lambda: PODS not in cache.behind(), 5, "the pod watch never opened again")
        wait_for(lambda: cache.seen_rv(PODS) > scaler_rv, 5, "the pod view never caught up")
        return held

    scaler_rv = int(kube.server.get("ScaleOut", "bert-out-1", NS)["metadata"]["resourceVersion"])
    index.refresh = then_catch_up  # type: ignore[method-assign]
    decisions = rec.tick(now())
    assert not [d for d in decisions if d.action is Action.SCALE_OUT]
    assert [o["metadata"]["name"] for o in kube.objects("ScaleOut")] == ["bert-out-1"]


def test_an_object_held_across_a_break_is_current_again_only_when_it_comes_again() -> None:
    """Reflector.current on plain data: what the view holds from before a break is not current
    once the view is live again, until it comes from the server again or SETTLE has passed; an
    object that came after the break is; nothing is while the view is behind."""
    import structlog

    from autoscaler.adapters.kube.reflector import SETTLE, Reflector

    r = Reflector(
        lambda **_: None, lambda _: True, dict, lambda _: None, threading.Event(),
        structlog.get_logger(), track_current=True,
    )  # fmt: skip
    a = {"metadata": {"name": "a", "resourceVersion": "1"}}
    b = {"metadata": {"name": "b", "resourceVersion": "2"}}
    r._apply("ADDED", a)
    r._live_again()
    r.synced.set()
    assert r.current("a")
    r._broke()  # the watch broke: nothing is current, not even what came before
    assert not r.current("a") and not r.current("b")
    r._live_again()  # open again; the replay not read yet
    now = time.monotonic()
    assert not r.current("a", now)
    r._apply("ADDED", b)  # came after the break
    assert r.current("b", now) and not r.current("a", now)
    r._apply("MODIFIED", {"metadata": {"name": "a", "resourceVersion": "3"}})
    assert r.current("a", now)
    r._broke()
    r._live_again()
    now = time.monotonic()
    assert not r.current("a", now) and r.current("a", now + SETTLE)
    r.assume({"metadata": {"name": "c", "resourceVersion": "4"}})  # our own write: no news
    assert not r.current("c", now) and r.get("c") is not None


@BOTH
def test_a_replicas_scale_out_on_a_view_missing_workers_never_lowers_replicas(kube: Kube) -> None:
    """A kind scaled by its replica count (CCE) takes the decision's target as it is, so it is
    never above max; but sized on a view that misses workers the job already asks for, the
    target is below what the job has, and the operator would remove workers."""
    kube.server.seed(
        node("a"),
        ai_training_job("ernie", replicas=4, max_workers=4),
        trainer("ernie", 0, "a"),
        trainer("ernie", 1, "a"),
    )
    cache = kube.cache()
    blind = Decision(
        "ml/ernie", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 2, 3, count=1
    )  # fmt: skip
    kube.actuator(cache).apply(blind, now())
    spec = kube.server.get("AITrainingJob", "ernie", NS)["spec"]["replicaSpecs"]["trainer"]
    assert spec["replicas"] == 4


def test_a_scale_out_the_server_cannot_check_now_waits_for_the_next_pass(kube: Kube) -> None:
    """The check is asked once: a 429 (Retry-After: 1) would hold the pass, and a notice that
    arrives meanwhile waits for it. The ScaleOut is not sent; the next pass sends it."""
    kube.server.seed(node("a"), *bert("a", "a"))
    cache = kube.cache()
    actuator = kube.actuator(cache)
    grow = Decision("ml/bert", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 2, 3, count=1)
    kube.server.fail_next(1, 429, path_contains="/pods?labelSelector", method="GET")
    started = time.monotonic()
    actuator.apply(grow, now())
    assert time.monotonic() - started < 1.0 and kube.objects("ScaleOut") == []
    actuator.apply(grow, now())
    [made] = kube.objects("ScaleOut")
    assert made["spec"]["toAdd"]["count"] == 1


def test_a_clamps_worker_in_a_notices_drain_needs_no_notice(kube: Kube) -> None:
    """Above max with a notice on a fresh view: one drain names the noticed worker and the
    clamp's; the clamp's node has no notice, and needs none. The drain waits for no read: node
    a's GET, begun for the ScaleIn to come (`read_ahead`), is still unanswered as it lands."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "b", "b", max_workers=1))
    cache = kube.cache()
    observer = kube.observer(cache)
    snap = observer.snapshot(now())
    assert snap.stale == frozenset() and cache.current(NODES, "a")
    [drain] = [d for d in decide(snap, kube.config.policy_set, now()) if d.action is Action.DRAIN]
    assert drain.nodes == ("a", "b") and len(drain.pods) == 2
    assert drain.for_notice == ("bert-worker-0",)  # the clamp's worker leaves for no notice
    drain_waits_for_no_node_read(kube, cache, drain)
    assert sorted(json.loads(drained(kube))) == sorted(drain.hosts)
    assert not kube.server.requests("GET", "/api/v1/nodes/b", watch=False)


@BOTH
def test_a_clamps_drain_counts_the_job_on_the_server(kube: Kube) -> None:
    """A clamp to max decided on a view that still counts a worker the server has deleted (a
    ghost: the view behind the server without knowing it). The drain hides only as many of the
    clamp's workers as the server's count is above the target: here none."""
    kube.server.seed(node("a"), node("b"), *bert("a", "b", "b", max_workers=2))
    cache = kube.cache()
    snap = kube.observer(cache).snapshot(now())
    [drain] = [d for d in decide(snap, kube.config.policy_set, now()) if d.action is Action.DRAIN]
    assert drain.reason is Reason.CLAMP_MAX and drain.to_workers == 2 and len(drain.pods) == 1
    kube.server.delete("Pod", "bert-worker-0", NS)  # the server is at max now
    kube.actuator(cache).apply(drain, now())
    assert drained(kube) == ""


@BOTH
def test_a_notice_withdrawn_after_the_decision_removes_and_drains_nobody(kube: Kube) -> None:
    """The chaos finding (long run, seed 8): a ScaleIn decided for a notice, checked again after
    a 429 when the view had seen the notice withdrawn. Its victims then passed for a clamp's, and
    the places the decision counted as leaving for the notice for room above its target: two
    healthy workers removed. Victims the decision named for a notice go only with that notice
    on the server, whatever the view says by then; drains too."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    snap = kube.observer(cache).snapshot(now())
    decided = {d.action: d for d in decide(snap, kube.config.policy_set, now())}
    drain, scale_in = decided[Action.DRAIN], decided[Action.SCALE_IN]
    assert scale_in.for_notice == scale_in.pods == ("bert-worker-0", "bert-worker-1")
    assert drain.for_notice == drain.pods
    kube.server.patch("Node", "a", {"spec": {"taints": []}})  # withdrawn
    wait_for(lambda: not kube.observer(cache).snapshot(now()).notices, 5, "the withdrawal")
    actuator = kube.actuator(cache)
    actuator.apply(drain, now())
    actuator.apply(scale_in, now())
    assert kube.objects("ScaleIn") == [] and drained(kube) == ""
