"""The decode step of the rollout engine with a static KV cache, compiled (`torch_compile: true`).

A decode forward of a small model is mostly Python and dispatch overhead: the model code runs for a (B, 1) input
and the cache grows by concatenation. Here the cache is allocated once per batch size (transformers' `StaticCache`,
its length rounded up to `LENGTH_BUCKET` tokens and grown, never shrunk, when a longer batch comes: one cache and
a few graphs per batch size, however the prompt widths vary), the attention mask is a fixed (B, L) tensor filled in
place, and the one-token forward is a `torch.compile`d function: inductor with its C++ wrapper on a CPU, CUDA graphs
(`reduce-overhead`) on a GPU. The prompt's forward (prefill) runs eagerly into the same cache, computing the last
position's logits only. Sampling stays outside, unchanged, so every token's log-prob still comes from the
distribution it was drawn from.

Compiling costs seconds per new batch shape, once per process; it pays off over runs of hundreds of steps, where
decoding is most of a GRPO step.
"""

from __future__ import annotations

from typing import Any

import torch

from rlft.models.masks import safe_attention

LENGTH_BUCKET = 64  # cache lengths are multiples of this: one compiled graph serves many prompt widths
# graphs of one decode step that dynamo keeps (its default, 8, counts every decoder of the process: the batch sizes of
# training, evaluation and the last chunk, each cache growth, and a rollout server's engine rebuilt for each adapter)
RECOMPILE_LIMIT = 64


def compile_options(cfg) -> tuple[str | None, str] | None:
    """(mode, backend) of the compiled decode step when `torch_compile` asks for it on this machine, else None."""
    if cfg.torch_compile is True or (cfg.torch_compile == "auto" and torch.cuda.is_available()):
        return cfg.torch_compile_mode, cfg.torch_compile_backend or "inductor"
    return None


class CompiledDecoder:
    """Static-cache decoding for one model: `prefill` a left-padded batch, then `step` one token at a time."""

    def __init__(self, model, cache_keyword: str, mode: str | None = None, backend: str = "inductor"):
        self.model = model
        self.cache_keyword = cache_keyword
        device = next(model.parameters()).device
        self.mode = mode or ("reduce-overhead" if device.type == "cuda" else None)
        # on a CPU, inductor's C++ wrapper calls the kernels without Python in between: 15-20 % faster decode steps
        options = {"cpp_wrapper": True} if self.mode is None and backend == "inductor" else None
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._step = torch.compile(self._forward, dynamic=False, backend=backend, mode=self.mode, options=options)
        self._caches: dict[int, tuple[int, Any]] = {}  # batch -> (length, StaticCache), reused across calls
        self.cache = None
        self.attention: torch.Tensor | None = None
        self.column = 0  # the cache position of the next token

    def _forward(self, input_ids, attention_mask, position_ids, cache_position, cache):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=1,
                          cache_position=cache_position, use_cache=True, **{self.cache_keyword: cache}).logits[:, -1]

    def _cache_for(self, batch: int, needed: int) -> tuple[int, Any]:
        """(length, cache) for `batch` rows: the batch size's cache if it holds `needed` positions, else a longer one in
        its place (the old one freed first)."""
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        length, cache = self._caches.get(batch, (0, None))
        if length < needed:
            self._caches.pop(batch, None)
            self.cache = cache = None
            length = -(-needed // LENGTH_BUCKET) * LENGTH_BUCKET
            base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            cache = StaticCache(config=base.config, max_cache_len=length)
            # sliding-window layers keep every position too: transformers' sliding cache layer counts its tokens in a
            # Python int, which would recompile the step at every token; the model's mask still applies the window
            cache.layers = [StaticLayer(max_cache_len=length) if getattr(layer, "is_sliding", False) else layer
                            for layer in cache.layers]
            self._caches[batch] = (length, cache)
        cache.reset()
        return length, cache

    def prefill(self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The prompts' forward (eager) into a fresh cache with room for `new_tokens` more; the last position's logits."""
        count, width = input_ids.shape
        length, self.cache = self._cache_for(count, width + new_tokens)
        self.attention = torch.zeros((count, length), dtype=attention.dtype, device=attention.device)
        self.attention[:, :width] = attention
        self.column = width
        cache_position = torch.arange(width, device=input_ids.device)
        mask = safe_attention(self.model, self.attention[:, :width], kv_length=length)  # left padding (rlft.models.masks)
        return self._forward(input_ids, mask, positions, cache_position, self.cache)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (at its row's next position); the logits of the next one."""
        self.attention[:, self.column] = 1
        cache_position = torch.tensor([self.column], device=tokens.device)
        self.column += 1
        logits = self._step(tokens[:, None], self.attention, positions[:, None], cache_position, self.cache)
        return logits.clone() if self.mode == "reduce-overhead" else logits  # CUDA graphs reuse their output buffer
