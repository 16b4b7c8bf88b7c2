"""The config language: schema, loading, overrides and checks. Imports nothing else of rlft."""

from rlft.config.base import planned_settings
from rlft.config.loading import build_config, deep_merge, explain, load_config, parse_overrides, read_yaml
from rlft.config.schema import DatasetConfig, RlftConfig, UserDefinedType

__all__ = [
    "DatasetConfig",
    "RlftConfig",
    "UserDefinedType",
    "build_config",
    "deep_merge",
    "explain",
    "load_config",
    "parse_overrides",
    "planned_settings",
    "read_yaml",
]
