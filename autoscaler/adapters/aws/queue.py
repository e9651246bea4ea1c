"""The EventBridge -> SQS consumer: spot interruptions, rebalance recommendations, state changes
and AWS Health scheduled changes become notices on the board.

Every message is deleted once handled, garbage included (counted and logged), as NTH and Karpenter
do; only a message whose instance lookup failed on an AWS error is left for redelivery.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import structlog
from botocore.exceptions import BotoCoreError, ClientError

from autoscaler.adapters.aws.clients import shared_clients
from autoscaler.adapters.aws.events import InstanceEvent, Unparsable, parse_message
from autoscaler.adapters.aws.nodes import Ec2Nodes
from autoscaler.adapters.cloud_sources import Clock, NodeIndex, post_notice, utcnow
from autoscaler.adapters.polling import describe_error, run_every
from autoscaler.adapters.sources import SourceContext
from autoscaler.config import Config
from autoscaler.core.model import Notice, NoticeKind
from autoscaler.notices_and_prices import NoticeBoard, Wake

SOURCE = "aws-sqs"
# How long the newest event per (instance, kind) is remembered after we saw it, to spot
# out-of-order deliveries: well past the queue's retention, so no older copy can still arrive.
_REMEMBER = timedelta(hours=1)


class SqsNoticeSource:
    """Long-polls one queue: `poll_once()` receives, handles and deletes; `run(stop)` loops it."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        board: NoticeBoard,
        wake: Wake,
        nodes: NodeIndex,
        *,
        wait_time: timedelta = timedelta(seconds=20),
        max_messages: int = 10,
        visibility_timeout: timedelta = timedelta(seconds=20),
        clock: Clock = utcnow,
    ) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._board = board
        self._wake = wake
        self._nodes = nodes
        self._wait = int(wait_time.total_seconds())
        self._max = max_messages
        self._visibility = int(visibility_timeout.total_seconds())
        self._clock = clock
        # (instance, kind) -> (newest event time acted on, when we saw it): older ones are stale
        self._newest: dict[tuple[str, NoticeKind], tuple[datetime, datetime]] = {}
        self.counts: Counter[str] = Counter()
        self._log = structlog.get_logger().bind(source=SOURCE)

    def poll_once(self, stop: threading.Event | None = None) -> int:
        """Receive up to `max_messages` (waiting up to `wait_time`), handle and delete them.
        Returns how many were received. SQS errors propagate (the loop backs off). Received
        once `stop` is set (the daemon shuts down, handing over to another replica), they are
        released instead: visible again at once, not after the visibility timeout."""
        reply = self._sqs.receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=self._max,
            WaitTimeSeconds=self._wait,
            VisibilityTimeout=self._visibility,
        )
        messages = reply.get("Messages", [])
        if stop is not None and stop.is_set():
            self._release(messages)
            return len(messages)
        now = self._clock()
        handled = [m for m in messages if self._handle(m, now)]
        self._delete(handled)
        self._forget_before(now - _REMEMBER)
        return len(messages)

    def run(self, stop: threading.Event) -> None:
        # The long poll paces the loop (stop is seen within one wait_time); a short poll
        # (wait_time 0) would spin on an empty queue, so it waits a second between receives.
        # The daemon's stop waits for the poll under way (SOURCE_STOP_TIMEOUT): a process that
        # left it behind would have SQS hand the next messages to a closed connection, hidden
        # for the visibility timeout from the replica taking over (measured: notices 10-20 s
        # late in benchmarks/reaction.py's second run, its queue shared with the first).
        run_every(functools.partial(self.poll_once, stop), stop, 0.0 if self._wait else 1.0, SOURCE)

    def _handle(self, message: dict[str, Any], now: datetime) -> bool:
        """Act on one message; True once it may be deleted."""
        self.counts["received"] += 1
        message_id = message.get("MessageId", "")
        try:
            events = parse_message(message.get("Body", ""))
        except Unparsable as exc:
            self.counts["unparsable"] += 1
            self._log.warning("message_unparsable", message_id=message_id, error=str(exc)[:200])
            return True
        if not events:
            self.counts["ignored"] += 1
            self._log.info("message_ignored", message_id=message_id)
            return True
        for event in events:
            try:
                self._act(event, now)
            except (ClientError, BotoCoreError) as exc:
                # EC2 could not say which node this is: let SQS redeliver after the visibility
                # timeout rather than lose a notice. Events already posted dedup on redelivery.
                self.counts["deferred"] += 1
                self._log.warning(
                    "message_deferred",
                    message_id=message_id,
                    instance=event.instance_id,
                    error=describe_error(exc),
                )
                return False
        return True

    def _act(self, event: InstanceEvent, now: datetime) -> None:
        key = (event.instance_id, event.kind)
        newest = self._newest.get(key, (None, None))[0]
        if newest is not None and event.time < newest:
            self.counts["stale"] += 1
            self._log.info(
                "event_stale",
                instance=event.instance_id,
                kind=event.kind.value,
                event_time=event.time.isoformat(),
                newest=newest.isoformat(),
            )
            return
        node = self._nodes.node_for_instance(event.instance_id)
        if node is None:
            self.counts["unknown_instance"] += 1
            self._log.info(
                "instance_unknown",
                instance=event.instance_id,
                detail_type=event.detail_type,
                event_id=event.event_id,
            )
            return
        self._newest[key] = (event.time, now)
        notice = Notice(
            node=node,
            kind=event.kind,
            source=SOURCE,
            id=event.notice_id,
            deadline=event.deadline,
            received_at=now,
        )
        post_notice(self._board, self._wake, notice, self.counts, self._log)

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        reply = self._sqs.delete_message_batch(
            QueueUrl=self._queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
        self.counts["deleted"] += len(reply.get("Successful", []))
        for failed in reply.get("Failed", []):
            # It comes back after the visibility timeout and dedups on the board then.
            self.counts["delete_failed"] += 1
            self._log.warning(
                "message_delete_failed", code=failed.get("Code"), error=failed.get("Message")
            )

    def _release(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        self._sqs.change_message_visibility_batch(
            QueueUrl=self._queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                for i, m in enumerate(messages)
            ],
        )
        self.counts["released"] += len(messages)
        self._log.info("messages_released_on_stop", count=len(messages))

    def _forget_before(self, cutoff: datetime) -> None:
        for key in [k for k, (_, seen) in self._newest.items() if seen < cutoff]:
            del self._newest[key]


def build(config: Config, ctx: SourceContext) -> SqsNoticeSource:
    """The `aws-sqs` source (adapters/sources.py)."""
    settings = config.aws
    sqs, ec2 = shared_clients(config, ctx)
    assert settings.queue_url is not None  # wanted only with a queue
    return SqsNoticeSource(
        sqs,
        settings.queue_url,
        ctx.board,
        ctx.wake,
        Ec2Nodes(ec2, ctx.index),
        wait_time=settings.wait_time,
        max_messages=settings.max_messages,
        visibility_timeout=settings.visibility_timeout,
    )
