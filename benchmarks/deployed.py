"""The daemon as deploy/ runs it, on a real control plane (benchmarks/reaction.py --cluster real).

- `install()`: deploy/'s namespace, ServiceAccount, RBAC (deploy/rbac.yaml: the ClusterRole, the
  Lease Role and both bindings, verbatim) and, unless told not to, its FlowSchemas
  (deploy/flowschema.yaml), created through the API by the admin, namespaced objects in the
  kustomization's namespace as `kubectl apply -k deploy/` puts them;
- `token()` / `write_kubeconfig()`: a bound token of that ServiceAccount (TokenRequest API) in a
  kubeconfig of its own: the daemon authenticates as `system:serviceaccount:spot-autoscaler:
  spot-autoscaler`, RBAC decides every request and API Priority and Fairness queues it (the
  admin's certificate is in system:masters, which RBAC lets through and APF exempts);
- `classify()`: the FlowSchema and priority level APF gave requests of the kinds the daemon
  makes, from the response headers `X-Kubernetes-PF-FlowSchema-UID` and
  `X-Kubernetes-PF-PriorityLevel-UID` (staging/src/k8s.io/apiserver/pkg/server/filters/
  priority-and-fairness.go), named by listing the flowcontrol objects;
- `flowcontrol()` and `flowcontrol_window()`: the API server's own APF metrics
  (`apiserver_flowcontrol_*`) of those FlowSchemas between two scrapes: requests dispatched and
  rejected, the time they waited in APF's queues; the seats of their priority levels.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
NAMESPACE = ACCOUNT = "spot-autoscaler"  # deploy/kustomization.yaml, deploy/serviceaccount.yaml
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
FLOW_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
LEVEL_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"
WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"

if TYPE_CHECKING:
    from benchmarks.real_plane import Rest
    from tests.support.control_plane import ControlPlane

Obj = dict[str, Any]

# where each kind of deploy/ is created (cluster-scoped: no namespace in the path)
_COLLECTIONS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "FlowSchema": f"{FLOWCONTROL}/flowschemas",
}


def manifests(flowschema: bool = True) -> list[Obj]:
    """deploy/'s objects that make the daemon's identity, in the order kubectl applies them."""
    files = ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml"]
    if flowschema:
        files.append("flowschema.yaml")
    out = []
    for name in files:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc:
                if "{ns}" in _COLLECTIONS[doc["kind"]]:
                    doc["metadata"].setdefault("namespace", NAMESPACE)
                out.append(doc)
    return out


def install(rest: Rest, flowschema: bool = True) -> list[str]:
    """Create deploy/'s identity objects (an existing one is left as it is); their kinds/names."""
    made = []
    for obj in manifests(flowschema):
        meta = obj["metadata"]
        path = _COLLECTIONS[obj["kind"]].format(ns=meta.get("namespace", ""))
        rest.call("POST", path, obj, exists_ok=True)
        made.append(f"{obj['kind']}/{meta['name']}")
    return made


def token(rest: Rest, seconds: int = 6 * 3600) -> str:
    """A bound token of deploy/'s ServiceAccount (the TokenRequest API, as a projected
    ServiceAccount token volume gets one), valid long enough for a run."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": seconds},
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token"
    got = rest.call("POST", path, body)
    assert got is not None
    return str(got["status"]["token"])


def write_kubeconfig(plane: ControlPlane, path: Path, bearer: str) -> str:
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
        "users": [{"name": ACCOUNT, "user": {"token": bearer}}],
        "contexts": [
            {
                "name": "real",
                "context": {"cluster": "real", "user": ACCOUNT, "namespace": NAMESPACE},
            }
        ],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(conf))
    path.chmod(0o600)
    return str(path)


def classify(
    plane: ControlPlane,
    rest: Rest,
    bearer: str | None,
    requests: Iterable[tuple[str, str, str]],
) -> dict[str, Obj]:
    """(label, method, path) -> the answer's status and the FlowSchema and priority level APF
    put the request in, sent with the token (None: the admin's certificate, which the mandatory
    `exempt` schema takes); PATCHes as server-side dry runs: nothing changes."""
    pool = rest.http  # the admin's
    if bearer is not None:
        ca = str(plane.dir / "pki" / "ca.crt")
        pool = urllib3.PoolManager(ca_certs=ca, cert_reqs="CERT_REQUIRED", retries=False)
    schemas = _names(rest, "flowschemas")
    levels = _names(rest, "prioritylevelconfigurations")
    out: dict[str, Obj] = {}
    try:
        for label, method, path in requests:
            headers = {"Accept": "application/json"}
            if bearer is not None:
                headers["Authorization"] = f"Bearer {bearer}"
            body = None
            if method == "PATCH":
                headers["Content-Type"] = "application/merge-patch+json"
                stamp = {"spot-autoscaler.test/apf-probe": uuid.uuid4().hex[:8]}
                body = json.dumps({"metadata": {"annotations": stamp}}).encode()
                path += ("&" if "?" in path else "?") + "dryRun=All"
            r = pool.request(method, plane.server + path, body=body, headers=headers)
            out[label] = {
                "status": r.status,
                "flow_schema": schemas.get(
                    r.headers.get(FLOW_HEADER, ""), r.headers.get(FLOW_HEADER)
                ),
                "priority_level": levels.get(
                    r.headers.get(LEVEL_HEADER, ""), r.headers.get(LEVEL_HEADER)
                ),
            }
    finally:
        if pool is not rest.http:
            pool.clear()
    return out


def _names(rest: Rest, plural: str) -> dict[str, str]:
    got = rest.get(f"{FLOWCONTROL}/{plural}") or {}
    return {o["metadata"]["uid"]: o["metadata"]["name"] for o in got.get("items") or []}


def flowschemas(rest: Rest) -> list[Obj]:
    """Every FlowSchema the server has, by precedence: name, precedence, level, subjects."""
    got = rest.get(f"{FLOWCONTROL}/flowschemas") or {}
    out = []
    for fs in sorted(got.get("items") or [], key=lambda f: f["spec"]["matchingPrecedence"]):
        subjects = []
        for rule in fs["spec"].get("rules") or []:
            for s in rule.get("subjects") or []:
                kind = s["kind"]
                who = s.get("group") or s.get("user") or s.get("serviceAccount") or {}
                ns = f"{who['namespace']}/" if "namespace" in who else ""
                subjects.append(f"{kind} {ns}{who.get('name')}")
        out.append(
            {
                "name": fs["metadata"]["name"],
                "precedence": fs["spec"]["matchingPrecedence"],
                "priority_level": fs["spec"]["priorityLevelConfiguration"]["name"],
                "subjects": subjects,
            }
        )
    return out


# --- the API server's APF metrics -----------------------------------------------------------
def flowcontrol(rest: Rest) -> dict[str, float]:
    """Every `apiserver_flowcontrol_*` series of the API server's /metrics, by name and labels
    as written."""
    r = rest.http.request("GET", rest.base + "/metrics")
    out = {}
    for line in r.data.decode().splitlines():
        if line.startswith("apiserver_flowcontrol_"):
            series, _, value = line.rpartition(" ")
            try:
                out[series] = float(value)
            except ValueError:
                continue
    return out


def _labels(series: str) -> dict[str, str]:
    inside = series.partition("{")[2].rstrip("}")
    out = {}
    for part in inside.split('",'):
        key, _, value = part.partition('="')
        if key:
            out[key.strip(",")] = value.rstrip('"')
    return out


def flowcontrol_window(
    before: dict[str, float], after: dict[str, float], schemas: Iterable[str]
) -> dict[str, Obj]:
    """Per FlowSchema, between two scrapes: requests dispatched and rejected (by reason), and
    the time they waited in APF before running (count, mean, the bucket bounds under which
    half and 99% fell); per priority level, its seats at the second scrape."""
    schemas = set(schemas)
    out: dict[str, Obj] = {}
    for fs in schemas:
        out[fs] = {"dispatched": 0, "rejected": {}, "wait": {}, "priority_level": None}
    buckets: dict[str, dict[float, float]] = {fs: {} for fs in schemas}
    sums: dict[str, float] = dict.fromkeys(schemas, 0.0)
    counts: dict[str, float] = dict.fromkeys(schemas, 0.0)
    for series, value in after.items():
        labels = _labels(series)
        fs = labels.get("flow_schema", "")
        if fs not in schemas:
            continue
        diff = value - before.get(series, 0.0)
        name = series.partition("{")[0]
        out[fs]["priority_level"] = labels.get("priority_level")
        if name == "apiserver_flowcontrol_dispatched_requests_total":
            out[fs]["dispatched"] += int(diff)
        elif name == "apiserver_flowcontrol_rejected_requests_total" and diff:
            reason = labels.get("reason", "?")
            out[fs]["rejected"][reason] = out[fs]["rejected"].get(reason, 0) + int(diff)
        elif name.startswith(WAIT) and labels.get("execute") == "true":
            if name == f"{WAIT}_bucket":
                le = float(labels["le"])
                buckets[fs][le] = buckets[fs].get(le, 0.0) + diff
            elif name == f"{WAIT}_sum":
                sums[fs] += diff
            elif name == f"{WAIT}_count":
                counts[fs] += diff
    for fs in schemas:
        n = counts[fs]
        ordered = sorted(buckets[fs].items())

        def bound(
            q: float, n: float = n, ordered: list[tuple[float, float]] = ordered
        ) -> float | None:
            return next((le for le, c in ordered if c >= q * n), None) if n else None

        out[fs]["wait"] = {
            "count": int(n),
            "mean_s": round(sums[fs] / n, 4) if n else None,
            "p50_le_s": bound(0.5),
            "p99_le_s": bound(0.99),
        }
        level = out[fs]["priority_level"]
        if level is not None:
            out[fs]["seats"] = {
                kind: after.get(
                    f'apiserver_flowcontrol_{kind}_limit_seats{{priority_level="{level}"}}'
                )
                for kind in ("nominal", "current", "lower", "upper")
            }
    return out


def wait_rbac(rest: Rest, timeout: float = 30.0) -> None:
    """Until the authorizer has the new bindings (its informers lag a write a little): a
    SubjectAccessReview for a verb deploy/rbac.yaml grants says allowed."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": USER,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            "resourceAttributes": {"verb": "list", "resource": "pods"},
        },
    }
    deadline = time.monotonic() + timeout
    while True:
        got = rest.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        if got and (got.get("status") or {}).get("allowed"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"deploy/rbac.yaml's grants not in force after {timeout:.0f} s")
        time.sleep(0.2)
