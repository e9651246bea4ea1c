"""`prices:` section: what a node costs per hour, from the tables or a per-GPU-hour default.

An instance type the tables do not list is priced per GPU-hour (`default_spot_per_gpu_hour`,
`default_on_demand_per_gpu_hour`) times the node's GPUs, never at one flat figure per node: a flat
figure makes an 8-GPU node look 8x cheaper per GPU-hour than a 1-GPU node. Without a default the
node has no price: it ranks after every priced node (on-demand after spot), and price caps and
budgets keep new workers off it. Each unknown type is logged once (`instance_type_unpriced`).
See docs/pricing.md.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import structlog
from pydantic import WithJsonSchema, field_validator

from autoscaler.core.policy import Price, StrictModel

log = structlog.get_logger()

# a removed key: null only (the chart's schema says so too)
Removed = Annotated[Any, WithJsonSchema({"type": "null"})]
_RENAMED = {
    "default_spot": "default_spot_per_gpu_hour",
    "default_on_demand": "default_on_demand_per_gpu_hour",
}

# (instance type, capacity type) already logged as unpriced: once per process, not per tick
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class Prices(StrictModel):
    """Node prices per hour by instance type; live spot prices from the clouds override `spot`."""

    on_demand: dict[str, Price] = {}  # USD per node-hour by instance type
    spot: dict[str, Price] = {}  # USD per node-hour by instance type (live feeds override)
    # USD per GPU-hour for instance types not listed (x the node's GPUs); None: no price
    default_on_demand_per_gpu_hour: Price | None = None
    default_spot_per_gpu_hour: Price | None = None  # the same for spot nodes
    # Removed (one per-node figure for every unknown type): only null is accepted, so an old
    # config fails check-config naming the new key instead of silently mispricing nodes.
    default_on_demand: Removed = None
    default_spot: Removed = None  # removed: only null is accepted (see default_on_demand)

    @field_validator("default_on_demand", "default_spot")
    @classmethod
    def _renamed(cls, value: Any, info: Any) -> Any:
        if value is not None:
            raise ValueError(
                f"removed: it priced every unlisted instance type at one figure per node-hour"
                f" whatever its GPUs; use prices.{_RENAMED[info.field_name]} (USD per GPU-hour,"
                f" multiplied by the node's GPUs)"
            )
        return value

    def listed(self, instance_type: str, spot: bool) -> float | None:
        """The table's price per node-hour, or None when the type is not listed."""
        return (self.spot if spot else self.on_demand).get(instance_type)

    def default_per_gpu_hour(self, spot: bool) -> float | None:
        return self.default_spot_per_gpu_hour if spot else self.default_on_demand_per_gpu_hour

    def for_node(
        self, instance_type: str, spot: bool, gpus: float | None = None, *, warn: bool = True
    ) -> float | None:
        """Price per node-hour: the table's, else the per-GPU-hour default x `gpus`, else None.

        Without `gpus` an unlisted type has no price (a per-GPU default cannot be applied).
        An unlisted type is logged once per process (`warn=False`: not at all).
        """
        price = self.listed(instance_type, spot)
        if price is not None:
            return price
        default = self.default_per_gpu_hour(spot)
        price = default * gpus if default is not None and gpus is not None and gpus > 0 else None
        if warn:
            _warn_unpriced(instance_type, spot, default, price)
        return price


def _warn_unpriced(
    instance_type: str, spot: bool, default: float | None, price: float | None
) -> None:
    kind = "spot" if spot else "on-demand"
    with _warned_lock:
        if (instance_type, kind) in _warned:
            return
        _warned.add((instance_type, kind))
    log.warning(
        "instance_type_unpriced",
        instance_type=instance_type or "<no instance-type label>",
        capacity_type=kind,
        default_per_gpu_hour=default,
        effect=(
            "priced at the per-GPU-hour default x its GPUs"
            if price is not None
            else "no price: ranked after priced nodes, kept out by price caps and budgets"
        ),
        fix=f"add it to prices.{'spot' if spot else 'on_demand'} (USD per node-hour)",
    )
