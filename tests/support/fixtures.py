"""Pytest fixtures for the Kubernetes API emulator.

Use from a test module (``from support.fixtures import kube_api, kube_client``; tests/ is on
sys.path under pytest's default import mode) or register once in a conftest with
``pytest_plugins = ["support.fixtures"]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from .kube_api import KubeApiServer


@pytest.fixture
def kube_api() -> Iterator[KubeApiServer]:
    """A started emulator; stopped (and its watches ended) after the test."""
    with KubeApiServer() as server:
        yield server


@pytest.fixture
def kube_client(kube_api: KubeApiServer) -> Iterator[ApiClient]:
    """An official-client ApiClient pointed at ``kube_api`` over HTTP, no auth."""
    client = kube_api.api_client()
    yield client
    client.close()
