"""EC2 spot prices per (instance type, availability zone) from DescribeSpotPriceHistory."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import structlog

from autoscaler.adapters.aws.clients import shared_clients
from autoscaler.adapters.cloud_sources import FetchPrices, SpotPriceFeed
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config


def ec2_spot_prices(ec2: Any, product_description: str = "Linux/UNIX") -> FetchPrices:
    log = structlog.get_logger().bind(source="aws-prices")

    def fetch(instance_types: Sequence[str], now: datetime) -> dict[tuple[str, str], float]:
        # StartTime=now returns, per zone, the last change at or before now: the price in force.
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(instance_types),
            ProductDescriptions=[product_description],
            StartTime=now,
        )
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        for page in pages:
            for item in page.get("SpotPriceHistory", []):
                key = (item.get("InstanceType", ""), item.get("AvailabilityZone", ""))
                try:
                    price = float(item["SpotPrice"])  # a decimal string, e.g. "0.918000"
                except (KeyError, TypeError, ValueError):
                    log.warning("spot_price_unreadable", instance_type=key[0], zone=key[1])
                    continue
                stamp = item.get("Timestamp") or now
                if key[0] and key[1] and (key not in newest or stamp >= newest[key][0]):
                    newest[key] = (stamp, price)
        return {key: price for key, (_, price) in newest.items()}

    return fetch


def build(config: Config, ctx: SourceContext) -> SpotPriceFeed:
    """The `aws-prices` feed (adapters/sources.py)."""
    _, ec2 = shared_clients(config, ctx)
    fetch = ec2_spot_prices(ec2, config.aws.product_description)
    return SpotPriceFeed(
        "aws-prices", fetch, ctx.prices, ctx.instance_types, config.aws.prices.refresh
    )
