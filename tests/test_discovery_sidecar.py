"""The launcher sidecar against the Kubernetes API emulator: annotation -> drain file, the
assigned-hosts file -> annotation, the end of the launcher container -> the sidecar's exit; and
the shipped manifests that wire it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing
import yaml
from support.kube_api import KubeApiServer
from support.rbac import role_grants
from support.sidecar import sidecar_thread
from support.waiting import seconds_until, wait_for

from autoscaler.adapters.discovery.sidecar import ContainerRef, DrainSidecar, JobRef
from autoscaler.adapters.discovery.watch import ObjectWatch
from autoscaler.annotations import (
    ASSIGNED_ANNOTATION,
    DRAINED_ANNOTATION,
    decode_assigned,
    encode_drained,
)

NS, JOB = "default", "bert"
LIST_PATH = f"/apis/kai.alibabacloud.com/v1alpha1/namespaces/{NS}/trainingjobs"
JOB_PATH = f"{LIST_PATH}/{JOB}"
LAUNCHER = f"{JOB}-launcher"  # et-operator's launcher pod (and service account) name
ROOT = Path(__file__).resolve().parents[1]


def training_job(name: str = JOB, drained: set[str] | None = None) -> dict[str, Any]:
    annotations = {DRAINED_ANNOTATION: encode_drained(drained)} if drained is not None else {}
    return {
        "apiVersion": "kai.alibabacloud.com/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"etReplicaSpecs": {"worker": {"replicas": 2}}},
    }


def annotate(api: KubeApiServer, value: str | None, name: str = JOB) -> None:
    api.patch("trainingjobs", name, {"metadata": {"annotations": {DRAINED_ANNOTATION: value}}}, NS)


def content(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


class Running:
    def __init__(self, api: KubeApiServer, drain: Path) -> None:
        self.api = api
        self.drain = drain
        self.sidecar = DrainSidecar(
            api.api_client(),
            JobRef(NS, JOB),
            drain,
            watch_timeout=timedelta(seconds=30),
            backoff_max=timedelta(seconds=0.5),
        )
        self.thread = threading.Thread(target=self.sidecar.run, daemon=True)

    def says(self, *hosts: str) -> bool:
        return content(self.drain) == "".join(f"{h}\n" for h in hosts)

    def lists(self) -> int:
        return sum(1 for r in self.api.requests("GET", LIST_PATH) if not r.watch)


@pytest.fixture
def run(kube_api: KubeApiServer, tmp_path: Path) -> Iterator[Running]:
    running = Running(kube_api, tmp_path / "edl" / "drained-hosts")
    yield running
    running.sidecar.stop()
    deadline = time.monotonic() + 5
    while running.thread.is_alive() and time.monotonic() < deadline:
        kube_api.drop_watches(abrupt=False)  # ends a watch the stop raced with
        running.thread.join(0.1)
    assert not running.thread.is_alive()


def test_first_sync_writes_the_annotation(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(training_job(drained={"bert-worker-3", "bert-worker-1"}))
    run.thread.start()
    wait_for(lambda: run.says("bert-worker-1", "bert-worker-3"), what="the first sync")


def test_changes_reach_the_file_within_a_second(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(training_job(drained=set()))
    run.thread.start()
    wait_for(lambda: run.says() and kube_api.watch_count == 1, what="the watch")
    annotate(kube_api, encode_drained({"bert-worker-2"}))
    took = seconds_until(lambda: run.says("bert-worker-2"), timeout=1.0, what="the drain")
    annotate(kube_api, encode_drained({"bert-worker-2", "bert-worker-0"}))
    wait_for(lambda: run.says("bert-worker-0", "bert-worker-2"), timeout=1.0, what="the second")
    annotate(kube_api, None)
    wait_for(lambda: run.says(), timeout=1.0, what="the undrain")
    print(f"\nannotation -> drain file: {took * 1000:.0f} ms")
    assert run.lists() == 1  # one list, then the watch carried everything


def test_a_malformed_annotation_drains_nothing(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(training_job(drained={"bert-worker-1"}))
    run.thread.start()
    wait_for(lambda: run.says("bert-worker-1"))
    annotate(kube_api, "{not json")
    wait_for(lambda: run.says(), what="an empty drain file")


def test_other_jobs_are_ignored(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(
        training_job(drained={"bert-worker-1"}), training_job("gpt", drained={"gpt-worker-0"})
    )
    run.thread.start()
    wait_for(lambda: run.says("bert-worker-1"))
    annotate(kube_api, encode_drained({"gpt-worker-5"}), name="gpt")
    annotate(kube_api, encode_drained({"bert-worker-2"}))
    wait_for(lambda: run.says("bert-worker-2"))


def test_a_missing_job_means_nothing_drained_until_it_appears(
    kube_api: KubeApiServer, run: Running
) -> None:
    run.thread.start()
    wait_for(lambda: run.says(), what="an empty drain file for a job that does not exist")
    kube_api.seed(training_job(drained={"bert-worker-0"}))
    wait_for(lambda: run.says("bert-worker-0"), what="the job's creation")
    kube_api.delete("trainingjobs", JOB, NS)
    wait_for(lambda: run.says(), what="the job's deletion")


def test_a_dropped_watch_resumes_without_relisting(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(training_job(drained=set()))
    run.thread.start()
    wait_for(lambda: kube_api.watch_count == 1, what="the watch")
    kube_api.drop_watches(abrupt=True)
    annotate(kube_api, encode_drained({"bert-worker-4"}))  # while nobody watches
    wait_for(lambda: run.says("bert-worker-4"), what="the missed change after the resume")
    wait_for(lambda: kube_api.watch_count == 1, what="the watch to come back")
    assert run.lists() == 1
    watches = [r for r in kube_api.requests("GET", LIST_PATH) if r.watch]
    assert watches[-1].query["resourceVersion"] != "0"  # resumed from where it was


def test_a_compacted_resource_version_relists(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(training_job(drained=set()))
    run.thread.start()
    wait_for(lambda: kube_api.watch_count == 1, what="the watch")
    kube_api.drop_watches(abrupt=True)
    annotate(kube_api, encode_drained({"bert-worker-7"}))
    kube_api.compact()  # the sidecar's resourceVersion is gone: 410 on resume
    wait_for(lambda: run.says("bert-worker-7"), what="the relist")
    assert run.lists() == 2


def test_api_errors_back_off_and_recover(kube_api: KubeApiServer, run: Running) -> None:
    kube_api.seed(training_job(drained={"bert-worker-1"}))
    kube_api.fail_next(3, status=500, path_contains="trainingjobs")
    run.thread.start()
    wait_for(lambda: run.says("bert-worker-1"), timeout=8, what="recovery after 3 errors")
    assert run.lists() == 4


class Reply:
    """What the client returns with _preload_content=False: a body, or a stream of lines."""

    def __init__(self, body: dict[str, Any] | None = None, events: list[Any] = ()) -> None:
        self.data = json.dumps(body).encode()
        self.events = events

    def stream(self, amt: None, decode_content: bool) -> Iterator[bytes]:
        yield from (json.dumps(e).encode() + b"\n" for e in self.events)

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_an_unexpected_error_is_logged_and_the_watch_starts_over() -> None:
    """A malformed list (no resourceVersion) applies nothing and does not end the watch
    thread: it is logged, and the watch lists again."""
    obj = {"metadata": {"name": "x", "resourceVersion": "7"}}
    replies = iter(
        [
            Reply({"items": []}),  # no metadata: KeyError
            Reply({"items": [obj], "metadata": {"resourceVersion": "7"}}),
            Reply(events=[{"type": "MODIFIED", "object": obj}]),
        ]
    )
    seen: list[Any] = []
    stop = threading.Event()
    log = structlog.get_logger("test")

    def on_object(o: Any) -> None:
        seen.append(o)
        if len(seen) == 2:
            stop.set()

    watch = ObjectWatch(
        lambda **_: next(replies),
        "x",
        on_object,
        timedelta(seconds=5),
        timedelta(seconds=0.01),
        stop,
        log,
    )
    with structlog.testing.capture_logs() as logs:
        watch.run()
    assert seen == [obj, obj]
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["watch_failed"]


def sidecar_command(edl: Path, *extra: str) -> list[str]:
    """`spot-autoscaler discovery-sidecar` for the test job, writing into `edl`."""
    base = [sys.executable, "-m", "autoscaler.cli", "discovery-sidecar", "--job", f"{NS}/{JOB}"]
    return [*base, "--dir", str(edl), *extra]


def test_the_command_runs_the_sidecar(kube_api: KubeApiServer, tmp_path: Path) -> None:
    kube_api.seed(training_job(drained={"bert-worker-1"}))
    kubeconfig = kube_api.kubeconfig(str(tmp_path / "kubeconfig"))
    edl = tmp_path / "edl"
    cmd = sidecar_command(edl, "--kubeconfig", kubeconfig, "--watch-timeout", "30s")
    log = tmp_path / "sidecar.log"

    def written() -> list[list[str]]:  # the file is written first, its log line after
        lines = (content(log) or "").splitlines()
        logged = [json.loads(line) for line in lines if line.startswith("{")]
        return [e["hosts"] for e in logged if e["event"] == "drain_file_written"]

    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        drain = edl / "drained-hosts"
        wait_for(lambda: content(drain) == "bert-worker-1\n", timeout=15, what="the command's sync")
        annotate(kube_api, encode_drained({"bert-worker-1", "bert-worker-2"}))
        wait_for(lambda: content(drain) == "bert-worker-1\nbert-worker-2\n", what="the change")
        wait_for(lambda: len(written()) >= 2, what="the change's log line")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert written() == [["bert-worker-1"], ["bert-worker-1", "bert-worker-2"]]


def test_a_bad_job_reference_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "discovery-sidecar", "--job", "no-namespace"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "NAMESPACE/NAME" in result.stderr


# --- the assigned hosts: discover_hosts.sh's file -> the job's annotation ----------------------
def launcher_pod(*terminated: str) -> dict[str, Any]:
    def state(name: str) -> dict[str, Any]:
        if name in terminated:
            return {"terminated": {"exitCode": 0, "reason": "Completed"}}
        return {"running": {"startedAt": "2025-01-01T00:00:00Z"}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": LAUNCHER, "namespace": NS},
        "spec": {"containers": [{"name": "launcher"}, {"name": "discovery-sidecar"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": n, "state": state(n)} for n in ("launcher", "discovery-sidecar")
            ],
        },
    }


class Sidecar:
    """`run_sidecar` in a thread, polling the assigned-hosts file every 20 ms."""

    def __init__(self, api: KubeApiServer, edl: Path, exit_with: ContainerRef | None) -> None:
        self.api = api
        self.assigned = edl / "assigned-hosts"
        self.stop = threading.Event()
        self.thread = sidecar_thread(
            api.api_client(),
            JobRef(NS, JOB),
            edl / "drained-hosts",
            self.stop,
            self.assigned,
            exit_with,
        )

    def start(self) -> None:
        """With the job and its launcher pod, once both watches run."""
        self.api.seed(training_job(drained=set()), launcher_pod())
        self.thread.start()
        wait_for(lambda: self.api.watch_count == 2, what="the job and pod watches")

    def script_writes(self, *hosts: str) -> None:
        """As discover_hosts.sh writes it: sorted, one per line, temp file + rename."""
        tmp = self.assigned.with_name("assigned-hosts.123")
        tmp.write_text("".join(f"{h}\n" for h in sorted(hosts)))
        tmp.rename(self.assigned)

    def published(self) -> str | None:
        job = self.api.get("trainingjobs", JOB, NS) or {}
        return (job["metadata"].get("annotations") or {}).get(ASSIGNED_ANNOTATION)

    def patches(self) -> int:
        return self.api.count("PATCH", JOB_PATH)

    def end(self) -> None:
        self.stop.set()
        deadline = time.monotonic() + 5
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.api.drop_watches(abrupt=False)  # ends a watch the stop raced with
            self.thread.join(0.1)
        assert not self.thread.is_alive()


@pytest.fixture
def sidecar(kube_api: KubeApiServer, tmp_path: Path) -> Iterator[Sidecar]:
    (tmp_path / "edl").mkdir()
    running = Sidecar(kube_api, tmp_path / "edl", ContainerRef(NS, LAUNCHER, "launcher"))
    yield running
    running.end()


def test_assigned_hosts_are_published_on_the_job_when_they_change(
    kube_api: KubeApiServer, sidecar: Sidecar
) -> None:
    sidecar.start()
    assert sidecar.published() is None and sidecar.patches() == 0  # no file: nothing known
    sidecar.script_writes("bert-worker-1", "bert-worker-0")
    took = seconds_until(
        lambda: sidecar.published() == '["bert-worker-0", "bert-worker-1"]',
        timeout=2,
        what="the first publication",
    )
    sidecar.script_writes("bert-worker-0", "bert-worker-1")  # rewritten, same set: no patch
    sidecar.script_writes("bert-worker-3")
    wait_for(lambda: sidecar.published() == '["bert-worker-3"]', what="the change")
    assert sidecar.patches() == 2
    assert decode_assigned(sidecar.published()) == {"bert-worker-3"}
    job = kube_api.get("trainingjobs", JOB, NS) or {}
    assert job["metadata"]["annotations"][DRAINED_ANNOTATION] == "[]"  # the rest left alone
    print(f"\nassigned-hosts file -> annotation: {took * 1000:.0f} ms")


def test_publishing_retries_after_api_errors_and_skips_bad_names(
    kube_api: KubeApiServer, sidecar: Sidecar
) -> None:
    kube_api.seed(training_job(drained=set()), launcher_pod())
    kube_api.fail_next(2, status=503, path_contains=JOB_PATH)
    sidecar.script_writes("bert-worker-2", "not a host:1")
    sidecar.thread.start()
    wait_for(lambda: sidecar.published() == '["bert-worker-2"]', what="the retried patch")
    assert sidecar.patches() == 3


def test_the_sidecar_returns_once_the_launcher_container_terminated(
    kube_api: KubeApiServer, sidecar: Sidecar
) -> None:
    sidecar.start()
    kube_api.patch("pods", LAUNCHER, launcher_pod("discovery-sidecar"), NS)  # not the one
    sidecar.script_writes("bert-worker-0")
    wait_for(lambda: sidecar.published() == '["bert-worker-0"]', what="a publication")
    assert sidecar.thread.is_alive()
    kube_api.patch("pods", LAUNCHER, launcher_pod("launcher"), NS)
    took = seconds_until(lambda: not sidecar.thread.is_alive(), timeout=2, what="the exit")
    print(f"\nlauncher terminated -> sidecar returned: {took * 1000:.0f} ms")


def test_a_launcher_already_terminated_at_start_ends_the_sidecar(
    kube_api: KubeApiServer, sidecar: Sidecar
) -> None:
    kube_api.seed(training_job(drained=set()), launcher_pod("launcher"))
    sidecar.thread.start()
    wait_for(lambda: not sidecar.thread.is_alive(), what="the exit after the first list")


def test_the_command_exits_0_with_the_launcher_container(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    kube_api.seed(training_job(drained={"bert-worker-1"}), launcher_pod())
    kubeconfig = kube_api.kubeconfig(str(tmp_path / "kubeconfig"))
    edl = tmp_path / "edl"
    cmd = sidecar_command(edl, "--kubeconfig", kubeconfig, "--exit-with-container", "launcher")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "POD_NAME": LAUNCHER, "POD_NAMESPACE": NS}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(
            lambda: content(edl / "drained-hosts") == "bert-worker-1\n",
            timeout=15,
            what="the command's first sync",
        )
        (edl / "assigned-hosts").write_text("bert-worker-0\n")
        wait_for(
            lambda: (
                (kube_api.get("trainingjobs", JOB, NS) or {})["metadata"]["annotations"].get(
                    ASSIGNED_ANNOTATION
                )
                == '["bert-worker-0"]'
            ),
            what="the publication",
        )
        assert proc.poll() is None
        kube_api.patch("pods", LAUNCHER, launcher_pod("launcher"), NS)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=10)
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    # two threads log these: the publisher's line may come after the watcher's (seen under load)
    assert {"assigned_hosts_published", "container_terminated"} <= set(events)


def test_exit_with_container_needs_the_downward_api(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("POD_NAME", "POD_NAMESPACE")}
    result = subprocess.run(
        sidecar_command(tmp_path, "--exit-with-container", "launcher"),
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 1
    assert "POD_NAME" in result.stderr


def test_the_example_role_allows_every_request_the_sidecar_makes(
    kube_api: KubeApiServer, sidecar: Sidecar
) -> None:
    example = ROOT / "deploy" / "launcher-sidecar-example.yaml"
    docs = list(yaml.safe_load_all(example.read_text()))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    (job,) = [d for d in docs if d["kind"] == "TrainingJob"]
    granted = role_grants(role)
    assert binding["subjects"][0]["name"] == f"{job['metadata']['name']}-launcher"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    kube_api.seed(training_job(drained={"bert-worker-1"}), launcher_pod())
    sidecar.thread.start()
    sidecar.script_writes("bert-worker-0")
    wait_for(lambda: sidecar.published() and kube_api.watch_count == 2)
    kube_api.patch("pods", LAUNCHER, launcher_pod("launcher"), NS)
    wait_for(lambda: not sidecar.thread.is_alive(), what="the exit")

    def verb(r: Any) -> str:
        return "watch" if r.watch else {"GET": "list", "PATCH": "patch"}[r.method]

    made = {
        (
            "" if r.path.startswith("/api/") else r.path.split("/")[2],
            "pods" if "/pods" in r.path else "trainingjobs",
            verb(r),
        )
        for r in kube_api.requests()
    }
    assert made == {
        ("kai.alibabacloud.com", "trainingjobs", "list"),
        ("kai.alibabacloud.com", "trainingjobs", "watch"),
        ("kai.alibabacloud.com", "trainingjobs", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
    }
    assert made <= granted
    assert {r.path for r in kube_api.requests()} == {  # one namespace, one job, one pod
        LIST_PATH,
        JOB_PATH,
        f"/api/v1/namespaces/{NS}/pods",
    }
    pod_lists = [r for r in kube_api.requests() if "/pods" in r.path]
    assert {r.query.get("fieldSelector") for r in pod_lists} == {f"metadata.name={LAUNCHER}"}


# --- the shipped manifests: every launcher sidecar lets its pod complete ----------------------
def launcher_templates() -> list[tuple[str, dict[str, Any]]]:
    """(file, launcher pod spec) of every shipped TrainingJob."""
    found = []
    for path in sorted((ROOT / "deploy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "TrainingJob":
                spec = doc["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]
                found.append((path.name, spec))
    return found


def is_sidecar(container: dict[str, Any]) -> bool:
    return "discovery-sidecar" in (container.get("args") or [])


def test_every_shipped_launcher_sidecar_ends_with_its_launcher() -> None:
    """A native sidecar (an init container with restartPolicy: Always) cannot reach the pod
    through et-operator: its TrainingJob CRD is a structural v1 schema generated from k8s.io/api
    v0.16 (config/crd/bases/kai.alibabacloud.com_trainingjobs.yaml), whose Container has no
    restartPolicy, so the API server prunes it, and newLauncher (pkg/controllers/resource.go)
    copies the template through those types again. The init container would then run forever
    and the launcher never start. So in a TrainingJob the sidecar is a regular container that
    exits with the launcher (containers[0], where horovodrun runs)."""
    templates = launcher_templates()
    assert [name for name, _ in templates if any(map(is_sidecar, _["containers"]))] == [
        "launcher-sidecar-example.yaml"
    ]
    for name, spec in templates:
        for init in spec.get("initContainers") or []:
            assert not is_sidecar(init), f"{name}: a sidecar init container would block the pod"
            assert "restartPolicy" not in init, f"{name}: et-operator drops restartPolicy"
        for sidecar in filter(is_sidecar, spec["containers"]):
            args = sidecar["args"]
            assert args[args.index("--exit-with-container") + 1] == spec["containers"][0]["name"]
            env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in sidecar["env"]}
            assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
            assert spec["containers"][0] is not sidecar
