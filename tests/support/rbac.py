"""What an RBAC Role or ClusterRole (a manifest dict) allows, for tests to compare with the
requests a program makes."""

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
