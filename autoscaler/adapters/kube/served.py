"""Which kinds the API server serves: a CRD that is not installed is not an error to retry.

Most clusters run et-operator or CCE, not both; the other one's kinds are simply absent (404 on
discovery and on every path). Watching them would never sync, so each custom kind is first looked
up in API discovery (`GET /apis/<group>/<version>`), and looked up again from time to time in case
its CRD is installed later.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.resources import Resource

_TIMEOUT = (10.0, 30.0)


def is_served(api: client.ApiClient, resource: Resource) -> bool:
    """Whether discovery lists `resource` now. Errors other than 404 are raised (retry later)."""
    if not resource.group:
        return True  # built-in kinds
    try:
        found = client.CustomObjectsApi(api).get_api_resources(
            resource.group, resource.version, _request_timeout=_TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:  # the group/version itself is not served: no CRD of it installed
            return False
        raise
    return any(r.name == resource.plural for r in found.resources or ())
