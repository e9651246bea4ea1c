"""Structural-schema handling of custom resources, as the real API server does it for
``apiextensions.k8s.io/v1`` CRDs (stdlib + PyYAML).

On every create, update and patch the apiextensions-apiserver decodes the body through the CRD's
structural schema: it prunes fields the schema does not declare (unless
``x-kubernetes-preserve-unknown-fields``), drops ``null`` values of non-nullable fields, applies
``default:`` values, then validates the whole object (types, ``required``, ``enum``, bounds,
formats, list uniqueness) and answers 422 Invalid with one cause per field. What we model, with
the upstream code it comes from:

- pruning: ``apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go`` ``prune`` /
  ``skipPrune``: a preserve-unknown-fields node keeps its unknown keys, but the properties it does
  declare are still pruned by their own schema; apiVersion/kind/metadata of the root are skipped.
  ``metadata`` is coerced to ObjectMeta (unknown metadata keys are dropped).
- unknown fields are reported like ``fieldValidation`` does (``Warn`` is the server default: a
  ``Warning`` header per field; ``Strict``: 400 "strict decoding error"; ``Ignore``: silent).
- defaulting and null pruning: ``schema/defaulting`` (``Default``,
  ``PruneNonNullableNullsWithoutDefaults``).
- validation: ``apiserver/validation`` on kube-openapi; messages follow ``field.Error``.
- validation ratcheting (``CRDValidationRatcheting``, beta and on by default since 1.30): on an
  update, a subtree equal to the old object's correlated value is not validated again, so an
  object that was stored invalid (e.g. seeded) can still have other parts changed.

v1beta1 CRDs did not prune unless ``spec.preserveUnknownFields: false``; et-operator's CRDs are
v1, so pruning is always on for them (v1 forbids ``preserveUnknownFields: true``).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
CRD_DIR = Path(__file__).resolve().parent / "crds"
_MISSING: Any = object()
_META_FIELDS = ("apiVersion", "kind", "metadata")
# metav1.ObjectMeta's JSON fields: a custom resource's metadata keeps only these.
_OBJECT_META = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_CAUSES = {
    "Required": "FieldValueRequired",
    "Invalid": "FieldValueInvalid",
    "TypeInvalid": "FieldValueTypeInvalid",
    "NotSupported": "FieldValueNotSupported",
    "Duplicate": "FieldValueDuplicate",
}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _go_repr(value: Any) -> str:
    """A value as field.Error prints it (%q for strings, %v for numbers and booleans)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


@dataclass(frozen=True)
class FieldError:
    """One k8s.io/apimachinery field.Error."""

    type: str  # Required | Invalid | TypeInvalid | NotSupported | Duplicate
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        if self.type == "Required":
            text = "Required value"
        elif self.type == "NotSupported":
            text = f"Unsupported value: {_go_repr(self.value)}"
        elif self.type == "Duplicate":
            text = f"Duplicate value: {_go_repr(self.value)}"
        else:
            text = f"Invalid value: {_go_repr(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> Obj:
        return {"reason": _CAUSES[self.type], "message": self.body(), "field": self.field}


def invalid_message(qualified_kind: str, name: str, errors: list[FieldError]) -> str:
    """errors.NewInvalid's message: one error plain, several as an aggregate ``[a, b]``."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    return f'{qualified_kind} "{name}" is invalid: {listed}'


# the format kube-openapi infers for a decoded JSON value (validate/type.go schemaInfoForType):
# encoding/json gives int64 and float64; booleans, objects, arrays and strings have none
_DATA_FORMATS = {"integer": "int64", "number": "float64"}


def type_problem(value: Any, schema: Obj) -> tuple[str, str] | None:
    """None if `value` has the schema's type, else (expected, found) as the 422 names them.

    kube-openapi pkg/validation/validate/type.go typeValidator.Validate: an integral number is
    an integer and an integer a number; and a value that is neither a string nor an array,
    checked against a schema with a `format`, is named by formats: a boolean where an
    `integer, format: int32` belongs is "must be of type int32" found "" (not "integer" and
    "boolean")."""
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, int | str) and not isinstance(value, bool)
        return None if ok else ("integer or string", json_type(value))
    kind, fmt = schema.get("type"), schema.get("format")
    actual = json_type(value)
    found_format = _DATA_FORMATS.get(actual, "")
    float_int = actual == "number" and float(value).is_integer() and kind == "integer"
    int_float = actual == "integer" and kind == "number"
    matches = not kind or actual == kind or float_int or int_float
    lower = (fmt, found_format) in (("int64", "int32"), ("float64", "float32"))
    if actual not in ("string", "array") and fmt and not (matches or found_format == fmt or lower):
        return str(fmt), found_format
    return None if matches else (str(kind), actual)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class StructuralSchema:
    """One version's openAPIV3Schema of a CRD."""

    def __init__(self, schema: Obj) -> None:
        self.root = schema

    # ------------------------------------------------------------ pruning
    def prune(self, obj: Obj) -> list[str]:
        """Drop undeclared fields in place; returns their paths (for fieldValidation)."""
        pruned: list[str] = []
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for k in [k for k in meta if k not in _OBJECT_META]:
                del meta[k]
                pruned.append(f"metadata.{k}")
        self._prune(obj, self.root, "", pruned, root=True)
        return pruned

    def _prune(
        self, x: Any, s: Obj | None, path: str, pruned: list[str], root: bool = False
    ) -> None:
        preserve = s is not None and bool(s.get("x-kubernetes-preserve-unknown-fields"))
        if isinstance(x, dict):
            if s is None:
                pruned.extend(_join(path, k) for k in x)
                x.clear()
                return
            props, extra = s.get("properties") or {}, s.get("additionalProperties")
            for k in list(x):
                if root and k in _META_FIELDS:
                    continue
                if k in props:
                    self._prune(x[k], props[k], _join(path, k), pruned)
                elif isinstance(extra, dict):
                    self._prune(x[k], extra, _join(path, k), pruned)
                elif not preserve and extra is not True:
                    del x[k]
                    pruned.append(_join(path, k))
        elif isinstance(x, list):
            items = s.get("items") if s is not None else None
            for i, v in enumerate(x):
                if items is not None or not preserve:
                    self._prune(v, items, f"{path}[{i}]", pruned)

    # ------------------------------------------------------------ defaulting
    def default(self, obj: Obj) -> None:
        """Drop nulls of non-nullable fields and fill in ``default:`` values, in place."""
        self._default(obj, self.root)

    def _default(self, x: Any, s: Obj | None) -> None:
        if s is None:
            return
        if isinstance(x, dict):
            props, extra = s.get("properties") or {}, s.get("additionalProperties")
            for k in list(x):
                sub = props.get(k, extra if isinstance(extra, dict) else None)
                if x[k] is None and sub is not None and not sub.get("nullable"):
                    del x[k]  # defaulting.PruneNonNullableNullsWithoutDefaults
            for k, sub in props.items():
                if k not in x and "default" in sub:
                    x[k] = copy.deepcopy(sub["default"])
            for k, v in x.items():
                self._default(v, props.get(k, extra if isinstance(extra, dict) else None))
        elif isinstance(x, list):
            for v in x:
                self._default(v, s.get("items"))

    # ------------------------------------------------------------ validation
    def validate(self, obj: Obj, old: Obj | None = None, ratchet: bool = True) -> list[FieldError]:
        errors: list[FieldError] = []
        root_old = old if (old is not None and ratchet) else _MISSING
        props = self.root.get("properties") or {}
        for k, v in obj.items():
            if k in _META_FIELDS:
                continue
            sub_old = root_old.get(k, _MISSING) if isinstance(root_old, dict) else _MISSING
            self._validate(v, props.get(k), k, sub_old, errors)
        for k in self.root.get("required") or ():
            if k not in obj:
                errors.append(FieldError("Required", k))
        return errors

    def _validate(
        self, x: Any, s: Obj | None, path: str, old: Any, errors: list[FieldError]
    ) -> None:
        if s is None or (old is not _MISSING and x == old):
            return  # undeclared (preserved) value, or an unchanged subtree (ratcheting)
        if x is None:
            if not s.get("nullable"):
                errors.append(
                    FieldError(
                        "TypeInvalid",
                        path,
                        "null",
                        f'{path} in body must be of type {s.get("type")}: "null"',
                    )
                )
            return
        problem = type_problem(x, s)
        if problem is not None:
            want, found = problem
            errors.append(
                FieldError(
                    "TypeInvalid", path, found, f'{path} in body must be of type {want}: "{found}"'
                )
            )
            return
        if "enum" in s and x not in s["enum"]:
            supported = ", ".join(_go_repr(v) for v in s["enum"])
            errors.append(FieldError("NotSupported", path, x, f"supported values: {supported}"))
        self._bounds(x, s, path, errors)
        if isinstance(x, dict):
            self._validate_object(x, s, path, old, errors)
        elif isinstance(x, list):
            self._validate_list(x, s, path, old, errors)

    @staticmethod
    def _bounds(x: Any, s: Obj, path: str, errors: list[FieldError]) -> None:
        def fail(detail: str) -> None:
            errors.append(FieldError("Invalid", path, x, f"{path} in body {detail}"))

        if isinstance(x, int | float) and not isinstance(x, bool):
            lo, hi = s.get("minimum"), s.get("maximum")
            if lo is not None and (x <= lo if s.get("exclusiveMinimum") else x < lo):
                fail(
                    f"should be greater than {'' if s.get('exclusiveMinimum') else 'or equal to '}"
                    f"{lo}"
                )
            if hi is not None and (x >= hi if s.get("exclusiveMaximum") else x > hi):
                fail(
                    f"should be less than {'' if s.get('exclusiveMaximum') else 'or equal to '}{hi}"
                )
        elif isinstance(x, str):
            if "maxLength" in s and len(x) > s["maxLength"]:
                fail(f"should be at most {s['maxLength']} chars long")
            if "minLength" in s and len(x) < s["minLength"]:
                fail(f"should be at least {s['minLength']} chars long")
            if "pattern" in s and not re.search(s["pattern"], x):
                fail(f"should match '{s['pattern']}'")
            if s.get("format") == "date-time" and not _is_datetime(x):
                fail(f'must be of type date-time: "{x}"')
        elif isinstance(x, list):
            if "maxItems" in s and len(x) > s["maxItems"]:
                fail(f"should have at most {s['maxItems']} items")
            if "minItems" in s and len(x) < s["minItems"]:
                fail(f"should have at least {s['minItems']} items")

    def _validate_object(
        self, x: Obj, s: Obj, path: str, old: Any, errors: list[FieldError]
    ) -> None:
        props, extra = s.get("properties") or {}, s.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for k in s.get("required") or ():
            if k not in x:
                errors.append(FieldError("Required", _join(path, k)))
        for k, v in x.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            key_path = _join(path, k) if k in props else f"{path}[{k}]"
            self._validate(v, sub, key_path, old_map.get(k, _MISSING), errors)

    def _validate_list(
        self, x: list[Any], s: Obj, path: str, old: Any, errors: list[FieldError]
    ) -> None:
        list_type = s.get("x-kubernetes-list-type", "atomic")
        keys = s.get("x-kubernetes-list-map-keys") or []
        old_list = old if isinstance(old, list) else []
        seen: list[Any] = []
        for i, item in enumerate(x):
            correlated = _MISSING
            if list_type == "set":
                ident: Any = item
                correlated = item if item in old_list else _MISSING
            elif list_type == "map" and isinstance(item, dict):
                ident = {k: item.get(k) for k in keys}
                correlated = next(
                    (
                        o
                        for o in old_list
                        if isinstance(o, dict) and {k: o.get(k) for k in keys} == ident
                    ),
                    _MISSING,
                )
            else:
                ident = _MISSING
            if ident is not _MISSING:
                if ident in seen:
                    errors.append(FieldError("Duplicate", f"{path}[{i}]", ident))
                seen.append(ident)
            self._validate(item, s.get("items"), f"{path}[{i}]", correlated, errors)


def _is_datetime(value: str) -> bool:
    if not _RFC3339.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class CrdVersion:
    """What the emulator needs from one served version of a CustomResourceDefinition."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    schema: StructuralSchema
    prunes: bool  # v1 always; v1beta1 only with spec.preserveUnknownFields: false


@cache
def load_crd(filename: str) -> CrdVersion:
    """Read a CRD file, ``tests/support/crds/<filename>`` or an absolute path (the storage
    version; cached). apiextensions.k8s.io/v1beta1 CRDs are read too: their schema may be
    global (``spec.validation``), and they prune (and default) only with
    ``spec.preserveUnknownFields: false``, which v1beta1 defaulted to true."""
    with open(CRD_DIR / filename) as f:
        crd = next(
            d
            for d in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if d and d.get("kind") == "CustomResourceDefinition"
        )
    spec = crd["spec"]
    versions = spec.get("versions") or [{"name": spec.get("version"), "storage": True}]
    version = next(v for v in versions if v.get("storage"))
    schema = (version.get("schema") or spec.get("validation") or {}).get("openAPIV3Schema") or {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    subresources = version.get("subresources") or spec.get("subresources") or {}
    v1 = crd.get("apiVersion") == "apiextensions.k8s.io/v1"
    return CrdVersion(
        group=spec["group"],
        version=version["name"],
        plural=spec["names"]["plural"],
        kind=spec["names"]["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        status_subresource="status" in subresources,
        schema=StructuralSchema(schema),
        prunes=v1 or spec.get("preserveUnknownFields") is False,
    )


# The CRDs the emulator serves by default: et-operator's (upstream) and CCE's (reconstructed).
DEFAULT_CRDS = (
    "kai.alibabacloud.com_trainingjobs.yaml",
    "kai.alibabacloud.com_scaleins.yaml",
    "kai.alibabacloud.com_scaleouts.yaml",
    "kongming.cce.baiudbce.com_aitrainingjobs.yaml",
)
