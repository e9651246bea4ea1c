"""`spot-autoscaler run` on the real control plane as deploy/ runs it: a ServiceAccount token bound
to deploy/rbac.yaml's rules (verbatim, under names of our own), a kubeconfig with that token, the
child process stopped with SIGTERM, and its JSON log lines read back."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

from support.cli import ROOT, run_cli
from support.control_plane import ControlPlane

Obj = dict[str, Any]
STOP_WITHIN = 30.0  # seconds the daemon has to stop after SIGTERM


def grant_deploy_rbac(api: ApiClient, plane: ControlPlane, namespace: str, account: str) -> str:
    """The ClusterRole and the leader-election Role of deploy/rbac.yaml (rules verbatim, names of
    our own), bound to a ServiceAccount of `namespace`; its token."""
    rbac = client.RbacAuthorizationV1Api(api)
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()) if d]
    cluster_rules = next(d for d in docs if d["kind"] == "ClusterRole")["rules"]
    lease_rules = next(d for d in docs if d["kind"] == "Role")["rules"]
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    name = f"{account}-{namespace}"

    def ref(kind: str) -> Obj:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}

    made: list[Callable[[], Any]] = [
        lambda: rbac.create_cluster_role({"metadata": {"name": name}, "rules": cluster_rules}),
        lambda: rbac.create_cluster_role_binding(
            {"metadata": {"name": name}, "roleRef": ref("ClusterRole"), "subjects": subject}
        ),
        lambda: rbac.create_namespaced_role(
            namespace, {"metadata": {"name": name}, "rules": lease_rules}
        ),
        lambda: rbac.create_namespaced_role_binding(
            namespace, {"metadata": {"name": name}, "roleRef": ref("Role"), "subjects": subject}
        ),
    ]
    for create in made:
        try:
            create()
        except ApiException as e:
            if e.status != 409:
                raise
    return plane.token_for(account, namespace)


def write_kubeconfig(plane: ControlPlane, path: Path, token: str, namespace: str) -> None:
    conf = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "real",
                "cluster": {
                    "server": plane.server,
                    "certificate-authority": str(plane.dir / "pki" / "ca.crt"),
                },
            }
        ],
        "users": [{"name": "daemon", "user": {"token": token}}],
        "contexts": [
            {
                "name": "real",
                "context": {"cluster": "real", "user": "daemon", "namespace": namespace},
            }
        ],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(conf))
    path.chmod(0o600)


@contextlib.contextmanager
def daemon(tmp_path: Path, out: Any, err: Any, identity: str) -> Iterator[subprocess.Popen[str]]:
    """`spot-autoscaler run`; SIGTERM on the way out (it must stop cleanly), killed if not."""
    proc = run_cli(tmp_path, identity=identity, stdout=out, stderr=err)
    try:
        yield proc
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_WITHIN)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def deployed(
    api: ApiClient, plane: ControlPlane, namespace: str, tmp_path: Path, config: str
) -> Iterator[subprocess.Popen[str]]:
    """`spot-autoscaler run` as deploy/ runs it (its own ServiceAccount under deploy/rbac.yaml's
    rules) with `config`; its stdout and stderr in tmp_path's out.log and err.log."""
    token = grant_deploy_rbac(api, plane, namespace, f"spot-autoscaler-{namespace}")
    write_kubeconfig(plane, tmp_path / "kubeconfig", token, namespace)
    (tmp_path / "config.yaml").write_text(config)
    with (
        open(tmp_path / "out.log", "w") as out,
        open(tmp_path / "err.log", "w") as err,
        daemon(tmp_path, out, err, identity=namespace) as proc,
    ):
        yield proc


def json_lines(path: Path) -> list[Obj]:
    lines = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                lines.append(event)
    return lines


def forbidden(err_log: Path) -> list[Obj]:
    """The daemon's warnings and errors that say a request was forbidden (RBAC too narrow)."""
    return [
        e
        for e in json_lines(err_log)
        if e.get("level") in ("error", "warning") and "forbidden" in json.dumps(e).lower()
    ]
