"""Karpenter's do-not-disrupt on protected workers, kept by the reconciler's standing-object pass
(adapters/kube/shield.py): added where missing, removed only where we added it."""

from __future__ import annotations

import pytest
from kube_fixtures import NS, Kube, node, now, training_job, worker
from support.waiting import wait_for

from autoscaler.adapters.kube.resources import NODES, PODS, annotations_of, labels_of
from autoscaler.annotations import DO_NOT_DISRUPT, SHIELD_MARK


def notes(kube: Kube, pod: str) -> dict[str, str]:
    [found] = [p for p in kube.server.objects("Pod", NS) if p["metadata"]["name"] == pod]
    return found["metadata"].get("annotations") or {}


SHIELDED = {DO_NOT_DISRUPT: "true", SHIELD_MARK: "true"}  # what our PATCH leaves on a worker


@pytest.mark.servers("emulator", "real")
def test_running_workers_are_shielded_while_managed_and_only_our_annotation_goes(
    kube: Kube,
) -> None:
    own = worker("gpt", 0, "a")
    own["metadata"]["annotations"] = {DO_NOT_DISRUPT: "true"}  # the job's template asks for it
    kube.server.seed(
        node("a", labels={"karpenter.sh/nodepool": "spot"}),  # launched by Karpenter
        node("b"),
        training_job("bert"),
        worker("bert", 0, "a"),
        worker("bert", 1, None, phase="Pending"),
        worker("bert", 2, "b"),
        training_job("gpt"),
        own,
    )
    rec = kube.reconciler()
    rec.tick(now())
    assert notes(kube, "bert-worker-0") == SHIELDED
    assert notes(kube, "bert-worker-1") == {}  # on no node yet: nothing to consolidate
    assert notes(kube, "bert-worker-2") == {}  # a node Karpenter does not manage: no PATCH
    assert notes(kube, "gpt-worker-0") == {DO_NOT_DISRUPT: "true"}  # already: left as it is
    for job in ("bert", "gpt"):  # no longer managed: ours goes, the job's own stays
        kube.server.patch("TrainingJob", job, {"status": {"phase": "Succeeded"}}, NS)
    wait_for(lambda: rec.tick(now()) is not None and notes(kube, "bert-worker-0") == {})
    assert notes(kube, "gpt-worker-0") == {DO_NOT_DISRUPT: "true"}


@pytest.mark.servers("emulator", "real")
def test_a_node_karpenter_takes_over_and_an_annotation_taken_off_are_seen_by_the_next_pass(
    kube: Kube,
) -> None:
    """Between full rescans (every RESCAN_EVERY passes) the shield follows what changed: a
    node's label and a pod's annotations, each seen by the very next pass."""
    kube.server.seed(node("a"), training_job("bert"), worker("bert", 0, "a"))
    cache = kube.cache()
    rec = kube.reconciler(cache)
    rec.tick(now())  # the first pass rescans
    assert notes(kube, "bert-worker-0") == {}  # not Karpenter's node
    kube.server.patch("Node", "a", {"metadata": {"labels": {"karpenter.sh/nodepool": "spot"}}})
    wait_for(lambda: "karpenter.sh/nodepool" in labels_of(cache.get(NODES, "a") or {}))
    rec.tick(now())
    assert notes(kube, "bert-worker-0") == SHIELDED
    # the view must have our write before the removal, or an empty view is only a stale one
    wait_for(lambda: annotations_of(cache.get(PODS, f"{NS}/bert-worker-0") or {}) == SHIELDED)
    gone = {DO_NOT_DISRUPT: None, SHIELD_MARK: None}  # someone took it off
    kube.server.patch("Pod", "bert-worker-0", {"metadata": {"annotations": gone}}, NS)
    wait_for(lambda: not annotations_of(cache.get(PODS, f"{NS}/bert-worker-0") or {}))
    rec.tick(now())
    assert notes(kube, "bert-worker-0") == SHIELDED
