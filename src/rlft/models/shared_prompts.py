"""When answers to one prompt may share one computation of it, and when that pays.

Prompt sharing (prefix sharing, Wang and Hegde 2024, arXiv:2410.20305) runs a prompt and all its answers as one sequence
(`rlft.data.collate.shared_prompt_rows`): DPO-family pairs (`rlft.data.preference.shared_pair_inputs`) and GRPO groups
(`rlft.models.logprobs.shared_completion_inputs`). It gives each answer its own row's log-probs only for models whose
attention applies a 4-D mask as given and whose positions come from the position ids alone; and it costs less only
while the longer sequences' attention does not outgrow the prompt tokens it saves.
"""

from __future__ import annotations

from typing import Any

from rlft.config.settings.training import DataSettings
from rlft.data.preference import example_length, shared_length
from rlft.errors import ConfigError
from rlft.models.attention import attention_implementation
from rlft.models.head import score_head

# Decoders whose attention takes a 4-D mask as given and whose positions come from the position ids alone, checked
# with a tiny model each in tests/unit/test_shared_prompt.py: for these, answers after one shared prompt get the
# log-probs of their own rows. Not here, among others: recurrent or convolutional layers (qwen3_next, lfm2, mamba
# hybrids), where a later answer would read an earlier one through the layer's state, and ALiBi (bloom, mpt).
SHARED_PROMPT_MODELS = ("apertus", "arcee", "cohere", "ernie4_5", "exaone4", "gemma", "gemma2", "gemma3_text", "glm4",
                        "gpt2", "gpt_oss", "granite", "granitemoe", "helium", "llama", "ministral", "mistral", "mixtral",
                        "olmo", "olmo2", "olmo3", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss",
                        "smollm3", "stablelm", "starcoder2")


def shared_prompt_problem(model) -> str | None:
    """Why `model` cannot run answers that share their prompt exactly, or None. (Sliding windows are applied to the
    shared layout's mask: `rlft.models.masks.per_layer_type`.)"""
    config = getattr(getattr(model, "module", model), "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SHARED_PROMPT_MODELS:
        return f"model type {kind} is not one rlft has checked for it (SHARED_PROMPT_MODELS in rlft/models/shared_prompts.py)"
    implementation = attention_implementation(model)
    if implementation not in ("sdpa", "eager"):
        return f"the model runs {implementation} attention, which reads no mask (use sdpa or eager)"
    if getattr(config, "output_router_logits", False):
        return ("the model's config sets output_router_logits: its router loss weighs the tokens by a mask per row, which "
                "the shared layout (one mask per group of answers) does not give it")
    return None


def forward_costs(model) -> tuple[int, int]:
    """Forward FLOPs of `model`'s body per token and per (query, key) pair: 2 per weight outside the embeddings and the
    output layer (which sees the same answer positions whether or not prompts are shared; of a mixture of experts,
    the share of the experts a token is routed to), and 4 x attention width x layers (scores and weighted values)."""
    network = getattr(model, "module", model)
    config = network.config
    outside = {id(p) for layer in (network.get_input_embeddings(), network.get_output_embeddings()) if layer is not None
               for p in layer.parameters()}
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    routed = getattr(config, "num_experts_per_tok", None)
    share = routed / experts if experts and routed else 1.0
    per_token = int(2 * sum(getattr(p, "ds_numel", p.numel()) * (share if ".experts." in f".{name}." else 1.0)
                            for name, p in network.named_parameters() if id(p) not in outside))
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(config, "head_dim", None)
    width = heads * head_dim if heads and head_dim else config.hidden_size
    return per_token, 4 * width * config.num_hidden_layers


def sequences_flops(lengths, costs: tuple[int, int]) -> float:
    """Forward FLOPs of sequences of these lengths: every token through the weights, and every (query, key) pair of
    each sequence's square (SDPA with a mask computes them all, masked or not)."""
    per_token, per_key = costs
    return float(sum(n * per_token + n * n * per_key for n in lengths))


def sharing_problem(data: DataSettings, models: list, problem: str | None = None) -> str | None:
    """Why answers cannot share their prompt with this config and these models (None entries skipped), or the method's
    own `problem`; with `share_prompts: true` that is a ConfigError."""
    problem = problem or data.sharing_problem or next(
        (problem for model in models if model is not None and (problem := shared_prompt_problem(model))), None)
    if problem and data.share_prompts:
        raise ConfigError(f"share_prompts: {problem}; remove the key (or set it to false)")
    return problem


def prompt_sharing(data: DataSettings, models: list, examples: list[dict[str, Any]], problem: str | None = None) -> tuple[bool, str]:
    """Whether pairs share their prompt (`share_prompts`, `shared_pair_inputs`) with these models (policy first, then
    the reference; None entries skipped), and the plan's line saying so; `problem`: the method's own reason not to.
    Asked for explicitly but impossible: ConfigError. Unset, it is on where it is exact and takes fewer forward FLOPs
    (`sharing_flops`)."""
    if data.share_prompts is False:
        return False, "twice per pair (share_prompts: false)"
    problem = sharing_problem(data, models, problem)
    if problem:
        return False, f"twice per pair: {problem}"
    once, twice = sharing_flops(models[0], examples)
    change = f"{abs(1 - once / twice):.0%} {'fewer' if once <= twice else 'more'} forward FLOPs"
    if once > twice and data.share_prompts is None:
        return False, (f"twice per pair: once would take {change} (the answers are long next to their prompts, and a "
                       "sequence's attention grows with the square of its length); share_prompts: true forces it")
    return True, f"once per pair, both answers after it (share_prompts; {change} than twice)"


def reward_sharing(data: DataSettings, model, examples: list[dict[str, Any]], compiled: bool) -> tuple[bool, str]:
    """`prompt_sharing` for a reward model, which also needs its scores read from its `score` head during the forward
    (`rlft.models.reward.pair_scores`): not under torch_compile, whose compiled forward would have to be retraced for
    the hook every step."""
    problem = ("torch_compile: the scores are read from the score head during the forward, which a compiled forward "
               "would retrace every step" if compiled else
               None if score_head(model) is not None else "the model has no `score` layer to read each answer's score from")
    return prompt_sharing(data, [model], examples, problem)


def group_sharing(data: DataSettings, models: list) -> tuple[bool, str]:
    """Whether the GRPO family's completions of one prompt share it in their micro-batch (`share_prompts`,
    `rlft.models.logprobs.shared_completion_inputs`), and the plan's line. Unset, each micro-batch takes the layout
    with fewer estimated forward FLOPs; `true` shares wherever two rows have the same prompt."""
    if data.share_prompts is False:
        return False, "once per completion (share_prompts: false)"
    problem = sharing_problem(data, models)
    if problem:
        return False, f"once per completion: {problem}"
    if data.share_prompts:
        return True, "once per group (share_prompts: true)"
    return True, "once per group where that saves forward FLOPs (share_prompts)"


def sharing_flops(model, examples: list[dict[str, Any]]) -> tuple[float, float]:
    """Estimated forward FLOPs of `model` over `examples` with each prompt once (one sequence per pair) and twice (two
    rows of prompt + the longer answer): `rlft.models.shared_prompts.sequences_flops`."""
    costs = forward_costs(model)
    once = sequences_flops([shared_length(e) for e in examples], costs)
    twice = sequences_flops([example_length(e) for e in examples for _ in range(2)], costs)
    return once, twice
