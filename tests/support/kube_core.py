"""The pure parts of the Kubernetes API emulator: resource descriptions, API errors (Status
objects), label/field selectors and the three patch formats. No state, no I/O."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource key, namespace or "", name)
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
BUILTIN_GROUPS = {"", "apps", "coordination.k8s.io", "events.k8s.io", "node.k8s.io", "policy"}
# Strategic merge patch: these lists merge by key instead of being replaced.
_SMP_MERGE_KEYS = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "ownerReferences": "uid",
    "addresses": "type",
}
POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
EVENT_FIELDS = tuple(
    f"involvedObject.{f}"
    for f in (
        "kind",
        "namespace",
        "name",
        "uid",
        "apiVersion",
        "resourceVersion",
        "fieldPath",
    )
) + ("reason", "reportingComponent", "source", "type")
NOT_FOUND = "the server could not find the requested resource"


def truthy(value: str | None) -> bool:
    """Boolean query parameters as Go's strconv.ParseBool reads them (the client sends True)."""
    return (value or "").lower() in ("1", "t", "true")


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = True
    # Status an API create starts from (real strategies reset it); None keeps the sent status.
    initial_status: Obj | None = None
    returns_deleted_object: bool = False  # ReturnDeletedObject in the real registry (pods)
    field_labels: tuple[str, ...] = ()  # beyond metadata.name / metadata.namespace
    crd: str | None = None  # tests/support/crds/<file>: the structural schema of a custom kind
    scale: bool = False  # has a scale subresource (spec.replicas), as the PDB controller needs
    # metadata.generation: set to 1 on create and moved by spec changes only for kinds whose
    # strategy does it (custom resources, pods, PDBs, workloads); others never have one
    generation: bool = False
    # rest.RESTUpdateStrategy AllowUnconditionalUpdate: a PUT without metadata.resourceVersion
    # is applied as is; False (custom resources, Leases, PDBs): 422, it must be specified
    unconditional_update: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:  # the "group resource" used in messages and as a store key
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def builtin(self) -> bool:
        return self.group in BUILTIN_GROUPS

    @property
    def qualified_kind(self) -> str:  # schema.GroupKind.String(), as in 422 messages
        return f"{self.kind}.{self.group}" if self.group else self.kind


class ApiError(Exception):
    """A failed request, answered with a metav1.Status (or ``body`` verbatim)."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: Obj | None = None,
        headers: dict[str, str] | None = None,
        body: Obj | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details
        self.reason = _REASONS.get(code, "Unknown") if reason is None else reason
        self.headers = headers or {}
        self.body = body

    def status(self) -> Obj:
        if self.body is not None:
            return self.body
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


class PlainNotFound(ApiError):
    """What the real server's last handler answers for a path nothing serves (an unknown group,
    or a custom kind whose CRD is not installed or not served): Go's ``http.NotFound``, a
    text/plain ``404 page not found``, not a Status (k8s.io/apiserver notfoundhandler; the
    apiextensions crdHandler delegates to it). The Python client raises ApiException(404)
    with that text as its body."""

    TEXT = "404 page not found\n"

    def __init__(self) -> None:
        super().__init__(404, self.TEXT.strip())


def details_of(res: Resource, name: str, kind: str | None = None) -> Obj:
    """metav1.StatusDetails: `group` is omitempty (none for the core group); `kind` is the
    resource's plural unless the error was made from a GroupKind."""
    details: Obj = {"name": name}
    if res.group:
        details["group"] = res.group
    details["kind"] = kind or res.plural
    return details


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, f'{res.key} "{name}" not found', details=details_of(res, name))


def conflict(res: Resource, name: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {res.key} "{name}": the object has '
        "been modified; please apply your changes to the latest version and "
        "try again",
        details=details_of(res, name),
    )


def invalid(res: Resource, name: str, errors: list[Any], by_resource: bool = False) -> ApiError:
    """errors.NewInvalid: 422 with one cause per field.Error (see kube_schema.FieldError).
    ``by_resource``: made from the resource in the kind's place, as the generic registry store
    does for its own checks (``leases.coordination.k8s.io "x" is invalid``, kind "leases")."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    kind = res.plural if by_resource else res.kind
    qualified = res.key if by_resource else res.qualified_kind
    return ApiError(
        422,
        f'{qualified} "{name}" is invalid: {listed}',
        "Invalid",
        {**details_of(res, name, kind), "causes": [e.cause() for e in errors]},
    )


# ---------------------------------------------------------------- selectors
def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses (set-based values contain commas)."""
    terms: list[str] = []
    depth, cur = 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms, cur = [*terms, cur], ""
        else:
            cur += ch
    return [t.strip() for t in [*terms, cur] if t.strip()]


LabelTest = Callable[[dict[str, str]], bool]


def _exists(k: str, neg: bool) -> LabelTest:
    return lambda ls: (k in ls) != neg


def _equals(k: str, v: str, neg: bool) -> LabelTest:
    return lambda ls: (ls.get(k) == v) != neg  # so != also matches objects without the label


def _member(k: str, values: set[str], neg: bool) -> LabelTest:
    return lambda ls: (k in ls and ls[k] in values) != neg


def parse_label_selector(selector: str) -> LabelTest:
    reqs: list[LabelTest] = []
    key = r"([A-Za-z0-9][-A-Za-z0-9_./]*)"
    for term in _split_terms(selector):
        if m := re.fullmatch(rf"(!?)\s*{key}", term):
            reqs.append(_exists(m.group(2), m.group(1) == "!"))
        elif m := re.fullmatch(rf"{key}\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)", term):
            reqs.append(_equals(m.group(1), m.group(3), m.group(2) == "!="))
        elif m := re.fullmatch(rf"{key}\s+(in|notin)\s*\(([^()]*)\)", term):
            values = {v.strip() for v in m.group(3).split(",")}
            reqs.append(_member(m.group(1), values, m.group(2) == "notin"))
        else:
            raise ApiError(400, f"unable to parse requirement: invalid selector {selector!r}")
    return lambda labels: all(r(labels) for r in reqs)


def selector_test(selector: Obj | None) -> LabelTest | None:
    """A metav1.LabelSelector object (matchLabels + matchExpressions) as a test on labels;
    None for a nil selector. metav1.LabelSelectorAsSelector: an empty one selects everything."""
    if selector is None:
        return None
    reqs: list[LabelTest] = [
        _equals(k, v, False) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key", ""), expr.get("operator"), set(expr.get("values") or ())
        if op in ("In", "NotIn"):
            reqs.append(_member(key, values, op == "NotIn"))
        elif op in ("Exists", "DoesNotExist"):
            reqs.append(_exists(key, op == "DoesNotExist"))
        else:
            raise ApiError(400, f'"{op}" is not a valid label selector operator')
    return lambda labels: all(r(labels) for r in reqs)


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return "" if cur is None else str(cur)


def parse_field_selector(selector: str, res: Resource) -> Callable[[Obj], bool]:
    allowed = ("metadata.name", "metadata.namespace", *res.field_labels)
    reqs: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        m = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise ApiError(400, f"invalid field selector: {term!r}")
        if m.group(1) not in allowed:  # the real server rejects unsupported fields; so do we
            raise ApiError(400, f"field label not supported: {m.group(1)}")
        reqs.append((m.group(1), m.group(2) == "!=", m.group(3)))
    return lambda obj: all((_field_value(obj, f) == v) != ne for f, ne, v in reqs)


# ---------------------------------------------------------------- patches
def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; with ``strategic`` the well-known lists merge by key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        elif (
            strategic
            and k in _SMP_MERGE_KEYS
            and isinstance(v, list)
            and isinstance(result.get(k), list)
        ):
            mk, merged = _SMP_MERGE_KEYS[k], list(result[k])
            for item in v:
                idx = next(
                    (
                        i
                        for i, o in enumerate(merged)
                        if isinstance(o, dict) and o.get(mk) == item.get(mk)
                    ),
                    None,
                )
                if idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = merge_patch(merged[idx], item, strategic)
            result[k] = merged
        else:
            result[k] = merge_patch(result.get(k), v, strategic)
    return result


def json_patch(doc: Any, ops: list[Obj]) -> Any:
    """RFC 6902 (add/remove/replace/move/copy/test); failures are 422 like the real server."""

    def tokens(path: str) -> list[str]:
        if path and not path.startswith("/"):
            raise ApiError(422, f"invalid JSON pointer {path!r}")
        return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]

    def walk(d: Any, toks: list[str]) -> Any:
        for t in toks:
            try:
                d = d[int(t)] if isinstance(d, list) else d[t]
            except (KeyError, IndexError, ValueError, TypeError):
                raise ApiError(422, f"json patch: path not found: /{'/'.join(toks)}") from None
        return d

    def remove(d: Any, toks: list[str]) -> Any:
        parent, last = walk(d, toks[:-1]), toks[-1]
        walk(parent, [last])
        return parent.pop(int(last) if isinstance(parent, list) else last)

    def add(d: Any, toks: list[str], value: Any) -> Any:
        if not toks:
            return value
        parent, last = walk(d, toks[:-1]), toks[-1]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if not 0 <= idx <= len(parent):
                raise ApiError(422, f"json patch: index out of range: {last}")
            parent.insert(idx, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise ApiError(422, "json patch: parent is not a container")
        return d

    doc = copy.deepcopy(doc)
    for op in ops:
        kind, toks, value = op.get("op"), tokens(op.get("path", "")), op.get("value")
        if kind in ("remove", "replace") and toks:
            remove(doc, toks)
        if kind in ("add", "replace"):
            doc = add(doc, toks, copy.deepcopy(value))
        elif kind in ("move", "copy"):
            src = tokens(op.get("from", ""))
            moved = remove(doc, src) if kind == "move" else copy.deepcopy(walk(doc, src))
            doc = add(doc, toks, moved)
        elif kind == "test" and walk(doc, toks) != value:
            raise ApiError(422, f"json patch: test operation failed at {op.get('path')}")
        elif kind not in ("remove", "test"):
            raise ApiError(422, f"json patch: unsupported operation {kind!r}")
    return doc
