"""A view behind the server never removes a healthy worker (issue 26), over real HTTP against
the API emulator: its fault injection is what keeps a watch from reopening on demand.

The cache knows which kinds are behind (a broken watch until the next one opens, a re-list), the
core holds what can wait (core/freshness.py), and a removal asks the server first
(adapters/kube/confirm.py)."""

from __future__ import annotations

import pytest
from kube_fixtures import NS, Kube, node, now, scaler, training_job, worker
from support.waiting import wait_for

from autoscaler.adapters.kube.kinds.et_operator import SCALE_INS
from autoscaler.adapters.kube.resources import NODES, PODS
from autoscaler.annotations import DRAINED_ANNOTATION
from autoscaler.core import Action, Decision, Reason

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
    nodes=("a",),
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


def test_a_scale_in_that_outlives_its_check_is_checked_again_and_sent_once(kube: Kube) -> None:
    """Three 500s on the create take it past CONFIRMED_FOR (retries at 0.2, 0.6 and 1.4 s): it
    is not sent on that check; the victims are checked again and the ScaleIn goes out in the same
    apply, not a back-off later."""
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert("a", "a", "b"))
    cache = kube.cache()
    kube.server.fail_next(3, 500, path_contains="/scaleins", method="POST")
    kube.server.clear_requests()
    kube.actuator(cache).apply(NOTICE_ON_A, now())
    [made] = kube.objects("ScaleIn")
    assert made["spec"]["toDelete"]["podNames"] == ["bert-worker-0", "bert-worker-1"]
    checks = kube.server.requests("GET", f"/namespaces/{NS}/pods/bert-worker-0", watch=False)
    assert len(checks) == 2
    assert len(kube.server.requests("POST", "/scaleins")) == 4  # three refused, one made


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
