"""The in-process rollout engine: all prompts x G samples in one batched KV-cache decode.

No per-sequence Python loop except for optional stop strings. Each token's log-prob is taken from
the exact distribution it was drawn from (`process_logits`).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from transformers import DynamicCache

from rlft.errors import RolloutError
from rlft.rollout.engine import process_logits
from rlft.rollout.types import Rollout, SamplingParams


class LocalEngine:
    """Batched sampling from an in-memory causal LM that this engine owns (kept in eval mode, no gradients).

    `from_policy` makes it from the policy being trained: a copy of the weights that train, sharing
    the frozen ones (a LoRA run copies only its adapter; a full fine-tune copies every weight).
    The trained module is never read while sampling: new weights arrive through `load_weights`.
    """

    def __init__(self, model, pad_id: int, tokenizer=None, max_batch: int = 256, version: int = 0):
        self.model = model.eval()
        self.pad_id = pad_id
        self.tokenizer = tokenizer  # only needed for stop strings
        self.max_batch = max_batch
        self._version = version
        self._params = dict(model.named_parameters())

    @classmethod
    def from_policy(cls, policy, pad_id: int, tokenizer=None, version: int = 0) -> "LocalEngine":
        shared = {id(p): p for p in policy.parameters() if not p.requires_grad}  # frozen weights never change: share them
        own = copy.deepcopy(policy, memo=shared).requires_grad_(False)
        return cls(own, pad_id, tokenizer, version=version)

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        unknown = [name for name in weights if name not in self._params]
        if unknown:
            raise RolloutError(f"load_weights: the engine's model has no parameter {unknown[0]!r} "
                               f"({len(unknown)} unknown of {len(weights)}): the weights come from another architecture")
        with torch.no_grad():
            for name, tensor in weights.items():
                self._params[name].copy_(tensor)
        self._version = version

    def health(self) -> dict[str, Any]:
        return {"ok": True, "engine": "local", "version": self._version}

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1) -> Rollout:
        expanded = [ids for ids in prompt_ids for _ in range(num_samples)]
        parts = [self._decode(expanded[i : i + self.max_batch], params) for i in range(0, len(expanded), self.max_batch)]
        return Rollout(expanded, [c for p in parts for c in p[0]], [lp for p in parts for lp in p[1]], [t for p in parts for t in p[2]],
                       weight_versions=[self._version] * len(expanded))

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
