"""Every notice source and price feed the daemon can run, one entry each, selected by config.

An entry names its source (the errors_total component it reports as), says from the config
alone whether it is wanted, and where its builder lives: a source nobody wants is never imported,
so a standalone daemon (or a cluster without a cloud account) loads neither boto3 nor the
Alibaba SDK. The sources of one cloud share that cloud's clients and instance-name table, built
once per daemon (`SourceContext.once`).

Not here, because they are not threads of the daemon: Kubernetes taints and cordons (read by the
observer from its Node cache, adapters/kube/nodes.py) and the node agent (its own program,
writing the notice annotation on its Node).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from autoscaler.adapters.cloud_sources import NamedSource, NodeIndex, Source
from autoscaler.config import Config
from autoscaler.notices_and_prices import NoticeBoard, PriceBook, Wake

T = TypeVar("T")


@dataclass
class SourceContext:
    """What a builder may use: where notices and prices go, and the cluster's instance names."""

    board: NoticeBoard
    prices: PriceBook
    wake: Wake
    index: NodeIndex
    instance_types: Callable[[], Iterable[str]]
    shared: dict[str, Any] = field(default_factory=dict)  # per cloud: its clients (tests seed it)

    def once(self, key: str, make: Callable[[], T]) -> T:
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]  # type: ignore[no-any-return]


class SdkMissing(RuntimeError):
    """A configured source's cloud SDK is not installed (it is an extra of the package)."""


@dataclass(frozen=True)
class SourceEntry:
    name: str
    wanted: Callable[[Config], bool]
    builder: str  # "module:function(config, ctx) -> Source", imported only when wanted
    extra: str  # the package extra that installs its SDK: `pip install 'spot-autoscaler[X]'`

    def build(self, config: Config, ctx: SourceContext) -> Source:
        module, function = self.builder.split(":")
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("autoscaler"):
                raise
            raise SdkMissing(
                f"{self.name} is configured ({self.extra}.enabled) but {exc.name} is not "
                f"installed: pip install 'spot-autoscaler[{self.extra}]' (the image has it)"
            ) from None
        make: Callable[[Config, SourceContext], Source] = getattr(found, function)
        return make(config, ctx)


_AWS, _ALI = "autoscaler.adapters.aws", "autoscaler.adapters.alibaba"
SOURCES: tuple[SourceEntry, ...] = (
    SourceEntry(
        "aws-sqs",
        lambda c: c.aws.enabled and bool(c.aws.queue_url),
        f"{_AWS}.queue:build",
        "aws",
    ),
    SourceEntry(
        "aws-prices",
        lambda c: c.aws.enabled and c.aws.prices.enabled,
        f"{_AWS}.prices:build",
        "aws",
    ),
    SourceEntry("alibaba-ecs", lambda c: c.alibaba.enabled, f"{_ALI}.recycling:build", "alibaba"),
    SourceEntry(
        "alibaba-cloudmonitor",
        lambda c: c.alibaba.enabled and c.alibaba.cloudmonitor.enabled,
        f"{_ALI}.cloudmonitor:build",
        "alibaba",
    ),
    SourceEntry(
        "alibaba-webhook",
        lambda c: c.alibaba.enabled and c.alibaba.webhook.enabled,
        f"{_ALI}.webhook:build",
        "alibaba",
    ),
    SourceEntry(
        "alibaba-prices",
        lambda c: c.alibaba.enabled and c.alibaba.prices.enabled,
        f"{_ALI}.prices:build",
        "alibaba",
    ),
)


def build_sources(config: Config, ctx: SourceContext) -> list[NamedSource]:
    """(name, source) for every source the config wants, in registry order."""
    return [(entry.name, entry.build(config, ctx)) for entry in SOURCES if entry.wanted(config)]
