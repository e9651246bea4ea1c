"""Connect to the API server: a kubeconfig when one is named, else the pod's in-cluster identity."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client(kubeconfig: str | os.PathLike[str] | None = None) -> client.ApiClient:
    """An ApiClient of its own (the library's global default configuration is left alone).

    Without `kubeconfig`: in-cluster service account; outside a cluster, $KUBECONFIG or
    ~/.kube/config, so the same command works on a laptop.
    """
    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        return config.new_client_from_config()
    return client.ApiClient(cfg)


def own_namespace() -> str:
    """This pod's namespace: $POD_NAMESPACE (downward API), the service account's, or default."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return _SA_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"
