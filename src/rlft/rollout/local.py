"""The in-process rollout engine: all prompts x G samples in one batched KV-cache decode.

No per-sequence Python loop except for optional stop strings. Each distinct prompt's forward runs once, its keys and
values shared by the rows that sample from it (`rlft.rollout.prefill`). Each token's log-prob is taken from
the exact distribution it was drawn from (`process_logits`).
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Mapping, NamedTuple

import torch

from rlft.errors import RolloutError
from rlft.models.head import without_router_logits
from rlft.models.logprobs import next_tokens, process_logits, uniforms
from rlft.rollout.compiled import CompiledDecoder
from rlft.rollout.prefill import cache_keyword, distinct_prompts, forward_prompts, left_padded, rows_copyable, shares_prompts
from rlft.rollout.types import Rollout, SamplingParams

NOT_FINITE = ("the policy's next-token distribution held NaN while sampling: its weights or logits are not finite (a "
              "diverged run, or an overflow in bf16/fp16). Lower learning_rate and resume from an earlier checkpoint (with "
              "save_only_model: true, start a new run from an earlier checkpoint's model/ folder)")


class Decoded(NamedTuple):
    """One sample per prompt: tokens (with the stop token), their sampling log-probs, whether max_new_tokens
    ended them, and per step the (token id, log-prob) pairs of the most likely tokens when asked for."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    truncated: list[bool]
    top_logprobs: list[list[list[tuple[int, float]]]] | None


class LocalEngine:
    """Batched sampling from an in-memory causal LM that this engine owns (kept in eval mode, no gradients).

    `from_policy` makes it from the policy being trained: a copy of the weights that train, sharing
    the frozen ones (a LoRA run copies only its adapter; a full fine-tune copies every weight).
    The trained module is never read while sampling: new weights arrive through `load_weights`.
    `from_policy(..., share=True)` shares the weights that train too (`shares_weights`): its modules are copies (in
    eval mode), their parameters the policy's own tensors, so it always samples with the weights as they are: for a
    trainer that samples only between optimizer steps and wants the newest weights every step, a weight push is then
    a new version number, and no second copy of the weights is kept.
    `compiled` (mode, backend) decodes with a static KV cache and a compiled one-token forward (rollout/compiled.py).
    """

    def __init__(self, model, pad_id: int, tokenizer=None, max_batch: int = 256, version: int = 0,
                 compiled: tuple[str | None, str] | None = None, shares_weights: bool = False):
        self.model = model.eval()
        self.pad_id = pad_id
        self.tokenizer = tokenizer  # only needed for stop strings
        self.max_batch = max_batch
        self._version = version
        self._params = dict(model.named_parameters())
        self.lock = threading.Lock()  # one decode or weight load at a time (async prefetch samples on another thread)
        self.shares_weights = shares_weights  # its parameters are the policy's own (`from_policy(share=True)`)
        self.compiled = compiled
        self.decoder = None
        if compiled is not None:
            self.decoder = CompiledDecoder(self.model, cache_keyword(self.model), pad_id, *compiled)

    @classmethod
    def from_policy(cls, policy, pad_id: int, tokenizer=None, version: int = 0,
                    compiled: tuple[str | None, str] | None = None, share: bool = False) -> "LocalEngine":
        # frozen weights never change: shared always; the trained ones with `share`
        shared = {id(p): p for p in policy.parameters() if share or not p.requires_grad}
        own = copy.deepcopy(policy, memo=shared)
        if not share:
            own.requires_grad_(False)
        return cls(own, pad_id, tokenizer, version=version, compiled=compiled, shares_weights=share)

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        unknown = [name for name in weights if name not in self._params]
        if unknown:
            raise RolloutError(f"load_weights: the engine's model has no parameter {unknown[0]!r} "
                               f"({len(unknown)} unknown of {len(weights)}): the weights come from another architecture")
        with self.lock, torch.no_grad():  # never while a batch is being decoded
            for name, tensor in weights.items():
                self._params[name].copy_(tensor)
            self._version = version

    def relabel(self, version: int) -> None:
        """The weights it holds are those of `version` too (no optimizer step changed them since)."""
        with self.lock:
            self._version = version

    def health(self) -> dict[str, Any]:
        return {"ok": True, "engine": "local", "version": self._version}

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1, seed: int | None = None) -> Rollout:
        """`seed` draws from a generator of its own (the stream of `torch.manual_seed(seed)`), so sampling is
        reproducible whatever other threads do with the global generator; None uses the global generator."""
        expanded = [ids for ids in prompt_ids for _ in range(num_samples)]
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        decoded = self.decode(expanded, params, generator=generator)
        return Rollout(expanded, decoded.completion_ids, decoded.logprobs, decoded.truncated,
                       weight_versions=[self._version] * len(expanded))

    @torch.no_grad()
    def decode(self, prompts: list[list[int]], params: SamplingParams, top_logprobs: int = 0,
               generator: torch.Generator | None = None) -> "Decoded":
        """One sample per prompt, in batches of `max_batch`; with `top_logprobs` > 0 also the k most likely
        tokens of each step's sampling distribution (the OpenAI `top_logprobs` of the rollout server)."""
        with self.lock:
            parts = [self._decode(prompts[i : i + self.max_batch], params, top_logprobs, generator)
                     for i in range(0, len(prompts), self.max_batch)]
        return Decoded([c for p in parts for c in p[0]], [lp for p in parts for lp in p[1]], [t for p in parts for t in p[2]],
                       [k for p in parts for k in p[3]] if top_logprobs > 0 else None)

    def _decode(self, prompts: list[list[int]], params: SamplingParams, top_logprobs: int = 0,
                generator: torch.Generator | None = None):
        device = next(self.model.parameters()).device
        (input_ids, attention, positions), logits, cache = self._prefill(prompts, params.max_new_tokens, device)
        count = input_ids.size(0)
        vocab = self.model.get_output_embeddings().weight.shape[0] if self.model.get_output_embeddings() is not None else None
        seen = None
        if params.repetition_penalty != 1.0:
            # counted, not scattered as booleans: a padding column must not clear a token the prompt does hold
            seen = torch.zeros((count, vocab), dtype=torch.long, device=device).scatter_add_(1, input_ids, attention) > 0
        stop = torch.tensor(params.stop_token_ids or [-1], device=device)
        cache = {cache_keyword(self.model): cache, **without_router_logits(self.model)}  # (the eager steps' arguments)
        tokens, logps, tops = [], [], []
        finished = torch.zeros(count, dtype=torch.bool, device=device)
        stops = []  # per draw, the rows a stop token or string ends there
        position = positions[:, -1]
        for step in range(params.max_new_tokens):
            position = position + 1  # of the token drawn now
            scores = process_logits(logits, seen, params)
            u = uniforms(count, device, generator) if params.temperature > 0 else None
            fused = self.decoder is not None and step < params.max_new_tokens - 1
            after = done = None
            if fused:  # the draw and the next token's forward in one compiled call (the last draw feeds no forward)
                chosen, logp, just_finished, logits, distribution, after, done = self.decoder.draw_and_step(
                    scores, u, finished, stop, position)
            else:
                chosen, logp, just_finished, distribution = next_tokens(scores, u, finished, stop, self.pad_id, u is None)
            tokens.append(chosen)
            logps.append(logp)
            stops.append(just_finished)
            if top_logprobs > 0:
                tops.append(torch.topk(distribution, min(top_logprobs, distribution.size(-1)), dim=-1))
            if seen is not None:
                seen.scatter_(1, chosen[:, None], ~finished[:, None])
            if params.stop_strings and self.tokenizer is not None:
                just_finished |= self._stop_string_hit(torch.stack(tokens, 1), finished | just_finished, params.stop_strings)
                after = None
            if after is None:
                after = finished | just_finished
                done = after.all()
            finished = after
            if bool(done) or step == params.max_new_tokens - 1:
                break
            if fused:
                continue
            attention = torch.cat([attention, torch.ones((count, 1), dtype=attention.dtype, device=device)], dim=1)
            logits = self.model(input_ids=chosen[:, None], attention_mask=attention, position_ids=position[:, None],
                                use_cache=True, **cache).logits[:, -1]
        tokens, logps = torch.stack(tokens, 1), torch.stack(logps, 1)
        hits = torch.stack(stops, 1)  # a row ends at most once: the first True is its stop
        stopped = hits.any(1)
        ended = torch.where(stopped, hits.to(torch.uint8).argmax(1) + 1, tokens.size(1))
        if bool((logps.isnan() & (torch.arange(tokens.size(1), device=device) < ended[:, None])).any()):
            raise RolloutError(NOT_FINITE)
        tokens, logps, ends = tokens.tolist(), logps.tolist(), ended.tolist()
        top_rows: list[list[list[tuple[int, float]]]] = []
        if tops:
            ids, values = torch.stack([t.indices for t in tops], 1).tolist(), torch.stack([t.values for t in tops], 1).tolist()
            top_rows = [[list(zip(i, v)) for i, v in zip(ids[row][:end], values[row][:end])] for row, end in enumerate(ends)]
        return ([row[:end] for row, end in zip(tokens, ends)], [row[:end] for row, end in zip(logps, ends)],
                [not row for row in stopped.tolist()], top_rows)

    def _prefill(self, prompts: list[list[int]], new_tokens: int, device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, Any]:
        """((input ids, attention mask, positions) of the left-padded batch, the last positions' logits, the eager
        steps' KV cache; None for the compiled decoder, whose own cache then holds the prompts). Each distinct prompt's
        forward runs once and its keys and values go to each of its rows (`rlft.rollout.prefill`)."""
        distinct, rows = distinct_prompts(prompts) if shares_prompts(self.model) else (prompts, None)
        batch = left_padded(distinct, self.pad_id, device)
        if rows is not None:
            rows = rows.to(device)  # index_select takes its index on the tensor's device
            logits, cache = forward_prompts(self.model, batch)
            batch = tuple(t.index_select(0, rows) for t in batch)
            if rows_copyable(cache):
                if self.decoder is None:
                    cache.batch_select_indices(rows)
                    return batch, logits.index_select(0, rows), cache
                if self.decoder.start(cache, rows, batch[1], new_tokens):
                    return batch, logits.index_select(0, rows), None
        if self.decoder is not None:  # every row, straight into the decoder's cache
            return batch, self.decoder.prefill(*batch, new_tokens), None
        logits, cache = forward_prompts(self.model, batch)
        return batch, logits, cache

    def _stop_string_hit(self, tokens: torch.Tensor, done: torch.Tensor, stop_strings: list[str]) -> torch.Tensor:
        window = max(len(s) for s in stop_strings) + 8  # tokens are at least one character
        hit = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
        for row in (~done).nonzero().flatten().tolist():
            tail = self.tokenizer.decode(tokens[row, -window:], skip_special_tokens=True)
            hit[row] = any(s in tail for s in stop_strings)
        return hit
