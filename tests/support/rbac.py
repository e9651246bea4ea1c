"""What an RBAC Role or ClusterRole (a manifest dict) allows and what a request needs, for tests
to compare the grants with the requests a program makes."""

from __future__ import annotations

from typing import Any

Grant = tuple[str, str, str]  # (API group, resource, verb); "" is the core group


def role_grants(role: dict[str, Any]) -> set[Grant]:
    """Every (group, resource, verb) the role's rules grant, rule by rule expanded."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def request_rights(method: str, path: str, watch: bool) -> Grant | None:
    """(apiGroup, resource, verb) RBAC checks for one request; None for non-resource URLs
    (/version, discovery: granted to every authenticated user by system:discovery)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        "GET": "get" if named else "watch" if watch else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    return group, resource, verb
