"""Get, create and merge-patch the objects we write, as plain dicts, retrying short trouble.

Every write attempt (each retry too) asks the `Fence` first and carries its total timeout: a
replica whose lease is not valid right now sends nothing (autoscaler.fencing).
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kube.resources import NODES, PODS, Obj, Resource
from autoscaler.adapters.kube.retry import URGENT, with_retries
from autoscaler.adapters.kube.server_fence import refusal
from autoscaler.fencing import Fence, NotLeader

MERGE_PATCH = "application/merge-patch+json"
_TIMEOUT = (10.0, 30.0)  # reads: (connect, read) seconds
_WRITE_TIMEOUT = 30.0  # writes without a fence timeout: total seconds

log = structlog.get_logger()


class ObjectApi:
    """The few verbs the actuators need, on Nodes and on the custom kinds."""

    def __init__(
        self, api_client: client.ApiClient, retries: int, fence: Fence | None = None
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._retries = retries
        self.fence = fence or Fence.open()

    def get(self, resource: Resource, namespace: str, name: str, urgent: bool = False) -> Obj:
        if resource is NODES:
            return self._call(f"get node {name}", self._core.read_node, name, urgent=urgent)
        if resource is PODS:
            read = self._core.read_namespaced_pod
            return self._call(f"get pod {namespace}/{name}", read, name, namespace, urgent=urgent)
        return self._call(
            f"get {resource.plural} {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            name,
            urgent=urgent,
        )

    def pods(self, namespace: str, label_selector: str, once: bool = False) -> list[Obj]:
        """The pods of `namespace` that match `label_selector`, as the server has them now;
        `once`: no retry (trouble goes to the caller at once, a 429's Retry-After too)."""
        what = f"list pods {namespace} {label_selector}"
        listed = self._call(
            what,
            self._core.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
            retries=0 if once else None,
        )
        return list(listed.get("items") or [])

    def create(self, resource: Resource, namespace: str, body: Obj) -> Obj:
        return self._write(
            f"create {resource.plural} {namespace}/{body['metadata']['name']}",
            self._custom.create_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            body,
        )

    def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: Obj, urgent: bool = False
    ) -> Obj:
        # The client would pick JSON patch for a dict body on core kinds: say merge patch outright.
        if resource is NODES:
            return self._write(
                f"patch node {name}", self._core.patch_node, name, patch, _content_type=MERGE_PATCH
            )
        if resource is PODS:
            return self._write(
                f"patch pod {namespace}/{name}",
                self._core.patch_namespaced_pod,
                name,
                namespace,
                patch,
                _content_type=MERGE_PATCH,
                urgent=urgent,
            )
        return self._write(
            f"patch {resource.plural} {namespace}/{name}",
            self._custom.patch_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            name,
            patch,
            _content_type=MERGE_PATCH,
            urgent=urgent,
        )

    def delete(self, resource: Resource, namespace: str, name: str, resource_version: str) -> Obj:
        """Delete the very version we decided on: a precondition makes the server answer 409 if
        the object changed since (e.g. the operator picked it up meanwhile)."""
        options = {"preconditions": {"resourceVersion": resource_version}}
        return self._write(
            f"delete {resource.plural} {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            name,
            body=options,
        )

    def delete_pod(self, namespace: str, name: str, uid: str) -> Obj:
        """Delete the very pod we decided on: a uid precondition makes the server answer 409
        if a new pod took its name meanwhile (the operator makes a deleted index again)."""
        return self._write(
            f"delete pod {namespace}/{name}",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            body={"preconditions": {"uid": uid}},
            urgent=True,
        )

    def _call(
        self,
        what: str,
        fn: Any,
        *args: Any,
        urgent: bool = False,
        retries: int | None = None,
        **kwargs: Any,
    ) -> Obj:
        def once() -> Obj:
            response = fn(*args, _preload_content=False, _request_timeout=_TIMEOUT, **kwargs)
            return json.loads(response.data)

        if retries is not None:
            return with_retries(once, what, retries)
        return self._retrying(once, what, urgent)

    def _write(self, what: str, fn: Any, *args: Any, urgent: bool = False, **kwargs: Any) -> Obj:
        def once() -> Obj:
            # before each attempt and as its bytes leave: NotLeader (or Stale) sends nothing
            with self.fence.sending(what):
                timeout = self.fence.timeout(_WRITE_TIMEOUT)  # one number: a total, not per read
                try:
                    response = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
                except ApiException as exc:
                    refused = refusal(exc)
                    if refused is None:
                        raise
                    log.warning("write_refused_by_server_fence", write=what, message=refused)
                    raise NotLeader(f"{what} refused by the API server: {refused}") from exc
            return json.loads(response.data)

        return self._retrying(once, what, urgent)

    def _retrying(self, once: Any, what: str, urgent: bool) -> Obj:
        if urgent:  # a drain: retried sooner and more often (retry.URGENT)
            base, most, retries = URGENT
            return with_retries(once, what, max(retries, self._retries), base, most)
        return with_retries(once, what, self._retries)
