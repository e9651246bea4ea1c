"""The `config` part of the Helm chart's values.schema.json, generated from the config model, so
`helm install` refuses a config `check-config` would (a key, a type, a bound, an enum, a
duration's or a cron's text) naming the key. The rest of the file (the chart's own values) is
written by hand; `python -m autoscaler.config.helm_schema` rewrites the generated keys in place
and tests/test_helm_schema.py fails while they are stale.

What JSON Schema cannot say stays with the templates (`fail`: rules across keys such as
`min_workers` > `max_workers`) or with check-config alone (deploy/helm/spot-autoscaler/README.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from autoscaler.config.schema import Config
from autoscaler.core.policy import DURATION_PATTERN, PolicySet, parse_duration

SCHEMA = Path(__file__).resolve().parents[2] / "deploy/helm/spot-autoscaler/values.schema.json"
# timedelta(seconds=x) overflows beyond ±999,999,999 days
_MAX_SECONDS = 86400 * (999_999_999 + 1)
_MIN_SECONDS = -86400 * 999_999_999
# chart value -> the config key it is copied to (templates/_helpers.tpl "spot-autoscaler.config")
CHART_KEYS = {
    ("eks", "prices"): ("aws", "prices"),
    ("ack", "pollInterval"): ("alibaba", "poll_interval"),
    ("ack", "prices"): ("alibaba", "prices"),
}
# the chart runs the daemon in kubernetes mode only (the templates fail on another, too)
DAEMON_MODE = {"type": "string", "enum": ["kubernetes"], "description": "the chart's only mode"}
_ANNOTATIONS = ("title", "default", "description")


class _Schema(GenerateJsonSchema):
    def timedelta_schema(self, schema: core_schema.TimedeltaSchema) -> JsonSchemaValue:
        """A duration as `parse_duration` takes it: seconds (a number) or its text."""
        return {
            "type": ["number", "string"],
            "pattern": DURATION_PATTERN,
            "minimum": _MIN_SECONDS,
            "exclusiveMaximum": _MAX_SECONDS,
        }


def config_schema() -> dict[str, Any]:
    """The schema of the chart's `config` value: the config file's, policy keys at the top."""
    generated = Config.model_json_schema(schema_generator=_Schema)
    definitions = generated.get("$defs", {})
    top = _tidy(generated, definitions)
    policy_keys = _tidy(PolicySet.model_json_schema(schema_generator=_Schema), definitions)
    sections = {k: v for k, v in top["properties"].items() if k != "policy_set"}
    top["properties"] = policy_keys["properties"] | sections
    top["properties"]["daemon"]["properties"]["mode"] = DAEMON_MODE
    top["description"] = "the daemon's config.yaml (docs/configuration.md), from its model"
    return dict(top)


def render(values_schema: dict[str, Any]) -> str:
    """values.schema.json with its generated keys rewritten."""
    config = config_schema()
    properties = values_schema["properties"]
    properties["config"] = config
    for (section, key), (config_section, config_key) in CHART_KEYS.items():
        from_config = config["properties"][config_section]["properties"][config_key]
        properties[section]["properties"][key] = from_config
    return json.dumps(values_schema, indent=2, ensure_ascii=False) + "\n"


def _tidy(node: Any, definitions: dict[str, Any]) -> Any:
    """References inlined, annotations dropped, `X or null` as one type list."""
    if isinstance(node, list):
        return [_tidy(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _tidy(definitions[node["$ref"].rsplit("/", 1)[-1]], definitions)
    out = {k: _tidy(v, definitions) for k, v in node.items() if k not in (*_ANNOTATIONS, "$defs")}
    if isinstance(node.get("properties"), dict):  # field names, not annotations
        out["properties"] = {k: _tidy(v, definitions) for k, v in node["properties"].items()}
    if out.get("pattern") == DURATION_PATTERN:
        _duration_bounds(out)
    if out.get("format") == "path":  # pydantic's own word: helm's validator knows no such format
        del out["format"]
    _merge_optional(out)
    return out


def _merge_optional(schema: dict[str, Any]) -> None:
    """pydantic's `anyOf: [X, null]` as X with `null` among its types (and its enum)."""
    branches = schema.get("anyOf", [])
    if {"type": "null"} not in branches or len(branches) != 2:
        return
    [other] = [b for b in branches if b != {"type": "null"}]
    if "type" not in other:
        return
    del schema["anyOf"]
    kinds = other["type"] if isinstance(other["type"], list) else [other["type"]]
    schema |= other | {"type": [*kinds, "null"]}
    if "enum" in other:
        schema["enum"] = [*other["enum"], None]


def _duration_bounds(schema: dict[str, Any]) -> None:
    """A bound of the model's (pydantic writes `gt: PT0S`) in seconds, for a number: the text
    of a duration is only checked by check-config against it."""
    for key, word, overflow in (
        ("ge", "minimum", "minimum"),
        ("gt", "exclusiveMinimum", "minimum"),
        ("le", "maximum", "exclusiveMaximum"),
        ("lt", "exclusiveMaximum", "exclusiveMaximum"),
    ):
        if key in schema:
            del schema[overflow]
            seconds = parse_duration(schema.pop(key)).total_seconds()
            schema[word] = int(seconds) if seconds.is_integer() else seconds


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA
    path.write_text(render(json.loads(path.read_text())))
