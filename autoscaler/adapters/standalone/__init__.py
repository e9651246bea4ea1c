"""Standalone mode: horovodrun on plain machines, no operator; we own the discovery file."""

from autoscaler.adapters.standalone.actuator import OwnedDiscoveryActuator
from autoscaler.adapters.standalone.notices import NoticeDirectory
from autoscaler.adapters.standalone.observer import StandaloneObserver

__all__ = ["NoticeDirectory", "OwnedDiscoveryActuator", "StandaloneObserver"]
