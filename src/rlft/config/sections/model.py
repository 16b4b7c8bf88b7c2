"""Top-level keys of the model: its source and tokenizer, precision and attention, kernels, memory, adapters and
which weights train."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import AliasChoices, field_validator

from rlft.config.base import Section, field
from rlft.config.template_names import NAMES as CHAT_TEMPLATE_NAMES
from rlft.config.unfrozen import parse_pattern

ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# Axolotl's other attention names (its CANONICAL_ATTN_IMPLS; `org/name` hub kernels also validate): train refuses them
AXOLOTL_ATTENTION = ("xformers", "sage", "fp8")


class ModelFields(Section):
    """The model, precision and attention, and adapter keys of the config file."""

    # --- model ---
    base_model: Optional[str] = field(
        None, "Hugging Face model folder (config.json, weights, tokenizer) or a hub id when online."
    )
    base_model_config: Optional[str] = field(None, "Folder whose config.json is used instead of base_model's.")
    revision_of_model: Optional[str] = field(
        None, "Branch, tag or commit of base_model on the hub, for its weights, config, tokenizer and generation config "
              "(offline: the cached snapshot of that revision), and for ref_model, tokenizer_config and base_model_config "
              "where they name the same repository; a saved adapter records it for its base. Refused when base_model is "
              "a local folder (Axolotl's key; model_revision too).",
        validation_alias=AliasChoices("revision_of_model", "model_revision"))
    tokenizer_config: Optional[str] = field(None, "Folder or hub id of the tokenizer (default: base_model).")
    model_type: Optional[str] = field(None, "transformers class that loads the model: AutoModelForCausalLM (the default) or a "
                                            "*ForCausalLM class; reward models: AutoModelForSequenceClassification. Other "
                                            "classes validate and train refuses them (Axolotl's key; type_of_model too).",
                                      validation_alias=AliasChoices("model_type", "type_of_model"))
    tokenizer_type: Optional[str] = field(None, "transformers class that loads the tokenizer: AutoTokenizer (the default) or a "
                                                "*Tokenizer / *TokenizerFast class.")
    tokenizer_use_mistral_common: Optional[bool] = field(
        None, "Load Mistral's own tokenizer (tekken.json or tokenizer.model.v*) through the mistral-common package, which "
              "encodes conversations itself (no chat template): SFT with chat_template or completion datasets. Unset: on "
              "when base_model, base_model_config or tokenizer_config names a Magistral model, as in Axolotl "
              "(docs/sft.md#mistrals-own-tokenizer-tokenizer_use_mistral_common).")
    overrides_of_model_config: Optional[dict[str, Any]] = field(
        None, "Settings set on the model's config before it is built (Axolotl's `model_config`), e.g. {rope_scaling: "
              "{rope_type: linear, factor: 2.0}}. With output_router_logits: true an MoE model's load-balancing loss "
              "(router_aux_loss_coef x aux_loss) joins the loss of SFT, as transformers adds it, and of the preference "
              "methods and the GRPO family, as TRL's trainers add it.",
        validation_alias=AliasChoices("model_config", "overrides_of_model_config"))
    tokens: Optional[list[str]] = field(None, "Tokens to add to the tokenizer (the embeddings are resized).")
    resize_token_embeddings_to_32x: Optional[bool] = field(
        None, "Grow the embedding rows to the tokenizer's length rounded up to a multiple of 32 (faster matrix products "
              "on some GPUs), not to the length itself.")
    shrink_embeddings: Optional[bool] = field(
        None, "Cut embedding rows beyond the tokenizer's length (or its multiple of 32); by default spare rows are kept.")
    mean_resizing_embeddings: Optional[bool] = field(
        False, "New embedding rows drawn around the old rows' mean and covariance (transformers' mean resizing); false "
               "(Axolotl's default): initialised as the model's own weights are, seeded by `seed`.")
    eot_tokens: Optional[list[str]] = field(None, "The strings that end a turn in the chat template (train_on_eos trains them); "
                                                  "added as special tokens when the tokenizer lacks them. Default: found in "
                                                  "the template.")
    random_init: bool = field(
        False, "Start from freshly initialised weights built from the model config (seeded by `seed`); Axolotl's "
               "reinit_weights too.", validation_alias=AliasChoices("random_init", "reinit_weights"))
    trust_remote_code: bool = field(False, "Allow model code shipped with the checkpoint to run.")
    special_tokens: Optional[dict[str, str]] = field(
        None, "Tokens to set on the tokenizer, e.g. {pad_token: '<|pad|>'}; new tokens resize the embeddings."
    )
    chat_template: str = field(
        "tokenizer_default",
        "tokenizer_default | a named template (chatml, llama3, qwen_25, gemma, phi_3, mistral_v1, alpaca, ...: docs/sft.md) | "
        "jinja (with chat_template_jinja) | a path to a .jinja file | tokenizer_default_fallback_NAME.",
    )
    chat_template_jinja: Optional[str] = field(None, "With chat_template: jinja, the template text or a file path.")

    # --- precision and attention ---
    bf16: Union[bool, Literal["auto"]] = field("auto", "bfloat16 mixed precision; `auto` (the default, as Axolotl's) uses it on "
                                                       "a CUDA GPU that supports it, unless fp16: true.")
    bfloat16: Optional[bool] = field(None, "Axolotl's other name for bf16: true (its examples set both); refused beside "
                                           "bf16: false.")
    fp16: bool = field(False, "float16 mixed precision (CUDA only).")
    tf32: Union[bool, Literal["auto"]] = field("auto", "Allow TF32 matmuls on CUDA; `auto` (the default, as Axolotl's) "
                                                       "where the GPU has them (Ampere and newer).")
    attn_implementation: Optional[str] = field(
        None, "transformers attention implementation: sdpa (default), eager, flash_attention_2, flash_attention_3, flex_attention; "
              "the *_attention flags below set it too. Axolotl's others (xformers, hub kernels `org/name`) validate; train refuses them."
    )
    flash_attention: bool = field(False, "Use flash_attention_2 (needs the flash-attn package and a CUDA GPU).")
    flex_attention: bool = field(False, "Use PyTorch flex_attention (GPU only for training).")
    torch_compile: Union[bool, Literal["auto"]] = field(
        False, "torch.compile the trained model's forward (every method), and for online RL the rollout engine's decode "
               "step with a static KV cache (in-process, or the server's transformers backend): faster steps after a "
               "compile of seconds to a minute. `auto`: on CUDA GPUs only.")
    torch_compile_backend: Optional[str] = field(None, "torch.compile backend for torch_compile (default inductor).")
    torch_compile_mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = field(
        None, "torch.compile mode for torch_compile. Unset: torch's default for the training forward; for the rollout "
              "decode step, reduce-overhead (CUDA graphs) on a GPU and the default on a CPU.")
    liger_rope: bool = field(False, "Liger Kernel's RoPE kernel (CUDA GPU and the liger-kernel package: pip install "
                                    "'rlft[liger]'; docs/training.md#liger-kernel).")
    liger_rms_norm: bool = field(False, "Liger Kernel's RMSNorm (CUDA GPU, liger-kernel).")
    liger_layer_norm: bool = field(False, "Liger Kernel's LayerNorm, for models that have LayerNorm layers (CUDA GPU, liger-kernel).")
    liger_glu_activation: bool = field(False, "Liger Kernel's gated MLP, SwiGLU (GeGLU for Gemma) (CUDA GPU, liger-kernel).")
    liger_swiglu: bool = field(False, "Axolotl's older name of liger_glu_activation.")
    liger_fused_linear_cross_entropy: bool = field(
        False, "SFT's loss through Liger Kernel's fused linear cross-entropy kernel instead of rlft's chunked torch one "
               "(neither builds the full logits; CUDA GPU, liger-kernel).")
    liger_cross_entropy: bool = field(False, "As liger_fused_linear_cross_entropy: rlft never builds the logits that a plain "
                                             "cross-entropy kernel would read.")
    cut_cross_entropy: Optional[bool] = field(
        None, "Axolotl's Cut Cross-Entropy plugin (plugins: [axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin], "
              "which turns it on): the loss without the (B, T, V) logits block. rlft's own chunked output-layer loss does "
              "this on every device without the package, fp32 included; the plan's `loss` row says where it applies "
              "(docs/training.md#losses-without-a-logits-block).")
    sdp_attention: bool = field(False, "Use PyTorch scaled_dot_product_attention (the default).")
    eager_attention: bool = field(False, "Use the plain eager attention implementation.")
    gradient_checkpointing: Union[bool, Literal["offload", "offload_disk"]] = field(
        False, "Recompute activations in the backward pass to save memory (offload: as Axolotl, also activation_offloading; "
               "offload_disk: train refuses it).")
    gradient_checkpointing_kwargs: Optional[dict[str, Any]] = field(
        None, "Passed to transformers' activation_checkpointing_enable, e.g. {use_reentrant: false}."
    )
    activation_offloading: Union[bool, Literal["legacy", "disk", "hidden_states"]] = field(
        False, "On a GPU, keep each checkpointed layer's input in pinned host memory from the forward to the backward "
               "(transformers' activation offloading): less GPU memory for a copy each way. true, legacy and "
               "hidden_states do the same in rlft (Axolotl's hidden_states); disk is not built. Needs "
               "gradient_checkpointing (docs/training.md#activation-offloading).")

    unfrozen_parameters: Optional[list[str]] = field(
        None, "Train only the parameters whose names match one of these patterns (Axolotl's rules: a regex matched from "
              "the start of the name, dots literal; a trailing [start:end] trains only those rows), e.g. "
              "['^model.layers.1[0-5].', '^model.norm.weight$']. Full fine-tuning only.")

    neftune_noise_alpha: Optional[float] = field(
        None, "NEFTune (https://arxiv.org/abs/2310.05914): uniform noise of scale alpha / sqrt(L * d) on the input "
              "embeddings while training (L: the micro-batch's row length, d: the hidden size), as transformers adds it; "
              "SFT and reward models, as in Axolotl. Papers use 5 to 15.", gt=0.0)

    # --- adapters ---
    adapter: Optional[Literal["lora", "qlora"]] = field(None, "Train a PEFT adapter instead of all weights.")
    lora_model_dir: Optional[str] = field(None, "Start from an existing LoRA adapter folder.")
    lora_r: int = field(8, "LoRA rank.", ge=1)
    lora_alpha: int = field(16, "LoRA scaling numerator (scale = alpha / r, or alpha / sqrt(r) with rsLoRA).", ge=1)
    lora_dropout: float = field(0.0, "Dropout on the LoRA input.", ge=0.0, lt=1.0)
    lora_target_modules: Optional[Union[str, list[str]]] = field(None, "Module names (or a regex) to adapt.")
    lora_target_linear: bool = field(False, "Adapt every linear layer except the output head.")
    lora_target_parameters: Optional[Union[str, list[str]]] = field(
        None, "Parameters (not modules) to adapt, by name suffix, e.g. [experts.gate_up_proj, experts.down_proj]: the "
              "experts of an MoE model, one 3D tensor per layer in transformers 5 (PEFT's target_parameters; needs "
              "lora_dropout: 0).")
    lora_fan_in_fan_out: Optional[bool] = field(
        None, "PEFT's fan_in_fan_out: whether the adapted layer stores its weight as (in, out). PEFT sets it from each "
              "layer's type (true for GPT-2's Conv1D, false for nn.Linear) and warns when the value given differs.")
    lora_modules_to_save: Optional[list[str]] = field(None, "Modules trained in full and saved with the adapter.")
    peft_use_rslora: bool = field(False, "Rank-stabilised LoRA scaling alpha/sqrt(r) (https://arxiv.org/abs/2312.03732).")
    peft_use_dora: bool = field(False, "Weight-decomposed LoRA (https://arxiv.org/abs/2402.09353).")
    peft_init_lora_weights: Optional[Union[bool, str]] = field(
        None, "PEFT init_lora_weights: true, false, gaussian, orthogonal, mica, pissa, pissa_niter_N, olora (loftq, eva "
              "and corda are refused: docs/training.md#adapters-lora-through-peft).")
    load_in_4bit: bool = field(False, "Load the base model in 4 bit (QLoRA; needs bitsandbytes and a CUDA GPU).")
    load_in_8bit: bool = field(False, "Load the base model in 8 bit (needs bitsandbytes and a CUDA GPU).")

    @field_validator("chat_template")
    @classmethod
    def _chat_template_known(cls, value: str) -> str:
        if value in CHAT_TEMPLATE_NAMES or value.endswith((".jinja", ".j2")) or value.startswith("tokenizer_default_fallback_"):
            return value
        raise ValueError(f"expected one of {', '.join(CHAT_TEMPLATE_NAMES)} or a path to a .jinja file")

    @field_validator("tokenizer_type")
    @classmethod
    def _tokenizer_class(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value.endswith(("Tokenizer", "TokenizerFast")):
            return value
        raise ValueError(f"{value!r}: expected AutoTokenizer or a transformers *Tokenizer / *TokenizerFast class")

    @field_validator("attn_implementation")
    @classmethod
    def _attention_known(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value in ATTENTION or value in AXOLOTL_ATTENTION or "/" in value:
            return value
        raise ValueError(f"unknown attention implementation {value!r}: expected one of {', '.join(ATTENTION)}")

    @field_validator("unfrozen_parameters")
    @classmethod
    def _patterns(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        for text in value or []:
            parse_pattern(text)
        return value

    @property
    def uses_mistral_common(self) -> bool:
        """tokenizer_use_mistral_common, or unset and a Magistral model named (Axolotl infers it the same way)."""
        if self.tokenizer_use_mistral_common is not None:
            return self.tokenizer_use_mistral_common
        return any("magistral" in (name or "").lower() for name in (self.base_model, self.base_model_config, self.tokenizer_config))

    @property
    def effective_attn_implementation(self) -> str:
        if self.attn_implementation:
            return self.attn_implementation
        if self.flash_attention:
            return "flash_attention_2"
        if self.flex_attention:
            return "flex_attention"
        if self.eager_attention:
            return "eager"
        return "sdpa"
