"""The time a job's plan is made at, as its time rules read it: each rule reports when its
answer flips by asking, so the plan memo (core/memo.py) keeps a plan exactly until the first
flip, and no list of the rules has to be kept in step with them."""

from __future__ import annotations

from datetime import datetime, timedelta

_TICK = timedelta(microseconds=1)  # datetime's resolution


class Moment:
    """`now` for the rules of a plan: they compare it only through `reached` and `passed`. Time
    only moves on, so an answer that is True stays True, and a False one flips at the instant
    asked about: the earliest of those is `next_flip`. `age` reads the time itself, so whatever
    shows it changes at every pass (`next_flip` is then `now`)."""

    __slots__ = ("_now", "next_flip")

    def __init__(self, now: datetime) -> None:
        self._now = now
        self.next_flip: datetime | None = None  # None: no answer changes with time alone

    def reached(self, at: datetime) -> bool:
        """Whether `at` has come (now >= at)."""
        if self._now >= at:
            return True
        self._flips_at(at)
        return False

    def passed(self, at: datetime) -> bool:
        """Whether `at` is over (now > at)."""
        if self._now > at:
            return True
        self._flips_at(at + _TICK)
        return False

    def age(self, since: datetime) -> timedelta:
        """How long ago `since` was: a figure that changes at every pass."""
        self._flips_at(self._now)
        return self._now - since

    def _flips_at(self, at: datetime) -> None:
        if self.next_flip is None or at < self.next_flip:
            self.next_flip = at
