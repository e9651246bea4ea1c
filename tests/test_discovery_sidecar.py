"""The launcher sidecar against the Kubernetes API emulator: annotation -> drain file."""

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
import yaml
from support.kube_api import KubeApiServer
from support.waiting import seconds_until, wait_for

from autoscaler.adapters.discovery.sidecar import DrainSidecar, JobRef
from autoscaler.signals import DRAINED_ANNOTATION, encode_drained

pytest_plugins = ["support.fixtures"]  # kube_api

NS, JOB = "default", "bert"
LIST_PATH = f"/apis/kai.alibabacloud.com/v1alpha1/namespaces/{NS}/trainingjobs"


def training_job(name: str = JOB, drained: set[str] | None = None) -> dict[str, Any]:
    annotations = {DRAINED_ANNOTATION: encode_drained(drained)} if drained is not None else {}
    return {
        "apiVersion": "kai.alibabacloud.com/v1alpha1", "kind": "TrainingJob",
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
            api.api_client(), JobRef(NS, JOB), drain,
            watch_timeout=timedelta(seconds=30), backoff_max=timedelta(seconds=0.5),
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


def test_the_command_runs_the_sidecar(kube_api: KubeApiServer, tmp_path: Path) -> None:
    kube_api.seed(training_job(drained={"bert-worker-1"}))
    kubeconfig = kube_api.kubeconfig(str(tmp_path / "kubeconfig"))
    edl = tmp_path / "edl"
    cmd = [sys.executable, "-m", "autoscaler.cli", "discovery-sidecar", "--job", f"{NS}/{JOB}",
           "--dir", str(edl), "--kubeconfig", kubeconfig, "--watch-timeout", "30s"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        drain = edl / "drained-hosts"
        wait_for(lambda: content(drain) == "bert-worker-1\n", timeout=15, what="the command's sync")
        annotate(kube_api, encode_drained({"bert-worker-1", "bert-worker-2"}))
        wait_for(lambda: content(drain) == "bert-worker-1\nbert-worker-2\n", what="the change")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [e["hosts"] for e in logged if e["event"] == "drain_file_written"] == [
        ["bert-worker-1"], ["bert-worker-1", "bert-worker-2"],
    ]


def test_a_bad_job_reference_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "discovery-sidecar", "--job", "no-namespace"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert "NAMESPACE/NAME" in result.stderr


def test_the_example_role_allows_every_request_the_sidecar_makes(
    kube_api: KubeApiServer, run: Running
) -> None:
    example = Path(__file__).resolve().parents[1] / "deploy" / "launcher-sidecar-example.yaml"
    docs = list(yaml.safe_load_all(example.read_text()))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    (job,) = [d for d in docs if d["kind"] == "TrainingJob"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert binding["subjects"][0]["name"] == f"{job['metadata']['name']}-launcher"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    kube_api.seed(training_job(drained={"bert-worker-1"}))
    run.thread.start()
    wait_for(lambda: run.says("bert-worker-1") and kube_api.watch_count == 1)
    made = {("kai.alibabacloud.com", "trainingjobs", "watch" if r.watch else "list")
            for r in kube_api.requests() if "trainingjobs" in r.path}
    assert made == {("kai.alibabacloud.com", "trainingjobs", "list"),
                    ("kai.alibabacloud.com", "trainingjobs", "watch")}
    assert made <= granted
    assert all(r.path == LIST_PATH for r in kube_api.requests())  # nothing else, one namespace
