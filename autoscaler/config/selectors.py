"""Label selectors evaluated client-side too: some API servers and emulators ignore them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

LabelMatcher = Callable[[Mapping[str, str]], bool]

_KEY = r"([A-Za-z0-9][-A-Za-z0-9_./]*)"
_VALUE = r"([-A-Za-z0-9_.]*)"
_EXISTS = re.compile(rf"(!?)\s*{_KEY}")
_EQUALITY = re.compile(rf"{_KEY}\s*(==|=|!=)\s*{_VALUE}")
_SET = re.compile(rf"{_KEY}\s+(in|notin)\s*\(([^()]*)\)")


def _terms(selector: str) -> list[str]:
    """Split on commas outside parentheses (`k in (a,b)` holds a comma)."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t.strip() for t in terms if t.strip()]


def _requirement(term: str) -> LabelMatcher:
    if m := _EXISTS.fullmatch(term):
        negate, key = m.group(1) == "!", m.group(2)
        return lambda labels: (key in labels) != negate
    if m := _EQUALITY.fullmatch(term):
        key, op, value = m.groups()
        # `!=` also matches objects without the label, as on the server
        return lambda labels: (labels.get(key) == value) != (op == "!=")
    if m := _SET.fullmatch(term):
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        return lambda labels: (labels.get(key) in values) != (op == "notin")
    raise ValueError(f"not a label selector term: {term!r}")


def label_matcher(selector: str) -> LabelMatcher:
    """A predicate over labels; raises ValueError on a malformed selector."""
    requirements = [_requirement(t) for t in _terms(selector)]
    return lambda labels: all(r(labels) for r in requirements)
