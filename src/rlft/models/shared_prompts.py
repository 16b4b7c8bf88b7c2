"""When answers to one prompt may share one computation of it, and when that pays.

Prompt sharing (prefix sharing, Wang and Hegde 2024, arXiv:2410.20305) runs a prompt and all its answers as one sequence
(`rlft.data.collate.shared_prompt_rows`): DPO-family pairs (`rlft.data.preference.shared_pair_inputs`) and GRPO groups
(`rlft.models.logprobs.shared_completion_inputs`). It gives each answer its own row's log-probs only for models whose
attention applies a 4-D mask as given and whose positions come from the position ids alone; and it costs less only
while the longer sequences' attention does not outgrow the prompt tokens it saves.
"""

from __future__ import annotations

from rlft.models.masks import attention_implementation

# Decoders whose attention takes a 4-D mask as given and whose positions come from the position ids alone, checked
# with a tiny model each in tests/unit/test_shared_prompt.py: for these, answers after one shared prompt get the
# log-probs of their own rows. Not here, among others: recurrent or convolutional layers (qwen3_next, lfm2, mamba
# hybrids), where a later answer would read an earlier one through the layer's state, and ALiBi (bloom, mpt).
SHARED_PROMPT_MODELS = ("apertus", "arcee", "cohere", "ernie4_5", "exaone4", "gemma", "gemma2", "gemma3_text", "glm4",
                        "gpt2", "gpt_oss", "granite", "granitemoe", "helium", "llama", "ministral", "mistral", "mixtral",
                        "olmo", "olmo2", "olmo3", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss",
                        "smollm3", "stablelm", "starcoder2")


def shared_prompt_problem(model, longest: int) -> str | None:
    """Why `model` cannot run answers that share their prompt (sequences up to `longest` tokens) exactly, or None."""
    config = getattr(getattr(model, "module", model), "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SHARED_PROMPT_MODELS:
        return f"model type {kind} is not one rlft has checked for it (SHARED_PROMPT_MODELS in rlft/models/shared_prompts.py)"
    implementation = attention_implementation(model)
    if implementation not in ("sdpa", "eager"):
        return f"the model runs {implementation} attention, which reads no mask (use sdpa or eager)"
    window = getattr(config, "sliding_window", None)
    layers = getattr(config, "layer_types", None) or ()
    windowed = getattr(config, "use_sliding_window", True) is not False and (not layers or "sliding_attention" in layers)
    if window and windowed and longest > window:
        return (f"its sliding window ({window} tokens) is shorter than the longest prompt with its answers "
                f"({longest} tokens): a later answer would lose sight of the prompt's start")
    return None


def forward_costs(model) -> tuple[int, int]:
    """Forward FLOPs of `model`'s body per token and per (query, key) pair: 2 per weight outside the embeddings and the
    output layer (which sees the same answer positions whether or not prompts are shared), and 4 x attention width x
    layers (scores and weighted values)."""
    network = getattr(model, "module", model)
    config = network.config
    outside = {id(p) for layer in (network.get_input_embeddings(), network.get_output_embeddings()) if layer is not None
               for p in layer.parameters()}
    per_token = 2 * sum(getattr(p, "ds_numel", p.numel()) for p in network.parameters() if id(p) not in outside)
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(config, "head_dim", None)
    width = heads * head_dim if heads and head_dim else config.hidden_size
    return per_token, 4 * width * config.num_hidden_layers


def sequences_flops(lengths, costs: tuple[int, int]) -> float:
    """Forward FLOPs of sequences of these lengths: every token through the weights, and every (query, key) pair of
    each sequence's square (SDPA with a mask computes them all, masked or not)."""
    per_token, per_key = costs
    return float(sum(n * per_token + n * n * per_key for n in lengths))
