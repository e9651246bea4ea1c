"""The product driving PyTorchJobs on the REAL Kubeflow training-operator v1.9.3 (support/
pytorch_cluster.py): kube-apiserver, controller-manager, kube-scheduler and kwok GPU nodes; the
operator makes and deletes the worker pods, the real scheduler binds them. The product acts
through its own code: its cache, observer, reconciler and actuator in-process, or the daemon
`spot-autoscaler run` under deploy/rbac.yaml's rules (a ServiceAccount token).

What the operator does (test_real_training_operator.py pins it; docs/pytorch.md cites the
source): lowering Worker.replicas deletes the highest indices, and a deleted middle index is made
again under its name once the old pod is gone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kube_fixtures import Kube, now
from support.pytorch_cluster import (
    NS,
    SETTLE,
    Cluster,
    cluster,
    pod_events,
    pytorch_job,
)
from support.real_api import RealApi
from support.real_daemon import deployed, forbidden, json_lines
from support.real_namespace import daemon_config
from support.waiting import wait_for

from autoscaler.adapters.kube.resources import MANAGER
from autoscaler.annotations import DRAINED_ANNOTATION
from autoscaler.config import parse_config
from autoscaler.core import Action, Decision, Reason
from autoscaler.notice import ANNOTATION, HOOK_ANNOTATION, decode
from autoscaler.reconcile import Reconciler

pytestmark = pytest.mark.real_cluster
__all__ = ["cluster"]  # the fixture

NTH_ITN = {"key": "aws-node-termination-handler/spot-itn", "value": "evt-1", "effect": "NoSchedule"}
# `grow` scales out at once, `hold` never grows, `capped` allows one worker at most
CONFIG = daemon_config(NS, "{name: capped, limits: {max_workers: 1}}")


# --- the product in-process: cache, observer, reconciler, actuator over the real API -------------
@dataclass
class Product:
    kube: Kube
    reconciler: Reconciler
    decisions: list[Decision] = field(default_factory=list)

    def until(self, done: Callable[[list[Decision]], bool], what: str) -> list[Decision]:
        """Passes (each after the cache saw a change, or 1 s) until `done(all decisions)`."""
        return wait_for(lambda: self._pass(done), SETTLE, what)

    def _pass(self, done: Callable[[list[Decision]], bool]) -> list[Decision] | None:
        woken = len(self.kube.wakes)
        self.decisions += self.reconciler.tick(now())
        assert self.reconciler.errors == 0
        if done(self.decisions):
            return self.decisions
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(self.kube.wakes) > woken, 1.0, "a change")
        return None

    def acted(self, job: str) -> list[tuple[Action, Reason, tuple[str, ...]]]:
        return [
            (d.action, d.reason, d.pods)
            for d in self.decisions
            if d.job == f"{NS}/{job}" and d.action is not Action.NOOP
        ]


@pytest.fixture
def product(cluster: Cluster) -> Iterator[Product]:
    real = RealApi(cluster.plane, NS)
    kube = Kube(real, parse_config(CONFIG))  # type: ignore[arg-type]
    try:
        yield Product(kube, kube.reconciler())
    finally:
        kube.close()
        real.close()


def replicas(cluster: Cluster, job: str) -> int:
    return int(cluster.job(job)["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])


def annotations(obj: dict) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def taint(cluster: Cluster, node: str) -> None:
    cluster.taint(node, NTH_ITN)


def signalled(cluster: Cluster, job: str) -> bool:
    """Every worker pod of the job carries the checkpoint signal's annotation."""
    return all(ANNOTATION in annotations(p.to_dict()) for p in cluster.workers(job).values())


def events(cluster: Cluster, job: str) -> list[tuple[str, str, str]]:
    """Our Events on the job: (type, reason, message)."""
    return [
        (e.type, e.reason, e.message)
        for e in cluster.core.list_namespaced_event(NS).items
        if e.involved_object.name == job and e.reporting_component == MANAGER
    ]


# --- scale-out, max, the bounds ------------------------------------------------------------------
def test_idle_gpus_raise_worker_replicas_up_to_the_elastic_max(
    cluster: Cluster, product: Product
) -> None:
    cluster.add_nodes("grow", 2, gpus=2)
    cluster.create(pytorch_job("grow", "grow", replicas=1, lo=1, hi=3, policy="grow"))
    cluster.wait_settled("grow", 1)
    first = cluster.uids("grow")
    product.until(lambda ds: replicas(cluster, "grow") == 3, "replicas raised to 3")
    cluster.wait_settled("grow", 3)  # the operator made workers 1 and 2; the scheduler bound them
    assert cluster.uids("grow")["grow-worker-0"] == first["grow-worker-0"]
    out = [d for d in product.decisions if d.action is Action.SCALE_OUT]
    assert [(d.from_workers, d.to_workers, d.reason) for d in out] == [(1, 3, Reason.IDLE_CAPACITY)]
    # four idle GPUs on our nodes, max 3: nothing more, ever
    product.until(lambda ds: ds[-1].reason is Reason.CLAMP_MAX, "the job at its max")
    assert replicas(cluster, "grow") == 3
    assert ("Normal", "ScaleOutRequested") in {(t, r) for t, r, _ in events(cluster, "grow")}


def test_a_job_above_its_elastic_max_loses_its_top_workers(
    cluster: Cluster, product: Product
) -> None:
    cluster.add_nodes("above", 4, gpus=1)
    cluster.create(pytorch_job("above", "above", policy="hold", replicas=4, lo=1, hi=2))
    cluster.wait_settled("above", 4)
    kept = {
        k: v for k, v in cluster.uids("above").items() if k in ("above-worker-0", "above-worker-1")
    }
    with pod_events(cluster, "above") as pods:
        product.until(lambda ds: replicas(cluster, "above") == 2, "replicas lowered to 2")
        cluster.wait_settled("above", 2)
        gone = {s.name for s in pods.seen if s.deleting or s.type == "DELETED"}
    assert gone == {"above-worker-2", "above-worker-3"}
    assert cluster.uids("above") == kept
    [scale_in] = [d for d in product.decisions if d.action is Action.SCALE_IN]
    assert scale_in.reason is Reason.CLAMP_MAX
    assert set(scale_in.pods) == {"above-worker-2", "above-worker-3"}


def test_a_job_without_elastic_policy_is_left_alone_and_told_why(
    cluster: Cluster, product: Product
) -> None:
    cluster.add_nodes("fixed", 3, gpus=1)
    cluster.create(pytorch_job("fixed", "fixed", replicas=2, policy="grow", elastic=False))
    cluster.wait_settled("fixed", 2)
    taint(cluster, cluster.workers("fixed")["fixed-worker-1"].spec.node_name)
    product.until(
        lambda ds: any(d.reason is Reason.NOT_SCALABLE for d in ds), "a not_scalable decision"
    )
    wait_for(
        lambda: any(r == "NotScalable" for _, r, _ in events(cluster, "fixed")), SETTLE, "Event"
    )
    [(kind, _, message)] = [e for e in events(cluster, "fixed") if e[1] == "NotScalable"]
    assert kind == "Warning" and "no spec.elasticPolicy" in message
    # idle GPUs and a notice: neither moves it
    assert product.acted("fixed") == []
    assert replicas(cluster, "fixed") == 2 and len(cluster.workers("fixed")) == 2
    assert DRAINED_ANNOTATION not in annotations(cluster.job("fixed"))


def test_a_min_above_the_policys_max_is_left_alone_with_a_reason(
    cluster: Cluster, product: Product
) -> None:
    cluster.add_nodes("minmax", 3, gpus=1)
    cluster.create(pytorch_job("minmax", "minmax", replicas=2, lo=2, hi=3, policy="capped"))
    cluster.wait_settled("minmax", 2)
    product.until(
        lambda ds: any(d.reason is Reason.NOT_SCALABLE for d in ds), "a not_scalable decision"
    )
    [noop] = {d.message: d for d in product.decisions if d.reason is Reason.NOT_SCALABLE}.values()
    assert "min (2 workers) is above policy 'capped''s max (1)" in noop.message
    assert product.acted("minmax") == [] and replicas(cluster, "minmax") == 2


# --- notices ------------------------------------------------------------------------------------
def test_a_notice_on_the_top_worker_deletes_it_and_lowers_replicas_past_it(
    cluster: Cluster, product: Product
) -> None:
    cluster.add_nodes("top", 3, gpus=1)
    cluster.create(pytorch_job("top", "top", policy="hold", replicas=3, lo=1, hi=3))
    cluster.wait_settled("top", 3)
    kept = {k: v for k, v in cluster.uids("top").items() if k != "top-worker-2"}
    doomed = cluster.workers("top")["top-worker-2"].spec.node_name
    with pod_events(cluster, "top") as pods:
        taint(cluster, doomed)
        product.until(lambda ds: any(d.action is Action.SCALE_IN for d in ds), "the scale-in")
        wait_for(
            lambda: pods.first(lambda s: s.name == "top-worker-2" and s.deleting), SETTLE, "gone"
        )
        cluster.wait_settled("top", 2)
    assert product.acted("top") == [
        (Action.DRAIN, Reason.PREEMPTION_NOTICE, ("top-worker-2",)),
        (Action.SCALE_IN, Reason.PREEMPTION_NOTICE, ("top-worker-2",)),
    ]
    assert replicas(cluster, "top") == 2 and cluster.uids("top") == kept
    # the checkpoint signal reached the job (in the drain's patch) and its pods
    told = decode(annotations(cluster.job("top"))[ANNOTATION])
    assert (told.hosts, told.reason, told.job) == (
        ("top-worker-2",),
        "preemption_notice",
        f"{NS}/top",
    )
    wait_for(lambda: signalled(cluster, "top"), SETTLE, "the survivors' pods annotated")
    assert {(t, r) for t, r, _ in events(cluster, "top")} >= {
        ("Normal", "HostsDrained"),
        ("Normal", "ScaleInRequested"),
    }


def test_a_notice_on_a_middle_worker_deletes_it_by_name_and_the_operator_makes_it_again(
    cluster: Cluster, product: Product
) -> None:
    """Lowering replicas would delete the healthy top worker: the middle one is deleted by name
    and made again under its name on a healthy node, the replacement; no other worker moves."""
    nodes = cluster.add_nodes("mid", 4, gpus=1)
    cluster.create(pytorch_job("mid", "mid", policy="hold", replicas=3, lo=1, hi=3))
    cluster.wait_settled("mid", 3)
    before = cluster.uids("mid")
    doomed = cluster.workers("mid")["mid-worker-1"].spec.node_name
    with pod_events(cluster, "mid") as pods:
        taint(cluster, doomed)
        product.until(lambda ds: any(d.action is Action.SCALE_IN for d in ds), "the scale-in")
        made = wait_for(
            lambda: pods.first(
                lambda s: s.name == "mid-worker-1" and s.uid != before["mid-worker-1"]
            ),
            SETTLE,
            "mid-worker-1 made again",
        )
        cluster.wait_settled("mid", 3)
        gone = {s.name for s in pods.seen if s.deleting or s.type == "DELETED"}
    assert made is not None and gone == {"mid-worker-1"}  # no healthy worker went
    assert replicas(cluster, "mid") == 3
    after = cluster.uids("mid")
    assert {k: after[k] for k in ("mid-worker-0", "mid-worker-2")} == {
        k: before[k] for k in ("mid-worker-0", "mid-worker-2")
    }
    assert cluster.workers("mid")["mid-worker-1"].spec.node_name in set(nodes) - {doomed}
    assert (Action.SCALE_IN, Reason.PREEMPTION_NOTICE, ("mid-worker-1",)) in product.acted("mid")


class Hook:
    """An HTTP server on one loopback address standing in for a worker's notice endpoint: it
    records each POST, or hangs (`hang`) or answers garbage (`garbage`)."""

    def __init__(self, address: str, port: int, mode: str = "ok") -> None:
        self.bodies: list[bytes] = []
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                hook.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                if mode == "hang":
                    hook.release.wait(30)
                if mode == "garbage":
                    self.wfile.write(b"\x00\x01 not http\r\n\r\n")
                    return
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_the_checkpoint_hook_posts_the_notice_to_every_worker_and_a_bad_one_never_holds_the_drain(
    cluster: Cluster, product: Product
) -> None:
    """Each node gives its pods a loopback IP (its podCIDR: kwok hands pod IPs out of it), so the
    daemon's POST reaches a server here; worker 0 answers, worker 1 hangs, worker 2 answers garbage.
    The notice for worker 2's node is drained and the pod deleted on time all the same."""
    port = 18099
    cidrs = ["127.42.0.0/24", "127.42.1.0/24", "127.42.2.0/24"]
    cluster.add_nodes("hook", 3, gpus=1, pod_cidrs=cidrs)
    hooked = {HOOK_ANNOTATION: f"{port}/ckpt"}
    cluster.create(pytorch_job("hook", "hook", replicas=3, hi=3, policy="hold", annotations=hooked))
    cluster.wait_settled("hook", 3)
    pods = cluster.workers("hook")
    modes = {"hook-worker-0": "ok", "hook-worker-1": "hang", "hook-worker-2": "garbage"}
    hooks = {name: Hook(pods[name].status.pod_ip, port, mode) for name, mode in modes.items()}
    try:
        taint(cluster, pods["hook-worker-2"].spec.node_name)
        product.until(lambda ds: any(d.action is Action.SCALE_IN for d in ds), "the scale-in")
        wait_for(lambda: all(h.bodies for h in hooks.values()), SETTLE, "a POST to every worker")
        for hook in hooks.values():
            told = decode(hook.bodies[0])
            assert (told.hosts, told.reason) == (("hook-worker-2",), "preemption_notice")
        assert replicas(cluster, "hook") == 2
        # the pod went without waiting for the hooks (the hanging one holds its POST 2 s)
        failures = lambda: product.reconciler.actuator.signal_failures  # noqa: E731
        wait_for(lambda: failures() >= 2, SETTLE, "two failures counted")
        assert failures() == 2  # the hanging one and the garbage one, nothing else
    finally:
        for hook in hooks.values():
            hook.close()


def test_a_hook_annotation_with_a_bad_port_is_told_once_and_changes_nothing_else(
    cluster: Cluster, product: Product
) -> None:
    cluster.add_nodes("badhook", 2, gpus=1)
    job = pytorch_job(
        "badhook",
        "badhook",
        replicas=2,
        hi=2,
        policy="hold",
        annotations={HOOK_ANNOTATION: "99999"},
    )
    cluster.create(job)
    cluster.wait_settled("badhook", 2)
    taint(cluster, cluster.workers("badhook")["badhook-worker-1"].spec.node_name)
    product.until(lambda ds: any(d.action is Action.SCALE_IN for d in ds), "the scale-in")
    wait_for(
        lambda: any(r == "CheckpointHookInvalid" for _, r, _ in events(cluster, "badhook")),
        SETTLE,
        "the Warning Event",
    )
    [(kind, _, message)] = [
        e for e in events(cluster, "badhook") if e[1] == "CheckpointHookInvalid"
    ]
    assert kind == "Warning" and "'99999' is not PORT or PORT/PATH" in message
    assert ANNOTATION in annotations(cluster.job("badhook"))  # the rest of the signal went out
    cluster.wait_settled("badhook", 1)


# --- the daemon as deployed ----------------------------------------------------------------------
def test_the_daemon_under_the_shipped_rbac_grows_a_pytorchjob_and_answers_a_notice(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`spot-autoscaler run` with a ServiceAccount token bound to deploy/rbac.yaml's rules: idle
    GPUs raise the replicas to max; a notice on the top worker's node deletes it (pods delete) and
    annotates the survivors (pods patch); nothing is forbidden."""
    cluster.add_nodes("rbac", 3, gpus=1)
    cluster.create(pytorch_job("rbac", "rbac", replicas=1, lo=1, hi=3, policy="grow"))
    cluster.wait_settled("rbac", 1)
    with deployed(cluster.api, cluster.plane, NS, tmp_path, CONFIG) as proc:
        wait_for(lambda: replicas(cluster, "rbac") == 3, SETTLE, "replicas raised to 3")
        cluster.wait_settled("rbac", 3)
        # the policy would grow it again at once: hold it to see the notice alone
        cluster.custom.patch_namespaced_custom_object(
            "kubeflow.org",
            "v1",
            NS,
            "pytorchjobs",
            "rbac",
            {"metadata": {"labels": {"spot-autoscaler.io/policy": "hold"}}},
        )
        taint(cluster, cluster.workers("rbac")["rbac-worker-2"].spec.node_name)
        wait_for(lambda: replicas(cluster, "rbac") == 2, SETTLE, "replicas lowered to 2")
        cluster.wait_settled("rbac", 2)
        wait_for(lambda: signalled(cluster, "rbac"), SETTLE, "the survivors' pods annotated")
        assert proc.poll() is None
    assert proc.returncode == 0, (tmp_path / "err.log").read_text()[-3000:]
    decisions = [
        (d["action"], d["reason"], d["pods"])
        for d in json_lines(tmp_path / "out.log")
        if d.get("event") == "decision" and d["action"] != "noop"
    ]
    assert ("scale_out", "idle_capacity", []) in decisions
    assert ("scale_in", "preemption_notice", ["rbac-worker-2"]) in decisions
    assert forbidden(tmp_path / "err.log") == []
    assert not any(
        e.get("event") == "checkpoint_signal_failed" for e in json_lines(tmp_path / "err.log")
    )
