"""`aws:` and `alibaba:` sections: cloud notice sources and spot price feeds.

No credentials live here: AWS uses boto3's default chain (env, profile, IRSA, instance role) and
Alibaba the default credential chain (ALIBABA_CLOUD_ACCESS_KEY_ID/SECRET, RRSA OIDC, ECS RAM role).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from autoscaler.core.policy import Duration, StrictModel

Port = Annotated[int, Field(ge=0, le=65535)]  # 0 = any free port (tests)


class SpotPriceSettings(StrictModel):
    """A live spot price feed; its prices override `prices.spot` for the types in the cluster."""

    enabled: bool = True  # false: only the static `prices` tables
    refresh: Duration = timedelta(minutes=5)  # how often the feed is read


class AwsSettings(StrictModel):
    """AWS notices (EventBridge -> SQS) and spot prices (EC2 DescribeSpotPriceHistory)."""

    enabled: bool = False  # true: needs boto3 and credentials (IRSA, instance profile, env)
    region: str | None = None  # None: boto3's default (AWS_REGION, profile, instance metadata)
    # The SQS queue an EventBridge rule feeds (see docs/cloud.md); None: no queue consumer.
    queue_url: str | None = None
    # Long poll as NTH and Karpenter do; the visibility timeout hides a message while we handle it.
    wait_time: Annotated[Duration, Field(ge=timedelta(0), le=timedelta(seconds=20))] = timedelta(
        seconds=20
    )
    max_messages: Annotated[int, Field(ge=1, le=10)] = 10  # per ReceiveMessage (SQS allows 10)
    # a received message stays hidden this long; one we could not handle comes back after it
    visibility_timeout: Annotated[Duration, Field(ge=timedelta(0))] = timedelta(seconds=20)
    product_description: str = "Linux/UNIX"  # the spot price series to follow
    prices: SpotPriceSettings = SpotPriceSettings()


class CloudMonitorSettings(StrictModel):
    """Poll CloudMonitor for `Instance:PreemptibleInstanceInterruption` events."""

    enabled: bool = True  # false: no CloudMonitor polling (DescribeInstances still runs)
    poll_interval: Duration = timedelta(seconds=15)  # between DescribeSystemEventAttribute calls
    lookback: Duration = timedelta(minutes=10)  # first poll: how far back events still matter


class WebhookSettings(StrictModel):
    """A local endpoint for CloudMonitor's URL callback (POST, JSON event body)."""

    enabled: bool = False  # true: listen for CloudMonitor's callback
    host: str = "0.0.0.0"  # a cluster Service in front of the daemon reaches it
    port: Port = 8089  # the callback's port
    path: str = "/cloudmonitor"  # the callback URL's path (must start with /)
    # Name of an env var holding a shared token the callback URL must carry as `?token=`.
    # None accepts any caller: only for a port no one outside the cluster can reach.
    token_env: str | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with /")
        return value


class AlibabaSettings(StrictModel):
    """Alibaba Cloud notices (ECS DescribeInstances, CloudMonitor events or callback) and prices."""

    enabled: bool = False  # true: needs aliyun-python-sdk-ecs and credentials (RRSA, env)
    region: str | None = None  # required when enabled, e.g. cn-hangzhou
    # DescribeInstances poll for the Recycling lock: ~5 min of notice, so poll well inside it.
    poll_interval: Annotated[Duration, Field(gt=timedelta(0), le=timedelta(seconds=30))] = (
        timedelta(seconds=15)
    )
    ecs_endpoint: str | None = None  # host[:port]; None: the SDK's endpoint for the region
    cms_endpoint: str | None = None  # CloudMonitor host[:port]; null: the SDK's for the region
    cloudmonitor: CloudMonitorSettings = CloudMonitorSettings()
    webhook: WebhookSettings = WebhookSettings()
    prices: SpotPriceSettings = SpotPriceSettings()

    @model_validator(mode="after")
    def _region_when_enabled(self) -> AlibabaSettings:
        if self.enabled and not self.region:
            raise ValueError("alibaba.region is required when alibaba.enabled is true")
        return self
