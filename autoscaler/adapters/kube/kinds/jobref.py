"""The job a launcher's sidecar serves: its name, and the resource of its kind."""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.adapters.kube.kinds.et_operator import TRAINING_JOBS
from autoscaler.adapters.kube.resources import Resource


@dataclass(frozen=True, slots=True)
class JobRef:
    namespace: str
    name: str
    resource: Resource = TRAINING_JOBS  # the job's kind (`--kind`): et-operator's by default

    @classmethod
    def parse(cls, text: str, resource: Resource = TRAINING_JOBS) -> JobRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace, name, resource)

    @property
    def path(self) -> tuple[str, str, str, str]:
        """(group, version, namespace, plural): the custom-objects API's arguments."""
        r = self.resource
        return r.group, r.version, self.namespace, r.plural

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
