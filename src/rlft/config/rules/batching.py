"""Which methods' batches can be packed, grouped by length, flattened or padded, and share their prompts; the
rules on those keys and on the GRPO family's micro-batch keys (`trl.max_token_len_per_mini_batch`,
`trl.balance_dp_token`)."""

from __future__ import annotations

from rlft.config.methods import method_spec, names_where, spec_of
from rlft.config.rl import trl_options


def prompt_sharing_problem(cfg) -> str | None:
    """Why this config's answers cannot share their prompt (`share_prompts`), or None (the model may still say no:
    `rlft.models.shared_prompts.shared_prompt_problem`)."""
    if not method_spec(cfg.method).shares_prompts:
        sharing = names_where("shares_prompts")
        return f"it applies to {', '.join(sharing[:-1])} and {sharing[-1]}, not {cfg.method}"
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
    return spec_of(cfg).flattens


def batching_problems(cfg):
    spec = spec_of(cfg)
    for key in ("sample_packing", "eval_sample_packing"):
        if getattr(cfg, key) and not spec.packs:
            yield f"{key} applies to SFT only, not {cfg.method}"
    if cfg.group_by_length and cfg.sample_packing:
        yield "group_by_length and sample_packing: packing already fills rows from documents of any length; keep one"
    if cfg.group_by_length and not spec.groups_by_length:
        yield f"group_by_length groups SFT, preference and reward-model batches (rollouts are not drawn by length), not {cfg.method}"
    if cfg.batch_flattening is True and cfg.sample_packing:
        yield "batch_flattening and sample_packing both remove padding: keep one (sample_packing also fills rows across batches)"
    flattened = flattens_batches(cfg)
    if cfg.batch_flattening is True and not flattened:
        instead = "use dpo_padding_free: true" if spec.preference else "remove it"
        yield (f"batch_flattening applies to SFT and to the GRPO family's rollouts (and structured EBFT), not {cfg.method}"
               f"{f' in {spec.mode} mode' if spec.mode else ''}: {instead}")
    if cfg.dpo_padding_free and not spec.preference:
        yield (f"dpo_padding_free applies to the preference methods ({', '.join(names_where('preference'))}), not {cfg.method}"
               f"{': use batch_flattening: true' if flattened else ''}")
    if cfg.pad_to_sequence_len and spec.generates:
        yield f"pad_to_sequence_len applies to SFT, preference and reward-model batches, not {cfg.method}"
    yield from _rl_micro_batch_problems(cfg, spec)


def _rl_micro_batch_problems(cfg, spec):
    trl = cfg.trl
    if not spec.engine:  # their trl: keys are refused for it with the other rollout keys (rlft.config.rules.online)
        return
    if trl.balance_dp_token and (loss_type := trl_options(cfg)["loss_type"]) != "token-mean":
        other = {"dapo": "already divides by the loss tokens of every process",
                 "cispo": "already divides by the loss tokens of every process",
                 "grpo": "averages each completion's own token mean", "dr_grpo": "divides by completions x a fixed length",
                 "bnpo": "is TRL's mean of each micro-batch's own token mean"}.get(loss_type, "has no token mean to balance")
        written = f" (as trl.loss_type: {trl.loss_type} runs)" if trl.loss_type not in (None, loss_type) else ""
        yield (f"trl.balance_dp_token balances Cosmos-RL's loss_type token-mean across processes; loss_type {loss_type}"
               f"{written} {other}: set trl.loss_type: token-mean, or remove balance_dp_token")
    if spec.engine and "balance_dp_token" in cfg.model_fields_set:
        yield ("balance_dp_token at the top level is Cosmos-RL's SFT key; the GRPO family's is trl.balance_dp_token "
               "(for loss_type token-mean, default false): move it under trl:")
