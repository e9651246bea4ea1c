"""What a job's own history says of its speed and its changeovers, and the bounds a deadline rule
takes from it (core/deadline.py). Pure: the daemon (core/progress_rates.py) and the simulator
measure from the progress annotation and the workers; this only reads the measurements.

Throughput is bounded, never extrapolated linearly. Two facts of a data-parallel ring hold for
any job: more workers never train slower, and each worker does no more in a larger ring. So a
ring of n does at least what m measured workers did times n/m when n <= m, and at most that when
n >= m. Above the largest size measured nothing is certain: the lower bound then follows a
conservative scaling curve, (n/m) ** exponent (0.5: each doubling gains 41%; Bamboo measured
ResNet-50 on 1-GPU AWS nodes gaining ~52% per doubling, Horovod's paper ~90%), until the size has
run. Pollux and Sia extrapolate the other way (optimistically, deliberately): right for a
scheduler that re-plans, wrong for a deadline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The longest wait for on-demand d̂ counts (seconds). Karpenter deletes a NodeClaim that has not
# registered within 15 min and launches another (kubernetes-sigs/karpenter, pkg/controllers/
# nodeclaim/lifecycle/liveness.go), cluster-autoscaler gives up on a node after its
# max-node-provision-time (15 min): a worker Pending for an hour waits for something a
# changeover does not measure (a pool at its limit, an image that does not pull), and counting
# all of it would hold every on-demand worker for as long as it waits.
LONGEST_WAIT = 3600.0


@dataclass(frozen=True, slots=True)
class Pace:
    """A job's measured history (what the observer saw of it recently)."""

    # per ring size: the slowest recent rate of the whole ring (fraction of the job per hour),
    # each from a stretch of at least a few minutes with the same running workers and no restart
    rates: tuple[tuple[int, float], ...] = ()
    slowest_start: float = 0.0  # seconds from a recent worker's creation to Ready, the slowest
    # seconds: the longest recent wait for on-demand, of workers that started off spot or went
    # while still Pending off spot (their ScaleOut timed out, their node was refused or capped)
    on_demand_wait: float = 0.0
    # seconds: the longest recent gap between two moves of the progress while workers ran (the
    # script reports at commits: a failure loses up to this much training)
    commit_gap: float = 0.0
    restart_loss: float = 0.0  # fraction of the job lost at the worst recent restart
    stalled_hours: float = 0.0  # hours with a worker running since the progress last moved

    @property
    def measured(self) -> bool:
        return bool(self.rates)

    def lower(self, n: int, exponent: float) -> float:
        """A lower bound on what a ring of `n` does per hour (0 when nothing was measured)."""
        if n <= 0:
            return 0.0
        return max(
            (x * (n / m if m >= n else (n / m) ** exponent) for m, x in self.rates), default=0.0
        )

    def upper(self, n: int) -> float | None:
        """An upper bound on what a ring of `n` does per hour (None when nothing was measured)."""
        if n <= 0:
            return 0.0
        return min((x * max(1.0, n / m) for m, x in self.rates), default=None)

    def estimate(self, n: int, exponent: float) -> float:
        """A middle estimate of what a ring of `n` does per hour: the geometric mean of the two
        bounds (0 when nothing was measured). Only for choosing how few workers to buy; whether
        the deadline is safe is judged on the lower bound."""
        return math.sqrt(self.lower(n, exponent) * (self.upper(n) or 0.0))

    def changeover_hours(self, floor_hours: float, pending: float = 0.0) -> float:
        """d̂: a pessimistic changeover (node provisioning and pod start-up, Horovod's reset, the
        training since the last commit), at least `floor_hours`. Provisioning is the slowest
        recent start, or longer when on-demand is scarce: the longest recent wait for on-demand,
        started or not, or `pending` (seconds: the oldest on-demand worker still Pending, a lower
        bound that grows while it waits), each counted up to LONGEST_WAIT."""
        waited = min(LONGEST_WAIT, max(self.on_demand_wait, pending))
        return max(floor_hours, (max(self.slowest_start, waited) + self.commit_gap) / 3600)
