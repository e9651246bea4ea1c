"""The Kubernetes adapter against the states et-operator and CCE leave behind, seeded in the API
emulator and read over real HTTP. No operator runs here, neither the real ones nor the
et-operator stand-in (support/et_operator.py: test_et_operator_scenarios.py); each seeded state
follows the operators' source:

et-operator (AliyunContainerService/et-operator, pkg/controllers): a ScaleIn whose named pods are
all gone deletes EVERY worker (scalein.go `setsSaleInToDelete` + worker.go `DeleteWorkerPods`);
a deleted scaler just ends (scaler.go `executeScaling`); a ScaleIn can wait forever on the
launcher's `ps` (scalein.go `checkWorkerShutdown`); new workers are named from the highest index
in status.targetWorkers (scaleout.go `setScaleOutWorkers`). CCE never clears `scaleInpods`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from kube_fixtures import (
    NS,
    Kube,
    ai_training_job,
    node,
    now,
    scaler,
    trainer,
    training_job,
    worker,
)
from kubernetes import client

from autoscaler.adapters.kube.kinds.et_operator import scaler_name, with_unseen
from autoscaler.adapters.kube.kinds.et_operator_scalers import ScalerFacts
from autoscaler.annotations import ASSIGNED_ANNOTATION
from autoscaler.core import Action, Reason, ScalerKind, Worker

NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-9", "effect": "NoSchedule"}
OURS = {"app.kubernetes.io/managed-by": "spot-autoscaler"}


def _evict_slowly(kube: Kube, *pods: str) -> None:
    """Delete pods the way NTH's drain does (graceful): they stay Terminating, since this
    kubelet never finishes them."""
    kube.server.kubelet_delay = None
    core = client.CoreV1Api(kube.server.api_client())
    for pod in pods:
        core.delete_namespaced_pod(pod, NS, grace_period_seconds=30)


def _ours(obj: dict, pods_frozen: list[str] | None = None) -> dict:
    obj["metadata"]["labels"] = dict(OURS)
    if pods_frozen is not None:
        obj["status"]["toDeletePods"] = pods_frozen
    return obj


def _our_finished_scale_in(at: datetime) -> dict:
    """Our ScaleIn bert-in-1 of bert-worker-0, succeeded AT, with the pods its status froze."""
    return _ours(
        scaler(
            "ScaleIn", "bert-in-1", "bert", pods=["bert-worker-0"], outcome="ScaleSucceeded", at=at
        ),
        pods_frozen=["bert-worker-0"],
    )


def _bert_with_a_notice_on_a(kube: Kube, *more: dict) -> None:
    """bert's worker-0 on node a (an NTH interruption taint), worker-1 on b; and `more`."""
    kube.server.seed(
        node("a", taints=[NTH_ITN]),
        node("b"),
        training_job("bert"),
        worker("bert", 0, "a"),
        worker("bert", 1, "b"),
        *more,
    )


def test_no_scale_in_names_a_pod_that_is_already_terminating(kube: Kube) -> None:
    # NTH evicted bert-worker-0 (Terminating for its grace period) before we saw the taint
    _bert_with_a_notice_on_a(kube)
    _evict_slowly(kube, "bert-worker-0")
    assert kube.server.get("Pod", "bert-worker-0", NS)["metadata"]["deletionTimestamp"]
    decisions = kube.reconciler().tick(now())
    assert [d.action for d in decisions if d.action is not Action.NOOP] == [Action.DRAIN]
    assert kube.objects("ScaleIn") == []


def test_our_unstarted_scale_in_whose_pods_vanished_is_deleted_before_the_operator_runs_it(
    kube: Kube,
) -> None:
    doomed = _ours(scaler("ScaleIn", "bert-in-1", "bert", pods=["bert-worker-0"], at=now()))
    kube.server.seed(node("b"), training_job("bert"), worker("bert", 1, "b"), doomed)
    rec = kube.reconciler()
    decisions = rec.tick(now())
    [cancel] = [d for d in decisions if d.action is Action.CANCEL]
    assert cancel.reason is Reason.VICTIMS_GONE and cancel.pods == ("bert-worker-0",)
    assert kube.objects("ScaleIn") == []
    [event] = kube.events("ScaleInCancelled")
    assert event["type"] == "Warning" and "bert-worker-0" in event["message"]
    assert rec.errors == 0
    assert not [d for d in rec.tick(now()) if d.action is Action.CANCEL]  # gone: nothing more


def test_a_started_or_foreign_scale_in_is_never_deleted(kube: Kube) -> None:
    started = _ours(
        scaler("ScaleIn", "bert-in-1", "bert", pods=["bert-worker-0"], at=now()),
        pods_frozen=["bert-worker-0"],
    )
    foreign = scaler("ScaleIn", "gpt-1700000000", "gpt", pods=["gpt-worker-0"], at=now())
    kube.server.seed(
        node("b"),
        training_job("bert"),
        worker("bert", 1, "b"),
        started,
        training_job("gpt"),
        worker("gpt", 1, "b"),
        foreign,
    )
    rec = kube.reconciler()
    assert not [d for d in rec.tick(now()) if d.action is Action.CANCEL]
    assert {s["metadata"]["name"] for s in kube.objects("ScaleIn")} == {
        "bert-in-1",
        "gpt-1700000000",
    }


def test_a_stuck_scaler_raises_one_warning_event_and_a_decision(kube: Kube) -> None:
    # et-operator waits for the launcher's `ps` to stop showing the victim: maybe forever
    old = scaler(
        "ScaleIn", "bert-in-1", "bert", pods=["bert-worker-1"], at=now() - timedelta(hours=1)
    )
    old["status"]["toDeletePods"] = ["bert-worker-1"]
    kube.server.seed(
        node("a"),
        training_job("bert", current_scaler=f"ScaleIn:{NS}/bert-in-1"),
        worker("bert", 0, "a"),
        worker("bert", 1, "a"),
        old,
    )
    rec = kube.reconciler()
    [decision] = rec.tick(now())
    assert (decision.action, decision.reason) == (Action.NOOP, Reason.SCALER_STUCK)
    assert "bert-in-1" in decision.message
    rec.tick(now())
    [event] = kube.events("ScalerStuck")  # once per episode, not once per pass
    assert event["type"] == "Warning" and "stuck-scalers" in event["message"]


def test_the_observer_reads_what_the_operator_and_the_sidecar_report(kube: Kube) -> None:
    job = training_job("bert", annotations={ASSIGNED_ANNOTATION: '["bert-worker-0"]'})
    # worker-5 died without a scaler: et-operator keeps it in targetWorkers, names the next 6
    job["status"]["targetWorkers"] = ["bert-worker-0", "bert-worker-1", "bert-worker-5"]
    kube.server.seed(node("a"), job, worker("bert", 0, "a"), worker("bert", 1, "a"))
    _evict_slowly(kube, "bert-worker-1")
    [snap_job] = kube.observer(kube.cache()).snapshot(now()).jobs
    assert snap_job.next_pod_names(1) == ("bert-worker-6",)
    assert snap_job.assigned_hosts == frozenset({"bert-worker-0"})
    assert [w.terminating for w in snap_job.workers] == [False, True]


def test_cce_jobs_in_cce_finished_phases_are_left_out(kube: Kube) -> None:
    kube.server.seed(
        node("a"),
        *(
            ai_training_job(f"j-{p.lower()}", phase=p)
            for p in ("Succeed", "Timeout", "Preempted", "NodeFail", "Running")
        ),
    )
    jobs = kube.observer(kube.cache()).snapshot(now()).jobs
    assert [j.name for j in jobs] == ["j-running"]


def test_cce_stale_scale_in_pods_are_cleared_on_scale_out(kube: Kube) -> None:
    job = ai_training_job("ernie", replicas=1)
    job["spec"]["replicaSpecs"]["trainer"]["scaleInpods"] = ["ernie-trainer-0"]  # never cleared
    kube.server.seed(node("a", 4), job, trainer("ernie", 1, "a"))
    decisions = kube.reconciler().tick(now())
    assert [d.action for d in decisions] == [Action.SCALE_OUT]
    patched = kube.server.get("AITrainingJob", "ernie", NS)["spec"]["replicaSpecs"]["trainer"]
    assert patched["replicas"] == 4 and "scaleInpods" not in patched


def test_a_pod_an_earlier_scale_in_of_ours_named_is_never_named_again(kube: Kube) -> None:
    # our ScaleIn finished (et-operator deleted worker-0) but the pod watch lags: naming it again
    # would make a ScaleIn whose pods are all gone, i.e. one that deletes every worker
    done = _our_finished_scale_in(now() + timedelta(seconds=5))
    _bert_with_a_notice_on_a(kube, done)
    kube.reconciler().tick(now())
    assert [s["metadata"]["name"] for s in kube.objects("ScaleIn")] == ["bert-in-1"]


def test_a_reused_pod_name_may_be_named_again(kube: Kube) -> None:
    # et-operator reuses indices: this worker-0 was created after our old ScaleIn for another
    old = _our_finished_scale_in(now() - timedelta(hours=1))
    _bert_with_a_notice_on_a(kube, old)
    kube.reconciler().tick(now())
    assert len(kube.objects("ScaleIn")) == 2


def test_already_exists_is_success_only_for_our_own_identical_scaler(kube: Kube) -> None:
    # a lost reply: our earlier create went through. But the same name holding something else
    # (not ours, or other pods) is no success: the pass reports the failure
    name = scaler_name("bert", "in", ["ScaleIn", "ml/bert", "bert-worker-0", ""])
    squatter = scaler(
        "ScaleIn", name, "gpt", pods=["gpt-worker-1"], outcome="ScaleSucceeded", at=now()
    )
    _bert_with_a_notice_on_a(kube, squatter)
    rec = kube.reconciler()
    rec.tick(now())
    assert rec.errors == 1 and len(kube.objects("ScaleIn")) == 1
    assert kube.objects("ScaleIn")[0]["spec"]["toDelete"]["podNames"] == ["gpt-worker-1"]


def test_pods_a_finished_scale_out_added_count_until_the_pod_watch_has_caught_up() -> None:
    # a cut pod watch: the ScaleOut is seen finished (rv 120) but the pod view is at rv 100;
    # counting only the pods seen would let the next pass scale out again, past max
    done = ScalerFacts(
        ScalerKind.SCALE_OUT,
        "bert-out-1",
        "ml/bert",
        now(),
        ("bert-worker-2", "bert-worker-3"),
        "ScaleSucceeded",
        now(),
        resource_version=120,
    )
    seen = (
        Worker("bert-worker-0", "a", "bert-worker-0", 0),
        Worker("bert-worker-2", "a", "bert-worker-2", 2),
    )
    lagging = with_unseen(seen, [done], pods_seen=100)
    assert [(w.pod, w.pending) for w in lagging[2:]] == [("bert-worker-3", True)]
    assert with_unseen(seen, [done], pods_seen=120) == seen  # caught up: trust the pods


def _done(kind: ScalerKind, name: str, pods: tuple[str, ...], rv: int, minute: int) -> ScalerFacts:
    at = now() + timedelta(minutes=minute)
    return ScalerFacts(kind, name, "ml/bert", at, pods, "ScaleSucceeded", at, resource_version=rv)


def test_a_finished_scale_in_ahead_of_the_pod_view_takes_its_pods_out_until_a_name_is_reused() -> (
    None
):
    """Expectations read from the scalers' own records, in the order they finished: a ScaleIn's
    victims leave the view; a later ScaleOut that got a freed index back adds that name again
    (et-operator reuses indices), whatever the lagging pod view still holds."""
    seen = tuple(Worker(f"bert-worker-{i}", "a", f"bert-worker-{i}", i) for i in range(3))
    scale_in = _done(ScalerKind.SCALE_IN, "bert-in-1", ("bert-worker-1", "bert-worker-2"), 110, 0)
    assert [w.pod for w in with_unseen(seen, [scale_in], pods_seen=100)] == ["bert-worker-0"]
    refill = _done(ScalerKind.SCALE_OUT, "bert-out-2", ("bert-worker-1",), 120, 1)
    lagging = with_unseen(seen, [refill, scale_in], pods_seen=100)
    assert [(w.pod, w.pending) for w in lagging] == [
        ("bert-worker-0", False),
        ("bert-worker-1", False),
    ]
    assert with_unseen(seen, [refill, scale_in], pods_seen=120) == seen  # caught up
