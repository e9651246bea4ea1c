"""docs/configuration.md, generated from the config model: every key, its type, default and what
it does. The "what" is the comment the model's source keeps next to (or just above) the field, so
the docs cannot drift from the code: `python -m autoscaler.config.reference > docs/configuration.md`
rewrites them, and tests/test_config_reference.py fails while the file is stale.
"""

from __future__ import annotations

import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from autoscaler.config.schema import Config
from autoscaler.core.policy import PolicySet

_HEADER = """# Configuration reference

Generated from the config model (`autoscaler/config/`, `autoscaler/core/policy.py`) by
`python -m autoscaler.config.reference > docs/configuration.md`; a test fails when it is stale.
Every key is optional unless its default says *required*. Durations take seconds (`90`), `90s`,
`5m`, `1h30m`, `1d12h`, `250ms` (spaces may stand between a number and its unit and between
parts: `1h 30m`) or ISO 8601 (`PT1H30M`), digits 0-9 only. A window's `schedule` is standard
5-field cron: numbers, month and weekday names, ranges, steps and lists (croniter's `L`, `W`,
`#`, `?` and `H` are refused); a day none of its months has (`0 0 31 2 *`) is refused too.
`check-config FILE` lists every problem of a file with its line.

The policy keys (`policies`, `default_policy`, `cluster_budget_per_hour`) sit at the top level of
the file; `policies[]` is a list of policies, each with the keys under `policies[].`.

Installed with Helm, this file is the chart's `config:` value (the same keys, under `config:` in
your values file); the chart's own values (image, replicas, RBAC per job kind, monitoring, EKS
and ACK, the node agent) are in
[deploy/helm/spot-autoscaler/README.md](../deploy/helm/spot-autoscaler/README.md). The chart's
`values.schema.json` holds this model too: its `config` part is generated from it
(`python -m autoscaler.config.helm_schema`, `make docs`; tests/test_helm_schema.py fails when it
is stale), with the duration and cron patterns the parser itself matches, so `helm install`
refuses an unknown key, a wrong type, a value out of its bounds or enum, a bad duration or cron,
naming the key. What JSON Schema cannot say is in the chart's README ("What is checked at
install").
"""


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    doc: str


def keys(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[Key]:
    """Every key under `model`, depth first, in the model's order."""
    for name, field in model.model_fields.items():
        if model is Config and name == "policy_set":
            yield from keys(PolicySet, prefix)  # written at the top level of the file
            continue
        path = f"{prefix}{name}"
        annotation = _resolved(model, field.annotation)
        nested, in_list = _nested_model(annotation)
        doc = _doc(model, name) or _summary(nested)
        yield Key(path, _type(annotation, field), _default(field, nested), doc)
        if nested is not None:
            yield from keys(nested, f"{path}[]." if in_list else f"{path}.")


def render() -> str:
    rows = [_HEADER, "| key | type | default | what it does |", "|---|---|---|---|"]
    for key in keys():
        cells = (f"`{key.path}`", key.type, key.default, key.doc or "")
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def undocumented() -> list[str]:
    return [key.path for key in keys() if not key.doc]


# --- the source comments -----------------------------------------------------------------------
_FIELD = re.compile(r"^\s+(\w+)\s*:")
_INLINE = re.compile(r"#\s?(.*)$")


@cache
def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its comment: the trailing `# ...` on its line, else the `#` lines above."""
    found: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match and match.group(1) in model.model_fields:
            inline = _INLINE.search(line.split('"')[-1])  # not a '#' inside a string default
            found[match.group(1)] = (inline.group(1).strip() if inline else " ".join(above)).strip()
        above = []
    return found


def _summary(section: type[BaseModel] | None) -> str:
    """A section's docstring, first paragraph, on one line."""
    text = inspect.getdoc(section) if section is not None and "__doc__" in vars(section) else None
    return " ".join((text or "").split("\n\n")[0].split())


def _doc(model: type[BaseModel], name: str) -> str:
    for klass in model.__mro__:
        ours = issubclass(klass, BaseModel) and klass is not BaseModel
        if ours and (text := _comments(klass).get(name)):
            return text
    return ""


# --- types and defaults ------------------------------------------------------------------------
def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    if _is_model(annotation):
        return annotation, False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and _is_model(args[0]):
        return args[0], True
    models = [a for a in args if _is_model(a)]
    return (models[0], False) if len(models) == 1 else (None, False)


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _resolved(model: type[BaseModel], annotation: Any) -> Any:
    """A forward reference (a section class defined further down its module) as the class."""
    if isinstance(annotation, typing.ForwardRef):
        return vars(sys.modules[model.__module__])[annotation.__forward_arg__]
    return annotation


def _type(annotation: Any, field: FieldInfo) -> str:
    text = _type_name(annotation)
    bounds = [
        f"{sign} {_value(getattr(m, attr))}"
        for m in field.metadata
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))
        if getattr(m, attr, None) is not None
    ]
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _type_name(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + (
            " or null" if type(None) in args else ""
        )
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map {_type_name(args[0])} → {_type_name(args[1])}"
    if _is_model(t):
        return "section"
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return " | ".join(f"`{m.value}`" for m in t)
    return {
        timedelta: "duration",
        float: "number",
        int: "integer",
        str: "string",
        bool: "bool",
    }.get(t, getattr(t, "__name__", str(t)))


def _default(field: FieldInfo, nested: type[BaseModel] | None) -> str:
    if field.is_required():
        return "*required*"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if nested is not None and not isinstance(value, list):
            return "(section)"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "*required*"
    return f"`{_value(value)}`"


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, BaseModel):
        return str(value.model_dump(mode="json", exclude_defaults=True) or "{}")
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    if seconds and seconds == int(seconds):
        seconds = int(seconds)
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds % size == 0:
                return f"{seconds // size}{unit}"
    return f"{seconds:g}s"


if __name__ == "__main__":
    sys.stdout.write(render())
