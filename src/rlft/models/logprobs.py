"""The one home of per-token log-probs and entropy of completions under a model.

Rows are [prompt left-padded | completion right-padded] (`rlft.data.collate.completion_batch`). With a real-size vocabulary the
forward builds no logits block at all: the output layer is applied to the completion tokens' positions only, in
chunks (`completion_scores`, `rlft.losses.linear_ce.linear_token_logps`). Otherwise (a small vocabulary, a sharded
or adapted output layer, soft-capped logits) only the last C + 1 positions' logits are computed (`logits_to_keep`),
where C is the completion width.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from rlft.data.collate import padded_to, shared_prompt_rows, tensor_of
from rlft.losses.linear_ce import linear_token_logps
from rlft.models.head import forward_hidden, output_layer, router_loss
from rlft.models.masks import safe_attention, with_model_mask
from rlft.models.shared_prompts import sequences_flops


def shared_completion_inputs(rows: list[dict[str, Any]], batch: dict[str, Any], pad_id: int, one_sequence: bool = False,
                             multiple: int = 1, costs: tuple[int, int] | None = None,
                             rows_apart: bool = False) -> dict[str, torch.Tensor] | None:
    """A completion batch's rows with each prompt computed once for all its completions: the rows with the same prompt
    (a GRPO group) as one sequence [prompt | completion 1 | completion 2 | ...] (`shared_prompt_rows`), whose log-probs
    are the rows' own to float rounding. None when no two rows share a prompt, or a prompt is empty, or (given the
    model's `costs`, `rlft.models.shared_prompts.forward_costs`) it would take no fewer forward FLOPs than the rows as
    they are: padded, flattened into one sequence under one mask (`one_sequence`), or flattened with each row
    attending on its own (`rows_apart`: per-row SDPA, `rlft.models.varlen`, each row costing its own length).

    Returned as the `flat_*` keys that `model_inputs` and `completion_scores` read; `flat_index` (B, width) gives each
    slot of `rlft.data.collate.completion_batch`'s layout the position in the forward's flattened outputs that holds its values: left
    padding points at the prompt's first token, right padding at the completion's last (an empty completion's at the
    prompt's last), and the completion mask hides them."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(tuple(row["prompt_ids"]), []).append(index)
    if len(groups) == len(rows) or not all(groups):
        return None
    members = list(groups.values())
    if costs is not None:  # decided from the lengths, before any layout is built
        real = batch["attention_mask"]
        now = [int(real.sum())] if one_sequence else real.sum(-1).tolist() if rows_apart else [real.size(1)] * real.size(0)
        lengths = [len(prompt) + sum(len(rows[i]["completion_ids"]) for i in group) for prompt, group in groups.items()]
        shared = [sum(lengths)] if one_sequence else [padded_to(max(lengths), 0, multiple)] * len(lengths)
        if sequences_flops(shared, costs) >= sequences_flops(now, costs):
            return None
    flat, starts = shared_prompt_rows([(rows[group[0]]["prompt_ids"], [rows[i]["completion_ids"] for i in group])
                                       for group in members], pad_id, one_sequence, multiple)
    prompt_start, answer_start = [0] * len(rows), [0] * len(rows)
    for group, group_starts in zip(members, starts):
        for k, i in enumerate(group):
            prompt_start[i], answer_start[i] = group_starts[0], group_starts[k + 1]
    prompt_width, width = batch["input_ids"].shape[1] - int(batch["completion_width"]), batch["input_ids"].shape[1]
    p = tensor_of([len(row["prompt_ids"]) for row in rows])[:, None]
    c = tensor_of([len(row["completion_ids"]) for row in rows])[:, None]
    prompt, answer = tensor_of(prompt_start)[:, None], tensor_of(answer_start)[:, None]
    slots = torch.arange(width)[None]
    in_prompt = prompt + (slots - (prompt_width - p)).clamp_min(0)
    in_answer = torch.where(c > 0, answer + torch.minimum(slots - prompt_width, c - 1), prompt + p - 1)
    flat["flat_index"] = torch.where(slots < prompt_width, in_prompt, in_answer)
    return flat


def model_inputs(batch: dict[str, Any], prefix: str = "", names: tuple[str, ...] = ("input_ids", "attention_mask",
                                                                                   "position_ids")) -> dict[str, Any]:
    """The forward's inputs: the flattened rows when the batch has them (`rlft.data.collate.flatten_rows`), else
    the padded ones."""
    if prefix + "flat_input_ids" in batch:
        return {"input_ids": batch[prefix + "flat_input_ids"], "position_ids": batch[prefix + "flat_position_ids"],
                "attention_mask": batch.get(prefix + "flat_attention_mask"), "documents": batch.get(prefix + "flat_documents")}
    return {name: batch[prefix + name] for name in names if prefix + name in batch}


def padded(outputs: torch.Tensor, batch: dict[str, Any], prefix: str = "") -> torch.Tensor:
    """A forward's (S, N, D) outputs over flattened rows (or pairs sharing their prompt, `share_prompts`) back in the
    padded (R, T, D) layout; padded outputs as they are."""
    index = batch.get(prefix + "flat_index")
    return outputs if index is None else take_rows(outputs.flatten(0, 1), index)


def take_rows(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`flat[index]`: the rows of `flat` at an index of any shape, by `index_select`, whose backward adds the rows'
    gradients with `index_add_` where advanced indexing's backward runs `index_put_` with accumulation, several
    times slower on a CPU (for 512 rows of 64 / 512 features: 73 against 185 us, 164 against 1,331 us)."""
    return flat.index_select(0, index.reshape(-1)).view(*index.shape, *flat.shape[1:])


def masked_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values[mask]` for a boolean `mask` over `values`' leading dimensions: of contiguous values through `take_rows`
    (its backward without `index_put_`: 159 against 227 us for 230 of 256 positions of 512 features on a CPU); of
    others as it is (their flattening would copy them)."""
    if not values.is_contiguous():
        return values[mask]
    return take_rows(values.flatten(0, mask.dim() - 1), mask.reshape(-1).nonzero().squeeze(1))


def completion_forward(model, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    """Raw float logits (B, C, V) at the positions that predict each completion token, and the forward's outputs."""
    width = int(batch["completion_width"])
    if "flat_input_ids" in batch:
        index = batch["flat_index"][:, -width - 1 : -1].reshape(-1)
        inputs = with_model_mask(model, model_inputs(batch))
        # logits_to_keep picks the same positions in every sequence: those any sequence needs (with one sequence per
        # group, the completion positions of all groups), then each slot's own out of them
        length = batch["flat_input_ids"].size(1)
        keep = torch.unique(index % length)
        outputs = model(**inputs, logits_to_keep=keep, use_cache=False)
        kept = index // length * keep.numel() + torch.searchsorted(keep, index % length)  # each slot's row of the kept logits
        logits = take_rows(outputs.logits.flatten(0, 1), kept)
        return logits.float().view(-1, width, logits.size(-1)), outputs
    outputs = model(**left_padded_inputs(model, batch), logits_to_keep=width + 1, use_cache=False)
    return outputs.logits[:, :-1].float(), outputs


def left_padded_inputs(model, batch: dict[str, Any]) -> dict[str, Any]:
    """`model_inputs` of a completion batch (prompts left-padded), with a mask no attention kernel turns into NaN
    (rlft.models.masks)."""
    inputs = with_model_mask(model, model_inputs(batch))  # a flattened batch's 4-D mask, for eager attention
    if "attention_mask" in inputs:
        inputs["attention_mask"] = safe_attention(model, inputs["attention_mask"])
    return inputs


class CompletionScores:
    """What one forward gives for the completion positions: their float logits (B, C, V), or their last hidden states
    (B, C, H) and the output layer to apply to them (then no (B, C, V) block is ever built); and an MoE router's
    load-balancing loss with its weight when the model's config sets output_router_logits (`head.router_loss`)."""

    def __init__(self, batch: dict[str, Any], logits: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                 head: torch.nn.Linear | None = None, router: tuple[torch.Tensor, float] | None = None):
        self.batch, self.logits, self.hidden, self.head, self.router = batch, logits, hidden, head, router

    @property
    def vocab(self) -> int:
        return self.logits.size(-1) if self.logits is not None else self.head.out_features

    def token_logps(self, temperature: float, with_entropy: bool, grad_entropy: bool = False):
        """Per-token log-probs (B, C) of the completion tokens at `temperature`, and their entropy (or None). Through
        the output layer, padding positions get 0 (nothing is computed there)."""
        if self.logits is not None:
            return logps_from_logits(self.logits, self.batch, temperature, with_entropy, grad_entropy)
        width = int(self.batch["completion_width"])
        targets = self.batch["input_ids"][:, -width:]
        valid = self.batch["attention_mask"][:, -width:].bool()
        logps, entropy = linear_token_logps(masked_rows(self.hidden, valid), self.head.weight, self.head.bias, targets[valid],
                                            temperature, with_entropy, grad_entropy)
        zeros = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
        return zeros.masked_scatter(valid, logps), zeros.masked_scatter(valid, entropy) if with_entropy else None

    def logits_at(self, rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """(N, V) float logits at completion positions (rows[i], steps[i])."""
        if self.logits is not None:
            return self.logits[rows, steps]
        return F.linear(self.hidden[rows, steps], self.head.weight, self.head.bias).float()


def completion_scores(model, batch: dict[str, Any]) -> CompletionScores:
    """One forward of `model` over a completion batch, through the output layer where that is exact and worth it
    (`rlft.models.head`), else with the model's logits at the completion positions."""
    head = output_layer(model)
    if head is not None:
        hidden, outputs = forward_hidden(model, left_padded_inputs(model, batch), head)
        if hidden is not None:
            width = int(batch["completion_width"])
            # only the completion positions out of the flat sequence(s), not every padded slot
            at = take_rows(hidden.flatten(0, 1), batch["flat_index"][:, -width - 1 : -1]) if "flat_index" in batch \
                else hidden[:, -width - 1 : -1]
            return CompletionScores(batch, hidden=at, head=head, router=router_loss(model, outputs))
    logits, outputs = completion_forward(model, batch)
    return CompletionScores(batch, logits=logits, router=router_loss(model, outputs))


def completion_logps(model, batch: dict[str, Any], temperature: float, with_entropy: bool, grad_entropy: bool = False):
    """Per-token log-probs (B, C) of the completion tokens at `temperature`, and their entropy (or None)."""
    return completion_scores(model, batch).token_logps(temperature, with_entropy, grad_entropy)


def logps_from_logits(logits: torch.Tensor, batch: dict[str, Any], temperature: float, with_entropy: bool,
                      grad_entropy: bool = False):
    log_probs = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    targets = batch["input_ids"][:, -int(batch["completion_width"]):]
    logps = log_probs.gather(-1, targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        context = torch.enable_grad() if grad_entropy else torch.no_grad()
        with context:  # an entry a model masks with -inf has p = 0 and adds nothing (0 * -inf would be NaN)
            entropy = -(log_probs.exp() * torch.where(torch.isinf(log_probs), 0.0, log_probs)).sum(-1)
    return logps, entropy


# ---------------------------------------------------------------------- the distribution sampled from

SAMPLED_CHUNK = 256  # positions per chunk of sampled_logps: sorting and masking a (chunk, vocab) block at a time


class SamplingFilters(Protocol):
    """What shapes the sampling distribution (rlft.rollout.types.SamplingParams has these fields)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float


def filters_active(params: SamplingFilters) -> bool:
    """Whether sampling reshapes the distribution beyond temperature (so its log-probs differ from
    log_softmax(logits / T))."""
    return params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0 or params.repetition_penalty != 1.0


def process_logits(logits: torch.Tensor, seen: torch.Tensor | None, params: SamplingFilters) -> torch.Tensor:
    """Scores of the sampling distribution, in vLLM's order: repetition penalty, temperature, min-p, top-k, top-p.

    `seen` (N, V) bool marks tokens already in each sequence (for the repetition penalty). Filtered
    tokens get -inf; log_softmax of the result is the distribution sampled from. Every rlft engine samples
    from it, vLLM applies the same steps in the same order (HF's `generate` applies min-p last, which keeps a
    different set when min-p and top-p are combined), and the trainer evaluates it (`sampled_logps`) so that
    importance ratios compare like with like.
    """
    scores = logits.float()
    if params.repetition_penalty != 1.0 and seen is not None:
        penalised = torch.where(scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty)
        scores = torch.where(seen, penalised, scores)
    if params.temperature > 0 and params.temperature != 1.0:  # skip no-op work: decoding is overhead-bound
        scores = scores / params.temperature
    if params.min_p > 0:
        probs = scores.softmax(-1)
        scores = scores.masked_fill(probs < params.min_p * probs.max(-1, keepdim=True).values, float("-inf"))
    if 0 < params.top_k < scores.size(-1):  # 0 or -1 = off
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - ordered.softmax(-1) >= params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def draw_tokens(log_probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of (N, V) normalised log-probs, drawn exactly from exp(log_probs) by the inverse CDF
    (`inverse_cdf`) with one uniform per row (`uniforms`).

    torch.multinomial draws V exponentials per row (the Gumbel-max trick) for the same distribution: about 10x the
    time at 32,768 entries on a CPU (`bench/decode.py --vocab 32768`), and 60 against 19 us per draw of 8 rows at 265
    entries, where decoding a small model is bound by such per-token costs. Tokens of probability 0 (filtered, -inf)
    are never drawn."""
    return inverse_cdf(log_probs, uniforms(log_probs.size(0), log_probs.device, generator))


def uniforms(rows: int, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """(rows, 1) float64 uniforms in [0, 1): what one token draw per row takes from `generator` (or the global one)."""
    return torch.rand((rows, 1), dtype=torch.float64, device=device, generator=generator)


def inverse_cdf(log_probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first token of each row whose cumulative probability (float64) exceeds u times the row's total."""
    cumulative = log_probs.exp().double().cumsum(-1)
    chosen = torch.searchsorted(cumulative, u * cumulative[:, -1:], right=True).squeeze(-1)
    return chosen.clamp_max(log_probs.size(-1) - 1)


def next_tokens(scores: torch.Tensor, u: torch.Tensor | None, finished: torch.Tensor, stop: torch.Tensor, pad_id: int,
                greedy: bool | torch.Tensor = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoding step's draw from (N, V) sampling scores (`process_logits`): (tokens, their log-probs, the rows a
    stop token ends now, the log-softmax distribution drawn from). `u`: one uniform per row (`uniforms`); `greedy`:
    the most likely token instead (temperature 0; `u` unread), a bool, or a 0-d bool tensor with which both are
    computed and one kept (one compiled graph for both). Rows already `finished` get `pad_id`. The rollout engine runs
    it eagerly, and its compiled decoder inside the decode step's graph (`rlft.rollout.compiled`)."""
    distribution = torch.log_softmax(scores, dim=-1)
    # a NaN distribution draws some token: its NaN log-prob stops the rollout (the engine's NOT_FINITE)
    if isinstance(greedy, torch.Tensor):
        chosen = torch.where(greedy, scores.argmax(-1), inverse_cdf(distribution, u))
    else:
        chosen = scores.argmax(-1) if greedy else inverse_cdf(distribution, u)
    chosen = chosen.masked_fill(finished, pad_id)
    logps = distribution.gather(-1, chosen.clamp_min(0)[:, None]).squeeze(-1)
    return chosen, logps, ~finished & torch.isin(chosen, stop), distribution


def first_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, V): the first attended position of each token in each row (the row length where it never occurs)."""
    count, length = input_ids.shape
    positions = torch.arange(length, device=input_ids.device).expand(count, length)
    positions = torch.where(attention_mask.bool(), positions, length)  # padding never counts
    first = torch.full((count, vocab), length, dtype=torch.long, device=input_ids.device)
    return first.scatter_reduce(1, input_ids, positions, reduce="amin")


def tokens_seen(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int, vocab: int) -> torch.Tensor:
    """(B, C, V) bool: token v occurs among the attended tokens before completion position t (what the engine's
    repetition penalty saw when it sampled token t: the prompt and the completion so far)."""
    length = input_ids.size(1)
    before = torch.arange(length - width, length, device=input_ids.device)  # completion token t sits here
    return first_positions(input_ids, attention_mask, vocab)[:, None, :] < before[None, :, None]


@torch.no_grad()
def sampled_logps(scores: CompletionScores | torch.Tensor, batch: dict[str, Any], params: SamplingFilters,
                  temperature_logps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) log-probs of the completion tokens under the distribution an engine with these weights samples from
    (`process_logits`), without gradient, computed SAMPLED_CHUNK positions at a time; and a (B, C) bool of the
    tokens these weights' filters drop (a boundary token the engine kept: numerics or staleness moved the
    boundary). Those get `temperature_logps` instead of log 0, so one such token does not zero a ratio or
    dominate a sequence's mean. `scores`: a forward's CompletionScores, or its (B, C, V) completion logits."""
    if isinstance(scores, torch.Tensor):
        scores = CompletionScores(batch, logits=scores)
    width = int(batch["completion_width"])
    count, vocab = batch["input_ids"].size(0), scores.vocab
    length = batch["input_ids"].size(1)
    targets = batch["input_ids"][:, -width:].reshape(-1)
    first = None
    if params.repetition_penalty != 1.0:
        first = first_positions(batch["input_ids"], batch["attention_mask"], vocab)
    out = []
    for start in range(0, count * width, SAMPLED_CHUNK):
        index = torch.arange(start, min(start + SAMPLED_CHUNK, count * width), device=targets.device)
        rows, steps = index // width, index % width
        seen = first[rows] < (length - width + steps)[:, None] if first is not None else None
        filtered = process_logits(scores.logits_at(rows, steps), seen, params)  # (chunk, V), never the whole batch
        out.append(torch.log_softmax(filtered, dim=-1).gather(-1, targets[index, None]).squeeze(-1))
    values = torch.cat(out).reshape(count, width)
    dropped = torch.isinf(values)
    return torch.where(dropped, temperature_logps.detach(), values), dropped
