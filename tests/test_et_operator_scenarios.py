"""The daemon's Kubernetes adapter against a stand-in et-operator that does what the real one
does (tests/support/et_operator.py, each behaviour cited from et-operator's source), including
deleting every worker for a ScaleIn whose pods are gone, and waiting on `ps` forever."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from kube_fixtures import (
    NS,
    Kube,
    node,
    now,
    pod,
    training_job,
    worker,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.et_operator import SSH_ATTACH, EtOperator
from support.eviction import evict
from support.waiting import wait_for

from autoscaler.adapters.kube.kinds.et_operator import SCALE_INS
from autoscaler.core import Action, Reason
from autoscaler.core.policy import POLICY_LABEL

NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-9", "effect": "NoSchedule"}


def launcher(job: str, node_name: str) -> dict:
    """The launcher pod et-operator runs horovodrun in: its exec target (no launcher, no
    hostfile writes and no `ps` wait: launcher.go executeOnLauncher)."""
    labels = {
        "group-name": "kai.alibabacloud.com",
        "training-job-name": job,
        "training-job-role": "launcher",
    }
    return pod(f"{job}-launcher", node_name, 0, labels=labels)


def seeded(kube: Kube, tmp_path: Path) -> EtOperator:
    kube.server.seed(
        node("a", taints=[NTH_ITN]),
        node("b"),
        node("c"),
        training_job("bert", replicas=3),
        launcher("bert", "b"),
        worker("bert", 0, "a"),
        worker("bert", 1, "b"),
        worker("bert", 2, "c"),
    )
    operator = EtOperator(kube.server, NS, tmp_path / "hostfile")
    operator.step()  # the job Running, its three workers current
    return operator


def pods(kube: Kube) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in kube.server.objects("Pod", NS)
        if p["metadata"]["labels"].get("training-job-role") == "worker"
    )


def test_the_stand_in_deletes_every_worker_for_a_scale_in_whose_pods_are_gone(
    kube: Kube, tmp_path: Path
) -> None:
    # what the daemon must never let happen (scalein.go setsSaleInToDelete + DeleteWorkerPods)
    operator = seeded(kube, tmp_path)
    kube.server.seed(
        {
            "apiVersion": "kai.alibabacloud.com/v1alpha1",
            "kind": "ScaleIn",
            "metadata": {"name": "by-hand", "namespace": NS},
            "spec": {"selector": {"name": "bert"}, "toDelete": {"podNames": ["bert-worker-9"]}},
        }
    )
    operator.step()
    assert pods(kube) == []


def test_a_scale_in_whose_pods_vanished_first_is_cancelled_and_the_job_survives(
    kube: Kube, tmp_path: Path
) -> None:
    operator = seeded(kube, tmp_path)
    cache = kube.cache()
    rec = kube.reconciler(cache)
    assert [d.action for d in rec.tick(now()) if d.action is not Action.NOOP] == [
        Action.DRAIN,
        Action.SCALE_IN,
    ]
    # the node dies and takes worker-0 with it before et-operator gets to our ScaleIn
    kube.server.delete("Pod", "bert-worker-0", NS)
    wait_for(lambda: any("bert-worker-0 deleted" in w for w in kube.wakes), what="the pod gone")
    cancel = [d for d in rec.tick(now()) if d.action is Action.CANCEL]
    assert [d.reason for d in cancel] == [Reason.VICTIMS_GONE]
    operator.step()
    assert pods(kube) == ["bert-worker-1", "bert-worker-2"]  # not every worker
    assert kube.server.objects("ScaleIn", NS) == []


def test_a_scale_in_the_operator_is_running_is_not_cancelled_when_its_victim_goes(
    kube: Kube, tmp_path: Path
) -> None:
    """et-operator takes our ScaleIn up (its Scaling condition), deletes the victim with grace 0,
    and writes status.toDeletePods only after (scaler.go `executeScaling`, a deferred status
    update): a pass in between sees the victim gone and the ScaleIn not started. It is left to
    the operator; one still not started seconds after its pickup is cancelled."""
    seeded(kube, tmp_path)
    cache = kube.cache()
    rec = kube.reconciler(cache)
    rec.tick(now())
    [scale_in] = kube.server.objects("ScaleIn", NS)
    name = scale_in["metadata"]["name"]
    taken = now().replace(microsecond=0)
    scaling = {
        "type": "Scaling",
        "status": "True",
        "reason": "ScaleInScaling",
        "lastUpdateTime": taken.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTransitionTime": taken.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    kube.server.patch("ScaleIn", name, {"status": {"conditions": [scaling]}}, NS)
    kube.server.delete("Pod", "bert-worker-0", NS)  # the operator's DeleteWorkerPods
    wait_for(lambda: any("bert-worker-0 deleted" in w for w in kube.wakes), what="the pod gone")
    wait_for(lambda: (cache.get(SCALE_INS, f"{NS}/{name}") or {}).get("status"), what="the pickup")
    assert not [d for d in rec.tick(now()) if d.action is Action.CANCEL]
    assert [s["metadata"]["name"] for s in kube.server.objects("ScaleIn", NS)] == [name]
    late = [d for d in rec.tick(taken + timedelta(seconds=6)) if d.action is Action.CANCEL]
    assert [d.reason for d in late] == [Reason.VICTIMS_GONE]
    assert kube.server.objects("ScaleIn", NS) == []


def test_evictions_wait_for_the_daemon_which_removes_the_worker_by_name(
    kube: Kube, tmp_path: Path
) -> None:
    operator = seeded(kube, tmp_path)
    for name in ("bert-worker-0", "bert-worker-1", "bert-worker-2"):  # Ready, as the kubelet says
        kube.server.patch(
            "Pod", name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, NS
        )
    rec = kube.reconciler()
    rec.tick(now())  # the guard budget is kept from the first pass
    [budget] = kube.server.objects("PodDisruptionBudget", NS)
    assert budget["spec"]["maxUnavailable"] == 0
    # NTH's drain (kubectl's drain helper) evicts: the budget makes it wait
    core = client.CoreV1Api(kube.server.api_client())
    with pytest.raises(ApiException) as err:
        evict(core, "bert-worker-0", NS)
    assert err.value.status == 429
    operator.step()  # et-operator runs our ScaleIn: the pod goes by name, gracefully drained
    assert pods(kube) == ["bert-worker-1", "bert-worker-2"]
    hostfile = (tmp_path / "hostfile").read_text()
    assert hostfile == "bert-worker-1:1\nbert-worker-2:1\n\n"  # echo '...' adds a newline


def test_missing_budgets_are_written_a_few_per_pass(kube: Kube) -> None:
    # at start-up every job lacks its budget: one pass writing them all (2,000 jobs: 70 s
    # against the emulator in benchmarks/reaction.py) held the first notices' drains behind it
    kube.server.seed(node("a"), *(training_job(f"job{i}") for i in range(12)))
    rec = kube.reconciler()
    written = []
    for _ in range(3):
        rec.tick(now())
        written.append((len(kube.server.objects("PodDisruptionBudget", NS)), rec.kept))
    assert written == [(5, False), (10, False), (12, True)]


def test_a_budget_goes_when_its_job_is_no_longer_guarded(kube: Kube) -> None:
    kube.server.seed(node("a"), training_job("bert"), training_job("gpt"))
    rec = kube.reconciler()
    rec.tick(now())
    rec.tick(now())  # nothing changed: the budgets are not looked at again
    budgets = kube.server.objects("PodDisruptionBudget", NS)
    assert sorted(b["metadata"]["name"] for b in budgets) == ["bert-spot-guard", "gpt-spot-guard"]
    kube.server.patch("TrainingJob", "gpt", {"status": {"phase": "Succeeded"}}, NS)
    wait_for(
        lambda: (
            rec.tick(now()) is not None and len(kube.server.objects("PodDisruptionBudget", NS)) == 1
        )
    )
    [left] = kube.server.objects("PodDisruptionBudget", NS)
    assert left["metadata"]["name"] == "bert-spot-guard"


def test_the_fast_path_drains_and_scales_in_and_the_full_pass_adds_no_second_scaler(
    kube: Kube, tmp_path: Path
) -> None:
    seeded(kube, tmp_path)  # node a carries NTH's spot-itn taint
    rec = kube.reconciler()
    fast = rec.react(now())
    assert [(d.action, d.pods) for d in fast] == [
        (Action.DRAIN, ("bert-worker-0",)),
        (Action.SCALE_IN, ("bert-worker-0",)),
    ]
    full = rec.tick(now())
    assert not [d for d in full if d.action in (Action.DRAIN, Action.SCALE_IN)]
    assert len(kube.server.objects("ScaleIn", NS)) == 1


def test_a_scale_in_stuck_on_the_launchers_ps_is_reported(kube: Kube, tmp_path: Path) -> None:
    operator = seeded(kube, tmp_path)
    operator.has_ps = False  # the launcher image has no `ps`: the ScaleIn waits forever
    rec = kube.reconciler()
    rec.tick(now())
    operator.step()
    operator.step()
    assert pods(kube) == ["bert-worker-0", "bert-worker-1", "bert-worker-2"]
    later = now() + timedelta(minutes=20)
    stuck = [d for d in rec.tick(later) if d.reason is Reason.SCALER_STUCK]
    assert stuck and "ScaleIn" in stuck[0].message
    assert kube.events("ScalerStuck")


def test_the_ps_wait_matches_substrings(kube: Kube, tmp_path: Path) -> None:
    # a process for worker-10 holds back the ScaleIn of worker-1 (strings.Contains)
    operator = seeded(kube, tmp_path)
    operator.processes = [f"root 42 1 0 {SSH_ATTACH} bert-worker-10 python train.py"]
    kube.server.seed(
        {
            "apiVersion": "kai.alibabacloud.com/v1alpha1",
            "kind": "ScaleIn",
            "metadata": {"name": "by-hand", "namespace": NS},
            "spec": {"selector": {"name": "bert"}, "toDelete": {"podNames": ["bert-worker-1"]}},
        }
    )
    operator.step()
    assert "bert-worker-1" in pods(kube)
    operator.processes = []
    operator.step()
    assert "bert-worker-1" not in pods(kube)


def test_new_worker_names_are_predicted_as_et_operator_makes_them(
    kube: Kube, tmp_path: Path
) -> None:
    operator = seeded(kube, tmp_path)
    kube.server.delete("Pod", "bert-worker-2", NS)  # lost without a scaler (restartPolicy Never)
    operator.step()  # stays in targetWorkers
    kube.server.patch("Node", "a", {"spec": {"taints": []}})
    cache = kube.cache()
    [job] = kube.observer(cache).snapshot(now()).jobs
    predicted = job.next_pod_names(2)
    rec = kube.reconciler(cache)
    assert [d.action for d in rec.tick(now()) if d.action is not Action.NOOP] == [Action.SCALE_OUT]
    operator.step()
    [out] = kube.server.objects("ScaleOut", NS)
    assert tuple(out["status"]["addPods"][:2]) == predicted == ("bert-worker-3", "bert-worker-4")


def test_a_misspelt_policy_label_grows_nothing_and_warns_once_naming_it(
    kube: Kube, tmp_path: Path
) -> None:
    kube.server.seed(
        node("a"),
        node("b"),
        training_job("bert", replicas=2, labels={POLICY_LABEL: "defualt"}),
        launcher("bert", "a"),
        worker("bert", 0, "a"),
        worker("bert", 1, "b"),
    )
    EtOperator(kube.server, NS, tmp_path / "hostfile").step()
    rec = kube.reconciler()
    for _ in range(3):
        [decision] = rec.tick(now())  # idle GPUs everywhere, yet no ScaleOut on a guess
        assert (decision.action, decision.reason) == (Action.NOOP, Reason.UNKNOWN_POLICY)
        assert "'defualt' names no policy (there are: default)" in decision.message
    assert kube.objects("ScaleOut") == []
    [event] = kube.events("UnknownPolicy")  # once per episode, not once per pass
    assert event["type"] == "Warning" and "'defualt'" in event["message"]
    assert event["involvedObject"]["name"] == "bert"
