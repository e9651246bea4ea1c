"""Which workers Karpenter's voluntary disruption (consolidation, drift) must leave alone.

A policy with `preemption.voluntary: protect` (the default) keeps its job's workers where they
are: each worker on a node carries `karpenter.sh/do-not-disrupt` while it runs, so Karpenter
does not pick its node (the adapter writes it: adapters/kube/shield.py). With `drain` the job may
be moved: a node Karpenter disrupts is a notice (NoticeKind.DISRUPTION) its workers leave at
once (core/notices.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from autoscaler.core.model import Job
from autoscaler.core.policy import PolicySet

# (namespace, pod) of every worker that must carry the annotation
Shield = frozenset[tuple[str, str]]


def shielded(jobs: Iterable[Job], policies: PolicySet) -> Shield:
    """The workers of managed jobs whose policy protects them: every one bound to a node and not
    being deleted (Karpenter counts a pod until it is terminating: pkg/utils/pod/scheduling.go
    `IsActive`, `IsDisruptable`)."""
    out: set[tuple[str, str]] = set()
    for job in jobs:
        policy = policies.for_job(job)
        if policy is None or policy.preemption.voluntary != "protect":
            continue
        out.update((job.namespace, w.pod) for w in job.workers if w.node and not w.terminating)
    return frozenset(out)
