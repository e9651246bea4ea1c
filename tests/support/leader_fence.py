"""deploy/leader-fence.yaml installed for a test's own ServiceAccount and Lease.

The shipped file names the daemon's account and Lease in namespace spot-autoscaler; a test
installs the same policy with its own names (cluster-scoped objects, so a suffix keeps tests
apart) and removes it after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .kustomize import ROOT

SHIPPED = ROOT / "deploy" / "leader-fence.yaml"
_SHIPPED_USER = "system:serviceaccount:spot-autoscaler:spot-autoscaler"


def fence_objects(namespace: str, account: str, lease: str) -> list[dict[str, Any]]:
    """The shipped policy and binding, named for `namespace`, its `account` and `lease`."""
    text = SHIPPED.read_text()
    assert _SHIPPED_USER in text, "deploy/leader-fence.yaml no longer names the shipped account"
    text = text.replace(_SHIPPED_USER, f"system:serviceaccount:{namespace}:{account}")
    policy, binding = (d for d in yaml.safe_load_all(text) if d)
    name = f"{policy['metadata']['name']}-{namespace}"
    policy["metadata"]["name"] = binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    binding["spec"]["paramRef"] |= {"name": lease, "namespace": namespace}
    return [policy, binding]


@contextmanager
def leader_fence(
    admin: client.ApiClient, namespace: str, account: str, lease: str
) -> Iterator[str]:
    """The fence installed while the block runs; its policy's name."""
    api = client.AdmissionregistrationV1Api(admin)
    policy, binding = fence_objects(namespace, account, lease)
    name = policy["metadata"]["name"]
    api.create_validating_admission_policy(policy)
    api.create_validating_admission_policy_binding(binding)
    try:
        yield name
    finally:
        with suppress(ApiException):
            api.delete_validating_admission_policy_binding(name)
        with suppress(ApiException):
            api.delete_validating_admission_policy(name)
