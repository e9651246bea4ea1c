"""The one exponential back-off: `base` seconds, doubling per failure, at most `cap`.

Every retry loop uses it: API calls (adapters/kube/retry.py), watches (the reflector, the
sidecar's object watch), pollers (adapters/polling.py), the reconcile loop and the source
supervisor. No clock and no sleeping here: callers wait as suits them (an Event, a wake).
"""

from __future__ import annotations

import random


class Backoff:
    """`next_delay()` after each failure, `reset()` after a success.

    With `jitter`, a delay is drawn from [d/2, d] ("equal jitter"): it spreads the retries of many
    clients hitting the same throttled API, and the floor of d/2 keeps a failing one from
    spinning.
    """

    def __init__(
        self,
        base: float = 1.0,
        cap: float = 60.0,
        jitter: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.base = base
        self.cap = max(base, cap)
        self.failures = 0  # since the last reset
        self._rng = (rng or random.Random()) if jitter else None

    def next_delay(self, hint: float | None = None) -> float:
        """The wait before the next try; `hint` (a server's Retry-After) replaces the computed
        delay, still capped."""
        ceiling = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        if hint is not None:
            return min(hint, self.cap)
        return self._rng.uniform(ceiling / 2, ceiling) if self._rng else ceiling

    def reset(self) -> None:
        self.failures = 0
