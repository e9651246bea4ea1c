"""Kubernetes adapter: a watch-fed cache, the observer that builds snapshots from it, and the
actuator that turns decisions into each job kind's writes (kinds/), annotations and Events.

The names below load on first use: importing one module of the adapter (say `kinds`) must not
load the rest, and with it the kubernetes SDK."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoscaler.adapters.kube.actuator import DryRunActuator, KubeActuator
    from autoscaler.adapters.kube.cache import KubeCache
    from autoscaler.adapters.kube.events import EventRecorder
    from autoscaler.adapters.kube.observer import KubeObserver

__all__ = ["DryRunActuator", "EventRecorder", "KubeActuator", "KubeCache", "KubeObserver"]

_HOMES = {
    "DryRunActuator": "actuator",
    "KubeActuator": "actuator",
    "KubeCache": "cache",
    "EventRecorder": "events",
    "KubeObserver": "observer",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
