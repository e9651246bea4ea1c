"""Connect to the API server: a kubeconfig when one is named, else the pod's in-cluster identity."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client(
    kubeconfig: str | os.PathLike[str] | None = None, identity: str | None = None
) -> client.ApiClient:
    """An ApiClient of its own (the library's global default configuration is left alone).

    Without `kubeconfig`: in-cluster service account; outside a cluster, $KUBECONFIG or
    ~/.kube/config, so the same command works on a laptop. With `identity` (the Lease holder
    name), every request says `User-Agent: spot-autoscaler/<identity>`: audit logs show which
    replica wrote what.
    """
    if kubeconfig is not None:
        api = config.new_client_from_config(config_file=str(kubeconfig))
    else:
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
            api = client.ApiClient(cfg)
        except config.ConfigException:
            api = config.new_client_from_config()
    if identity:
        api.user_agent = f"spot-autoscaler/{identity}"
    return api


def own_namespace() -> str:
    """This pod's namespace: $POD_NAMESPACE (downward API), the service account's, or default."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return _SA_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"
