"""EventBridge envelopes -> instance events: the documented shapes, and garbage refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.adapters.aws.events import Unparsable, parse_message
from autoscaler.core import NoticeKind

T = "2026-03-02T12:00:00Z"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def envelope(detail_type: str, detail: dict, source: str = "aws.ec2", **extra: object) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": "7bf73129-1428-4cd3-a780-95db273d1602",
            "detail-type": detail_type,
            "source": source,
            "account": "123456789012",
            "time": T,
            "region": "us-east-1",
            "resources": [],
            "detail": detail,
            **extra,
        }
    )


def test_interruption_warning_has_a_two_minute_deadline() -> None:
    [event] = parse_message(
        envelope(
            "EC2 Spot Instance Interruption Warning",
            {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"},
        )
    )
    assert event.kind is NoticeKind.INTERRUPTION
    assert event.instance_id == "i-1234567890abcdef0"
    assert event.time == T0 and event.deadline == T0 + timedelta(minutes=2)
    assert event.notice_id == "7bf73129-1428-4cd3-a780-95db273d1602/i-1234567890abcdef0"


def test_rebalance_recommendation_is_soft_and_open_ended() -> None:
    body = envelope("EC2 Instance Rebalance Recommendation", {"instance-id": "i-1"})
    [event] = parse_message(body)
    assert event.kind is NoticeKind.REBALANCE and event.deadline is None


@pytest.mark.parametrize("state", ["stopping", "stopped", "shutting-down", "terminated"])
def test_leaving_states_are_state_changes(state: str) -> None:
    [event] = parse_message(
        envelope("EC2 Instance State-change Notification", {"instance-id": "i-1", "state": state})
    )
    assert event.kind is NoticeKind.STATE_CHANGE


@pytest.mark.parametrize("state", ["pending", "running"])
def test_other_states_are_ignored(state: str) -> None:
    detail = {"instance-id": "i-1", "state": state}
    body = envelope("EC2 Instance State-change Notification", detail)
    assert parse_message(body) == []


def test_health_scheduled_change_is_maintenance_per_affected_instance() -> None:
    detail = {
        "eventArn": "arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x",
        "service": "EC2",
        "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "eventTypeCategory": "scheduledChange",
        "startTime": "Sat, 07 Mar 2026 15:10:09 GMT",
        "affectedEntities": [{"entityValue": "i-2"}, {"entityValue": "i-1"}],
    }
    events = parse_message(envelope("AWS Health Event", detail, source="aws.health"))
    assert [e.instance_id for e in events] == ["i-1", "i-2"]
    assert {e.kind for e in events} == {NoticeKind.MAINTENANCE}
    assert events[0].deadline == datetime(2026, 3, 7, 15, 10, 9, tzinfo=UTC)
    assert events[0].notice_id != events[1].notice_id  # one board entry per instance


def test_health_events_of_other_services_or_categories_are_ignored() -> None:
    s3 = {"service": "S3", "eventTypeCategory": "scheduledChange", "affectedEntities": []}
    issue = {
        "service": "EC2",
        "eventTypeCategory": "issue",
        "affectedEntities": [{"entityValue": "i-1"}],
    }
    assert parse_message(envelope("AWS Health Event", s3, source="aws.health")) == []
    assert parse_message(envelope("AWS Health Event", issue, source="aws.health")) == []


def test_unknown_detail_types_are_ignored_not_garbage() -> None:
    assert parse_message(envelope("EC2 AMI State Change", {"ImageId": "ami-1"})) == []


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        "[]",
        '"text"',
        json.dumps({"detail-type": "EC2 Spot Instance Interruption Warning", "id": "x", "time": T}),
        json.dumps(
            {
                "detail-type": "EC2 Spot Instance Interruption Warning",
                "id": "x",
                "time": "soon",
                "detail": {"instance-id": "i-1"},
            }
        ),
        json.dumps(
            {
                "detail-type": "EC2 Spot Instance Interruption Warning",
                "id": "x",
                "time": T,
                "detail": {"instance-id": 7},
            }
        ),
        json.dumps({"id": "x", "time": T, "detail": {}}),
    ],
)
def test_garbage_is_unparsable(body: str) -> None:
    with pytest.raises(Unparsable):
        parse_message(body)
