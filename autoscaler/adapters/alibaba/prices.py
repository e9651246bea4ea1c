"""ECS spot prices per (instance type, zone) from DescribeSpotPriceHistory."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import structlog
from aliyunsdkcore.client import AcsClient
from aliyunsdkecs.request.v20140526.DescribeSpotPriceHistoryRequest import (
    DescribeSpotPriceHistoryRequest,
)

from autoscaler.adapters.alibaba.client import call, shared_client
from autoscaler.adapters.cloud_sources import FetchPrices, SpotPriceFeed
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config

_MAX_PAGES = 100


def ecs_spot_prices(client: AcsClient) -> FetchPrices:
    log = structlog.get_logger().bind(source="alibaba-prices")

    def fetch(instance_types: Sequence[str], now: datetime) -> dict[tuple[str, str], float]:
        prices: dict[tuple[str, str], float] = {}
        for instance_type in instance_types:  # the API takes one type per call
            newest: dict[str, tuple[str, float]] = {}  # zone -> (timestamp, price)
            for item in _history(client, instance_type):
                zone, stamp = item.get("ZoneId"), str(item.get("Timestamp", ""))
                try:
                    price = float(item["SpotPrice"])
                except (KeyError, TypeError, ValueError):
                    log.warning("spot_price_unreadable", instance_type=instance_type, zone=zone)
                    continue
                # ISO-8601 UTC stamps ("2017-09-18T11:00:00Z") sort as strings
                fresher = zone not in newest or stamp >= newest[zone][0]
                if isinstance(zone, str) and zone and fresher:
                    newest[zone] = (stamp, price)
            prices.update({(instance_type, zone): p for zone, (_, p) in newest.items()})
        return prices

    return fetch


def _history(client: AcsClient, instance_type: str) -> list[dict[str, Any]]:
    """The last few hours of prices (the API's default window), every page."""
    items: list[dict[str, Any]] = []
    offset = 0
    for _ in range(_MAX_PAGES):
        request = DescribeSpotPriceHistoryRequest()
        request.set_NetworkType("vpc")
        request.set_InstanceType(instance_type)
        request.set_OSType("linux")
        if offset:
            request.set_Offset(offset)
        reply = call(client, request)
        entries = (reply.get("SpotPrices") or {}).get("SpotPriceType") or []
        page = [p for p in entries if isinstance(p, dict)]
        items.extend(page)
        next_offset = reply.get("NextOffset")
        if not page or not isinstance(next_offset, int) or next_offset <= offset:
            return items
        offset = next_offset
    return items


def build(config: Config, ctx: SourceContext) -> SpotPriceFeed:
    """The `alibaba-prices` feed (adapters/sources.py)."""
    client, _ = shared_client(config, ctx)
    return SpotPriceFeed(
        "alibaba-prices",
        ecs_spot_prices(client),
        ctx.prices,
        ctx.instance_types,
        config.alibaba.prices.refresh,
    )
