"""The watch cache survives what API servers do: dropped watches, 410 Gone, 5xx, restarts; and it
wakes the daemon for changes that matter, not for heartbeats. The tests marked BOTH run on the
real kube-apiserver too; the rest inject faults only the emulator can."""

from __future__ import annotations

import pytest
from kube_fixtures import (
    NS,
    Kube,
    node,
    now,
    pod,
    scaler,
    training_job,
)
from support.real_api import RealApi
from support.waiting import wait_for

from autoscaler.adapters.kube.eviction_guard import desired_guard
from autoscaler.adapters.kube.kinds.et_operator import SCALE_OUTS, TRAINING_JOBS
from autoscaler.adapters.kube.resources import NODES, PDBS, PODS

BOTH = pytest.mark.servers("emulator", "real")  # Kubernetes-facing: pinned on both


def names(k: Kube, cache, resource) -> set[str]:  # noqa: ANN001
    return {o["metadata"]["name"] for o in cache.items(resource)}


@BOTH
def test_lists_then_follows_changes(kube: Kube) -> None:
    kube.server.seed(node("a"), training_job("bert"))
    cache = kube.cache()
    assert cache.synced() and names(kube, cache, NODES) == {"a"}
    kube.server.seed(node("b"), scaler("ScaleOut", "bert-out-1", "bert"))
    kube.server.delete("Node", "a")
    wait_for(lambda: names(kube, cache, NODES) == {"b"}, what="node changes")
    wait_for(lambda: cache.get(SCALE_OUTS, f"{NS}/bert-out-1"), what="the scaler")


@BOTH
def test_terminated_pods_leave_the_cache(kube: Kube) -> None:
    kube.server.seed(node("a"), pod("p", "a"))
    cache = kube.cache()
    kube.server.patch("Pod", "p", {"status": {"phase": "Succeeded"}}, NS)
    wait_for(lambda: cache.items(PODS) == [], what="the finished pod to go")


def test_dropped_watches_resume_where_they_stopped(kube: Kube) -> None:
    cache = kube.cache()
    for abrupt in (True, False):
        kube.server.drop_watches(abrupt=abrupt)
        kube.server.seed(node(f"after-{abrupt}"))
        wait_for(lambda a=abrupt: f"after-{a}" in names(kube, cache, NODES), what="the later node")
    assert kube.server.count("GET", "nodes", watch=False) == 1  # one list, resumed, no re-list


def test_a_broken_watch_resumes_after_the_last_event_it_delivered(kube: Kube) -> None:
    """Not from where the watch began: the server would replay what came since, and a replayed
    event of an object deleted since brings it back until its deletion comes again (ghost pods
    a clamp counted, on a real kube-apiserver, draining healthy workers)."""
    cache = kube.cache()
    kube.server.seed(node("b"))
    kube.server.delete("Node", "b")
    wait_for(lambda: cache.seen_rv(NODES) >= kube.server.resource_version, what="b deleted")
    last = kube.server.resource_version
    kube.server.clear_requests()
    kube.server.drop_watches(abrupt=True)
    kube.server.wait_until(lambda: kube.server.count("GET", "/nodes", watch=True) >= 1)
    resumed = kube.server.requests("GET", "/nodes", watch=True)[0]
    assert int(resumed.query["resourceVersion"]) == last


def test_410_gone_relists_and_reports_what_changed_meanwhile(kube: Kube) -> None:
    kube.server.seed(node("a"), node("b"))
    cache = kube.cache()
    kube.server.wait_until(lambda: kube.server.watch_count >= 6)
    kube.server.latency = 0.2  # the re-watch arrives after the changes below
    kube.server.drop_watches()
    kube.server.seed(node("c"))
    kube.server.delete("Node", "a")
    kube.server.compact()  # the server forgets them: resuming from our resourceVersion is 410
    wait_for(lambda: names(kube, cache, NODES) == {"b", "c"}, what="the relist")
    assert kube.server.count("GET", "nodes", watch=False) >= 2  # listed again
    wait_for(lambda: any("Node a deleted" in w for w in kube.wakes), what="the relist's news")


def test_server_errors_back_off_and_recover(kube: Kube) -> None:
    cache = kube.cache()
    kube.server.fail_next(4, 500, path_contains="watch=")
    kube.server.drop_watches()
    kube.server.seed(training_job("late"))
    wait_for(lambda: cache.get(TRAINING_JOBS, f"{NS}/late"), what="the job after the errors")
    assert cache.errors() >= 1


def test_a_failing_initial_list_is_retried(kube: Kube) -> None:
    kube.server.seed(node("a"))
    kube.server.fail_next(2, 503, path_contains="/nodes")
    cache = kube.cache()
    assert names(kube, cache, NODES) == {"a"} and cache.errors() == 2


@BOTH
def test_wakes_for_notices_and_capacity_but_not_heartbeats(kube: Kube) -> None:
    kube.server.seed(node("a"), pod("p", "a", 2), pod("cpu", "a", 0))
    cache = kube.cache()
    real = isinstance(kube.server, RealApi)
    # the initial list is not news; on a real server the node lifecycle controller may still
    # taint the fresh node (not-ready) just after the list: real news, not this test's
    lifecycle = {"notice: Node a changed", "Node a changed"} if real else set()
    assert [w for w in kube.wakes if w not in lifecycle] == []
    ready = {"type": "Ready", "status": "True", "lastHeartbeatTime": "2020-01-01T00:00:00Z"}
    heartbeat = {"status": {"conditions": [ready]}}
    kube.server.patch("Node", "a", heartbeat)
    kube.server.patch("Pod", "cpu", {"metadata": {"labels": {"x": "y"}}}, NS)  # no GPUs: no news
    taint = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    kube.server.patch("Node", "a", {"spec": {"taints": [taint]}})
    kube.server.delete("Pod", "p", NS)
    job = training_job("bert")
    status = job.pop("status")  # created as a client does it: the operator writes status after
    kube.server.seed(job)
    kube.server.patch("TrainingJob", "bert", {"status": {**status, "phase": "Scaling"}}, NS)
    # our budgets are standing objects no decision reads: thousands are written at start-up
    kube.server.seed(desired_guard(kube.server.objects("TrainingJob", NS)[0], {"x": "y"}))
    wait_for(lambda: cache.get(PDBS, f"{NS}/bert-spot-guard"), what="the budget in the cache")
    wait_for(lambda: len(kube.wakes) >= 4, what="four wakes")
    # one thread per kind: order holds within a kind only; the heartbeat woke nothing (on a
    # real server a Node wake may also be the lifecycle controller's, so only that kind repeats)
    # (it lifts its not-ready taint: a plain wake, no notice)
    wakes = sorted(set(kube.wakes) - {"Node a changed"}) if real else sorted(kube.wakes)
    assert wakes == [
        f"Pod {NS}/p deleted",
        f"TrainingJob {NS}/bert added",
        f"TrainingJob {NS}/bert changed",
        "notice: Node a changed",  # a Node's change may be a notice: the loop's fast path
    ]


def test_only_a_node_change_that_may_bring_a_notice_goes_to_the_responder(kube: Kube) -> None:
    """A node's new taint is a notice wake (the responder answers it at once); its GPUs, a
    label, a node added untainted or a taint withdrawn wake the pass only."""
    kube.server.seed(node("a"))
    kube.cache()
    kube.server.patch("Node", "a", {"status": {"allocatable": {"nvidia.com/gpu": "4"}}})
    kube.server.patch("Node", "a", {"metadata": {"labels": {"team": "x"}}})
    kube.server.seed(node("b"))
    taint = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    kube.server.patch("Node", "a", {"spec": {"taints": [taint]}})
    kube.server.patch("Node", "a", {"spec": {"taints": []}})
    wait_for(lambda: len(kube.wakes) >= 5, what="five wakes")
    assert kube.wakes == [
        "Node a changed",
        "Node a changed",
        "Node b added",
        "notice: Node a changed",
        "Node a changed",
    ]


def test_stop_ends_every_watch_promptly(kube: Kube) -> None:
    cache = kube.cache()
    kube.server.wait_until(lambda: kube.server.watch_count >= 6)
    started = now()
    cache.stop(timeout=3)
    assert (now() - started).total_seconds() < 1.5
    kube.server.wait_until(lambda: kube.server.watch_count == 0, timeout=3)


def test_a_relist_keeps_what_it_holds_of_unchanged_objects(kube: Kube) -> None:
    kube.server.seed(node("a"), node("b"))
    cache = kube.cache()
    held_b = cache.get(NODES, "b")
    kube.server.wait_until(lambda: kube.server.watch_count >= 6)
    kube.server.latency = 0.2  # the re-watch arrives after the changes below
    kube.server.drop_watches()
    kube.server.patch("Node", "a", {"metadata": {"labels": {"x": "y"}}})
    kube.server.compact()  # resuming is 410 Gone: listed again
    wait_for(lambda: kube.server.count("GET", "nodes", watch=False) >= 2, what="the relist")
    wait_for(
        lambda: (cache.get(NODES, "a") or {})["metadata"]["labels"].get("x") == "y",
        what="the changed node",
    )
    # the same dict: no second copy of an unchanged cluster, nothing for readers to derive again
    assert cache.get(NODES, "b") is held_b
