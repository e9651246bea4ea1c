"""The pure decision core: no I/O, no clock, no client objects. Adapters feed it snapshots."""

from autoscaler.core.decide import decide, decide_departures
from autoscaler.core.idle import track_idle
from autoscaler.core.memo import PassMemo
from autoscaler.core.model import (
    Action,
    CapacityType,
    Decision,
    GpuNode,
    Job,
    Notice,
    NoticeKind,
    Reason,
    Scaler,
    ScalerKind,
    Snapshot,
    Worker,
)
from autoscaler.core.policy import Policy, PolicySet
from autoscaler.core.voluntary import Shield, ShieldMemo

__all__ = [
    "Action",
    "CapacityType",
    "Decision",
    "GpuNode",
    "Job",
    "Notice",
    "NoticeKind",
    "PassMemo",
    "Policy",
    "PolicySet",
    "Reason",
    "Scaler",
    "ScalerKind",
    "Shield",
    "ShieldMemo",
    "Snapshot",
    "Worker",
    "decide",
    "decide_departures",
    "track_idle",
]
