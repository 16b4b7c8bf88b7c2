"""Which methods' batches can be packed, grouped by length, flattened or padded, and share their prompts; the
rules on those keys."""

from __future__ import annotations

PREFERENCE_METHODS = ("dpo", "ipo", "kto", "orpo", "simpo")
PAIR_METHODS = ("dpo", "ipo", "orpo", "simpo")  # trained on (prompt, chosen, rejected)
SHARING_METHODS = (*PAIR_METHODS, "reward_model", "grpo", "gdpo")  # several answers to one prompt in a micro-batch
ROUTER_LOSS_METHODS = ("sft", *PREFERENCE_METHODS, "grpo", "gdpo")  # an MoE router's load-balancing loss joins theirs


def prompt_sharing_problem(cfg) -> str | None:
    """Why this config's answers cannot share their prompt (`share_prompts`), or None (the model may still say no:
    `rlft.models.shared_prompts.shared_prompt_problem`)."""
    if cfg.method not in SHARING_METHODS:
        return f"it applies to {', '.join(SHARING_METHODS[:-1])} and {SHARING_METHODS[-1]}, not {cfg.method}"
    attention = cfg.effective_attn_implementation
    if attention not in ("sdpa", "eager"):
        return f"it needs SDPA or eager attention (they read the mask that keeps the answers apart), not {attention}"
    if cfg.pad_to_sequence_len:
        return "pad_to_sequence_len pads every row to sequence_len, and a pair with its prompt shared is up to twice that"
    if (cfg.overrides_of_model_config or {}).get("output_router_logits"):
        return ("model_config.output_router_logits: transformers' router loss weighs the tokens by a mask per row, which the "
                "shared layout (one mask per pair of answers) does not give it")
    return None


def flattens_batches(cfg) -> bool:
    """Whether the method's micro-batches can be flattened by `batch_flattening` (SFT, the GRPO family, structured EBFT)."""
    return cfg.method == "sft" or cfg.rl in ("grpo", "gdpo") or (cfg.rl == "ebft" and cfg.ebft.mode != "strided")


def batching_problems(cfg):
    for key in ("sample_packing", "eval_sample_packing"):
        if getattr(cfg, key) and cfg.method != "sft":
            yield f"{key} applies to SFT only, not {cfg.method}"
    if cfg.group_by_length and cfg.sample_packing:
        yield "group_by_length and sample_packing: packing already fills rows from documents of any length; keep one"
    if cfg.group_by_length and cfg.method not in ("sft", "reward_model", *PREFERENCE_METHODS):
        yield f"group_by_length groups SFT, preference and reward-model batches (rollouts are not drawn by length), not {cfg.method}"
    if cfg.batch_flattening is True and cfg.sample_packing:
        yield "batch_flattening and sample_packing both remove padding: keep one (sample_packing also fills rows across batches)"
    flattened = flattens_batches(cfg)
    if cfg.batch_flattening is True and not flattened:
        instead = "use dpo_padding_free: true" if cfg.method in PREFERENCE_METHODS else "remove it"
        yield (f"batch_flattening applies to SFT and to the GRPO family's rollouts (and structured EBFT), not {cfg.method}"
               f"{' in strided mode' if cfg.rl == 'ebft' else ''}: {instead}")
    if cfg.dpo_padding_free and cfg.method not in PREFERENCE_METHODS:
        yield (f"dpo_padding_free applies to the preference methods (dpo, ipo, kto, orpo, simpo), not {cfg.method}"
               f"{': use batch_flattening: true' if flattened else ''}")
    if cfg.pad_to_sequence_len and cfg.method in ("grpo", "gdpo", "ebft"):
        yield f"pad_to_sequence_len applies to SFT, preference and reward-model batches, not {cfg.method}"
