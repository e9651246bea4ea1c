"""Test support: local servers that speak real protocols to the official clients."""

from .kube_api import ApiError, KubeApiServer, RequestRecord, Resource

__all__ = ["ApiError", "KubeApiServer", "RequestRecord", "Resource"]
