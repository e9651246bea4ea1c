"""Load the YAML config into typed objects; report every problem as file, key path and line."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoscaler.config.schema import Config
from autoscaler.core.policy import naming_problems

KeyPath = tuple[str | int, ...]

# a GPU worker's start on a node that is up (schedule, image pull, start): a refill's retry
_POD_START = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path or '<top>'}: {self.message}"


class ConfigError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def load_config(path: str | Path) -> Config:
    return check_config(path)[0]


def check_config(path: str | Path, now: datetime | None = None) -> tuple[Config, list[Problem]]:
    """The config in `path` and its warnings (legal, but likely to misbehave); ConfigError if
    it is invalid, or (given `now`: check-config, not the daemon, whose jobs may simply be
    done) if a policy's absolute deadline has passed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot read: {exc.strerror}")]) from exc
    except UnicodeDecodeError as exc:
        line, byte = _line_at(exc.object, exc.start), exc.object[exc.start]
        problem = Problem(str(path), line, "", f"not UTF-8 text (byte 0x{byte:02x})")
        raise ConfigError([problem]) from exc
    config, lines = _parse(text, str(path))
    if now is not None and (past := _past_deadlines(config, lines, str(path), now)):
        raise ConfigError(past)
    return config, config_warnings(config, lines, str(path))


def _past_deadlines(
    config: Config, lines: dict[KeyPath, int], source: str, now: datetime
) -> list[Problem]:
    out = []
    for i, policy in enumerate(config.policy_set.policies):
        deadline = policy.deadline
        if deadline is not None and deadline.at is not None and deadline.at <= now:
            path: KeyPath = ("policies", i, "deadline", "at")
            message = f"{deadline.at.isoformat()} is in the past (now {now.isoformat()})"
            out.append(Problem(source, _line(lines, path), _dotted(path), message))
    return out


def parse_config(text: str, source: str = "<config>") -> Config:
    return _parse(text, source)[0]


def config_warnings(
    config: Config, lines: dict[KeyPath, int] | None = None, source: str = "<config>"
) -> list[Problem]:
    """What check-config warns about (the daemon runs such a config as it is)."""
    lines = lines or {}
    out = []
    for i, policy in enumerate(config.policy_set.policies):
        rules, elastic = policy.scale_out, policy.horovod.elastic_timeout
        if not rules.enabled:
            continue  # it never starts a ScaleOut
        # a refill below min: the first ScaleOut times out, the backoff, a second ScaleOut whose
        # pods start on a node that is up (a refill takes idle capacity; what needed a new node
        # was provisioned for the first)
        needed = rules.timeout + rules.backoff + _POD_START
        if needed > elastic:
            path: KeyPath = ("policies", i, "scale_out")
            out.append(
                Problem(
                    source,
                    _line(lines, (*path, "timeout")),
                    _dotted(path),
                    f"warning: timeout ({_span(rules.timeout)}) + backoff ({_span(rules.backoff)})"
                    f" + a pod's start ({_span(_POD_START)}) = {_span(needed)} exceeds"
                    " horovod.elastic_timeout"
                    f" ({_span(elastic)}): a refill below min whose first ScaleOut times out cannot"
                    f" be retried before Horovod stops the job; shorten timeout/backoff (or raise"
                    f" elastic_timeout to match the job's HOROVOD_ELASTIC_TIMEOUT)",
                )
            )
    prices = config.prices
    spot, on_demand = prices.default_spot_per_gpu_hour, prices.default_on_demand_per_gpu_hour
    if spot is not None and on_demand is not None and on_demand < spot:
        path = ("prices", "default_on_demand_per_gpu_hour")
        out.append(
            Problem(
                source,
                _line(lines, path),
                _dotted(path),
                f"warning: below default_spot_per_gpu_hour ({spot}): on-demand nodes of unlisted"
                f" types get new workers before spot nodes of unlisted types",
            )
        )
    return out


def _line(lines: dict[KeyPath, int], path: KeyPath) -> int | None:
    """The line of the deepest part of `path` the file has."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _span(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


# deeper than any real config; the YAML composer and our walk recurse once per level
_MAX_DEPTH = 64
# values (keys, items, scalars) a document may hold with its aliases expanded; the example has
# 163. A "billion laughs" of a few hundred bytes would otherwise take seconds to minutes to walk
_MAX_VALUES = 50_000


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader whose composer stops, at the line where it happens, a document
    nested deeper than _MAX_DEPTH or expanding through aliases to more than _MAX_VALUES values
    (before Python's recursion limit or the walk of a million aliased values)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values: dict[int, int] = {}  # id of a collection node -> values it expands to

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if self._depth > _MAX_DEPTH:
            raise _compose_error(f"nested deeper than {_MAX_DEPTH} levels", event)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.CollectionNode) and not isinstance(event, yaml.AliasEvent):
            children = node.value if isinstance(node, yaml.SequenceNode) else _pairs(node)
            values = 1 + sum(self._values.get(id(child), 1) for child in children)
            if values > _MAX_VALUES:
                message = f"more than {_MAX_VALUES:,} values with its aliases expanded"
                raise _compose_error(message, event)
            self._values[id(node)] = values
        return node


def _pairs(node: yaml.MappingNode) -> list[yaml.Node]:
    return [part for pair in node.value for part in pair]


def _compose_error(message: str, event: yaml.Event) -> yaml.composer.ComposerError:
    return yaml.composer.ComposerError(None, None, message, event.start_mark)


def _yaml_problem(exc: yaml.YAMLError, text: str) -> tuple[int | None, str]:
    """(line, message) of a YAML error: the reader's (a control character) has a position in
    the text, the others a mark."""
    if isinstance(exc, yaml.reader.ReaderError) and isinstance(exc.character, int):
        at = text.count("\n", 0, exc.position) + 1
        return at, f"unacceptable character #x{exc.character:04x}: {exc.reason}"
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None, getattr(exc, "problem", None) or str(exc)


def _parse(text: str, source: str) -> tuple[Config, dict[KeyPath, int]]:
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        line, problem = _yaml_problem(exc, text)
        raise ConfigError([Problem(source, line, "", f"bad YAML: {problem}")]) from exc
    lines: dict[KeyPath, int] = {(): 1}  # an empty file's missing keys: line 1
    problems: list[Problem] = []
    try:
        data = _to_python(root, (), lines, problems, source) if root is not None else {}
    except _Unreadable as exc:
        raise ConfigError([*problems, exc.problem]) from None
    if not isinstance(data, dict):
        raise ConfigError([*problems, Problem(source, 1, "", "the top level must be a mapping")])
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems += [_problem(err, lines, source) for err in exc.errors(include_url=False)]
        problems += _naming_problems(data, lines, source, already=problems)
        raise ConfigError(sorted(problems, key=lambda p: (p.line or 0, p.path))) from exc
    if problems:
        raise ConfigError(problems)
    return config, lines


def _naming_problems(
    data: dict[str, Any], lines: dict[KeyPath, int], source: str, already: list[Problem]
) -> list[Problem]:
    """Cross-policy problems pydantic skips when a field already failed."""
    policies = data.get("policies")
    if not isinstance(policies, list):
        return []
    names = [p.get("name") for p in policies if isinstance(p, dict)]
    reported = " ".join(p.message for p in already)
    return [
        Problem(source, _line(lines, (key,)), key, message)
        for key, message in naming_problems(names, data.get("default_policy", "default"))
        if message not in reported
    ]


class _Unreadable(Exception):
    """A node no config could mean (a list as a key, an alias that contains itself, an unknown
    tag, absurd nesting): the walk stops there with one problem."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def _to_python(
    node: yaml.Node,
    path: KeyPath,
    lines: dict[KeyPath, int],
    problems: list[Problem],
    source: str,
    open_nodes: frozenset[int] = frozenset(),
) -> Any:
    """Build plain data from the YAML node tree, noting each key's line; flag duplicate keys."""
    line = node.start_mark.line + 1
    lines[path] = line

    def unreadable(message: str) -> _Unreadable:
        return _Unreadable(Problem(source, line, _dotted(path), message))

    if id(node) in open_nodes:
        raise unreadable("an alias that contains itself")
    if len(path) > _MAX_DEPTH:
        raise unreadable(f"nested deeper than {_MAX_DEPTH} levels")
    open_nodes = open_nodes | {id(node)}
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line = key_node.start_mark.line + 1
                raise unreadable("a key must be a plain value, not a list or a mapping")
            key = _scalar(key_node, unreadable)
            if key in out:
                problems.append(
                    Problem(
                        source, key_node.start_mark.line + 1, _dotted((*path, key)), "duplicate key"
                    )
                )
            out[key] = _to_python(value_node, (*path, key), lines, problems, source, open_nodes)
            lines[(*path, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_python(item, (*path, i), lines, problems, source, open_nodes)
            for i, item in enumerate(node.value)
        ]
    return _scalar(node, unreadable)


def _scalar(node: yaml.Node, unreadable: Any) -> Any:
    try:
        value = yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    except yaml.YAMLError as exc:  # e.g. an unknown tag (!!python/object...)
        raise unreadable(f"bad YAML: {getattr(exc, 'problem', None) or exc}") from None
    except Exception:  # a value its explicit tag cannot be: `!!int x`, `!!bool maybe`
        tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
        raise unreadable(f"bad YAML: {node.value!r} is not a valid {tag}") from None
    try:
        hash(value)
    except TypeError:
        raise unreadable("a key must be a plain value") from None
    return value


def _problem(err: Any, lines: dict[KeyPath, int], source: str) -> Problem:
    # pydantic adds tags for unions/validators (e.g. 'function-before[...]'): keep real keys only
    loc: KeyPath = tuple(p for p in err["loc"] if isinstance(p, int) or "[" not in str(p))
    if loc[:1] == ("policy_set",):  # its keys stand at the top level of the file
        loc = loc[1:]
    line = _line(lines, loc)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    return Problem(source, line, _dotted(loc), message)


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
