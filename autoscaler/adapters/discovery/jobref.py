"""The et-operator TrainingJob a launcher's sidecar serves."""

from __future__ import annotations

from dataclasses import dataclass

GROUP, VERSION, PLURAL = "kai.alibabacloud.com", "v1alpha1", "trainingjobs"  # et-operator


@dataclass(frozen=True, slots=True)
class JobRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> JobRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace, name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
