"""The node agent against a local metadata service (IMDSv2 token flow, Alibaba termination-time)
and the Kubernetes API emulator: the notice lands on the Node's annotation, once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from kubernetes.client import ApiClient
from support.http import serving
from support.kube_api import KubeApiServer

from autoscaler.adapters.nodeagent.agent import NodeAgent
from autoscaler.adapters.nodeagent.annotator import NodeAnnotator
from autoscaler.adapters.nodeagent.detect import detect
from autoscaler.adapters.nodeagent.metadata import AlibabaMetadata, AwsImds, MetadataError
from autoscaler.annotations import NOTICE_ANNOTATION, decode_notice
from autoscaler.core import NoticeKind

NODE = "ip-10-0-1-7.ec2.internal"
ROOT = Path(__file__).resolve().parents[1]


# (method, path with query, request headers, request body) -> (status, body, reply headers)
Answer = Callable[[str, str, Message, bytes], tuple[int, str, dict[str, str]]]


@contextmanager
def metadata_server(answer: Answer) -> Iterator[str]:
    """A metadata service on 127.0.0.1 (a thread per request, so an answer may hang as a long
    poll does); yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request_body = self.rfile.read(length) if length else b""
            status, body, headers = answer(self.command, self.path, self.headers, request_body)
            data = body.encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = _serve  # noqa: N815 - http.server's naming

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as address:
        yield f"http://{address}"


@dataclass
class FakeMetadata:
    """AWS IMDSv2 (token required on every GET) or Alibaba's metadata service."""

    provider: str = "aws"
    instance_action: dict | None = None
    rebalance: dict | None = None
    termination_time: str | None = None
    tokens: set[str] = field(default_factory=set)
    token_puts: int = 0
    url: str = ""

    def answer(
        self, method: str, path: str, headers: Message, _: bytes
    ) -> tuple[int, str, dict[str, str]]:
        status, body = self._answer(method, path, headers)
        return status, body, {}

    def _answer(self, method: str, path: str, headers: Message) -> tuple[int, str]:
        if self.provider == "alibaba":
            if method == "GET" and path == "/latest/meta-data/instance-id":
                return 200, "i-bp1"
            if method == "GET" and path == "/latest/meta-data/instance/spot/termination-time":
                return (200, self.termination_time) if self.termination_time else (404, "")
            return 404, ""
        if method == "PUT" and path == "/latest/api/token":
            if headers.get("X-aws-ec2-metadata-token-ttl-seconds") is None:
                return 400, ""
            self.token_puts += 1
            token = f"token-{self.token_puts}"
            self.tokens.add(token)
            return 200, token
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, ""
        documents = {
            "/latest/meta-data/spot/instance-action": self.instance_action,
            "/latest/meta-data/events/recommendations/rebalance": self.rebalance,
        }
        document = documents.get(path)
        return (200, json.dumps(document)) if document is not None else (404, "")


@pytest.fixture
def imds() -> Iterator[FakeMetadata]:
    fake = FakeMetadata()
    with metadata_server(fake.answer) as fake.url:
        yield fake


@pytest.fixture
def kube(kube_api: KubeApiServer, kube_client: ApiClient) -> tuple[KubeApiServer, ApiClient]:  # noqa: F811
    kube_api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
    return kube_api, kube_client


def annotation(api: KubeApiServer) -> str | None:
    node = api.get("Node", NODE) or {}
    return (node.get("metadata", {}).get("annotations") or {}).get(NOTICE_ANNOTATION)


def patches(api: KubeApiServer) -> int:
    return api.count("PATCH", f"/api/v1/nodes/{NODE}")


def fails_without_notice(agent: NodeAgent, api: KubeApiServer, errors: int = 1) -> None:
    """The poll raises (for the loop to back off), is counted, and annotates nothing."""
    with pytest.raises(MetadataError):
        agent.poll_once()
    assert agent.counts["metadata_errors"] == errors and annotation(api) is None


def seconds_to_annotation(
    agent: NodeAgent, api: KubeApiServer, settled: Callable[[], bool], announce: Callable[[], None]
) -> float:
    """Run the agent's loop in a thread; once `settled()`, `announce()` a notice: the seconds
    until it is on the Node. The loop must then stop on request."""
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        api.wait_until(settled, timeout=10)
        announced_at = time.monotonic()
        announce()
        api.wait_until(lambda: annotation(api) is not None, timeout=5)
        return time.monotonic() - announced_at
    finally:
        stop.set()
        thread.join(5)
        assert not thread.is_alive()


def aws_agent(imds: FakeMetadata, client: ApiClient) -> NodeAgent:
    """An agent that polls the fake IMDS and annotates NODE through CLIENT."""
    return NodeAgent(AwsImds(imds.url), NodeAnnotator(client, NODE))


def test_aws_notices_are_annotated_once_each_and_never_downgraded(
    imds: FakeMetadata,
    kube: tuple[KubeApiServer, ApiClient],
) -> None:
    api, client = kube
    agent = aws_agent(imds, client)
    assert agent.poll_once() is None and patches(api) == 0

    imds.rebalance = {"noticeTime": "2026-03-02T12:00:00Z"}
    assert agent.poll_once().kind is NoticeKind.REBALANCE
    assert decode_notice(NODE, annotation(api)).kind is NoticeKind.REBALANCE

    imds.instance_action = {"action": "terminate", "time": "2026-03-02T12:02:00Z"}
    agent.poll_once()
    agent.poll_once()  # the same notice again: no second patch
    persisted = decode_notice(NODE, annotation(api))
    assert persisted.kind is NoticeKind.INTERRUPTION and persisted.source == "aws-imds"
    assert persisted.deadline == datetime(2026, 3, 2, 12, 2, tzinfo=UTC)
    assert patches(api) == 2 and agent.counts["reported"] == 2
    assert imds.token_puts == 1  # one IMDSv2 session token for all of it

    restarted = aws_agent(imds, client)
    restarted.poll_once()  # reads the Node first: already reported
    assert patches(api) == 2


def test_an_expired_token_is_renewed(
    imds: FakeMetadata,
    kube: tuple[KubeApiServer, ApiClient],
) -> None:
    api, client = kube
    agent = aws_agent(imds, client)
    agent.poll_once()
    imds.tokens.clear()  # IMDS forgot our session
    imds.instance_action = {"action": "stop", "time": "2026-03-02T12:02:00Z"}
    assert agent.poll_once().id == "stop@2026-03-02T12:02:00+00:00"
    assert imds.token_puts == 2 and annotation(api) is not None


def test_alibaba_termination_time_is_an_interruption(
    imds: FakeMetadata,
    kube: tuple[KubeApiServer, ApiClient],
) -> None:
    api, client = kube
    imds.provider = "alibaba"
    metadata = detect("auto", imds.url)
    assert isinstance(metadata, AlibabaMetadata)
    agent = NodeAgent(metadata, NodeAnnotator(client, NODE))
    assert agent.poll_once() is None
    imds.termination_time = "2026-03-02T12:05:00Z\n"
    agent.poll_once()
    persisted = decode_notice(NODE, annotation(api))
    assert persisted.kind is NoticeKind.INTERRUPTION
    assert persisted.deadline == datetime(2026, 3, 2, 12, 5, tzinfo=UTC)


def test_metadata_garbage_and_outages_raise_for_the_loop_to_back_off(imds: FakeMetadata) -> None:
    imds.instance_action = {"action": "terminate", "time": "in a bit"}
    with pytest.raises(MetadataError):
        AwsImds(imds.url).notices(NODE, datetime.now(UTC))
    with pytest.raises(MetadataError):
        AwsImds("http://127.0.0.1:9").notices(NODE, datetime.now(UTC))
    with pytest.raises(MetadataError, match="hostNetwork"):
        detect("auto", "http://127.0.0.1:9")


def test_the_command_runs_as_a_daemonset_would_and_stops_on_sigterm(
    imds: FakeMetadata,
    kube_api: KubeApiServer,
    tmp_path: Path,  # noqa: F811
) -> None:
    kube_api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    imds.instance_action = {"action": "terminate", "time": "2026-03-02T12:02:00Z"}
    kubeconfig = kube_api.kubeconfig(str(tmp_path / "kubeconfig"))
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoscaler.cli",
            "node-agent",
            "--provider",
            "auto",
            "--metadata-url",
            imds.url,
            "--kubeconfig",
            kubeconfig,
            "--interval",
            "100ms",
        ],
        cwd=ROOT,
        env={**os.environ, "NODE_NAME": NODE},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        kube_api.wait_until(lambda: annotation(kube_api) is not None, timeout=20)
        kube_api.wait_until(lambda: imds.token_puts >= 1, timeout=5)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=10)
    assert agent.returncode == 0, err
    assert decode_notice(NODE, annotation(kube_api)).kind is NoticeKind.INTERRUPTION
    assert patches(kube_api) == 1  # polled many times, patched once
    assert "notice_annotated" in err
