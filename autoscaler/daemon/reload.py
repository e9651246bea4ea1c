"""Re-read the config file; apply new policies live, keep the old config when the file is bad.

The policy part (`policies`, `default_policy`, `cluster_budget_per_hour`) and `prices` change a
running daemon; other sections (ports, mode, watches, cloud sources) are wired at start, so a
change there is logged as needing a restart. A ConfigMap volume is updated in place by the
kubelet, so editing the ConfigMap is enough to change policies and prices.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoscaler.config import Config, ConfigError, load_config

_LIVE = frozenset({"policy_set", "prices"})
_IGNORED = frozenset({"simulate"})  # the daemon does not read it


class ConfigReloader:
    def __init__(
        self,
        path: Path,
        current: Config,
        apply: Callable[[Config], None],
        logger: Any,
        on_rejected: Callable[[list[str]], None],
    ) -> None:
        self.path = path
        self.current = current
        self._apply = apply
        self._logger = logger
        self._on_rejected = on_rejected  # metric and Event: once per distinct bad file
        self._reported: list[str] | None = None  # the problems last logged: a bad file is told once

    @property
    def healthy(self) -> bool:
        """False while the file on disk is rejected (the previous config still runs)."""
        return self._reported is None

    def check(self) -> bool:
        """Reload if the file changed; True if new policies were applied."""
        try:
            new = load_config(self.path)
        except ConfigError as exc:
            problems = [str(p) for p in exc.problems]
            if problems != self._reported:
                self._reported = problems
                self._on_rejected(problems)
                self._logger.error(
                    "config_rejected",
                    file=str(self.path),
                    problems=problems,
                    kept="the previous config",
                )
            return False
        self._reported = None
        if new == self.current:
            return False
        changed = {
            name
            for name in Config.model_fields
            if getattr(new, name) != getattr(self.current, name)
        }
        restart = sorted(changed - _LIVE - _IGNORED)
        if restart:
            self._logger.warning(
                "config_change_needs_restart", file=str(self.path), sections=restart
            )
        self.current = new
        if changed & _LIVE:
            names = [p.name for p in new.policy_set.policies]
            self._logger.info("config_reloaded", file=str(self.path), policies=names)
            self._apply(new)
            return True
        return False
