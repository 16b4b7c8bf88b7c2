"""What `rlft.models` reads: the model's source, its tokenizer, how it is loaded, and its adapter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlft.config.activation_checkpointing import checkpoints
from rlft.config.sections.qat import QATConfig

# Axolotl key -> the switch of liger's apply functions (liger_swiglu is Axolotl's older name of liger_glu_activation)
LIGER_LAYER_KEYS = {"liger_rope": "rope", "liger_rms_norm": "rms_norm", "liger_layer_norm": "layer_norm",
                    "liger_glu_activation": "swiglu", "liger_swiglu": "swiglu"}
LIGER_LOSS_KEYS = ("liger_cross_entropy", "liger_fused_linear_cross_entropy")


@dataclass(frozen=True)
class AdapterSettings:
    """The PEFT adapter a run trains (`adapter:` and the `lora_*` / `peft_*` keys)."""

    kind: str | None  # adapter: lora or qlora; None trains every weight
    model_dir: str | None  # lora_model_dir: an adapter folder to start from
    r: int  # lora_r
    alpha: int  # lora_alpha
    dropout: float  # lora_dropout
    target_linear: bool  # lora_target_linear: every linear layer but the output head
    target_modules: str | list[str] | None  # lora_target_modules
    target_parameters: str | list[str] | None  # lora_target_parameters
    modules_to_save: list[str] | None  # lora_modules_to_save
    fan_in_fan_out: bool  # lora_fan_in_fan_out
    use_rslora: bool  # peft_use_rslora
    use_dora: bool  # peft_use_dora
    init_lora_weights: bool | str | None  # peft_init_lora_weights as written (None: PEFT's default init)


@dataclass(frozen=True)
class ModelSettings:
    """How the policy model and its tokenizer are found and loaded."""

    base_model: str | None  # base_model: a folder or a hub id
    base_model_config: str | None  # base_model_config: a folder whose config.json replaces base_model's
    revision: str | None  # revision_of_model: the version of base_model's hub repository
    ref_model: str | None  # ref_model: a separate reference model
    model_type: str | None  # model_type: the transformers class that loads the model
    trust_remote_code: bool  # trust_remote_code
    config_overrides: dict[str, Any]  # model_config: settings set on the model's config before it is built
    random_init: bool  # random_init: weights drawn from the seed, not read
    seed: int  # seed: for random weights and new embedding rows
    attention: str  # the attention implementation (attn_implementation or the *_attention switches)
    load_in_4bit: bool  # load_in_4bit
    load_in_8bit: bool  # load_in_8bit
    fp16: bool  # fp16 (qat refuses MXFP4 under half precision)
    bf16: bool | str  # bf16: true, false or auto
    qat: QATConfig | None  # the qat: section
    liger: tuple[str, ...]  # the liger_* keys set to true, in LIGER_LAYER_KEYS then LIGER_LOSS_KEYS order
    torch_compile: bool | str  # torch_compile: true, false or auto
    torch_compile_mode: str | None  # torch_compile_mode
    torch_compile_backend: str  # torch_compile_backend (inductor where unset)
    checkpointing: bool  # decoder layers checkpointed (gradient_checkpointing or fsdp_config's activation_checkpointing)
    checkpointing_kwargs: dict[str, Any]  # gradient_checkpointing_kwargs (non-reentrant where unset)
    offload_activations: bool  # activation_offloading (or gradient_checkpointing: offload) asks for host memory
    # tokenizer
    tokenizer_config: str | None  # tokenizer_config: where the tokenizer comes from (default base_model)
    tokenizer_type: str  # tokenizer_type (AutoTokenizer where unset)
    mistral_common: bool  # the tokenizer is mistral-common's (tokenizer_use_mistral_common, or a Magistral model)
    special_tokens: dict[str, str] | None  # special_tokens
    tokens: list[str] | None  # tokens added to the tokenizer
    eot_tokens: list[str] | None  # eot_tokens: end-of-turn markers, added as special tokens where missing
    chat_template: str  # chat_template
    chat_template_jinja: str | None  # chat_template_jinja
    # embeddings
    embeddings_to_32x: bool  # resize_token_embeddings_to_32x
    shrink_embeddings: bool  # shrink_embeddings
    mean_resizing_embeddings: bool  # mean_resizing_embeddings
    # what the method asks of the model (checks before training)
    method: str  # the training method (rlft.config.methods)
    ebft_mode: str  # ebft.mode (strided EBFT builds its own masks)
    sequence_len: int  # sequence_len, checked against the model's context
    sample_packing: bool  # sample_packing: several documents per training row
    eval_sample_packing: bool  # eval_sample_packing: several documents per evaluation row
    flat_batches: str | None  # how micro-batches are flattened: None, varlen or mask (RlftConfig.flat_batches)
    adapter: AdapterSettings  # the adapter (adapter.kind None: full fine-tuning)


def adapter_settings(cfg) -> AdapterSettings:
    """The adapter keys of `cfg`."""
    return AdapterSettings(
        kind=cfg.adapter, model_dir=cfg.lora_model_dir, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
        target_linear=cfg.lora_target_linear, target_modules=cfg.lora_target_modules,
        target_parameters=cfg.lora_target_parameters, modules_to_save=cfg.lora_modules_to_save,
        fan_in_fan_out=bool(cfg.lora_fan_in_fan_out), use_rslora=cfg.peft_use_rslora, use_dora=cfg.peft_use_dora,
        init_lora_weights=cfg.peft_init_lora_weights,
    )


def model_settings(cfg) -> ModelSettings:
    """The model keys of `cfg` resolved (`rlft.config.settings.resolve` builds them once per run)."""
    return ModelSettings(
        base_model=cfg.base_model, base_model_config=cfg.base_model_config, revision=cfg.revision_of_model,
        ref_model=cfg.ref_model, model_type=cfg.model_type, trust_remote_code=cfg.trust_remote_code,
        config_overrides=dict(cfg.overrides_of_model_config or {}), random_init=cfg.random_init, seed=cfg.seed,
        attention=cfg.effective_attn_implementation, load_in_4bit=cfg.load_in_4bit, load_in_8bit=cfg.load_in_8bit,
        fp16=cfg.fp16, bf16=cfg.bf16, qat=cfg.qat,
        liger=tuple(key for key in (*LIGER_LAYER_KEYS, *LIGER_LOSS_KEYS) if getattr(cfg, key, False)),
        torch_compile=cfg.torch_compile, torch_compile_mode=cfg.torch_compile_mode,
        torch_compile_backend=cfg.torch_compile_backend or "inductor", checkpointing=checkpoints(cfg),
        checkpointing_kwargs=dict(cfg.gradient_checkpointing_kwargs or {"use_reentrant": False}),
        offload_activations=(cfg.activation_offloading in (True, "legacy", "hidden_states")
                             or cfg.gradient_checkpointing == "offload"),
        tokenizer_config=cfg.tokenizer_config, tokenizer_type=cfg.tokenizer_type or "AutoTokenizer",
        mistral_common=cfg.uses_mistral_common, special_tokens=cfg.special_tokens, tokens=cfg.tokens,
        eot_tokens=cfg.eot_tokens, chat_template=cfg.chat_template, chat_template_jinja=cfg.chat_template_jinja,
        embeddings_to_32x=bool(cfg.resize_token_embeddings_to_32x), shrink_embeddings=bool(cfg.shrink_embeddings),
        mean_resizing_embeddings=bool(cfg.mean_resizing_embeddings), method=cfg.method, ebft_mode=cfg.ebft.mode,
        sequence_len=cfg.sequence_len, sample_packing=cfg.sample_packing,
        eval_sample_packing=bool(cfg.eval_sample_packing), flat_batches=cfg.flat_batches,
        adapter=adapter_settings(cfg),
    )
