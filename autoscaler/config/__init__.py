"""Reading the YAML config (I/O lives here, not in the core)."""

from autoscaler.config.loader import ConfigError, Problem, load_config, parse_config
from autoscaler.config.schema import Config, Prices

__all__ = ["Config", "ConfigError", "Prices", "Problem", "load_config", "parse_config"]
