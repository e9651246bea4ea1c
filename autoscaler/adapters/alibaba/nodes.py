"""ECS instance id -> Kubernetes node name."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from autoscaler.adapters.cloud_sources import NodeIndex


def private_ip(instance: dict[str, Any]) -> str | None:
    """The VPC private IP of a DescribeInstances `Instance` entry."""
    vpc = instance.get("VpcAttributes") or {}
    ips = (vpc.get("PrivateIpAddress") or {}).get("IpAddress") or []
    return ips[0] if ips and isinstance(ips[0], str) else None


class EcsNodes:
    """The cluster's own index first (ACK spec.providerID is `<region>.<instance-id>`), then ACK's
    default node name `<region>.<private-ip>` for instances DescribeInstances has shown us.
    Itself a NodeIndex, so the CloudMonitor sources can share what the instance poller learned.
    """

    def __init__(self, index: NodeIndex, region: str) -> None:
        self._index = index
        self._region = region
        self._lock = threading.Lock()
        self._ips: dict[str, str] = {}

    def remember(self, instances: Iterable[dict[str, Any]]) -> None:
        """Replace what we know with one full DescribeInstances listing (released ones drop out)."""
        ips = {
            i["InstanceId"]: ip
            for i in instances
            if isinstance(i.get("InstanceId"), str) and (ip := private_ip(i))
        }
        with self._lock:
            self._ips = ips

    def node_for_instance(self, instance_id: str) -> str | None:
        node = self._index.node_for_instance(instance_id)
        if node:
            return node
        with self._lock:
            ip = self._ips.get(instance_id)
        return f"{self._region}.{ip}" if ip else None
