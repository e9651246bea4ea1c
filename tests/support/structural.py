"""What the API server does with a custom resource that has a structural schema
(apiextensions.k8s.io/v1): unknown fields are pruned, wrong types and missing required fields are
rejected with 422 Invalid. The schemas are in tests/support/crds/, each with its source."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
CRDS = Path(__file__).parent / "crds"
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float),
}


@cache
def schemas() -> dict[tuple[str, str, str], Obj]:
    """(group, version, plural) -> openAPIV3Schema."""
    out = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        out[(crd["group"], crd["version"], crd["plural"])] = crd["schema"]
    return out


_NONE = object()


def conform(schema: Obj, value: Any, path: str = "", old: Any = _NONE) -> tuple[Any, list[str]]:
    """(value pruned to the schema, the problems found) as the API server's validation says
    them: `<path>: Invalid value: ...: <path> in body must be of type <t>`. With `old` (an
    update), a part equal to what was stored is not held against the write: validation
    ratcheting, on by default since Kubernetes 1.30 (CRDValidationRatcheting)."""
    return _conform(schema, value, path, old)


def _conform(schema: Obj, value: Any, path: str, old: Any) -> tuple[Any, list[str]]:
    pruned, problems = _check(schema, value, path, old)
    unchanged = old is not _NONE and value == old
    return pruned, [] if unchanged else problems


def _child(old: Any, key: Any) -> Any:
    if isinstance(old, dict):
        return old.get(key, _NONE)
    if isinstance(old, list) and isinstance(key, int) and key < len(old):
        return old[key]
    return _NONE


def _check(schema: Obj, value: Any, path: str, old: Any) -> tuple[Any, list[str]]:
    if schema.get("x-kubernetes-int-or-string") and isinstance(value, int | str) \
            and not isinstance(value, bool):
        return value, []
    kind = schema.get("type")
    if kind and value is not None and (
        not isinstance(value, _TYPES[kind]) or (kind in ("integer", "number")
                                                and isinstance(value, bool))):
        found = type(value).__name__.replace("dict", "object").replace("list", "array")
        return value, [f"{path}: Invalid value: \"{found}\": {path} in body must be of type "
                       f"{kind}: \"{found}\""]
    problems: list[str] = []
    if isinstance(value, dict) and path != "metadata":
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields")
        out = {}
        for key, item in value.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            where = f"{path}.{key}" if path else key
            if sub is not None:
                out[key], found = _conform(sub, item, where, _child(old, key))
                problems += found
            elif keep or extra is True:
                out[key] = item
            # else: pruned, silently, as the real server does
        for key in schema.get("required") or ():
            if key not in value:
                where = f"{path}.{key}" if path else key
                problems.append(f"{where}: Required value")
        return out, problems
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        pruned = []
        for i, item in enumerate(value):
            item, found = _conform(schema["items"], item, f"{path}[{i}]", _child(old, i))
            pruned.append(item)
            problems += found
        return pruned, problems
    return value, problems
