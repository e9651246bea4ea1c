"""Which cloud's metadata service this node has: the one named, or (auto) the first that answers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from autoscaler.adapters.nodeagent.azure import AZURE_METADATA_URL, AzureScheduledEvents
from autoscaler.adapters.nodeagent.gcp import DEFAULT_WAIT, GCE_METADATA_URL, GceMetadata
from autoscaler.adapters.nodeagent.metadata import (
    ALIBABA_METADATA_URL,
    AWS_METADATA_URL,
    AlibabaMetadata,
    AwsImds,
    MetadataError,
)

Service = AwsImds | AlibabaMetadata | GceMetadata | AzureScheduledEvents
PROVIDERS = ("aws", "alibaba", "gcp", "azure")


def detect(
    provider: str, metadata_url: str | None = None, interval: timedelta | None = None
) -> Service:
    """The metadata service for `provider` (one of PROVIDERS, or auto: whichever answers, in that
    order). `metadata_url` replaces the provider's address; `interval` is GCE's long-poll wait."""
    services: dict[str, Callable[[], Service]] = {
        "aws": lambda: AwsImds(metadata_url or AWS_METADATA_URL),
        "alibaba": lambda: AlibabaMetadata(metadata_url or ALIBABA_METADATA_URL),
        "gcp": lambda: GceMetadata(metadata_url or GCE_METADATA_URL, interval or DEFAULT_WAIT),
        "azure": lambda: AzureScheduledEvents(metadata_url or AZURE_METADATA_URL),
    }
    if provider != "auto":
        return services[provider]()
    for name in PROVIDERS:
        service = services[name]()
        if service.available():
            return service
    raise MetadataError("no AWS, Alibaba, GCE or Azure metadata service answers (hostNetwork?)")
