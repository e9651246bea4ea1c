"""The notice responder: the fast path (`Reconciler.react`) on a thread of its own.

A notice's drains and ScaleIns must not wait for the pass under way: at 1,000 nodes with churn
a notice waited p99 1.4 s for the snapshot and decisions of the pass before it
(docs/benchmarks.md). Here it waits at most for that pass's snapshot (the observer is for one
thread at a time: `Reconciler._look`). What the pass decided on its older view for a job the
responder has written since is dropped when the pass writes (`writes.Writes._claim`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class NoticeResponder:
    def __init__(self, react: Callable[[], None], may_act: Callable[[], bool]) -> None:
        """`react` answers every notice there is (it logs its own failures); `may_act`: the
        caches have synced and this replica leads (else the passes answer later)."""
        self._react = react
        self._may_act = may_act
        self._changed = threading.Condition()
        self._waiting = False  # a wake that may carry a notice came since the last react began
        self._reacting = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="notices", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Let a react under way finish (its writes are not cut in half), then end the thread."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def notify(self) -> None:
        """A wake that may carry a notice: answer it now (a burst becomes one or two reacts)."""
        with self._changed:
            self._waiting = True
            self._changed.notify_all()

    def busy(self) -> bool:
        """A notice waits for the responder, or it is answering one."""
        with self._changed:
            return self._thread is not None and not self._stopped and self._answering()

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until no notice waits or is being answered, or the
        responder stopped; True then."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._stopped or not self._answering(), max(0.0, timeout)
            )

    def _answering(self) -> bool:
        return self._waiting or self._reacting

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting or self._stopped)
                if self._stopped:
                    return
                self._waiting, self._reacting = False, True
            try:
                if self._may_act():
                    self._react()
            finally:
                with self._changed:
                    self._reacting = False
                    self._changed.notify_all()
