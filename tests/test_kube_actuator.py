"""Decisions carried out over real HTTP: ScaleOut/ScaleIn objects, drain annotations, Events,
CCE patches, dry run, restarts. The Reconciler drives observe -> decide -> act."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from kube_fixtures import (
    NS,
    Kube,
    ai_training_job,
    node,
    now,
    pod,
    scaler,
    trainer,
    training_job,
    worker,
)
from support.waiting import wait_for

from autoscaler.annotations import (
    DRAINED_ANNOTATION,
    NOTICE_ANNOTATION,
    decode_drained,
    decode_notice,
)
from autoscaler.core import Action, Decision, Notice, NoticeKind, Reason
from autoscaler.notice import ANNOTATION

BOTH = pytest.mark.servers("emulator", "real")  # Kubernetes-facing: pinned on both
NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-9", "effect": "NoSchedule"}


def actions(decisions: list[Decision]) -> list[tuple[str, Action]]:
    return [(d.job, d.action) for d in decisions if d.action is not Action.NOOP]


def reasons(decisions: list[Decision]) -> dict[str, Reason]:
    return {d.job: d.reason for d in decisions}


def bert_on(*placement: str | None, max_workers: int = 4, **job: object) -> list[dict]:
    return [training_job("bert", max_workers=max_workers, **job)] + [  # type: ignore[arg-type]
        worker("bert", i, where) for i, where in enumerate(placement)
    ]


@BOTH
def test_idle_gpus_appearing_make_exactly_one_scale_out(kube: Kube) -> None:
    kube.server.seed(node("a", 4), *bert_on("a", "a"), pod("batch", "a", 2, namespace="other"))
    cache = kube.cache()
    rec = kube.reconciler(cache)
    assert actions(rec.tick(now())) == []  # the node is full
    kube.server.delete("Pod", "batch", "other")  # two GPUs free up
    wait_for(lambda: any("Pod other/batch deleted" in w for w in kube.wakes), what="a wake")
    assert actions(rec.tick(now())) == [("ml/bert", Action.SCALE_OUT)]
    assert actions(rec.tick(now())) == []  # the new scaler is in flight: nothing more
    [out] = kube.objects("ScaleOut")
    assert out["spec"] == {"selector": {"name": "bert"}, "toAdd": {"count": 2}, "timeout": 90}
    assert out["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "spot-autoscaler"}
    assert out["metadata"]["name"].startswith("bert-out-")
    [event] = kube.events("ScaleOutCreated")
    about = event["involvedObject"]
    assert (about["kind"], about["name"], about["namespace"]) == ("TrainingJob", "bert", NS)
    assert "add 2 worker(s), 2->4, reason idle_capacity" in event["message"]
    assert rec.errors == 0


@BOTH
def test_a_noticed_node_drains_then_scales_in_exactly_its_pods(kube: Kube) -> None:
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert_on("a", "b", "a", max_workers=3))
    rec = kube.reconciler()
    assert actions(rec.tick(now())) == [("ml/bert", Action.DRAIN), ("ml/bert", Action.SCALE_IN)]
    job = kube.server.get("TrainingJob", "bert", NS)
    assert decode_drained(job["metadata"]["annotations"][DRAINED_ANNOTATION]) == {
        "bert-worker-0",
        "bert-worker-2",
    }
    [scale_in] = kube.objects("ScaleIn")
    assert scale_in["spec"] == {
        "selector": {"name": "bert"},
        "toDelete": {"podNames": ["bert-worker-0", "bert-worker-2"]},
    }
    assert [e["reason"] for e in kube.events()] == ["HostsDrained", "ScaleInCreated"]
    assert (
        "remove bert-worker-0, bert-worker-2, 3->1, reason preemption_notice"
        in kube.events("ScaleInCreated")[0]["message"]
    )
    assert actions(rec.tick(now())) == []  # the ScaleIn is in flight, the hosts already drained


@BOTH
def test_drained_hosts_come_back_when_the_notice_is_withdrawn(kube: Kube) -> None:
    drained = {"metadata": {"annotations": {DRAINED_ANNOTATION: json.dumps(["bert-worker-0"])}}}
    kube.server.seed(node("a"), node("b"), *bert_on("a", "b", max_workers=2))
    kube.server.patch("TrainingJob", "bert", drained, NS)
    assert actions(kube.reconciler().tick(now())) == [("ml/bert", Action.UNDRAIN)]
    annotations = kube.server.get("TrainingJob", "bert", NS)["metadata"].get("annotations", {})
    assert DRAINED_ANNOTATION not in annotations  # the last host shown again: annotation removed
    assert [e["reason"] for e in kube.events()] == ["HostsUndrained"]


def test_a_drain_of_hosts_already_drained_tells_no_pod_again(kube: Kube) -> None:
    """Two writers may decide the same drain (the responder's and a pass's view before it
    landed): the second changes nothing and sends no checkpoint signal (a list and a PATCH per
    worker, repeated, queued thousands at 2,000 nodes). A drain of a new host still tells."""
    kube.server.seed(node("a", taints=[NTH_ITN]), *bert_on("a", "a", max_workers=2))
    held = {"metadata": {"annotations": {DRAINED_ANNOTATION: json.dumps(["bert-worker-0"])}}}
    kube.server.patch("TrainingJob", "bert", held, NS)
    cache = kube.cache()
    actuator = kube.actuator(cache)
    again = Decision(
        "ml/bert", Action.DRAIN, Reason.PREEMPTION_NOTICE, "default", 2, 1, count=1,
        pods=("bert-worker-0",), hosts=("bert-worker-0",), nodes=("a",),
    )  # fmt: skip
    actuator.apply(again, now())
    actuator.apply(replace(again, pods=("bert-worker-1",), hosts=("bert-worker-1",)), now())

    def told(pod: str) -> dict[str, object]:
        notice = kube.server.get("Pod", pod, NS)["metadata"].get("annotations", {}).get(ANNOTATION)
        return json.loads(notice) if notice else {}

    for name in ("bert-worker-0", "bert-worker-1"):
        wait_for(lambda n=name: told(n).get("hosts") == ["bert-worker-1"], 5, f"{name} told")
    assert len(kube.server.requests("PATCH", f"/namespaces/{NS}/pods/")) == 2  # the new drain's
    assert len(kube.server.requests("GET", f"/namespaces/{NS}/pods", watch=False)) == 1


@BOTH
def test_a_scaler_in_flight_blocks_any_new_one(kube: Kube) -> None:
    kube.server.seed(node("a"), *bert_on("a"), scaler("ScaleOut", "bert-manual", "bert"))
    decisions = kube.reconciler().tick(now())
    assert reasons(decisions) == {"ml/bert": Reason.SCALER_IN_FLIGHT}
    assert [s["metadata"]["name"] for s in kube.objects("ScaleOut")] == ["bert-manual"]


@BOTH
def test_a_failed_scale_out_backs_off_then_retries_under_a_new_name(kube: Kube) -> None:
    a_minute_ago = now() - timedelta(minutes=1)
    failed = scaler("ScaleOut", "bert-out-old", "bert", outcome="ScaleFailed", at=a_minute_ago)
    kube.server.seed(node("a"), *bert_on("a"), failed)
    rec = kube.reconciler()
    assert reasons(rec.tick(now())) == {"ml/bert": Reason.BACKOFF}
    assert len(kube.objects("ScaleOut")) == 1
    # past the policy's 10 minute back-off the same need is met by a scaler with a fresh name
    assert actions(rec.tick(now() + timedelta(minutes=11))) == [("ml/bert", Action.SCALE_OUT)]
    assert len(kube.objects("ScaleOut")) == 2


@BOTH
def test_a_restart_mid_scale_creates_no_second_scaler(kube: Kube) -> None:
    kube.server.seed(node("a"), *bert_on("a"))
    first = kube.cache()
    assert actions(kube.reconciler(first).tick(now())) == [("ml/bert", Action.SCALE_OUT)]
    first.stop()  # the daemon dies; a new one starts with new cache, observer and actuator
    decisions = kube.reconciler().tick(now())
    assert reasons(decisions) == {"ml/bert": Reason.SCALER_IN_FLIGHT}
    assert len(kube.objects("ScaleOut")) == 1


def test_the_same_decision_twice_gets_the_same_name_and_one_object(kube: Kube) -> None:
    """A pass whose cache has not seen the scaler yet: 409 AlreadyExists counts as done."""
    kube.server.seed(node("a"), *bert_on("a"))
    stale = kube.cache()
    stale.stop()  # frozen view: it will never see the scaler below
    decision = next(d for d in kube.reconciler().tick(now()) if d.action is Action.SCALE_OUT)
    kube.actuator(stale).apply(decision, now())
    assert len(kube.objects("ScaleOut")) == 1
    assert len(kube.events("ScaleOutCreated")) == 1
    assert kube.server.count("POST", "scaleouts") == 2  # the second create answered 409


@BOTH
def test_the_actuator_refuses_what_the_operator_would_not_run(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        training_job("busy", phase="Scaling"),
        worker("busy", 0, "a"),
        training_job("queued"),
        scaler("ScaleIn", "queued-in", "queued"),
    )
    actuator = kube.actuator(kube.cache())
    for job in ("busy", "queued"):
        actuator.apply(
            Decision(f"ml/{job}", Action.SCALE_OUT, Reason.IDLE_CAPACITY, "default", 1, 2, count=1),
            now(),
        )
    unknown = Decision(
        "ml/busy",
        Action.SCALE_IN,
        Reason.PREEMPTION_NOTICE,
        "default",
        1,
        0,
        count=1,
        pods=("no-such-pod",),
    )
    actuator.apply(unknown, now())  # never a ScaleIn for pods that do not exist
    assert kube.objects("ScaleOut") == []
    assert [s["metadata"]["name"] for s in kube.objects("ScaleIn")] == ["queued-in"]


def test_transient_api_errors_are_retried_and_lasting_ones_reach_the_reconciler(kube: Kube) -> None:
    kube.server.seed(node("a"), *bert_on("a"))
    rec = kube.reconciler()
    kube.server.fail_next(2, 503, path_contains="scaleouts", method="POST")
    assert actions(rec.tick(now())) == [("ml/bert", Action.SCALE_OUT)]
    assert rec.errors == 0 and len(kube.objects("ScaleOut")) == 1

    kube.server.seed(node("b", taints=[NTH_ITN]), worker("bert", 9, "b"))
    wait_for(lambda: any("bert-worker-9" in w for w in kube.wakes), what="the new worker")
    # its node comes on another watch: without its taint in the view there is nothing to drain
    wait_for(lambda: any("Node b added" in w for w in kube.wakes), what="the noticed node")
    kube.server.fail_next(1, 403, path_contains="trainingjobs/bert", method="PATCH")
    rec.tick(now())
    assert rec.errors == 1  # the drain failed for good: logged, retried by the next pass
    rec.tick(now())
    assert rec.errors == 1
    annotations = kube.server.get("TrainingJob", "bert", NS)["metadata"].get("annotations", {})
    assert decode_drained(annotations[DRAINED_ANNOTATION]) == {"bert-worker-9"}


def test_dry_run_writes_nothing(kube: Kube) -> None:
    kube.server.seed(node("a", taints=[NTH_ITN]), node("b"), *bert_on("a", "b"))
    decisions = kube.reconciler(dry_run=True).tick(now())
    assert actions(decisions) == [("ml/bert", Action.DRAIN), ("ml/bert", Action.SCALE_IN)]
    assert [r.method for r in kube.server.requests() if r.method != "GET"] == []


def test_cce_jobs_scale_by_patching_trainer_replicas(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        node("b"),
        ai_training_job("ernie", replicas=2, max_workers=4),
        trainer("ernie", 0, "a"),
        trainer("ernie", 1, "b"),
    )
    rec = kube.reconciler()
    assert actions(rec.tick(now())) == [("ml/ernie", Action.SCALE_OUT)]
    trainer_spec = kube.server.get("AITrainingJob", "ernie", NS)["spec"]["replicaSpecs"]["trainer"]
    assert trainer_spec["replicas"] == 4 and "scaleInpods" not in trainer_spec
    rec.tick(now())  # the operator has not acted yet: the same patch is not sent again
    assert kube.server.count("PATCH", "aitrainingjobs") == 1
    assert len(kube.events("ScaleOutRequested")) == 1

    kube.server.patch("Node", "b", {"spec": {"taints": [NTH_ITN]}})
    wait_for(lambda: any("Node b changed" in w for w in kube.wakes), what="the taint")
    assert actions(rec.tick(now())) == [("ml/ernie", Action.DRAIN), ("ml/ernie", Action.SCALE_IN)]
    trainer_spec = kube.server.get("AITrainingJob", "ernie", NS)["spec"]["replicaSpecs"]["trainer"]
    assert trainer_spec["replicas"] == 1 and trainer_spec["scaleInpods"] == ["ernie-trainer-1"]
    assert [e["reason"] for e in kube.events()][-2:] == ["HostsDrained", "ScaleInRequested"]


@BOTH
def test_cloud_notices_persist_on_the_node(kube: Kube) -> None:
    kube.server.seed(node("a"))
    actuator = kube.actuator(kube.cache())
    hard = Notice(
        "a",
        NoticeKind.INTERRUPTION,
        "aws-sqs",
        "m-1",
        deadline=now() + timedelta(minutes=2),
        received_at=now(),
    )
    soft = Notice("a", NoticeKind.REBALANCE, "aws-sqs", "m-2", received_at=now())
    assert actuator.persist_notice("a", hard) is True
    assert actuator.persist_notice("a", hard) is False  # already there
    assert actuator.persist_notice("a", soft) is False  # never softens a harder notice
    assert actuator.persist_notice("gone", hard) is False
    held = kube.server.get("Node", "a")["metadata"]["annotations"][NOTICE_ANNOTATION]
    assert decode_notice("a", held) == hard
    [event] = kube.events("PreemptionNotice")
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"


@pytest.mark.parametrize("kube", [{"namespaces": [NS]}], indirect=True)
@BOTH
def test_namespaced_watches_drive_the_same_flow(kube: Kube) -> None:
    kube.server.seed(node("a"), *bert_on("a"), training_job("bert", namespace="other"))
    assert actions(kube.reconciler().tick(now())) == [("ml/bert", Action.SCALE_OUT)]
    assert [o["metadata"]["namespace"] for o in kube.server.objects("ScaleOut")] == [NS]


def test_a_warning_about_the_daemon_itself_lands_on_its_own_pod(
    kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoscaler.adapters.kube import EventRecorder

    kube.server.seed(pod("spot-autoscaler-0", "a", 0, namespace="ops"))
    recorder = EventRecorder(kube.server.api_client(), host="spot-autoscaler-0")
    monkeypatch.setenv("POD_NAME", "spot-autoscaler-0")
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    recorder.about_self("ConfigRejected", "config.yaml:3: bad", now())
    assert recorder.flush(5)
    uid = kube.server.get("Pod", "spot-autoscaler-0", "ops")["metadata"]["uid"]
    [event] = [e for e in kube.server.objects("events") if e["reason"] == "ConfigRejected"]
    # kubectl describe pod finds Events by the pod's kind, name, namespace and uid
    assert (event["metadata"]["namespace"], event["type"]) == ("ops", "Warning")
    assert {k: event["involvedObject"][k] for k in ("kind", "name", "namespace", "uid")} == {
        "kind": "Pod",
        "name": "spot-autoscaler-0",
        "namespace": "ops",
        "uid": uid,
    }

    monkeypatch.delenv("POD_NAME")  # outside a pod: nothing to attach it to, nothing sent
    recorder.about_self("ConfigRejected", "again", now())
    assert recorder.flush(5)
    assert len([e for e in kube.server.objects("events") if e["reason"] == "ConfigRejected"]) == 1
