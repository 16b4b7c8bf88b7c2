"""Every numeric key has its valid range in the schema, and validate names every value outside it."""

from __future__ import annotations

import random
import typing

import annotated_types as at
import pytest

from rlft.config.schema import RlftConfig
from rlft.config.sections.datasets import DatasetConfig
from rlft.config.sections.ebft import EBFTConfig
from rlft.config.sections.trl import TRLConfig
from rlft.config.sections.vllm import VLLMConfig

SECTIONS = (("", RlftConfig), ("trl.", TRLConfig), ("vllm.", VLLMConfig), ("ebft.", EBFTConfig), ("datasets[].", DatasetConfig))
# checked by a validator of their own, with a message that says more than the bound
CUSTOM = {"micro_batch_size", "gradient_accumulation_steps", "sequence_len", "logging_steps", "trl.vllm_importance_sampling_cap"}
BOUNDS = (at.Ge, at.Gt, at.Le, at.Lt, at.Interval)


def numeric_fields():
    for prefix, model in SECTIONS:
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            args = typing.get_args(info.annotation) or (info.annotation,)
            if "axolotl_only" not in extra and any(a in (int, float) for a in args) and bool not in args:
                yield prefix + name, info


def test_every_numeric_key_has_a_range():
    unbounded = [key for key, info in numeric_fields() if key not in CUSTOM and not any(
        isinstance(m, BOUNDS) or getattr(m, "allow_inf_nan", None) is False for m in info.metadata)]
    assert unbounded == []


def _outside(info) -> float | None:
    """A value just outside the field's lower bound (None when it has none)."""
    for m in info.metadata:
        if isinstance(m, at.Ge):
            return m.ge - 1
        if isinstance(m, at.Gt):
            return m.gt - (1 if isinstance(m.gt, int) else 0.5)
    return None


@pytest.mark.parametrize("seed", range(5))
def test_random_out_of_range_values_are_all_named(config_problems, seed):
    chosen = random.Random(seed).sample([(k, i) for k, i in numeric_fields() if k not in CUSTOM and "." not in k
                                         and _outside(i) is not None], 6)
    overrides = {key: _outside(info) for key, info in chosen}
    problems = dict(config_problems(**overrides))
    for key, _ in chosen:
        assert key in problems and problems[key].startswith("must be >") and f"got {overrides[key]!r}" in problems[key], (key, problems)


def test_sections_report_their_ranges_too(config_problems):
    problems = dict(config_problems(trl={"epsilon": 0.0, "entropy_coeff": -1.0}, ebft={"rl_coef": -0.5}))
    assert problems["trl.epsilon"] == "must be > 0.0, got 0.0"
    assert problems["trl.entropy_coeff"] == "must be >= 0.0, got -1.0"
    assert problems["ebft.rl_coef"] == "must be >= 0.0, got -0.5"
