"""Kubernetes adapter: a watch-fed cache, the observer that builds snapshots from it, and the
actuator that turns decisions into each job kind's writes (kinds/), annotations and Events."""

from autoscaler.adapters.kube.actuator import DryRunActuator, KubeActuator
from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.observer import KubeObserver

__all__ = ["DryRunActuator", "EventRecorder", "KubeActuator", "KubeCache", "KubeObserver"]
