"""boto3 clients from the `aws:` config. Credentials come only from boto3's default chain
(environment, shared profile, IRSA web identity, instance role): nothing is passed or logged here.
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config as BotoConfig

from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config
from autoscaler.config.cloud import AwsSettings


def aws_clients(settings: AwsSettings, endpoint_url: str | None = None) -> tuple[Any, Any]:
    """(sqs, ec2). `endpoint_url` is for local test servers; AWS_ENDPOINT_URL_* work as usual."""
    session = boto3.session.Session(region_name=settings.region)
    config = BotoConfig(
        # The read timeout must outlast the long poll, or every empty receive would time out.
        read_timeout=settings.wait_time.total_seconds() + 10,
        connect_timeout=5,
        retries={"mode": "standard", "max_attempts": 3},  # throttling beyond this: our backoff
    )
    return (
        session.client("sqs", config=config, endpoint_url=endpoint_url),
        session.client("ec2", config=config, endpoint_url=endpoint_url),
    )


def shared_clients(config: Config, ctx: SourceContext) -> tuple[Any, Any]:
    """(sqs, ec2), built once for every AWS source of the daemon."""
    return ctx.once("aws", lambda: aws_clients(config.aws))
