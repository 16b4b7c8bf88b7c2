"""The config language: schema, loading, overrides and checks. Of rlft it imports only `rlft.errors`.

`rlft.config.schema.RlftConfig` is the whole file, joined from the key families in `rlft.config.sections`;
`rlft.config.rules` holds the cross-field checks, `rlft.config.methods` what each training method is.
"""

from rlft.config.base import planned_settings
from rlft.config.loading import build_config, deep_merge, explain, load_config, parse_overrides, read_yaml
from rlft.config.schema import RlftConfig
from rlft.config.sections.datasets import DatasetConfig, UserDefinedType

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
