"""Instance metadata services, read from the node itself: the notices they hold right now.

AWS IMDSv2: a session token from `PUT /latest/api/token`, then `spot/instance-action` (the 2-minute
warning) and `events/recommendations/rebalance`; 404 means "no notice". Alibaba:
`instance/spot/termination-time` (404 until the instance is reclaimed).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Protocol

from autoscaler.core.model import Notice, NoticeKind
from autoscaler.times import parse_utc

AWS_METADATA_URL = "http://169.254.169.254"
ALIBABA_METADATA_URL = "http://100.100.100.200"
_TIMEOUT_S = 2.0  # link-local and answered by the hypervisor: slow means broken
_TOKEN_TTL_S = 21600  # IMDSv2's maximum; renewed a minute before it ends
# Link-local addresses must never go through an HTTP(S)_PROXY the pod may have in its environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MetadataError(RuntimeError):
    """The metadata service did not answer as documented."""


class Metadata(Protocol):
    """A node's metadata service: `notices` lists what it announces for `node` now."""

    def notices(self, node: str, now: datetime) -> list[Notice]: ...


def _request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """(status, body); 4xx/5xx are statuses, not exceptions. Network errors raise MetadataError."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with _OPENER.open(request, timeout=_TIMEOUT_S) as reply:
            return reply.status, reply.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:
        raise MetadataError(f"{url}: {exc}") from None


def _time(value: object) -> datetime:
    parsed = parse_utc(value)
    if parsed is None:
        raise MetadataError(f"not a time: {value!r}")
    return parsed


class AwsImds:
    SOURCE = "aws-imds"

    def __init__(self, base_url: str = AWS_METADATA_URL) -> None:
        self._base = base_url.rstrip("/")
        self._token: str | None = None
        self._token_until = 0.0  # monotonic

    def available(self) -> bool:
        try:
            self._fresh_token(force=True)
        except MetadataError:
            return False
        return True

    def notices(self, node: str, now: datetime) -> list[Notice]:
        out: list[Notice] = []
        action = self._get_json("/latest/meta-data/spot/instance-action")
        if action is not None:
            when = _time(action.get("time"))
            what = action.get("action", "terminate")
            out.append(_notice(node, NoticeKind.INTERRUPTION, self.SOURCE, what, when, now))
        rebalance = self._get_json("/latest/meta-data/events/recommendations/rebalance")
        if rebalance is not None:
            when = _time(rebalance.get("noticeTime"))
            out.append(_notice(node, NoticeKind.REBALANCE, self.SOURCE, "rebalance", when, now))
        return out

    def _get_json(self, path: str) -> dict[str, object] | None:
        status, body = self._get(path)
        if status == 401:  # the token expired early (e.g. IMDS restarted): one fresh try
            self._fresh_token(force=True)
            status, body = self._get(path)
        if status == 404:
            return None
        if status != 200:
            raise MetadataError(f"{path}: HTTP {status}")
        try:
            data = json.loads(body)
        except ValueError:
            raise MetadataError(f"{path}: not JSON") from None
        if not isinstance(data, dict):
            raise MetadataError(f"{path}: not a JSON object")
        return data

    def _get(self, path: str) -> tuple[int, str]:
        token = self._fresh_token()
        return _request(self._base + path, headers={"X-aws-ec2-metadata-token": token})

    def _fresh_token(self, force: bool = False) -> str:
        if force or self._token is None or time.monotonic() >= self._token_until:
            status, body = _request(
                self._base + "/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(_TOKEN_TTL_S)},
            )
            if status != 200 or not body:
                raise MetadataError(f"IMDSv2 token: HTTP {status}")
            self._token, self._token_until = body, time.monotonic() + _TOKEN_TTL_S - 60
        return self._token


class AlibabaMetadata:
    SOURCE = "alibaba-metadata"

    def __init__(self, base_url: str = ALIBABA_METADATA_URL) -> None:
        self._base = base_url.rstrip("/")

    def available(self) -> bool:
        try:
            status, _ = _request(self._base + "/latest/meta-data/instance-id")
        except MetadataError:
            return False
        return status == 200

    def notices(self, node: str, now: datetime) -> list[Notice]:
        status, body = _request(self._base + "/latest/meta-data/instance/spot/termination-time")
        if status == 404:
            return []
        if status != 200:
            raise MetadataError(f"termination-time: HTTP {status}")
        when = _time(body.strip())
        return [_notice(node, NoticeKind.INTERRUPTION, self.SOURCE, "termination", when, now)]


def _notice(
    node: str, kind: NoticeKind, source: str, what: object, when: datetime, now: datetime
) -> Notice:
    """`what@when` identifies it; a rebalance recommendation has no deadline."""
    deadline = None if kind is NoticeKind.REBALANCE else when
    return Notice(
        node=node,
        kind=kind,
        source=source,
        id=f"{what}@{when.isoformat()}",
        deadline=deadline,
        received_at=now,
    )


def detect(provider: str, metadata_url: str | None = None) -> AwsImds | AlibabaMetadata:
    """The metadata service for `provider` (aws, alibaba, or auto: whichever answers)."""
    if provider == "aws":
        return AwsImds(metadata_url or AWS_METADATA_URL)
    if provider == "alibaba":
        return AlibabaMetadata(metadata_url or ALIBABA_METADATA_URL)
    aws = AwsImds(metadata_url or AWS_METADATA_URL)
    if aws.available():
        return aws
    alibaba = AlibabaMetadata(metadata_url or ALIBABA_METADATA_URL)
    if alibaba.available():
        return alibaba
    raise MetadataError("no AWS or Alibaba metadata service answers (is hostNetwork set?)")
