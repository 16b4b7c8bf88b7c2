"""The decode step of the rollout engine with a static KV cache, compiled (`torch_compile: true`).

A decode forward of a small model is mostly Python and dispatch overhead: the model code runs for a (B, 1) input
and the cache grows by concatenation. Here the cache is allocated once per batch size (transformers' `StaticCache`,
its length rounded up to `LENGTH_BUCKET` tokens and grown, never shrunk, when a longer batch comes: one cache and
a few graphs per batch size, however the prompt widths vary), the attention mask is a fixed (B, L) tensor set once a
decode (`decode_mask`), and each step is one call of a `torch.compile`d function that draws the next token from the
last step's sampling scores (`rlft.models.logprobs.next_tokens`: log-softmax, the inverse-CDF draw from a uniform drawn
outside, the token's log-prob, the stop check, which rows are now finished) and runs the one-token forward of the
drawn tokens: inductor with its C++
wrapper on a CPU, CUDA graphs (`reduce-overhead`) on a GPU. The draw's dozen small operators would otherwise each be a
call of their own per token. The uniforms come from the same generator in the same order as the eager engine's, so
both draw the same tokens at the same seed, unless a uniform falls within float rounding of the boundary between two
tokens (inductor's log-softmax rounds otherwise than torch's). The scores themselves (repetition
penalty, temperature, min-p, top-k, top-p: `process_logits`) are computed outside the graph, so sampling settings
never change what a graph computes. On a CPU, inductor computes a product of one query row with the whole cache as a
broadcast multiply and a sum in a loop over the cached positions; a pass stores that row first (`store_reused_rows`),
where inductor would recompute it, rotary sines and cosines included, for every cached position (at size S with 576
cached positions a compiled step took 1.5-2.0 ms before, 0.6-1.0 ms with the pass: bench/README.md). The prompt's
forward (prefill) runs eagerly, computing the last position's logits only: into the same cache, or, where the batch
holds prompts several times, once per distinct prompt, whose keys and values `start` copies to each of its rows
(`rlft.rollout.prefill`). It runs once per decode, and a compiled one (dynamic shapes, for every prompt width) saves
less in a run of hundreds of steps than its compile costs.

Each decoder keeps compiled graphs of its own (`own_code`), so that they only ever run with its own model, whose
modules never change once it is built (new weights are copied into the same tensors; a server builds a new engine
for a new adapter). Where the step compiles as one graph, its guards then need only check the tensors that vary
between calls (batch size, cache length) and the process's state (`decoder_guards`): dynamo's default guards check
every module attribute and global on every call (`bench/decode.py` reports their time per step). The step is always
called with the same kinds of arguments (a greedy step passes a flag tensor and zeros for the uniforms: one graph
computes both tokens and keeps one), so nothing the guards no longer check changes between calls. A forward that
breaks into several graphs keeps dynamo's default guards (`compile_step`).

Compiling costs seconds per new batch shape, once per decoder; it pays off over runs of hundreds of steps, where
decoding is most of a GRPO step (at size S on a CPU a compiled GRPO run ended first from step 196 with inductor's cache
filled, from step 1,589 without: bench/compile_cost.py --method grpo).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from rlft.models.compile import RECOMPILE_LIMIT
from rlft.models.head import without_router_logits
from rlft.models.logprobs import next_tokens
from rlft.models.masks import safe_attention

LENGTH_BUCKET = 64  # cache lengths are multiples of this: one compiled graph serves many prompt widths
# guards on the process's state that every compiled graph keeps (grad mode, deterministic algorithms, ...)
STATE_GUARDS = frozenset({"GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "GLOBAL_STATE", "TORCH_FUNCTION_STATE", "DEFAULT_DEVICE",
                          "AUTOGRAD_SAVED_TENSORS_HOOKS", "SHAPE_ENV"})
COMPILE_ERRORS = (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError, torch._dynamo.exc.UncapturedHigherOrderOpError)


class CompiledDecoder:
    """Static-cache decoding for one model: `prefill` a left-padded batch, then `draw_and_step` one token at a time.
    `pad_id`: the token a finished row is fed."""

    def __init__(self, model, cache_keyword: str, pad_id: int, mode: str | None = None, backend: str = "inductor"):
        self.model = model
        self.cache_keyword = cache_keyword
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.mode = mode or ("reduce-overhead" if self.device.type == "cuda" else None)
        self.backend = backend
        self._compile(whole=True)
        self._caches: dict[int, tuple[int, Any]] = {}  # batch -> (length, StaticCache), reused across calls
        self.cache = None
        self.attention: torch.Tensor | None = None
        self.column = 0  # the cache position of the next token
        # the step's flag and cache position, made once: a tensor built from a Python value per token costs as much as
        # an operator
        self._greedy = {flag: torch.tensor(flag, device=self.device) for flag in (False, True)}
        self._cache_position = torch.zeros(1, dtype=torch.long, device=self.device)

    def _compile(self, whole: bool) -> None:
        """`whole`: the step compiles as one graph, guarded by `decoder_guards`; else with dynamo's own guards."""
        self.whole = whole
        self._step = compile_step(own_code(self._draw_and_step), self.mode, self.backend, self.device.type == "cpu", whole)

    def _forward(self, input_ids, attention_mask, position_ids, cache_position, cache):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=1,
                          cache_position=cache_position, use_cache=True, **{self.cache_keyword: cache},
                          **without_router_logits(self.model)).logits[:, -1]

    def _draw_and_step(self, scores, u, greedy, finished, stop, position_ids, attention_mask, cache_position, cache):
        """The compiled step: the draw from `scores`, then the drawn tokens' forward. On a CPU its one query attends
        through SDPA's math path, whose products and softmax inductor fuses into the step, where the CPU flash kernel
        is a call of its own. The prefill, whose (T, T) scores the math path would hold whole, keeps SDPA's choice."""
        chosen, logps, ended, distribution = next_tokens(scores, u, finished, stop, self.pad_id, greedy)
        with sdpa_kernel(SDPBackend.MATH) if self.device.type == "cpu" else contextlib.nullcontext():
            logits = self._forward(chosen[:, None], attention_mask, position_ids, cache_position, cache)
        after = finished | ended  # the loop's stop bookkeeping, here rather than two operators of its own per token
        return chosen, logps, ended, logits, distribution, after, after.all()

    def _cache_for(self, batch: int, needed: int) -> tuple[int, Any]:
        """(length, cache) for `batch` rows: the batch size's cache if it holds `needed` positions, else a longer one in
        its place (the old one freed first)."""
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
        self.attention = decode_mask(attention, length)
        self.column = width
        cache_position = torch.arange(width, device=input_ids.device)
        mask = safe_attention(self.model, self.attention[:, :width], kv_length=length)  # left padding (rlft.models.masks)
        return self._forward(input_ids, mask, positions, cache_position, self.cache)

    def start(self, prompts_cache, rows: torch.Tensor, attention: torch.Tensor, new_tokens: int) -> bool:
        """A fresh cache with room for `new_tokens` more, holding the keys and values of a prefill of distinct prompts
        (`rlft.rollout.prefill.forward_prompts`, plain layers) for the batch's rows: row i takes those of prompt
        `rows[i]`. `attention`: the batch's (rows, width) mask. False (nothing done) where the static cache has other
        layers than the prefill's (a model whose layers share keys and values): then `prefill` every row."""
        count, width = attention.shape
        length, self.cache = self._cache_for(count, width + new_tokens)
        if len(self.cache.layers) != len(prompts_cache.layers):
            return False
        self.attention = decode_mask(attention, length)
        self.column = width
        for target, source in zip(self.cache.layers, prompts_cache.layers, strict=True):
            keys, values = source.keys.index_select(0, rows), source.values.index_select(0, rows)
            if not target.is_initialized:
                target.lazy_initialization(keys, values)
            target.keys[:, :, :width].copy_(keys)
            target.values[:, :, :width].copy_(values)
            target.cumulative_length.fill_(width)  # where the next token's keys go
        return True

    def draw_and_step(self, scores: torch.Tensor, u: torch.Tensor | None, finished: torch.Tensor, stop: torch.Tensor,
                      positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One token per row drawn from `scores` (`next_tokens`; `u` None: the most likely) and fed at its row's next
        position (`positions`): (tokens, log-probs, rows a stop token ends now, the next logits, the distribution
        drawn from, the rows finished after this draw (`finished` or ended now), whether every row is)."""
        cache_position = self._cache_position.fill_(self.column)
        self.column += 1
        greedy = self._greedy[u is None]
        if u is None:  # the graph computes a draw too, from zeros (the generator is not read)
            u = torch.zeros((scores.size(0), 1), dtype=torch.float64, device=scores.device)
        inputs = (scores, u, greedy, finished, stop, positions[:, None], self.attention, cache_position, self.cache)
        try:
            out = self._step(*inputs)
        except COMPILE_ERRORS:
            if not self.whole:  # found while tracing, before anything ran: the forward does not compile as one graph
                raise
            self._compile(whole=False)
            out = self._step(*inputs)
        return tuple(t.clone() for t in out) if self.device.type == "cuda" else out  # CUDA graphs reuse their outputs


def decode_mask(attention: torch.Tensor, length: int) -> torch.Tensor:
    """The (rows, length) attention mask of a decode into a static cache of `length` positions: the prompts' mask
    (`attention`, left padding), then ones. The positions a step has not written yet are hidden by the causal mask
    (a key after the query's cache position), so the whole mask is set once, not a column per token."""
    mask = torch.ones((attention.size(0), length), dtype=attention.dtype, device=attention.device)
    mask[:, : attention.size(1)] = attention
    return mask


def compile_step(function, mode: str | None, backend: str, cpu: bool, whole: bool):
    """`function` compiled as a decoder's step, keeping up to RECOMPILE_LIMIT graphs. `whole`: as one graph
    (`fullgraph`), guarded by `decoder_guards` alone; else with dynamo's own guards, which a forward that breaks into
    several graphs needs (each decoder layer's frame would otherwise run the graph compiled for the first layer, whose
    cache index it holds). On a CPU, inductor's C++ wrapper calls the kernels without Python in between (15-20 %
    faster decode steps), and `store_reused_rows` runs on the graph."""
    guards = {"guard_filter_fn": decoder_guards} if whole else {}
    if backend == "inductor":  # a mode is its inductor options (torch.compile takes a mode or options, not both)
        from torch._inductor import list_mode_options  # on use: importing inductor takes seconds

        options = {**list_mode_options(mode or "default", False), **guards}
        if cpu and mode is None:
            options["cpp_wrapper"] = True
        if cpu:
            options["post_grad_custom_post_pass"] = store_reused_rows()
        mode = None
    else:  # another backend gets the mode it was given, with dynamo's own guards
        options = None if mode not in (None, "default") else guards or None
    return torch.compile(function, dynamic=False, fullgraph=whole, backend=backend, mode=mode, options=options,
                         recompile_limit=RECOMPILE_LIMIT)


def store_reused_rows():
    """An inductor pass for a CPU: a batched product of one row by many columns (the decode step's query by the cached
    keys, its attention weights by the cached values), or of many rows by one column, inductor computes as a
    broadcast multiply and a sum in a loop over the many, into which it inlines the single row's producers: every
    cached position recomputed the query's rotary embedding (a sine and a cosine per element). The pass marks that
    input to be stored once before the loop (inductor's own flag for it). The values are the same. (Built on first
    use: importing inductor takes seconds, and the launching command imports this module.)"""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files  # inductor: seconds to import

    class StoreReusedRows(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            for product in graph.find_nodes(op="call_function", target=torch.ops.aten.bmm.default):
                first, second = product.args[:2]
                shapes = [getattr(getattr(node, "meta", {}).get("val"), "shape", None) for node in (first, second)]
                if None in shapes:  # no shapes recorded: left as inductor has it
                    continue
                rows, columns = shapes[0][1], shapes[1][2]
                if rows == 1 and columns != 1:
                    first.meta["inductor_realize_to_strides"] = True
                elif columns == 1 and rows != 1:
                    second.meta["inductor_realize_to_strides"] = True

        def uuid(self) -> bytes:  # inductor's cache key: this file's text
            return get_hash_for_files((__file__,))

    return StoreReusedRows()


def own_code(method):
    """`method` (bound) with a copy of its function's code object. dynamo keeps compiled graphs on the code object, so
    this decoder's graphs are never tried for another decoder's model, which may differ in what `decoder_guards` does
    not check (an adapter's scaling, a layer's width), and they go when the decoder goes."""
    function = method.__func__
    copy = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    return types.MethodType(copy, method.__self__)


def decoder_guards(entries) -> list[bool]:
    """Which of dynamo's guards a decoder's graph keeps: the shapes, dtypes and devices of the tensors it is called
    with (the cache's included, not the parameters'), and the process's state. Dropped: the checks of module
    attributes and globals, which cannot change for a decoder's own model (`own_code`)."""
    return [(entry.guard_type == "TENSOR_MATCH" and not isinstance(entry.value, torch.nn.Parameter))
            or entry.guard_type in STATE_GUARDS for entry in entries]
