"""Rules on the model keys: its source and precision, model_config, the mistral-common tokenizer, QAT, attention
and kernel switches, activation offloading, NEFTune."""

from __future__ import annotations

from rlft.config.activation_checkpointing import checkpoints
from rlft.config.plugins import CCE_PLUGIN, cut_cross_entropy, nemo_gym_enabled
from rlft.config.methods import method_spec
from rlft.config.sections.datasets import UserDefinedType
from rlft.config.sections.qat import combination_problem


def essentials(cfg):
    """A model, data and one precision."""
    if not cfg.base_model:
        yield "base_model is not set: give a model folder (or a hub id when online)"
    if not cfg.datasets and not nemo_gym_enabled(cfg) and not cfg.pretraining_dataset:  # NeMo Gym's task files replace datasets:
        yield "datasets is empty: add at least one entry with a `path`"
    if cfg.bf16 is True and cfg.fp16:
        yield "bf16 and fp16 are both true: choose one precision"


def model_config_problems(cfg):
    settings = cfg.overrides_of_model_config or {}
    if settings.get("output_router_logits") and not method_spec(cfg.method).router_loss:
        yield (f"model_config.output_router_logits: the MoE router's load-balancing loss is added to the loss of SFT, "
               f"the preference methods (DPO, IPO, KTO, ORPO, SimPO/CPO) and the GRPO family; for {cfg.method} it is not "
               "built: remove it")
    if settings.get("output_router_logits") and not cfg.effective_attn_implementation.startswith("flash_attention") and (
            cfg.sample_packing or cfg.eval_sample_packing or cfg.flat_batches):
        yield ("model_config.output_router_logits with packed or flattened rows: transformers' router loss needs a mask per "
               "token, which packed rows have only under flash-attention; turn sample_packing / batch_flattening off, or "
               "use flash_attention on a GPU")
    loading = sorted(set(settings) - {"output_router_logits", "router_aux_loss_coef"})
    if loading and cfg.adapter:
        yield (f"model_config {', '.join(loading)} with an adapter: the adapter is saved for the original base model, which "
               "merge-lora, generate and the rollout server load without these settings; train without the adapter, or "
               "write them into a copy of the base model's config.json")


def mistral_common_problems(cfg):
    if not cfg.uses_mistral_common:
        return
    why = ("tokenizer_use_mistral_common" if cfg.tokenizer_use_mistral_common else
           "tokenizer_use_mistral_common (on for a Magistral model unless set to false)")
    if not method_spec(cfg.method).packs:
        yield (f"{why} is built for SFT; {cfg.method} renders prompts as text through a chat template, which a "
               "mistral-common tokenizer does not have: set tokenizer_use_mistral_common: false to use the model's "
               "transformers tokenizer")
    edits = [key for key in ("chat_template", "chat_template_jinja", "special_tokens", "tokens")
             if getattr(cfg, key) and getattr(cfg, key) != "tokenizer_default"]  # set and not empty, as Axolotl checks
    if edits:
        yield (f"{why} with {', '.join(edits)}: mistral-common encodes conversations with its own control tokens and "
               "cannot be given a template or new tokens (Axolotl refuses these too): remove them")
    if cfg.eot_tokens:
        yield (f"{why} with eot_tokens {cfg.eot_tokens}: mistral-common ends every assistant turn with </s> (train_on_eos "
               "decides whether it is trained) and cannot add other end-of-turn tokens; Axolotl ignores the key with "
               "mistral-common, rlft does not: remove eot_tokens")
    for ds in list(cfg.datasets or []) + list(cfg.test_datasets or []) + list(cfg.pretraining_dataset or []):
        if isinstance(ds.type, UserDefinedType) or ds.type in ("alpaca", "input_output"):
            name = "a user-defined format" if isinstance(ds.type, UserDefinedType) else ds.type
            yield (f"dataset type {name} with {why}: mistral-common encodes chat messages (type: "
                   "chat_template) and plain text (type: completion); other formats need a chat template or text pieces "
                   "tokenised apart")


def qat_problems(cfg):
    if cfg.qat is None:
        return
    problem = combination_problem(cfg.qat.activation, cfg.qat.weight, cfg.qat.group_size)
    if problem:
        yield f"qat: {problem}"
    micro = [key for key in ("quantize_embedding", "fake_quant_after_n_steps") if getattr(cfg.qat, key)]
    if cfg.qat.weight in ("nvfp4", "mxfp4") and micro:
        yield (f"qat: {' and '.join(micro)} with {cfg.qat.weight}: torchao's {cfg.qat.weight.upper()} layers have no "
               "embedding version and no switch to train without rounding (Axolotl's switch skips them): use int4 or "
               "float8 weights, or remove it")
    if not method_spec(cfg.method).qat:
        yield f"qat is built for SFT (as Axolotl's QAT examples train), not {cfg.method}: remove the qat section"
    if cfg.adapter:
        yield (f"qat with adapter: {cfg.adapter}: quantization-aware training adapts the full weights to their rounding, "
               "and a LoRA's frozen base cannot adapt: remove one")
    if cfg.deepspeed:
        yield "qat under DeepSpeed is not built: use fsdp (fsdp_version: 2), or one process"


def offloading_problems(cfg):
    if cfg.activation_offloading and not checkpoints(cfg):
        yield ("activation_offloading moves each checkpointed layer's input to host memory, and needs gradient_checkpointing: "
               "true (as in Axolotl; or fsdp_config.activation_checkpointing)")


def kernel_problems(cfg):
    """The chat template, attention and loss-kernel switches."""
    set_keys = cfg.model_fields_set
    if cfg.chat_template == "jinja" and not cfg.chat_template_jinja:
        yield "chat_template: jinja needs chat_template_jinja (the template text or a .jinja file path)"
    if cfg.chat_template_jinja and cfg.chat_template != "jinja":
        yield (f"chat_template_jinja is read with chat_template: jinja (or with chat_template unset), and chat_template is "
               f"{cfg.chat_template}: remove one of them")
    attention_flags = [k for k in ("flash_attention", "flex_attention", "sdp_attention", "eager_attention") if getattr(cfg, k)]
    if len(attention_flags) > 1:
        yield f"{' and '.join(attention_flags)} are all set: choose one attention implementation"
    if "liger_swiglu" in set_keys and "liger_glu_activation" in set_keys:
        yield "liger_swiglu and liger_glu_activation are both set: liger_swiglu is the older name, keep liger_glu_activation"
    if cfg.liger_cross_entropy and cfg.liger_fused_linear_cross_entropy:
        yield "liger_cross_entropy and liger_fused_linear_cross_entropy are both true: keep liger_fused_linear_cross_entropy"
    liger_ce = [key for key in ("liger_fused_linear_cross_entropy", "liger_cross_entropy") if getattr(cfg, key)]
    if liger_ce and cut_cross_entropy(cfg):
        yield (f"cut_cross_entropy and {liger_ce[0]} both choose the loss's kernel: keep one (cut_cross_entropy is on when "
               f"{CCE_PLUGIN} is listed; set cut_cross_entropy: false to keep Liger's)")


def neftune_problems(cfg):
    if cfg.neftune_noise_alpha and not method_spec(cfg.method).neftune:
        yield (f"neftune_noise_alpha noises the embeddings of SFT and reward-model training (Axolotl passes it to those "
               f"trainers only), not {cfg.method}: remove it")
