"""Instance metadata services, read from the node itself: the notices they hold right now.

What every cloud's reader shares (one HTTP call, one notice), and the two simplest readers. AWS
IMDSv2: a session token from `PUT /latest/api/token`, then `spot/instance-action` (the 2-minute
warning) and `events/recommendations/rebalance`; 404 means "no notice". Alibaba:
`instance/spot/termination-time` (404 until the instance is reclaimed). GCE and Azure: gcp.py and
azure.py.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import Message
from typing import Protocol, runtime_checkable

from autoscaler.core.model import Notice, NoticeKind
from autoscaler.times import parse_utc

AWS_METADATA_URL = "http://169.254.169.254"
ALIBABA_METADATA_URL = "http://100.100.100.200"
TIMEOUT_S = 2.0  # link-local and answered by the hypervisor: slow means broken
_TOKEN_TTL_S = 21600  # IMDSv2's maximum; renewed a minute before it ends
# Link-local addresses must never go through an HTTP(S)_PROXY the pod may have in its environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MetadataError(RuntimeError):
    """The metadata service did not answer as documented."""


class Metadata(Protocol):
    """A node's metadata service: `notices` lists what it announces for `node` now; `interval`
    is how often to ask by default."""

    interval: timedelta

    def notices(self, node: str, now: datetime) -> list[Notice]: ...


@runtime_checkable
class Acknowledging(Protocol):
    """A service that waits for the node to say it is ready (Azure's Scheduled Events): called
    after every poll whose notice is on the Node; `drained()` says whether the node's workload is
    gone."""

    def acknowledge(self, now: datetime, drained: Callable[[], bool]) -> None: ...


@dataclass(frozen=True)
class Reply:
    status: int
    body: str
    headers: Message


def request(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = TIMEOUT_S,
) -> Reply:
    """4xx/5xx are statuses, not exceptions. Network errors and timeouts raise MetadataError."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with _OPENER.open(req, timeout=timeout) as reply:
            return Reply(reply.status, reply.read().decode("utf-8", "replace"), reply.headers)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, "", exc.headers)
    except (urllib.error.URLError, OSError) as exc:
        raise MetadataError(f"{url}: {exc}") from None


def answers(url: str, headers: dict[str, str] | None = None) -> Reply | None:
    """The reply to a probe, None if nothing answers there (detection)."""
    try:
        return request(url, headers=headers)
    except MetadataError:
        return None


def parse_json(what: str, body: str) -> dict[str, object]:
    """A JSON object, or MetadataError."""
    try:
        data = json.loads(body)
    except ValueError:
        raise MetadataError(f"{what}: not JSON") from None
    if not isinstance(data, dict):
        raise MetadataError(f"{what}: not a JSON object")
    return data


def parse_time(value: object) -> datetime:
    parsed = parse_utc(value)
    if parsed is None:
        raise MetadataError(f"not a time: {value!r}")
    return parsed


def notice(
    node: str,
    kind: NoticeKind,
    source: str,
    what: object,
    when: datetime,
    now: datetime,
    deadline: datetime | None,
) -> Notice:
    """`what@when` identifies it (`when`: the event's own time, else when it was first seen)."""
    return Notice(
        node=node,
        kind=kind,
        source=source,
        id=f"{what}@{when.isoformat()}",
        deadline=deadline,
        received_at=now,
    )


class AwsImds:
    SOURCE = "aws-imds"
    interval = timedelta(seconds=5)  # AWS's advice for instance-action

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
            when = parse_time(action.get("time"))
            what = action.get("action", "terminate")
            out.append(notice(node, NoticeKind.INTERRUPTION, self.SOURCE, what, when, now, when))
        rebalance = self._get_json("/latest/meta-data/events/recommendations/rebalance")
        if rebalance is not None:  # a recommendation has no deadline
            when = parse_time(rebalance.get("noticeTime"))
            out.append(
                notice(node, NoticeKind.REBALANCE, self.SOURCE, "rebalance", when, now, None)
            )
        return out

    def _get_json(self, path: str) -> dict[str, object] | None:
        reply = self._get(path)
        if reply.status == 401:  # the token expired early (e.g. IMDS restarted): one fresh try
            self._fresh_token(force=True)
            reply = self._get(path)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise MetadataError(f"{path}: HTTP {reply.status}")
        return parse_json(path, reply.body)

    def _get(self, path: str) -> Reply:
        token = self._fresh_token()
        return request(self._base + path, headers={"X-aws-ec2-metadata-token": token})

    def _fresh_token(self, force: bool = False) -> str:
        if force or self._token is None or time.monotonic() >= self._token_until:
            reply = request(
                self._base + "/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(_TOKEN_TTL_S)},
            )
            if reply.status != 200 or not reply.body:
                raise MetadataError(f"IMDSv2 token: HTTP {reply.status}")
            self._token, self._token_until = reply.body, time.monotonic() + _TOKEN_TTL_S - 60
        return self._token


class AlibabaMetadata:
    SOURCE = "alibaba-metadata"
    interval = timedelta(seconds=5)

    def __init__(self, base_url: str = ALIBABA_METADATA_URL) -> None:
        self._base = base_url.rstrip("/")

    def available(self) -> bool:
        reply = answers(self._base + "/latest/meta-data/instance-id")
        return reply is not None and reply.status == 200

    def notices(self, node: str, now: datetime) -> list[Notice]:
        reply = request(self._base + "/latest/meta-data/instance/spot/termination-time")
        if reply.status == 404:
            return []
        if reply.status != 200:
            raise MetadataError(f"termination-time: HTTP {reply.status}")
        when = parse_time(reply.body.strip())
        return [notice(node, NoticeKind.INTERRUPTION, self.SOURCE, "termination", when, now, when)]
