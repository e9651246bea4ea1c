"""The Alibaba sources the `alibaba:` config asks for, ready for the daemon to run on threads."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from aliyunsdkcore.client import AcsClient

from autoscaler.adapters.alibaba.client import make_client
from autoscaler.adapters.alibaba.cloudmonitor import CloudMonitorPoller
from autoscaler.adapters.alibaba.nodes import EcsNodes
from autoscaler.adapters.alibaba.prices import ecs_spot_prices
from autoscaler.adapters.alibaba.recycling import RecyclingPoller
from autoscaler.adapters.alibaba.webhook import CloudMonitorWebhook
from autoscaler.adapters.cloud_sources import NamedSource, NodeIndex, SpotPriceFeed
from autoscaler.boards import NoticeBoard, PriceBook, Wake
from autoscaler.config.cloud import AlibabaSettings


def alibaba_sources(
    settings: AlibabaSettings,
    board: NoticeBoard,
    book: PriceBook,
    wake: Wake,
    index: NodeIndex,
    instance_types: Callable[[], Iterable[str]],
    client: AcsClient | None = None,
) -> list[NamedSource]:
    """(name, source) pairs; [] when `alibaba.enabled` is false. `client` is for tests."""
    if not settings.enabled:
        return []
    client = client or make_client(settings)
    # One name table for all three: the CloudMonitor sources reuse the IPs the poller learns.
    nodes = EcsNodes(index, settings.region or "")
    poller = RecyclingPoller(client, board, wake, nodes, interval=settings.poll_interval)
    out: list[NamedSource] = [("alibaba-ecs", poller)]
    monitor = settings.cloudmonitor
    if monitor.enabled:
        out.append(
            (
                "alibaba-cloudmonitor",
                CloudMonitorPoller(
                    client,
                    board,
                    wake,
                    nodes,
                    interval=monitor.poll_interval,
                    lookback=monitor.lookback,
                ),
            )
        )
    hook = settings.webhook
    if hook.enabled:
        out.append(
            (
                "alibaba-webhook",
                CloudMonitorWebhook(
                    board,
                    wake,
                    nodes,
                    host=hook.host,
                    port=hook.port,
                    path=hook.path,
                    token=_token(hook.token_env),
                ),
            )
        )
    if settings.prices.enabled:
        fetch = ecs_spot_prices(client)
        out.append(
            (
                "alibaba-prices",
                SpotPriceFeed(
                    "alibaba-prices",
                    fetch,
                    book,
                    instance_types,
                    settings.prices.refresh,
                ),
            )
        )
    return out


def _token(env: str | None) -> str | None:
    if env is None:
        return None
    token = os.environ.get(env)
    if not token:  # fail closed: a configured but missing token must not open the endpoint
        raise ValueError(f"alibaba.webhook.token_env: ${env} is not set")
    return token
