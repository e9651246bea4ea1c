"""The Alibaba sources through the real aliyunsdkcore client against a local HTTP server that checks
each request's HMAC-SHA1 signature and answers with the documented JSON (ECS DescribeInstances and
DescribeSpotPriceHistory, CloudMonitor DescribeSystemEventAttribute), plus the CloudMonitor
webhook over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import pytest
from alibabacloud_credentials.provider import (
    StaticAKCredentialsProvider,
    StaticSTSCredentialsProvider,
)
from aliyunsdkcore.acs_exception.exceptions import ServerException
from cloud_fixtures import Index
from core_fixtures import job, node, only, policies, snapshot
from structlog.testing import capture_logs
from support.http import serving

from autoscaler.adapters.alibaba.client import make_client
from autoscaler.adapters.alibaba.cloudmonitor import EVENT_NAME, CloudMonitorPoller
from autoscaler.adapters.alibaba.nodes import EcsNodes
from autoscaler.adapters.alibaba.prices import ecs_spot_prices
from autoscaler.adapters.alibaba.recycling import RecyclingPoller
from autoscaler.adapters.alibaba.webhook import CloudMonitorWebhook
from autoscaler.adapters.cloud_sources import SpotPriceFeed
from autoscaler.adapters.sources import SourceContext, build_sources
from autoscaler.config import Config
from autoscaler.config.cloud import AlibabaSettings
from autoscaler.core import Action, CapacityType, GpuNode, NoticeKind, decide
from autoscaler.notices_and_prices import NoticeBoard, NoticeWake, PriceBook

REGION = "cn-hangzhou"
KEY_ID, SECRET = "LTAI5tTestKeyId0000000000", "test-secret-do-not-log"
GPU_TYPE = "ecs.gn6i-c4g1.xlarge"
ROOT = Path(__file__).resolve().parents[1]


def _enc(value: str) -> str:
    return quote(value, safe="~")  # RFC 3986, as Alibaba's RPC signature wants


def rpc_signature(method: str, params: dict[str, str], secret: str) -> str:
    canonical = "&".join(f"{_enc(k)}={_enc(v)}" for k, v in sorted(params.items()))
    to_sign = f"{method}&{_enc('/')}&{_enc(canonical)}"
    digest = hmac.new(f"{secret}&".encode(), to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def instance(iid: str, ip: str, spot: str = "SpotAsPriceGo", locks: tuple[str, ...] = ()) -> dict:
    return {
        "InstanceId": iid,
        "InstanceType": GPU_TYPE,
        "ZoneId": "cn-hangzhou-i",
        "Status": "Running",
        "SpotStrategy": spot,
        "GPUAmount": 1,
        "InstanceChargeType": "PostPaid",
        "VpcAttributes": {"PrivateIpAddress": {"IpAddress": [ip]}, "VpcId": "vpc-1"},
        "OperationLocks": {"LockReason": [{"LockReason": r} for r in locks]},
    }


def cms_event(iid: str, at: datetime, content: str = "", name: str = EVENT_NAME) -> dict:
    return {
        "Product": "ECS",
        "Name": name,
        "Level": "WARN",
        "Status": "Normal",
        "RegionId": REGION,
        "ResourceId": f"acs:ecs:{REGION}:1234567890:instance/{iid}",
        "InstanceName": iid,
        "GroupId": "0",
        "Time": int(at.timestamp() * 1000),
        "Content": content or json.dumps({"instanceId": iid, "action": "delete"}),
    }


@dataclass
class FakeAlibaba:
    """ECS and CloudMonitor RPC endpoints: signed requests in, documented JSON out."""

    secrets: dict[str, str] = field(default_factory=lambda: {KEY_ID: SECRET})
    instances: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    prices: dict[str, list[dict]] = field(default_factory=dict)
    price_page: int = 2  # entries per DescribeSpotPriceHistory page: small, to make it page
    fail: list[str] = field(default_factory=list)  # error codes to answer before serving again
    calls: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def serve(self, request: BaseHTTPRequestHandler) -> tuple[int, dict]:
        params = dict(parse_qsl(urlsplit(request.path).query, keep_blank_values=True))
        length = int(request.headers.get("Content-Length") or 0)
        params.update(parse_qsl(request.rfile.read(length).decode(), keep_blank_values=True))
        self.calls.append(params)
        signature = params.pop("Signature", "")
        secret = self.secrets.get(params.get("AccessKeyId", ""))
        if secret is None:
            return 404, {"Code": "InvalidAccessKeyId.NotFound", "Message": "key not found"}
        if not hmac.compare_digest(signature, rpc_signature(request.command, params, secret)):
            return 400, {"Code": "SignatureDoesNotMatch", "Message": "signature not matched"}
        if self.fail:
            return 400, {"Code": self.fail.pop(0), "Message": "denied due to user flow control"}
        handler = getattr(self, params.get("Action", ""), None)
        if handler is None:
            return 404, {"Code": "InvalidAction.NotFound", "Message": "Specified api is not found."}
        return 200, {"RequestId": "5A4C-TEST", **handler(params)}

    def DescribeInstances(self, q: dict[str, str]) -> dict:  # noqa: N802 - the API's name
        size = min(int(q.get("MaxResults", 10)), 100)
        start = int(q.get("NextToken") or 0)
        page = self.instances[start : start + size]
        more = start + size < len(self.instances)
        return {"Instances": {"Instance": page}, "NextToken": str(start + size) if more else ""}

    def DescribeSystemEventAttribute(self, q: dict[str, str]) -> dict:  # noqa: N802
        lo, hi = int(q["StartTime"]), int(q["EndTime"])
        hits = [e for e in self.events if e["Name"] == q.get("Name") and lo <= e["Time"] <= hi]
        size, number = int(q.get("PageSize", 10)), int(q.get("PageNumber", 1))
        page = hits[(number - 1) * size : number * size]
        return {
            "Code": "200",
            "Success": "true",
            "Message": "success",
            "SystemEvents": {"SystemEvent": page},
        }

    def DescribeSpotPriceHistory(self, q: dict[str, str]) -> dict:  # noqa: N802
        assert q["NetworkType"] == "vpc"
        offset = int(q.get("Offset") or 0)
        history = self.prices.get(q["InstanceType"], [])
        page = history[offset : offset + self.price_page]
        return {
            "Currency": "CNY",
            "NextOffset": offset + len(page),
            "SpotPrices": {"SpotPriceType": page},
        }

    def actions(self, name: str) -> int:
        return sum(1 for c in self.calls if c.get("Action") == name)


@pytest.fixture
def ali() -> Iterator[FakeAlibaba]:
    fake = FakeAlibaba()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            status, payload = fake.serve(self)
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json;charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as address:
        fake.url = address
        yield fake


@dataclass
class Daemonish:
    """The daemon's side: the board, the price book and a wake callback that records why."""

    board: NoticeBoard = field(default_factory=NoticeBoard)
    book: PriceBook = field(default_factory=PriceBook)
    wakes: list[str] = field(default_factory=list)

    def wake(self, why: str) -> None:
        self.wakes.append(why)

    def decide(self, nodes: list[GpuNode], jobs: list[Any], **policy: Any) -> list[Any]:
        now = datetime.now(UTC)
        return decide(snapshot(nodes, jobs, list(self.board.active(now))), policies(**policy), now)


def settings(fake: FakeAlibaba, **kw: Any) -> AlibabaSettings:
    return AlibabaSettings(
        enabled=True, region=REGION, ecs_endpoint=fake.url, cms_endpoint=fake.url, **kw
    )


def client(fake: FakeAlibaba, provider: Any = None) -> Any:
    provider = provider or StaticAKCredentialsProvider(
        access_key_id=KEY_ID, access_key_secret=SECRET
    )
    return make_client(settings(fake), provider)


def test_a_recycling_lock_drains_and_scales_in_the_workers_on_that_node(ali: FakeAlibaba) -> None:
    ali.instances = [instance(f"i-bp{n:04d}", f"10.0.{n // 200}.{n % 200}") for n in range(150)]
    target = ali.instances[120]  # on the second page: found only by paging
    d = Daemonish()
    nodes = EcsNodes(Index({"i-bp0120": "gpu-a"}), REGION)
    poller = RecyclingPoller(client(ali), d.board, d.wake, nodes)
    assert poller.poll_once() == 0 and d.wakes == []
    assert ali.actions("DescribeInstances") == 2

    target["OperationLocks"]["LockReason"].append({"LockReason": "recycling"})  # any case
    before = datetime.now(UTC)
    assert poller.poll_once() == 1
    assert d.wakes == [NoticeWake("alibaba: interruption on gpu-a")]
    [notice] = d.board.active(datetime.now(UTC))
    assert notice.kind is NoticeKind.INTERRUPTION and notice.node == "gpu-a"
    lead = timedelta(minutes=5)
    assert before + lead <= notice.deadline <= datetime.now(UTC) + lead

    poller.poll_once()  # still locked: the same notice, no second wake
    assert len(d.wakes) == 1 and poller.counts["duplicate"] == 1

    bert = job("bert", lo=1, hi=4, placement=["gpu-a", "gpu-a", "gpu-b"])
    out = d.decide([node("gpu-a", 8, 2), node("gpu-b", 8, 1)], [bert])
    [drain], [scale_in] = only(out, Action.DRAIN), only(out, Action.SCALE_IN)
    assert scale_in.pods == ("bert-worker-0", "bert-worker-1") == drain.pods


def test_only_spot_instances_and_only_recycling_locks_count(ali: FakeAlibaba) -> None:
    ali.instances = [
        instance("i-ondemand", "10.0.0.1", spot="NoSpot", locks=("Recycling",)),
        instance("i-overdue", "10.0.0.2", locks=("financial",)),
        instance("i-reclaimed", "10.0.0.3", locks=("Recycling",)),
    ]
    d = Daemonish()
    poller = RecyclingPoller(client(ali), d.board, d.wake, EcsNodes(Index(), REGION))
    assert poller.poll_once() == 1
    # not in the index: ACK's default node name, <region>.<private ip>
    assert [n.node for n in d.board.active(datetime.now(UTC))] == [f"{REGION}.10.0.0.3"]


def test_cloudmonitor_events_are_polled_and_dedup_with_the_lock(ali: FakeAlibaba) -> None:
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    ali.events = [
        cms_event("i-bp1", at),
        cms_event("i-bp2", at, content="{garbage"),
        cms_event("i-bp3", at, name="Instance:SystemMaintenance.Reboot"),
        cms_event("i-bp4", at - timedelta(hours=1)),  # outside the lookback window
    ]
    d = Daemonish()
    nodes = EcsNodes(Index({"i-bp1": "gpu-a", "i-bp4": "gpu-d"}), REGION)
    with capture_logs() as logs:
        monitor = CloudMonitorPoller(client(ali), d.board, d.wake, nodes)
        assert monitor.poll_once() == 1
    [notice] = d.board.active(datetime.now(UTC))
    assert (notice.node, notice.deadline) == ("gpu-a", at + timedelta(minutes=5))
    assert monitor.counts["unparsable"] == 1
    assert any(e["event"] == "event_unparsable" for e in logs)

    ali.instances = [instance("i-bp1", "10.0.0.1", locks=("Recycling",))]
    RecyclingPoller(client(ali), d.board, d.wake, nodes).poll_once()
    assert d.wakes == [NoticeWake("alibaba: interruption on gpu-a")]  # one reclaim, one wake


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def callback_body(iid: str) -> bytes:
    return json.dumps(
        {
            "product": "ECS",
            "resourceId": f"acs:ecs:{REGION}:1234567890:instance/{iid}",
            "level": "WARN",
            "instanceName": iid,
            "regionId": REGION,
            "groupId": "0",
            "name": EVENT_NAME,
            "status": "Normal",
            "content": {"instanceId": iid, "action": "delete"},
        }
    ).encode()


@pytest.fixture
def webhook() -> Iterator[tuple[CloudMonitorWebhook, Daemonish, str]]:
    d = Daemonish()
    hook = CloudMonitorWebhook(
        d.board, d.wake, Index({"i-bp1": "gpu-a"}), host="127.0.0.1", port=0, token="s3cret"
    )
    hook.start()
    yield hook, d, f"http://127.0.0.1:{hook.port}"
    hook.stop()


def test_the_webhook_posts_pushed_events_and_refuses_garbage(
    webhook: tuple[CloudMonitorWebhook, Daemonish, str],
) -> None:
    hook, d, url = webhook
    assert post(f"{url}/cloudmonitor", callback_body("i-bp1")) == 403  # no token
    assert post(f"{url}/cloudmonitor?token=wrong", callback_body("i-bp1")) == 403
    assert post(f"{url}/cloudmonitor?token=s3cret", callback_body("i-bp1")) == 200
    assert d.wakes == [NoticeWake("alibaba: interruption on gpu-a")]
    assert post(f"{url}/cloudmonitor?token=s3cret", callback_body("i-bp1")) == 200  # a retry
    assert len(d.wakes) == 1
    assert post(f"{url}/cloudmonitor?token=s3cret", b"{not json") == 400
    no_instance = json.dumps({"name": EVENT_NAME}).encode()
    assert post(f"{url}/cloudmonitor?token=s3cret", no_instance) == 400
    assert post(f"{url}/cloudmonitor?token=s3cret", callback_body("i-unknown")) == 200
    assert post(f"{url}/elsewhere?token=s3cret", callback_body("i-bp1")) == 404
    assert (hook.counts["unparsable"], hook.counts["unknown_instance"]) == (2, 1)
    assert hook.counts["forbidden"] == 2


def test_the_webhook_runs_until_stopped() -> None:
    hook = CloudMonitorWebhook(NoticeBoard(), print, Index(), host="127.0.0.1", port=0)
    stop = threading.Event()
    stop.set()
    hook.run(stop)  # serves, sees the stop, closes its socket and returns
    with pytest.raises(AssertionError):
        hook.port  # noqa: B018 - no socket any more


def test_spot_prices_are_paged_newest_per_zone_and_feed_the_price_cap(ali: FakeAlibaba) -> None:
    ali.prices[GPU_TYPE] = [
        {
            "ZoneId": z,
            "InstanceType": GPU_TYPE,
            "NetworkType": "vpc",
            "IoOptimized": "optimized",
            "SpotPrice": p,
            "OriginPrice": 10.9,
            "Timestamp": t,
        }
        for z, p, t in [
            ("cn-hangzhou-i", 2.1, "2026-03-02T10:00:00Z"),
            ("cn-hangzhou-j", 1.5, "2026-03-02T10:00:00Z"),
            ("cn-hangzhou-i", 2.4, "2026-03-02T11:00:00Z"),
            ("cn-hangzhou-j", 1.2, "2026-03-02T11:00:00Z"),
            ("cn-hangzhou-k", 0.9, "2026-03-02T11:00:00Z"),
        ]
    ]
    d = Daemonish()
    feed = SpotPriceFeed(
        "alibaba-prices",
        ecs_spot_prices(client(ali)),
        d.book,
        lambda: [GPU_TYPE],
        timedelta(minutes=5),
    )
    assert feed.refresh(datetime.now(UTC))
    assert ali.actions("DescribeSpotPriceHistory") == 4  # 5 entries, 2 a page, then an empty one
    assert d.book.spot_price(GPU_TYPE, "cn-hangzhou-i") == 2.4
    assert d.book.spot_price(GPU_TYPE, "cn-hangzhou-j") == 1.2
    assert d.book.spot_price(GPU_TYPE) == 0.9  # the type's cheapest zone

    def gpu(name: str, zone: str) -> GpuNode:
        return GpuNode(
            name,
            1,
            0,
            CapacityType.SPOT,
            d.book.spot_price(GPU_TYPE, zone),
            zone=zone,
            instance_type=GPU_TYPE,
        )

    bert = job("bert", lo=1, hi=3, placement=["gpu-busy"])
    world = [
        node("gpu-busy", 1, 1),
        gpu("gpu-dear", "cn-hangzhou-i"),
        gpu("gpu-cheap", "cn-hangzhou-j"),
    ]
    out = d.decide(world, [bert], cost={"max_price_per_gpu_hour": 2.0})
    [grow] = only(out, Action.SCALE_OUT)
    assert grow.nodes == ("gpu-cheap",) and grow.count == 1  # 2.4/GPU-h is above the cap
    [uncapped] = only(d.decide(world, [bert]), Action.SCALE_OUT)
    assert uncapped.nodes == ("gpu-cheap", "gpu-dear")


def test_api_errors_propagate_from_a_poll_and_the_loop_recovers(ali: FakeAlibaba) -> None:
    ali.instances = [instance("i-bp1", "10.0.0.1", locks=("Recycling",))]
    ali.fail = ["Throttling.User"]
    d = Daemonish()
    nodes = EcsNodes(Index({"i-bp1": "gpu-a"}), REGION)
    poller = RecyclingPoller(client(ali), d.board, d.wake, nodes, interval=timedelta(seconds=0.05))
    with pytest.raises(ServerException):
        poller.poll_once()
    ali.fail = ["Throttling.User"]
    woken, stop = threading.Event(), threading.Event()
    poller = RecyclingPoller(
        client(ali), d.board, lambda why: woken.set(), nodes, interval=timedelta(seconds=0.05)
    )
    thread = threading.Thread(target=poller.run, args=(stop,))
    thread.start()
    try:
        assert woken.wait(10)  # after one backoff of at most a second
    finally:
        stop.set()
        thread.join(5)


def test_temporary_credentials_send_their_security_token(ali: FakeAlibaba) -> None:
    ali.secrets["STS.tmp-id"] = "tmp-secret"
    sts = StaticSTSCredentialsProvider(
        access_key_id="STS.tmp-id", access_key_secret="tmp-secret", security_token="tok-123"
    )
    d = Daemonish()
    RecyclingPoller(client(ali, sts), d.board, d.wake, EcsNodes(Index(), REGION)).poll_once()
    assert ali.calls[-1]["SecurityToken"] == "tok-123"


def test_the_default_chain_signs_with_env_keys_and_never_logs_them(ali: FakeAlibaba) -> None:
    script = (
        "from autoscaler.logs import configure; configure(json_lines=True, level='debug');"
        "from autoscaler.adapters.alibaba.client import make_client;"
        "from autoscaler.adapters.alibaba.recycling import RecyclingPoller;"
        "from autoscaler.adapters.alibaba.nodes import EcsNodes;"
        "from autoscaler.config.cloud import AlibabaSettings;"
        "from autoscaler.notices_and_prices import NoticeBoard;"
        f"s = AlibabaSettings(enabled=True, region='{REGION}', ecs_endpoint='{ali.url}');"
        "idx = type('I', (), {'node_for_instance': lambda self, i: 'gpu-a'})();"
        "p = RecyclingPoller(make_client(s), NoticeBoard(), print, EcsNodes(idx, s.region));"
        "print('recycling', p.poll_once())"
    )
    ali.instances = [instance("i-bp1", "10.0.0.1", locks=("Recycling",))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALIBABA_CLOUD_", "ALIYUN_"))}
    env |= {
        "ALIBABA_CLOUD_ACCESS_KEY_ID": KEY_ID,
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET,
        "ALIBABA_CLOUD_ECS_METADATA_DISABLED": "true",
        "ALIBABA_CLOUD_CLI_PROFILE_DISABLED": "true",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "recycling 1" in done.stdout and "notice_posted" in done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert ali.calls and ali.calls[-1]["AccessKeyId"] == KEY_ID


def test_config_decides_which_sources_run(
    ali: FakeAlibaba,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = Daemonish()
    index = Index()

    def names(alibaba: AlibabaSettings) -> list[str]:
        ctx = SourceContext(
            d.board,
            d.book,
            d.wake,
            index,
            lambda: [GPU_TYPE],
            shared={"alibaba": (client(ali), EcsNodes(index, REGION))},
        )
        return [name for name, _ in build_sources(Config(alibaba=alibaba), ctx)]

    assert names(AlibabaSettings()) == []
    assert names(settings(ali)) == ["alibaba-ecs", "alibaba-cloudmonitor", "alibaba-prices"]
    every = settings(ali, webhook={"enabled": True, "port": 0, "token_env": "HOOK_TOKEN"})
    with pytest.raises(ValueError, match="HOOK_TOKEN"):
        names(every)  # a configured token that is missing fails closed
    monkeypatch.setenv("HOOK_TOKEN", "t")
    assert "alibaba-webhook" in names(every)
    quiet = settings(ali, cloudmonitor={"enabled": False}, prices={"enabled": False})
    assert names(quiet) == ["alibaba-ecs"]
