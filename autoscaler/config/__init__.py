"""Reading the YAML config (I/O lives here, not in the core)."""

from autoscaler.config.loader import (
    ConfigError,
    Problem,
    check_config,
    config_warnings,
    load_config,
    parse_config,
)
from autoscaler.config.schema import Config, Prices

__all__ = [
    "Config",
    "ConfigError",
    "Prices",
    "Problem",
    "check_config",
    "config_warnings",
    "load_config",
    "parse_config",
]
