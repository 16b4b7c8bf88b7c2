"""Rollout engines: sample completions and the log-prob of every sampled token.

`LocalEngine` samples from the policy being trained, in-process: all prompts x G samples in one
batched KV-cache decode (no per-sequence Python loop except for optional stop strings). Each
token's log-prob is taken from the exact distribution it was drawn from (after repetition
penalty, temperature, top-k, top-p and min-p), which later engines (rollout server, vLLM) report
the same way, so importance-sampling corrections compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)


@dataclass
class Rollout:
    """N = prompts x samples rows, prompt-major (the G samples of prompt 0 first)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # including the stop token when one was produced
    logprobs: list[list[float]]  # sampling-distribution log-prob of each completion token
    truncated: list[bool]  # ended by max_new_tokens, not by a stop token or string


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], num_samples: int, params: SamplingParams) -> Rollout: ...


def process_logits(logits: torch.Tensor, seen: torch.Tensor | None, params: SamplingParams) -> torch.Tensor:
    """Scores of the sampling distribution (HF order: repetition penalty, temperature, top-k, top-p, min-p).

    `seen` (N, V) bool marks tokens already in each sequence (for the repetition penalty). Filtered
    tokens get -inf; log_softmax of the result is the distribution sampled from.
    """
    scores = logits.float()
    if params.repetition_penalty != 1.0 and seen is not None:
        penalised = torch.where(scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty)
        scores = torch.where(seen, penalised, scores)
    if params.temperature > 0 and params.temperature != 1.0:  # skip no-op work: decoding is overhead-bound
        scores = scores / params.temperature
    if 0 < params.top_k < scores.size(-1):  # 0 or -1 = off
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - ordered.softmax(-1) >= params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    if params.min_p > 0:
        probs = scores.softmax(-1)
        scores = scores.masked_fill(probs < params.min_p * probs.max(-1, keepdim=True).values, float("-inf"))
    return scores


class LocalEngine:
    """Batched sampling from an in-memory causal LM (the policy itself)."""

    def __init__(self, model, pad_id: int, tokenizer=None, max_batch: int = 256):
        self.model = model
        self.pad_id = pad_id
        self.tokenizer = tokenizer  # only needed for stop strings
        self.max_batch = max_batch

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], num_samples: int, params: SamplingParams) -> Rollout:
        expanded = [ids for ids in prompt_ids for _ in range(num_samples)]
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._decode(expanded[i : i + self.max_batch], params) for i in range(0, len(expanded), self.max_batch)]
        finally:
            self.model.train(was_training)
        return Rollout(expanded, [c for p in parts for c in p[0]], [lp for p in parts for lp in p[1]], [t for p in parts for t in p[2]])

    def _decode(self, prompts: list[list[int]], params: SamplingParams):
        device = next(self.model.parameters()).device
        count, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((count, width), self.pad_id, dtype=torch.long, device=device)
        attention = torch.zeros((count, width), dtype=torch.long, device=device)
        for row, ids in enumerate(prompts):  # left padding: every row's next token is at the same column
            input_ids[row, width - len(ids):] = torch.tensor(ids, device=device)
            attention[row, width - len(ids):] = 1
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        vocab = self.model.get_output_embeddings().weight.shape[0] if self.model.get_output_embeddings() is not None else None
        seen = None
        if params.repetition_penalty != 1.0:
            seen = torch.zeros((count, vocab), dtype=torch.bool, device=device)
            seen.scatter_(1, input_ids, attention.bool())
        stop = torch.tensor(params.stop_token_ids or [-1], device=device)
        cache = DynamicCache()
        logits = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                            past_key_values=cache, use_cache=True).logits[:, -1]
        tokens, logps = [], []
        finished = torch.zeros(count, dtype=torch.bool, device=device)
        end_step = torch.full((count,), -1, dtype=torch.long, device=device)  # step of the stop token/string
        next_position = positions[:, -1]
        for step in range(params.max_new_tokens):
            scores = process_logits(logits, seen, params)
            distribution = torch.log_softmax(scores, dim=-1)
            if params.temperature > 0:
                chosen = torch.multinomial(distribution.exp(), 1).squeeze(-1)
            else:
                chosen = scores.argmax(-1)
            chosen = torch.where(finished, torch.full_like(chosen, self.pad_id), chosen)
            tokens.append(chosen)
            logps.append(distribution.gather(-1, chosen.clamp_min(0)[:, None]).squeeze(-1))
            if seen is not None:
                seen.scatter_(1, chosen[:, None], ~finished[:, None])
            just_finished = ~finished & torch.isin(chosen, stop)
            if params.stop_strings and self.tokenizer is not None:
                just_finished |= self._stop_string_hit(torch.stack(tokens, 1), finished | just_finished, params.stop_strings)
            end_step = torch.where(just_finished, torch.full_like(end_step, step), end_step)
            finished = finished | just_finished
            if bool(finished.all()) or step == params.max_new_tokens - 1:
                break
            attention = torch.cat([attention, torch.ones((count, 1), dtype=attention.dtype, device=device)], dim=1)
            next_position = next_position + 1
            logits = self.model(input_ids=chosen[:, None], attention_mask=attention, position_ids=next_position[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]
        tokens, logps = torch.stack(tokens, 1).tolist(), torch.stack(logps, 1).tolist()
        ends = [end + 1 if end >= 0 else len(tokens[0]) for end in end_step.tolist()]
        return ([row[:end] for row, end in zip(tokens, ends)], [row[:end] for row, end in zip(logps, ends)],
                [end < 0 for end in end_step.tolist()])

    def _stop_string_hit(self, tokens: torch.Tensor, done: torch.Tensor, stop_strings: list[str]) -> torch.Tensor:
        window = max(len(s) for s in stop_strings) + 8  # tokens are at least one character
        hit = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
        for row in (~done).nonzero().flatten().tolist():
            tail = self.tokenizer.decode(tokens[row, -window:], skip_special_tokens=True)
            hit[row] = any(s in tail for s in stop_strings)
        return hit
