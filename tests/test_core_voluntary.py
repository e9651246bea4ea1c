"""Which workers carry Karpenter's do-not-disrupt (core/voluntary.py), on plain data."""

from __future__ import annotations

from dataclasses import replace

from core_fixtures import job

from autoscaler.core import PolicySet, ShieldMemo, Worker


def test_a_protecting_policy_shields_every_worker_on_a_node_and_a_draining_one_none() -> None:
    ps = PolicySet.model_validate(
        {
            "policies": [
                {"name": "default"},
                {
                    "name": "mover",
                    "match": {"labels": {"move": "yes"}},
                    "preemption": {"voluntary": "drain"},
                },
            ]
        }
    )
    kept = job("kept", placement=["a", "b"])
    pending = Worker("kept-worker-2", None, "kept-worker-2", 2, pending=True)
    going = Worker("kept-worker-3", "a", "kept-worker-3", 3, terminating=True)
    kept = replace(kept, workers=(*kept.workers, pending, going))
    moved = job("moved", placement=["a"], labels={"move": "yes"})
    assert ShieldMemo().shield([kept, moved], ps) == {
        "ml/kept": {("ml", "kept-worker-0", "a"), ("ml", "kept-worker-1", "b")}
    }


def test_jobs_no_policy_manages_are_not_shielded() -> None:
    ps = PolicySet.model_validate(
        {"policies": [{"name": "only", "match": {"labels": {"x": "y"}}}], "default_policy": None}
    )
    assert ShieldMemo().shield([job("other", placement=["a"])], ps) == {}


def test_a_job_unchanged_keeps_its_very_entry_and_a_changed_one_gets_a_new_one() -> None:
    ps = PolicySet.model_validate({"policies": [{"name": "default"}]})
    memo = ShieldMemo()
    same, moving = job("same", placement=["a"]), job("moving", placement=["a"])
    first = memo.shield([same, moving], ps)
    moved = replace(moving, workers=(Worker("moving-worker-0", "b", "moving-worker-0", 0),))
    second = memo.shield([same, moved], ps)
    assert second["ml/same"] is first["ml/same"]  # a reader may skip it
    assert second["ml/moving"] == {("ml", "moving-worker-0", "b")}
    assert memo.shield([same], ps).keys() == {"ml/same"}  # a job gone is gone
