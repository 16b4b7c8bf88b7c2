"""Cross-field rules: every combination of keys that cannot run, found from the config alone (no model, no data), so
`rlft validate` reports them. `rlft.config.loading.build_config` runs them after the keys themselves validate."""

from __future__ import annotations

from rlft.config.best_model import best_model_problems
from rlft.config.rules.adapters import adapter_key_problems, lora_init_problems, unfrozen_problems
from rlft.config.rules.batching import batching_problems
from rlft.config.rules.data import conversation_problems, streaming_problems
from rlft.config.rules.model import (essentials, kernel_problems, mistral_common_problems, model_config_problems,
                                     neftune_problems, offloading_problems, qat_problems)
from rlft.config.rules.multi_turn import multi_turn_problems
from rlft.config.rules.nemo_gym import nemo_gym_problems
from rlft.config.rules.online import online_problems
from rlft.config.rules.parallel import ddp_problems, sharding_problems
from rlft.config.rules.preference import preference_problems
from rlft.config.rules.profiling import profiler_problems
from rlft.config.rules.schedule import schedule_problems
from rlft.config.rules.validation import validation_problems
from rlft.config.trackers import logger_problems


def combination_problems(cfg):
    """Yield one sentence per impossible combination of keys: the keys involved and the fix."""
    yield from essentials(cfg)
    yield from model_config_problems(cfg)
    yield from mistral_common_problems(cfg)
    yield from qat_problems(cfg)
    yield from streaming_problems(cfg)
    yield from conversation_problems(cfg)
    yield from offloading_problems(cfg)
    yield from ddp_problems(cfg)
    yield from kernel_problems(cfg)
    yield from schedule_problems(cfg)
    yield from adapter_key_problems(cfg)
    yield from batching_problems(cfg)
    yield from preference_problems(cfg)
    yield from online_problems(cfg)
    yield from nemo_gym_problems(cfg)
    yield from multi_turn_problems(cfg)
    yield from best_model_problems(cfg)
    yield from unfrozen_problems(cfg)
    yield from lora_init_problems(cfg)
    yield from neftune_problems(cfg)
    yield from sharding_problems(cfg)
    yield from profiler_problems(cfg)
    yield from logger_problems(cfg)
    yield from validation_problems(cfg)
