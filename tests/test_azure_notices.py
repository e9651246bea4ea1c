"""The node agent on Azure, against a local IMDS that answers Scheduled Events as documented
(MicrosoftDocs/azure-compute-docs, virtual-machines/linux/scheduled-events.md): 400 without
`Metadata: true`, DocumentIncarnation rising on every change, an acknowledged event Started with
a blank NotBefore, 200 to a StartRequest naming a known event, 400 to a malformed one. The notice
lands on the Node; the acknowledgement waits until the node's pods are gone."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import Message
from email.utils import format_datetime

import pytest
from kubernetes.client import ApiClient, CoreV1Api
from support.kube_api import KubeApiServer
from test_node_agent import (
    NODE,
    annotation,
    fails_without_notice,
    metadata_server,
    seconds_to_annotation,
)

from autoscaler.adapters.kube.nodes import node_notices
from autoscaler.adapters.nodeagent.agent import NodeAgent
from autoscaler.adapters.nodeagent.annotator import NodeAnnotator
from autoscaler.adapters.nodeagent.azure import AzureScheduledEvents
from autoscaler.adapters.nodeagent.detect import detect
from autoscaler.adapters.nodeagent.metadata import MetadataError
from autoscaler.adapters.nodeagent.pods import NodePods
from autoscaler.annotations import decode_notice
from autoscaler.config.kubernetes import KubernetesSettings
from autoscaler.core import NoticeKind

VM = "aks-spot-31415926-vmss_4"
EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@dataclass
class FakeImds:
    events: list[dict[str, object]] = field(default_factory=list)
    incarnation: int = 1
    acknowledged: list[str] = field(default_factory=list)
    fail: list[int | str] = field(default_factory=list)  # next GETs: a status or a body
    hang: bool = False
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def schedule(self, kind: str, not_before: datetime, *resources: str) -> str:
        event_id = f"5DD55B64-45AD-49D3-BBC9-F57D4EA97BD{len(self.events)}"
        with self.lock:
            self.events.append(
                {
                    "EventId": event_id,
                    "EventType": kind,
                    "ResourceType": "VirtualMachine",
                    "Resources": list(resources or [VM]),
                    "EventStatus": "Scheduled",
                    "NotBefore": format_datetime(not_before, usegmt=True),
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
            self.incarnation += 1
        return event_id

    def answer(
        self, method: str, path: str, headers: Message, body: bytes
    ) -> tuple[int, str, dict[str, str]]:
        if headers.get("Metadata") != "true":
            return 400, '{"error": "Bad request. Required metadata header not specified"}', {}
        if path.startswith("/metadata/instance/compute/name?") and "format=text" in path:
            return 200, VM, {}
        if path != EVENTS:
            return 404, "", {}
        if self.hang:
            self.released.wait(30)
        if method == "POST":
            return self._start(body)
        if self.fail:
            failure = self.fail.pop(0)
            return (failure, "", {}) if isinstance(failure, int) else (200, failure, {})
        with self.lock:
            document = {"DocumentIncarnation": self.incarnation, "Events": self.events}
            return 200, json.dumps(document), {"Content-Type": "application/json"}

    def _start(self, body: bytes) -> tuple[int, str, dict[str, str]]:
        try:
            ids = [r["EventId"] for r in json.loads(body)["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return 400, "", {}
        with self.lock:
            for event in self.events:
                if event["EventId"] in ids:
                    event |= {"EventStatus": "Started", "NotBefore": ""}
                    self.acknowledged.append(str(event["EventId"]))
            self.incarnation += 1
        return 200, "", {}


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    with metadata_server(fake.answer) as fake.url:
        yield fake
        fake.released.set()


def pod(name: str, **meta: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "training", **meta},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "train"}]},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def cluster(kube_api: KubeApiServer, kube_client: ApiClient) -> tuple[KubeApiServer, ApiClient]:
    """The API emulator holding this node's Node, and a client of it."""
    kube_api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return kube_api, kube_client


def agent_for(imds: FakeImds, client: ApiClient, now: datetime = NOW) -> NodeAgent:
    metadata = detect("auto", imds.url)
    assert isinstance(metadata, AzureScheduledEvents)
    return NodeAgent(
        metadata,
        NodeAnnotator(client, NODE),
        drained=NodePods(client, NODE).drained,
        clock=lambda: now,
    )


def test_a_preempt_is_annotated_and_acknowledged_only_once_the_worker_is_gone(
    imds: FakeImds, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    api, client = cluster
    api.kubelet_delay = None  # a deleted pod stays Terminating until finish_terminating()
    api.seed(
        pod("bert-worker-1"),
        pod("gpu-plugin-x2", ownerReferences=[{"kind": "DaemonSet", "name": "gpu-plugin"}]),
        pod("kube-proxy-" + NODE, annotations={"kubernetes.io/config.mirror": "abc"}),
        pod("warmup-7") | {"status": {"phase": "Succeeded"}},
    )
    agent = agent_for(imds, client)
    assert agent.poll_once() is None
    event_id = imds.schedule("Preempt", NOW + timedelta(seconds=30))

    notice = agent.poll_once()
    assert notice.kind is NoticeKind.INTERRUPTION and notice.source == "azure-scheduled-events"
    persisted = decode_notice(NODE, annotation(api))
    assert persisted.deadline == NOW + timedelta(seconds=30) and event_id in persisted.id
    assert imds.acknowledged == []  # the worker still runs

    # the daemon's scale-in deletes the worker: Terminating (saving a checkpoint) is not gone
    CoreV1Api(client).delete_namespaced_pod("bert-worker-1", "training")
    agent.poll_once()
    assert imds.acknowledged == []
    api.finish_terminating("bert-worker-1", "training")
    agent.poll_once()
    assert imds.acknowledged == [event_id]  # only DaemonSet, mirror and finished pods are left

    agent.poll_once()  # Started now, NotBefore blank: the same notice, no second ack
    assert imds.acknowledged == [event_id]
    assert decode_notice(NODE, annotation(api)).deadline == NOW + timedelta(seconds=30)


def test_an_event_for_another_vm_is_ignored(
    imds: FakeImds, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    api, client = cluster
    imds.schedule("Preempt", NOW + timedelta(seconds=30), "aks-spot-31415926-vmss_7")
    imds.schedule("Freeze", NOW + timedelta(minutes=15))  # ours, but the VM stays
    agent = agent_for(imds, client)
    assert agent.poll_once() is None
    assert annotation(api) is None and imds.acknowledged == []


def test_a_shared_event_is_acknowledged_only_at_its_deadline(
    imds: FakeImds, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    """Acknowledging starts an event for every VM it names: ours is drained (no pods at all),
    the other may not be, so it waits for NotBefore."""
    api, client = cluster
    event_id = imds.schedule(
        "Terminate", NOW + timedelta(minutes=5), VM, "aks-spot-31415926-vmss_5"
    )
    agent_for(imds, client).poll_once()
    assert decode_notice(NODE, annotation(api)).kind is NoticeKind.INTERRUPTION
    assert imds.acknowledged == []
    agent_for(imds, client, now=NOW + timedelta(minutes=5)).poll_once()
    assert imds.acknowledged == [event_id]


def test_without_leave_to_list_pods_it_waits_for_the_deadline(
    imds: FakeImds, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    api, client = cluster
    api.fail_next(1, status=403, path_contains="/api/v1/pods", method="GET")
    imds.schedule("Preempt", NOW + timedelta(seconds=30))
    pods = NodePods(client, NODE)
    agent = NodeAgent(
        AzureScheduledEvents(imds.url),
        NodeAnnotator(client, NODE),
        drained=pods.drained,
        clock=lambda: NOW,
    )
    agent.poll_once()
    assert annotation(api) is not None and imds.acknowledged == [] and pods.failures == 1
    agent.poll_once()  # allowed again, and nothing runs here
    assert len(imds.acknowledged) == 1


@pytest.mark.parametrize(
    "failure",
    [
        500,
        "<html>Service Unavailable</html>",
        '{"DocumentIncarnation": 2}',
        '{"Events": [{"EventId": "x", "EventType": "Preempt", "Resources": "' + VM + '"}]}',
        '{"Events": [{"EventId": "x", "EventType": "Preempt", "EventStatus": "Scheduled",'
        ' "Resources": ["' + VM + '"], "NotBefore": "in a bit"}]}',
    ],
    ids=["HTTP 500", "not JSON", "no Events", "Resources not a list", "NotBefore not a time"],
)
def test_errors_and_garbage_are_counted_and_never_a_notice(
    imds: FakeImds, cluster: tuple[KubeApiServer, ApiClient], failure: int | str
) -> None:
    api, client = cluster
    agent = agent_for(imds, client)
    imds.fail = [failure]
    fails_without_notice(agent, api)
    assert imds.acknowledged == []
    assert agent.poll_once() is None  # answered properly again


def test_a_server_that_hangs_times_out_after_the_first_answer(imds: FakeImds) -> None:
    metadata = AzureScheduledEvents(imds.url)
    assert metadata.notices(NODE, NOW) == []  # the first call may take minutes; later ones not
    imds.hang = True
    started = time.monotonic()
    with pytest.raises(MetadataError):
        metadata.notices(NODE, NOW)
    assert time.monotonic() - started < 5


def test_the_loop_reports_a_preempt_within_its_poll(
    imds: FakeImds, cluster: tuple[KubeApiServer, ApiClient]
) -> None:
    api, client = cluster
    agent = NodeAgent(AzureScheduledEvents(imds.url), NodeAnnotator(client, NODE))
    imds.fail = [503]

    def preempt() -> None:
        imds.schedule("Preempt", datetime.now(UTC) + timedelta(seconds=30))

    delay = seconds_to_annotation(agent, api, lambda: agent.counts["polls"] >= 3, preempt)
    assert agent.counts["metadata_errors"] == 1
    # the 0.5 s poll, plus one request and one patch (room for a loaded machine: a benchmark
    # gives the figures, benchmarks/cloud_notices.py)
    assert delay <= 1.2, delay


def test_the_aks_spot_taint_is_not_a_notice() -> None:
    """AKS puts `kubernetes.azure.com/scalesetpriority=spot:NoSchedule` on every spot node from
    its start: it says what the node is, not that it is going."""
    node = {
        "metadata": {"name": NODE, "labels": {"kubernetes.azure.com/scalesetpriority": "spot"}},
        "spec": {
            "taints": [
                {
                    "key": "kubernetes.azure.com/scalesetpriority",
                    "value": "spot",
                    "effect": "NoSchedule",
                }
            ]
        },
    }
    assert node_notices(node, KubernetesSettings()) == []
