"""Which workers carry Karpenter's do-not-disrupt (core/voluntary.py), on plain data."""

from __future__ import annotations

from dataclasses import replace

from core_fixtures import job

from autoscaler.core import PolicySet, Worker, shielded


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
    assert shielded([kept, moved], ps) == {("ml", "kept-worker-0"), ("ml", "kept-worker-1")}


def test_jobs_no_policy_manages_are_not_shielded() -> None:
    ps = PolicySet.model_validate(
        {"policies": [{"name": "only", "match": {"labels": {"x": "y"}}}], "default_policy": None}
    )
    assert shielded([job("other", placement=["a"])], ps) == frozenset()
