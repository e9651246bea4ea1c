"""`aws:` and `alibaba:` sections: cloud notice sources and spot price feeds."""

from __future__ import annotations

from autoscaler.core.policy import StrictModel


class AwsSettings(StrictModel):
    """Filled in by the cloud signals work (issue 4)."""


class AlibabaSettings(StrictModel):
    """Filled in by the cloud signals work (issue 4)."""
