"""The AWS sources against moto's real HTTP server: events published through EventBridge (a rule
targeting the queue, as AWS delivers them), consumed over SQS, mapped to nodes via EC2, and fed
through the decision core."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import requests
from botocore.config import Config as BotoConfig
from cloud_fixtures import Index
from core_fixtures import job, node, only, policies, snapshot
from moto.server import ThreadedMotoServer
from structlog.testing import capture_logs

from autoscaler.adapters.aws.clients import aws_clients
from autoscaler.adapters.aws.nodes import Ec2Nodes
from autoscaler.adapters.aws.prices import ec2_spot_prices
from autoscaler.adapters.aws.queue import SqsNoticeSource
from autoscaler.adapters.cloud_sources import SpotPriceFeed
from autoscaler.adapters.polling import run_every
from autoscaler.adapters.sources import SdkMissing, SourceContext, build_sources
from autoscaler.backoff import Backoff
from autoscaler.config import Config
from autoscaler.config.cloud import AwsSettings
from autoscaler.core import Action, CapacityType, GpuNode, NoticeKind, Reason, decide
from autoscaler.notices_and_prices import NoticeBoard, NoticeWake, PriceBook

REGION = "us-east-1"
GPU_TYPE = "g5.xlarge"  # moto knows its offerings in us-east-1 (p3 it does not)
# The rule docs/cloud.md tells users to create.
EVENT_PATTERN = {
    "source": ["aws.ec2", "aws.health"],
    "detail-type": [
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "AWS Health Event",
    ],
}


@dataclass
class Aws:
    url: str
    sqs: Any
    ec2: Any
    events: Any
    queue_url: str
    board: NoticeBoard = field(default_factory=NoticeBoard)
    wakes: list[str] = field(default_factory=list)

    def source(self, index: Index | None = None, ec2: Any = None, **kw: Any) -> SqsNoticeSource:
        kw.setdefault("wait_time", timedelta(seconds=0))
        return SqsNoticeSource(
            self.sqs,
            self.queue_url,
            self.board,
            self.wakes.append,
            Ec2Nodes(ec2 or self.ec2, index or Index()),
            **kw,
        )

    def publish(self, detail_type: str, detail: dict[str, Any], source: str = "aws.ec2") -> None:
        reply = self.events.put_events(
            Entries=[
                {
                    "Source": source,
                    "DetailType": detail_type,
                    "Detail": json.dumps(detail),
                    "Resources": [],
                }
            ]
        )
        assert reply["FailedEntryCount"] == 0

    def send(self, body: str) -> None:
        """Straight into the queue: a redelivered or hand-made message."""
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body)

    def spot_instance(self) -> tuple[str, str]:
        reply = self.ec2.run_instances(
            ImageId="ami-12c6146b",
            MinCount=1,
            MaxCount=1,
            InstanceType=GPU_TYPE,
            InstanceMarketOptions={"MarketType": "spot"},
        )
        instance = reply["Instances"][0]
        return instance["InstanceId"], instance["PrivateDnsName"]

    def messages_left(self) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(v) for v in attrs.values())


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any, Any]]:
    """moto's server and (sqs, ec2, events) clients, once per module (clients are slow to make)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    nowhere = str(tmp_path_factory.mktemp("aws") / "none")
    with pytest.MonkeyPatch.context() as env:
        # boto3's default chain, fed from the environment only (no profile, no instance metadata)
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": nowhere,
            "AWS_SHARED_CREDENTIALS_FILE": nowhere,
        }.items():
            env.setenv(key, value)
        sqs, ec2 = aws_clients(AwsSettings(region=REGION, wait_time=timedelta(seconds=5)), url)
        events = boto3.client("events", region_name=REGION, endpoint_url=url)
        yield url, sqs, ec2, events
    server.stop()


@pytest.fixture
def aws(moto: tuple[str, Any, Any, Any]) -> Aws:
    url, sqs, ec2, events = moto
    requests.post(f"{url}/moto-api/reset", timeout=5)
    queue_url = sqs.create_queue(QueueName=f"notices-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]
    arn = attrs["QueueArn"]
    events.put_rule(Name="spot-notices", EventPattern=json.dumps(EVENT_PATTERN))
    events.put_targets(Rule="spot-notices", Targets=[{"Id": "queue", "Arn": arn}])
    return Aws(url, sqs, ec2, events, queue_url)


def itn(instance_id: str) -> dict[str, str]:
    return {"instance-id": instance_id, "instance-action": "terminate"}


def envelope(event_id: str, detail_type: str, detail: dict[str, Any], time: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": event_id,
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": "123456789012",
            "time": time,
            "region": REGION,
            "resources": [],
            "detail": detail,
        }
    )


def decisions(
    board: NoticeBoard, nodes: list[GpuNode], jobs: list[Any], **policy: Any
) -> list[Any]:
    now = datetime.now(UTC)
    return decide(snapshot(nodes, jobs, list(board.active(now))), policies(**policy), now)


def test_interruption_drains_and_scales_in_exactly_the_workers_on_that_node(aws: Aws) -> None:
    instance, doomed = aws.spot_instance()  # not in the index: found through EC2's PrivateDnsName
    aws.publish("EC2 Spot Instance Interruption Warning", itn(instance))
    source = aws.source()
    assert source.poll_once() == 1
    assert aws.messages_left() == 0
    assert aws.wakes == [NoticeWake(f"aws-sqs: interruption on {doomed}")]
    [notice] = aws.board.active(datetime.now(UTC))
    assert (notice.node, notice.kind) == (doomed, NoticeKind.INTERRUPTION)
    assert notice.deadline is not None and notice.received_at is not None

    bert = job("bert", lo=1, hi=4, placement=[doomed, doomed, "safe"])
    out = decisions(aws.board, [node(doomed, 8, 2), node("safe", 8, 1)], [bert])
    [drain], [scale_in] = only(out, Action.DRAIN), only(out, Action.SCALE_IN)
    assert scale_in.pods == ("bert-worker-0", "bert-worker-1")
    assert scale_in.reason is Reason.PREEMPTION_NOTICE and scale_in.nodes == (doomed,)
    assert drain.hosts == ("bert-worker-0", "bert-worker-1")


def test_rebalance_keeps_new_workers_off_that_node(aws: Aws) -> None:
    index = Index({"i-0aaaaaaaaaaaaaaa1": "gpu-risky"})
    bert = job("bert", lo=1, hi=4, placement=["gpu-busy"])
    world = [node("gpu-busy", 1, 1), node("gpu-risky", 4, 0)]
    before = only(decisions(aws.board, world, [bert]), Action.SCALE_OUT)
    assert [set(d.nodes) for d in before] == [
        {"gpu-risky"}
    ]  # without the notice it would grow there

    aws.publish("EC2 Instance Rebalance Recommendation", {"instance-id": "i-0aaaaaaaaaaaaaaa1"})
    aws.source(index).poll_once()
    out = decisions(aws.board, world, [bert])
    assert only(out, Action.SCALE_OUT) == [] and only(out, Action.SCALE_IN) == []
    assert [d.reason for d in out] == [Reason.REBALANCE]


def test_a_duplicate_interruption_is_acted_on_once(aws: Aws) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = envelope("dup-1", "EC2 Spot Instance Interruption Warning", itn("i-1"), now)
    aws.send(body)
    aws.send(body)  # SQS delivers at least once
    source = aws.source(Index({"i-1": "gpu-a"}), max_messages=10)
    received = source.poll_once()
    while received < 2:
        received += source.poll_once()
    assert aws.wakes == [NoticeWake("aws-sqs: interruption on gpu-a")]
    assert len(aws.board.active(datetime.now(UTC))) == 1
    assert (source.counts["posted"], source.counts["duplicate"]) == (1, 1)
    assert aws.messages_left() == 0


def test_garbage_is_deleted_counted_and_the_rest_handled(aws: Aws) -> None:
    aws.send("{not json")
    aws.send(json.dumps({"detail-type": "EC2 Spot Instance Interruption Warning"}))
    aws.publish("EC2 Spot Instance Interruption Warning", itn("i-2"))
    with capture_logs() as logs:
        source = aws.source(Index({"i-2": "gpu-b"}))
        while source.counts["received"] < 3:
            source.poll_once()
    assert source.counts["unparsable"] == 2 and source.counts["posted"] == 1
    assert aws.messages_left() == 0
    assert [e["event"] for e in logs].count("message_unparsable") == 2


def test_an_unknown_instance_is_ignored_with_a_log_line(aws: Aws) -> None:
    aws.publish("EC2 Spot Instance Interruption Warning", itn("i-0123456789abcdef0"))
    with capture_logs() as logs:
        source = aws.source()
        source.poll_once()
    assert aws.board.active(datetime.now(UTC)) == () and aws.wakes == []
    assert source.counts["unknown_instance"] == 1 and aws.messages_left() == 0
    [line] = [e for e in logs if e["event"] == "instance_unknown"]
    assert line["instance"] == "i-0123456789abcdef0"


def test_an_older_event_arriving_after_a_newer_one_is_stale(aws: Aws) -> None:
    change = "EC2 Instance State-change Notification"
    terminated = {"instance-id": "i-3", "state": "terminated"}
    aws.send(envelope("new", change, terminated, "2026-03-02T12:05:00Z"))
    source = aws.source(Index({"i-3": "gpu-c"}))
    source.poll_once()
    stopping = {"instance-id": "i-3", "state": "stopping"}
    aws.send(envelope("old", change, stopping, "2026-03-02T12:00:00Z"))
    source.poll_once()
    assert (source.counts["posted"], source.counts["stale"]) == (1, 1)
    assert [n.id for n in aws.board.active(datetime(2026, 3, 2, 12, 6, tzinfo=UTC))] == ["new/i-3"]


def test_a_health_scheduled_change_becomes_maintenance_with_its_start_as_deadline(aws: Aws) -> None:
    aws.publish(
        "AWS Health Event",
        {
            "service": "EC2",
            "eventTypeCategory": "scheduledChange",
            "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "startTime": "Sat, 05 Jun 2027 15:10:09 GMT",
            "affectedEntities": [{"entityValue": "i-4"}],
        },
        source="aws.health",
    )
    aws.source(Index({"i-4": "gpu-d"})).poll_once()
    [notice] = aws.board.active(datetime.now(UTC))
    assert notice.kind is NoticeKind.MAINTENANCE
    assert notice.deadline == datetime(2027, 6, 5, 15, 10, 9, tzinfo=UTC)


def test_a_failed_instance_lookup_leaves_the_message_for_redelivery(aws: Aws) -> None:
    instance, name = aws.spot_instance()
    aws.publish("EC2 Spot Instance Interruption Warning", itn(instance))
    unreachable = boto3.client(  # nothing listens on port 9: fail fast, no retries
        "ec2",
        region_name=REGION,
        endpoint_url="http://127.0.0.1:9",
        config=BotoConfig(retries={"total_max_attempts": 1}, connect_timeout=1),
    )
    broken = aws.source(ec2=unreachable, visibility_timeout=timedelta(seconds=1))
    broken.poll_once()
    assert broken.counts["deferred"] == 1 and aws.messages_left() == 1 and aws.wakes == []

    healthy = aws.source(wait_time=timedelta(seconds=5))  # returns once the message is visible
    assert healthy.poll_once() == 1
    assert (
        aws.wakes == [NoticeWake(f"aws-sqs: interruption on {name}")] and aws.messages_left() == 0
    )


def test_run_wakes_the_daemon_and_stops_when_asked(aws: Aws) -> None:
    woken, stop = threading.Event(), threading.Event()
    source = SqsNoticeSource(
        aws.sqs,
        aws.queue_url,
        aws.board,
        lambda why: woken.set(),
        Index({"i-5": "gpu-e"}),
        wait_time=timedelta(seconds=1),
    )
    thread = threading.Thread(target=source.run, args=(stop,))
    thread.start()
    try:
        aws.publish("EC2 Spot Instance Interruption Warning", itn("i-5"))
        assert woken.wait(10)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_the_loop_backs_off_on_errors_and_never_dies() -> None:
    calls: list[int] = []
    stop = threading.Event()

    def step() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("throttled")
        stop.set()

    with capture_logs() as logs:
        run_every(step, stop, 0.0, "test", Backoff(base=0.01, cap=0.02, jitter=True))
    assert len(calls) == 3
    errors = [e for e in logs if e["event"] == "source_error"]
    assert [e["failures"] for e in errors] == [1, 2]
    assert all(0.005 <= e["retry_in_s"] <= 0.02 for e in errors)


def test_backoff_grows_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(base=1, cap=8, jitter=True)
    delays = [backoff.next_delay() for _ in range(6)]
    for n, delay in enumerate(delays):
        ceiling = min(8, 2**n)
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert backoff.next_delay() <= 1


def test_spot_prices_reach_the_nodes_and_the_price_cap(aws: Aws) -> None:
    book = PriceBook()
    feed = SpotPriceFeed(
        "aws-prices", ec2_spot_prices(aws.ec2), book, lambda: [GPU_TYPE, ""], timedelta(minutes=5)
    )
    now = datetime.now(UTC)
    assert feed.refresh(now) is True
    assert feed.refresh(now + timedelta(minutes=1)) is False  # cached until due
    price = book.spot_price(GPU_TYPE, "us-east-1a")
    assert price == pytest.approx(0.00001)  # moto's constant spot price, parsed from a string

    def world() -> list[GpuNode]:
        return [
            node("gpu-busy", 1, 1),
            GpuNode(
                "gpu-idle",
                1,
                0,
                CapacityType.SPOT,
                book.spot_price(GPU_TYPE, "us-east-1a"),
                zone="us-east-1a",
                instance_type=GPU_TYPE,
            ),
        ]

    bert = job("bert", lo=1, hi=2, placement=["gpu-busy"])
    capped = decisions(NoticeBoard(), world(), [bert], cost={"max_price_per_gpu_hour": price / 2})
    assert [d.reason for d in capped] == [Reason.PRICE_CAP]
    under = decisions(NoticeBoard(), world(), [bert], cost={"max_price_per_gpu_hour": price * 2})
    assert [d.nodes for d in only(under, Action.SCALE_OUT)] == [("gpu-idle",)]


def test_config_decides_which_sources_run(aws: Aws) -> None:
    def names(settings: AwsSettings) -> list[str]:
        ctx = SourceContext(
            NoticeBoard(),
            PriceBook(),
            aws.wakes.append,
            Index(),
            lambda: [GPU_TYPE],
            shared={"aws": (aws.sqs, aws.ec2)},  # the clients every AWS source shares
        )
        return [name for name, _ in build_sources(Config(aws=settings), ctx)]

    assert names(AwsSettings(enabled=False, queue_url=aws.queue_url)) == []
    assert names(AwsSettings(enabled=True, queue_url=aws.queue_url)) == ["aws-sqs", "aws-prices"]
    assert names(AwsSettings(enabled=True, prices={"enabled": True})) == ["aws-prices"]
    no_prices = AwsSettings(enabled=True, queue_url=aws.queue_url, prices={"enabled": False})
    assert names(no_prices) == ["aws-sqs"]


def test_a_configured_source_without_its_sdk_says_which_extra_to_install(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cloud SDKs are extras (`spot-autoscaler[aws]`): a config that wants AWS on an install
    without boto3 gets one clear line, not an ImportError from deep inside an adapter."""
    for module in [m for m in sys.modules if m.startswith("autoscaler.adapters.aws")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if not installed
    ctx = SourceContext(NoticeBoard(), PriceBook(), aws.wakes.append, Index(), lambda: [GPU_TYPE])
    with pytest.raises(SdkMissing, match=r"aws-sqs .* boto3 is not installed: pip install "):
        build_sources(Config(aws=AwsSettings(enabled=True, queue_url=aws.queue_url)), ctx)


def test_a_message_a_stopping_daemon_receives_is_released_to_the_next_replica(aws: Aws) -> None:
    """The daemon stops while its long poll is under way: what that poll receives is not acted
    on but made visible again at once, so the replica taking over gets it now, not after the
    visibility timeout (a process that left the poll behind lost such notices for 10-20 s)."""
    stop = threading.Event()
    source = aws.source(
        Index({"i-6": "gpu-f"}),
        wait_time=timedelta(seconds=5),
        visibility_timeout=timedelta(seconds=60),
    )
    received: list[int] = []
    poll = threading.Thread(target=lambda: received.append(source.poll_once(stop)))
    poll.start()
    stop.set()
    aws.publish("EC2 Spot Instance Interruption Warning", itn("i-6"))
    poll.join(10)
    assert received == [1] and not aws.board.active(datetime.now(UTC))
    assert source.counts["released"] == 1
    reply = aws.sqs.receive_message(QueueUrl=aws.queue_url, WaitTimeSeconds=1)
    assert len(reply.get("Messages", [])) == 1  # hidden for 60 s without the release
    aws.sqs.delete_message(
        QueueUrl=aws.queue_url, ReceiptHandle=reply["Messages"][0]["ReceiptHandle"]
    )
