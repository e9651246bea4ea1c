"""An aliyunsdkcore client signed from Alibaba's default credential chain, and one-call helper.

aliyunsdkcore alone knows static keys and the ECS RAM role; RRSA (OIDC, what ACK pods use) lives in
`alibabacloud_credentials`. Its default chain reads ALIBABA_CLOUD_ACCESS_KEY_ID/SECRET (and
ALIBABA_CLOUD_SECURITY_TOKEN), RRSA's ALIBABA_CLOUD_ROLE_ARN/OIDC_PROVIDER_ARN/OIDC_TOKEN_FILE,
the credentials file and the ECS RAM role, refreshing temporary keys itself. Nothing here logs them.
"""

from __future__ import annotations

import json
from typing import Any

from alibabacloud_credentials.provider import DefaultCredentialsProvider
from alibabacloud_credentials_api import ICredentialsProvider
from aliyunsdkcore.auth.credentials import AccessKeyCredential
from aliyunsdkcore.auth.signers.signer import Signer
from aliyunsdkcore.client import AcsClient
from aliyunsdkcore.request import AcsRequest

from autoscaler.adapters.alibaba.nodes import EcsNodes
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config
from autoscaler.config.cloud import AlibabaSettings

_TIMEOUT_S = 10  # connect and read: a hung API call must not stall a 15 s poll loop for long


class ChainSigner(Signer):
    """Signs each request with the chain's current keys (fetched once per request, so an id and
    secret from two different refreshes are never mixed)."""

    def __init__(self, provider: ICredentialsProvider) -> None:
        self._provider = provider

    def sign(self, region_id: str, request: AcsRequest) -> tuple[dict[str, str], str]:
        cred = self._provider.get_credentials()
        key_id, secret = cred.get_access_key_id(), cred.get_access_key_secret()
        token = cred.get_security_token()
        if token:
            if request.get_style() == "RPC":
                request.add_query_param("SecurityToken", token)
            else:
                request.add_header("x-acs-security-token", token)
        header = request.get_signed_header(region_id, key_id, secret)
        return header, request.get_url(region_id, key_id, secret)


def make_client(
    settings: AlibabaSettings, provider: ICredentialsProvider | None = None
) -> AcsClient:
    """A client for the configured region (ECS and CloudMonitor); `provider` overrides the chain."""
    region = settings.region or ""
    # The placeholder key only satisfies AcsClient's constructor; the chain signer replaces it
    # (the SDK has no public hook for a refreshing credential source).
    client = AcsClient(
        region_id=region,
        credential=AccessKeyCredential("unused", "unused"),
        auto_retry=False,  # our poll loop backs off with jitter instead of sleeping in the SDK
        connect_timeout=_TIMEOUT_S,
        timeout=_TIMEOUT_S,
    )
    client._signer = ChainSigner(provider or DefaultCredentialsProvider())
    for product, endpoint in (("Ecs", settings.ecs_endpoint), ("Cms", settings.cms_endpoint)):
        if endpoint:
            client.add_endpoint(region, product, endpoint)
    return client


def call(client: AcsClient, request: AcsRequest) -> dict[str, Any]:
    """Send one request; the JSON reply. SDK Client/ServerExceptions propagate."""
    reply = json.loads(client.do_action_with_exception(request))
    if not isinstance(reply, dict):
        raise ValueError(f"{request.get_action_name()}: reply is not a JSON object")
    return reply


def shared_client(config: Config, ctx: SourceContext) -> tuple[AcsClient, EcsNodes]:
    """The client and the instance-name table every Alibaba source of the daemon shares (the
    CloudMonitor sources reuse the IPs the Recycling poller learns)."""
    settings = config.alibaba
    return ctx.once(
        "alibaba", lambda: (make_client(settings), EcsNodes(ctx.index, settings.region or ""))
    )
