"""EC2 instance id -> Kubernetes node name."""

from __future__ import annotations

import threading
from typing import Any

from botocore.exceptions import ClientError

from autoscaler.adapters.cloud_sources import NodeIndex

# EC2 says these when the instance does not exist (any more): the instance is unknown, not an error.
_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


class Ec2Nodes:
    """The cluster's own index first (spec.providerID), then EC2's PrivateDnsName (the node name
    on EKS), cached: a node's name never changes while its instance lives. Itself a NodeIndex.
    """

    def __init__(self, ec2: Any, index: NodeIndex) -> None:
        self._ec2 = ec2
        self._index = index
        self._lock = threading.Lock()
        self._cache: dict[str, str] = {}

    def node_for_instance(self, instance_id: str) -> str | None:
        node = self._index.node_for_instance(instance_id)
        if node:
            return node
        with self._lock:
            if instance_id in self._cache:
                return self._cache[instance_id]
        try:
            reply = self._ec2.describe_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return None
            raise
        names = [
            i.get("PrivateDnsName")
            for r in reply.get("Reservations", [])
            for i in r.get("Instances", [])
            if i.get("InstanceId") == instance_id
        ]
        name = next((n for n in names if n), None)  # a terminated instance has an empty name
        if name:
            with self._lock:
                self._cache[instance_id] = name
        return name
