"""The whole config language: Axolotl-style top-level keys plus the `trl:`, `ebft:`, `vllm:`, `qat:`, `profiler:` and
`validation:` sections.

`RlftConfig` joins the key families of `rlft.config.sections` and `rlft.config.trackers` with the method keys and the
multi-process keys. Defaults equal the documented Axolotl/TRL ones. Cross-field rules live in
`rlft.config.rules.combination_problems` (run by `rlft.config.build_config`), so `rlft validate` reports them without
loading a model or a dataset.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import TypeAdapter, ValidationError, field_validator, model_validator

from rlft.config.axolotl_tables import TOP_LEVEL, known_only
from rlft.config.base import field, planned
from rlft.config.methods import RL_METHODS, method_spec
from rlft.config.rules.batching import flattens_batches
from rlft.config.sections.data import DataFields
from rlft.config.sections.ebft import EBFTConfig
from rlft.config.sections.loop import LoopFields
from rlft.config.sections.model import ModelFields
from rlft.config.sections.nemo_gym import NemoGymFields
from rlft.config.sections.preference import PreferenceFields
from rlft.config.sections.profiler import ProfilerFields
from rlft.config.sections.qat import QATConfig
from rlft.config.sections.trl import TRLConfig
from rlft.config.sections.validation import ValidationFields
from rlft.config.sections.vllm import VLLMConfig
from rlft.config.trackers import TrackerFields

RlMethod = Literal[RL_METHODS]


def _as_bool(value: Any) -> bool | None:
    """`value` as a bool field reads it, or None where it is not one."""
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return None


# The bases' order keeps the keys in the order the docs and error messages list them: Axolotl-only keys, trackers,
# NeMo Gym, preference, model, data, loop, profiler, validation, then the keys below.
class RlftConfig(ValidationFields, ProfilerFields, LoopFields, DataFields, ModelFields, PreferenceFields, NemoGymFields,
                 TrackerFields, known_only("AxolotlKeys", TOP_LEVEL)):
    """The whole config file."""

    # --- methods ---
    rl: Optional[RlMethod] = field(None, f"The method: unset for SFT, else {', '.join(RL_METHODS)}.")
    trl: TRLConfig = field(default_factory=TRLConfig, description="Online-RL (GRPO family) options.")
    ebft: EBFTConfig = field(default_factory=EBFTConfig, description="Energy-based fine-tuning options.")
    qat: Optional[QATConfig] = field(None, "Quantization-aware training through torchao's fake quantizers (Axolotl's "
                                           "section; SFT): docs/training.md#quantization-aware-training-qat.")
    vllm: VLLMConfig = field(default_factory=VLLMConfig, description="Rollout server (vLLM) options.")
    batch_flattening: Union[bool, Literal["auto"]] = field(
        False, "Each micro-batch as one sequence without padding, rows kept apart (SFT without sample_packing, and the GRPO "
        "family's rollouts; https://arxiv.org/abs/2407.09105). auto: on with flash_attention and micro_batch_size > 1, as in "
        "Axolotl; true also works with SDPA (attention per row, no mask: rlft.models.varlen) and eager attention (a "
        "block-diagonal mask)."
    )
    share_prompts: Optional[bool] = field(
        None, "Answers to one prompt in one sequence, the prompt once and every answer after it, a mask keeping each "
        "answer from the others (prefix sharing, https://arxiv.org/abs/2410.20305): each pair's prompt (dpo, ipo, orpo, "
        "simpo, reward models) or each group's prompt (grpo, gdpo) runs through the model once, for the same results. "
        "SDPA or eager attention. None -> on where rlft has checked the model type and it saves forward FLOPs (the plan "
        "says; GRPO decides per micro-batch); docs/preference.md, docs/grpo.md."
    )

    # --- several processes (docs/distributed.md) ---
    fsdp: Optional[list[str]] = field(None, "Shard the model over the processes (FSDP2): [full_shard, auto_wrap]; shard_grad_op "
                                      "keeps parameters gathered until backward; offload moves them to the CPU.")
    fsdp_config: Optional[dict[str, Any]] = field(
        None, "FSDP settings: fsdp_transformer_layer_cls_to_wrap, fsdp_reshard_after_forward, fsdp_offload_params, "
              "fsdp_activation_checkpointing, fsdp_version (rlft always runs FSDP2).")
    ddp_timeout: int = field(1800, "Seconds a collective may wait for a rank before the run stops (a rank that hangs).", gt=0)
    ddp_find_unused_parameters: Optional[bool] = field(
        None, "DDP (plain data parallelism) looks for parameters that got no gradient in a step and reduces them anyway: "
              "needed when some do (a vision tower in text-only training). None -> false, "
              "as accelerate: a traversal less per step (transformers' Trainer and Axolotl: true without "
              "gradient_checkpointing).")
    ddp_bucket_cap_mb: Optional[int] = field(None, "DDP's gradient bucket size in MiB; None -> 25 (PyTorch's).", gt=0)
    ddp_broadcast_buffers: Optional[bool] = field(
        None, "DDP copies rank 0's buffers to the other ranks before each forward; None -> true (PyTorch's).")
    deepspeed: Optional[str] = field(None, "DeepSpeed JSON file (ZeRO-1/2/3): a path, or one rlft ships by name "
                                     "(deepspeed_configs/zero3_bf16.json); \"auto\" values come from the config.")
    context_parallel_size: int = planned(1, "Sequence/context parallel degree.", what="context parallelism", ge=1)

    @field_validator("micro_batch_size", "gradient_accumulation_steps", "sequence_len", "logging_steps")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @model_validator(mode="before")
    @classmethod
    def _bfloat16_is_bf16(cls, data: Any) -> Any:
        """Axolotl's `bfloat16: true` trains in bf16 as `bf16: true` does (it reads `bf16 or bfloat16`). Values are read
        as the fields read them (1, "yes" and "true" are true); one neither field takes is reported by the field."""
        if not isinstance(data, dict) or "bfloat16" not in data or (on := _as_bool(data["bfloat16"])) is not True:
            return data
        if _as_bool(data.get("bf16")) is False:
            raise ValueError("bfloat16: true and bf16: false disagree: remove one (bfloat16 is Axolotl's other name for bf16)")
        return {**data, "bf16": on}

    @model_validator(mode="before")
    @classmethod
    def _one_revision_key(cls, data: Any) -> Any:
        for key, other in (("revision_of_model", "model_revision"), ("random_init", "reinit_weights")):
            if isinstance(data, dict) and data.get(key) is not None and data.get(other) is not None:
                raise ValueError(f"{key} and {other} are both set (two names of one key): keep one")
        return data

    @model_validator(mode="before")
    @classmethod
    def _jinja_template_alone(cls, data: Any) -> Any:
        """Axolotl's rule: `chat_template_jinja` without `chat_template` means `chat_template: jinja`."""
        if isinstance(data, dict) and data.get("chat_template_jinja") and data.get("chat_template") is None:
            data = {**data, "chat_template": "jinja"}
        return data

    @property
    def method(self) -> str:
        """The training method: `sft`, `reward_model`, or the value of `rl` (`ipo` means DPO+IPO loss)."""
        if self.rl:
            return self.rl
        return "reward_model" if self.reward_model else "sft"

    @property
    def flat_batches(self) -> str | None:
        """How micro-batches are flattened (`batch_flattening`): None (padded rows), "varlen" (flash-attention finds the
        rows from the position ids) or "mask" (a block-diagonal causal mask, for SDPA and eager attention)."""
        flash = self.effective_attn_implementation.startswith("flash_attention")
        if method_spec(self.method).preference:  # TRL's and Axolotl's key for the DPO trainer's padding-free batches
            on = bool(self.dpo_padding_free)
        else:
            on = flattens_batches(self) and (self.batch_flattening is True or (
                self.batch_flattening == "auto" and flash and not self.sample_packing and self.micro_batch_size > 1))
        return ("varlen" if flash else "mask") if on else None
