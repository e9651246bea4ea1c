"""The AWS sources the `aws:` config asks for, ready for the daemon to run on threads."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from autoscaler.adapters.aws.clients import aws_clients
from autoscaler.adapters.aws.nodes import Ec2Nodes
from autoscaler.adapters.aws.prices import ec2_spot_prices
from autoscaler.adapters.aws.queue import SOURCE, SqsNoticeSource
from autoscaler.adapters.cloud_sources import NamedSource, NodeIndex, SpotPriceFeed
from autoscaler.boards import NoticeBoard, PriceBook, Wake
from autoscaler.config.cloud import AwsSettings


def aws_sources(
    settings: AwsSettings,
    board: NoticeBoard,
    book: PriceBook,
    wake: Wake,
    index: NodeIndex,
    instance_types: Callable[[], Iterable[str]],
    clients: tuple[Any, Any] | None = None,
) -> list[NamedSource]:
    """(name, source) pairs; [] when `aws.enabled` is false. `clients` = (sqs, ec2) for tests."""
    if not settings.enabled:
        return []
    sqs, ec2 = clients or aws_clients(settings)
    out: list[NamedSource] = []
    if settings.queue_url:
        out.append(
            (
                SOURCE,
                SqsNoticeSource(
                    sqs,
                    settings.queue_url,
                    board,
                    wake,
                    Ec2Nodes(ec2, index),
                    wait_time=settings.wait_time,
                    max_messages=settings.max_messages,
                    visibility_timeout=settings.visibility_timeout,
                ),
            )
        )
    if settings.prices.enabled:
        fetch = ec2_spot_prices(ec2, settings.product_description)
        out.append(
            (
                "aws-prices",
                SpotPriceFeed(
                    "aws-prices",
                    fetch,
                    book,
                    instance_types,
                    settings.prices.refresh,
                ),
            )
        )
    return out
