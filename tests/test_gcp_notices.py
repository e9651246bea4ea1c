"""The node agent on GCE, against a local metadata server that answers as GCE's does: plain-text
values, an ETag per value, `Metadata-Flavor: Google` required, `wait_for_change` held until the
value differs from `last_etag` or `timeout_sec` passes. The notice lands on the Node."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import Message
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes.client import ApiClient
from support.kube_api import KubeApiServer
from test_node_agent import (
    NODE,
    annotation,
    fails_without_notice,
    metadata_server,
    seconds_to_annotation,
)

from autoscaler.adapters.nodeagent.agent import NodeAgent
from autoscaler.adapters.nodeagent.annotator import NodeAnnotator
from autoscaler.adapters.nodeagent.detect import detect
from autoscaler.adapters.nodeagent.gcp import GceMetadata
from autoscaler.adapters.nodeagent.metadata import MetadataError
from autoscaler.annotations import decode_notice
from autoscaler.core import NoticeKind

ROOT = "/computeMetadata/v1/"


@dataclass
class FakeGce:
    """`preempted` and `maintenance-event` as GCE serves them; `fail` answers the next requests
    with these statuses or bodies (an int: that status; a str: that body); with `hang`, requests
    get no answer until `released`."""

    values: dict[str, str] = field(
        default_factory=lambda: {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
        }
    )
    fail: list[int | str] = field(default_factory=list)
    hang: bool = False
    released: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    url: str = ""

    def set(self, key: str, value: str) -> None:
        with self.changed:
            self.values[f"instance/{key}"] = value
            self.changed.notify_all()

    def answer(
        self, method: str, path: str, headers: Message, _: bytes
    ) -> tuple[int, str, dict[str, str]]:
        self.paths.append(path)
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing required header: Metadata-Flavor", {}
        url = urlsplit(path)
        key, query = url.path.removeprefix(ROOT), parse_qs(url.query)
        if key == "instance/id":
            return 200, "4520031799277581759", {"Metadata-Flavor": "Google"}
        if method != "GET" or key not in self.values:
            return 404, "", {}
        if self.hang:
            self.released.wait(30)
        if self.fail:
            failure = self.fail.pop(0)
            return (failure, "", {}) if isinstance(failure, int) else (200, failure, {})
        if query.get("wait_for_change") == ["true"]:
            last = query.get("last_etag", [_etag(self.values[key])])[0]
            timeout = float(query.get("timeout_sec", ["3600"])[0])
            with self.changed:
                self.changed.wait_for(lambda: _etag(self.values[key]) != last, timeout)
        value = self.values[key]
        return 200, value, {"ETag": _etag(value), "Metadata-Flavor": "Google"}


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


@pytest.fixture
def gce() -> Iterator[FakeGce]:
    fake = FakeGce()
    with metadata_server(fake.answer) as fake.url:
        yield fake
        fake.released.set()


@pytest.fixture
def cluster(kube_api: KubeApiServer, kube_client: ApiClient) -> tuple[KubeApiServer, ApiClient]:
    """The API emulator holding this node's Node, and a client of it."""
    kube_api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return kube_api, kube_client


def agent_for(gce: FakeGce, client: ApiClient) -> NodeAgent:
    metadata = detect("auto", gce.url)
    assert isinstance(metadata, GceMetadata)
    return NodeAgent(metadata, NodeAnnotator(client, NODE))


def in_thread(poll: NodeAgent) -> tuple[threading.Thread, list[object]]:
    """One poll in a thread (a long poll hangs); its result or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(poll.poll_once())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_preemption_ends_the_long_poll_at_once_and_is_annotated(
    gce: FakeGce, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    api, client = cluster
    agent = agent_for(gce, client)
    assert agent.poll_once() is None  # a plain GET: learns the ETag
    thread, out = in_thread(agent)  # now a hanging GET with last_etag
    time.sleep(0.3)
    assert thread.is_alive()
    preempted_at = time.monotonic()
    gce.set("preempted", "TRUE")
    thread.join(5)
    assert time.monotonic() - preempted_at < 0.5  # not the next poll: the long poll returned
    [notice] = out
    assert notice.kind is NoticeKind.INTERRUPTION and notice.source == "gce-metadata"
    assert notice.deadline == notice.received_at + timedelta(seconds=30)
    persisted = decode_notice(NODE, annotation(api))
    assert persisted.kind is NoticeKind.INTERRUPTION and persisted.deadline == notice.deadline
    hanging = [p for p in gce.paths if "wait_for_change=true" in p]
    assert hanging and all("last_etag=" in p and "timeout_sec=1" in p for p in hanging)


def test_an_unchanged_value_returns_after_timeout_sec_and_polls_go_on(
    gce: FakeGce, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    _, client = cluster
    agent = agent_for(gce, client)
    agent.poll_once()
    started = time.monotonic()
    assert agent.poll_once() is None
    assert 0.9 < time.monotonic() - started < 2.5  # held for timeout_sec=1, then answered


def test_maintenance_terminate_is_a_notice_migrate_is_not(
    gce: FakeGce, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    api, client = cluster
    metadata = GceMetadata(gce.url)
    now = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    gce.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    assert metadata.notices(NODE, now) == []  # live migration: the VM stays

    gce.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    [first] = metadata.notices(NODE, now)
    assert first.kind is NoticeKind.MAINTENANCE and first.deadline == now + timedelta(seconds=60)
    [again] = metadata.notices(NODE, now + timedelta(seconds=5))
    assert (again.id, again.deadline) == (first.id, first.deadline)  # kept from the first sighting

    gce.set("maintenance-event", "NONE")
    assert metadata.notices(NODE, now + timedelta(minutes=1)) == []
    gce.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    [later] = metadata.notices(NODE, now + timedelta(hours=1))
    assert later.id != first.id  # a new event

    agent = NodeAgent(GceMetadata(gce.url), NodeAnnotator(client, NODE))
    agent.poll_once()
    assert decode_notice(NODE, annotation(api)).kind is NoticeKind.MAINTENANCE


@pytest.mark.parametrize(
    "failure",
    [503, 404, "MAYBE", "<html>Error</html>"],
    ids=["maintenance 503", "not found", "not TRUE/FALSE", "an HTML page"],
)
def test_errors_and_garbage_are_counted_and_never_a_notice(
    gce: FakeGce, cluster: tuple[KubeApiServer, ApiClient], failure: int | str
) -> None:
    api, client = cluster
    agent = agent_for(gce, client)
    gce.fail = [failure]
    fails_without_notice(agent, api)
    gce.set("maintenance-event", "a new kind of event")
    fails_without_notice(agent, api, errors=2)


def test_a_server_that_hangs_times_out(gce: FakeGce) -> None:
    gce.hang = True
    started = time.monotonic()
    with pytest.raises(MetadataError):
        GceMetadata(gce.url).notices(NODE, datetime.now(UTC))
    assert time.monotonic() - started < 5


def test_the_loop_backs_off_through_errors_and_reports_the_preemption(
    gce: FakeGce, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    """At the default interval (1 s long polls): failures are retried, never fatal; once the
    server answers, the preemption reaches the Node's annotation."""
    api, client = cluster
    agent = agent_for(gce, client)
    gce.fail = [503, "garbage"]
    errors_over = time.monotonic() + 1e9

    def settled() -> bool:  # through the errors, then back in a long poll for a while
        nonlocal errors_over
        if agent.counts["metadata_errors"] == 2 and not gce.fail:
            errors_over = min(errors_over, time.monotonic())
        return time.monotonic() - errors_over > 1.5

    delay = seconds_to_annotation(agent, api, settled, lambda: gce.set("preempted", "TRUE"))
    assert delay < 1.0, delay  # notice -> annotation: the long poll answers at once
    assert decode_notice(NODE, annotation(api)).kind is NoticeKind.INTERRUPTION
