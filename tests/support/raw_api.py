"""Kubernetes API requests through the official client's raw `call_api`: JSON in and out, no
models, the ApiClient's own credentials and TLS, as the product's own calls go."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes.client import ApiClient
from urllib3 import BaseHTTPResponse


def send(
    api: ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    merge: bool = False,
    query: Iterable[tuple[str, Any]] = (),
    timeout: float = 30,
) -> BaseHTTPResponse:
    """The response unread (`json.loads(response.data)`, or a watch streamed on it); ApiException
    on an error status. `merge`: the body is a JSON merge patch."""
    content = "application/merge-patch+json" if merge else "application/json"
    response: BaseHTTPResponse = api.call_api(
        path,
        method,
        query_params=list(query),
        body=body,
        auth_settings=[],
        header_params={"Content-Type": content, "Accept": "application/json"},
        _preload_content=False,
        _return_http_data_only=True,
        _request_timeout=timeout,
    )
    return response
