"""Kubernetes adapter: a watch-fed cache, the observer that builds snapshots from it, and the
actuators that turn decisions into et-operator scalers, CCE patches, annotations and Events."""

from autoscaler.adapters.kube.actuator import DryRunActuator, KubeActuator
from autoscaler.adapters.kube.cache import KubeCache
from autoscaler.adapters.kube.cce import CceActuator
from autoscaler.adapters.kube.et_operator import EtOperatorActuator
from autoscaler.adapters.kube.events import EventRecorder
from autoscaler.adapters.kube.observer import KubeObserver

__all__ = [
    "CceActuator", "DryRunActuator", "EtOperatorActuator", "EventRecorder", "KubeActuator",
    "KubeCache", "KubeObserver",
]
