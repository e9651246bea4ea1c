"""One malformed object never stops the rest: it is skipped, logged and counted once per version,
and told once as a Warning Event; every other job goes on in the same pass."""

from __future__ import annotations

from kube_fixtures import (
    Kube,
    node,
    now,
    training_job,
    worker,
)
from support.waiting import wait_for

from autoscaler.annotations import NOTICE_ANNOTATION, decode_notice
from autoscaler.core import Action, Notice, NoticeKind

NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-9", "effect": "NoSchedule"}


def test_a_malformed_job_is_skipped_and_the_others_are_drained_in_the_same_pass(
    kube: Kube,
) -> None:
    broken = training_job("broken")
    broken["spec"]["etReplicaSpecs"] = [{"worker": {"replicas": 2}}]  # a list, not a map
    kube.server.seed(
        node("a", taints=[NTH_ITN]),
        node("b"),
        broken,
        worker("broken", 0, "a"),
        training_job("bert"),
        worker("bert", 0, "a"),
        worker("bert", 1, "b"),
    )
    rec = kube.reconciler()
    decisions = rec.tick(now())
    assert {(d.job, d.action) for d in decisions if d.action is not Action.NOOP} == {
        ("ml/bert", Action.DRAIN),
        ("ml/bert", Action.SCALE_IN),
    }
    rec.tick(now())
    assert kube.rejections.counts() == {("TrainingJob", "AttributeError"): 1}  # once a version
    [event] = kube.events("ObjectRejected")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "broken"
    assert rec.errors == 0
    kube.server.seed(training_job("broken"))  # a new version that reads fine: the job is back
    wait_for(
        lambda: "ml/broken" in {j.key for j in rec.observer.snapshot(now()).jobs},
        what="the fixed job in the snapshot",
    )


def test_an_unreadable_notice_annotation_is_rejected_but_the_node_still_counts(kube: Kube) -> None:
    kube.server.seed(node("a", annotations={NOTICE_ANNOTATION: "{not json"}))
    snap = kube.observer(kube.cache()).snapshot(now())
    assert [n.name for n in snap.nodes] == ["a"] and snap.notices == ()
    assert kube.rejections.counts() == {("Node", "bad_notice_annotation"): 1}


def test_a_notice_time_without_zone_is_utc_not_a_crash() -> None:
    value = '{"kind": "interruption", "id": "x", "deadline": "2026-03-02T12:02:00"}'
    notice = decode_notice("a", value)
    assert isinstance(notice, Notice) and notice.kind is NoticeKind.INTERRUPTION
    assert notice.deadline is not None and notice.deadline.utcoffset() is not None
    assert decode_notice("a", '{"kind": "interruption", "deadline": "tomorrow"}') is None
