"""SDPA over each document of a packed or flattened batch on its own: variable-length attention without flash-attention.

A packed or flattened batch (`sample_packing`, `batch_flattening`, `dpo_padding_free`) holds several documents per
row. flash-attention's variable-length kernels attend within each document and compute nothing else. SDPA has no such
kernel: under the block-diagonal mask it computes every (query, key) pair of the whole row and masks most of them, and
building the (T, T) mask is itself quadratic in the row's length. Here the documents' queries, keys and
values are cut out of the rows, and the documents of each length run through SDPA as one batch (causal, and limited
to the layer's sliding window where it has one). Attention then costs the sum of the squares of the documents'
lengths, in as many SDPA calls as there are distinct lengths, and no (T, T) mask is built (`unread_mask`). On a
CUDA GPU in bf16 or fp16 all documents run through one call of PyTorch's variable-length flash-attention instead
(`torch.nn.attention.varlen`): the grouped SDPA calls cut the documents out and put them back with gathers whose
backwards cost more than the attention (on an H200, a flattened bf16 SFT step took 3x the padded one).

It works through transformers' attention interface: `install` wraps the "sdpa" entry, and the wrapper takes this
path only when a forward passes `rlft_documents` (the boundaries from `rlft.data.collate.document_bounds`); every
other forward, in rlft or not, gets transformers' SDPA unchanged, except that a compiled forward on a CPU over short
rows runs SDPA's math path (`short_rows_kernel`). A model whose layers do not pass the forward's
keywords on to attention would attend across documents, so only model types checked to pass them
(`runs_documents`, tests/unit/test_varlen.py) run this way, and a layer that gets the batch without its boundaries
stops the run; the others get the block mask.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.attention.varlen as torch_varlen
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations import sdpa_attention

from rlft.config.settings.model import ModelSettings
from rlft.errors import ModelError
from rlft.models.attention import attention_implementation, sliding_window
from rlft.models.compile import compile_options
from rlft.models.shared_prompts import SHARED_PROMPT_MODELS

DOCUMENTS = "rlft_documents"  # the forward keyword that carries the boundaries down to the attention function
KEYWORDS_DROPPED = ("stablelm",)  # its decoder layers call attention without the forward's keywords
MATH_KEYS = 64  # a compiled forward on a CPU attends over at most this many keys through SDPA's math path
# off where the compiled forward autotunes its GEMMs (`torch_compile_mode: max-autotune`, rlft.train.wrap): inductor's
# C++ batched-GEMM template then fixes one batch size into a graph compiled for any (torch 2.13: "Expected size for
# first two dimensions of batch2 tensor" at the first batch of another size)
SHORT_ROWS_MATH = True


def runs_documents(model) -> bool:
    """Whether `model`'s forward can attend per document here: SDPA, a model type checked to pass the forward's
    keywords to its attention in transformers' own modeling code (not a checkpoint's remote code of the same type),
    not a compiled forward (which would recompile for every new set of lengths), and transformers' own SDPA in place
    (`install`)."""
    network = getattr(model, "module", model)
    network = network.get_base_model() if hasattr(network, "get_base_model") else network  # PEFT
    kind = getattr(getattr(network, "config", None), "model_type", None)
    return (attention_implementation(model) == "sdpa" and kind in SHARED_PROMPT_MODELS and kind not in KEYWORDS_DROPPED
            and type(network).__module__.startswith("transformers.models.") and not hasattr(model, "_orig_mod")
            and install())


def rows_apart(settings: ModelSettings, model) -> bool:
    """Whether this run's flattened batches attend each row on its own (`runs_documents`, and no compiled training
    forward, which gets the block mask): what a layout's cost is estimated from (`rlft.models.shared_prompts`)."""
    return compile_options(settings) is None and runs_documents(model)


def layer_window(module, kwargs: dict) -> int | None:
    """The sliding window of the attention layer `module` (None: full attention): the one the layer passes its
    attention function (`kwargs`, what flash-attention gets), else the config's for the layer."""
    if "sliding_window" in kwargs:
        return kwargs["sliding_window"]
    window, everywhere = sliding_window(module)
    if window is None or everywhere:
        return window
    return window if module.config.layer_types[module.layer_idx] == "sliding_attention" else None


def documents_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs):
    """transformers' SDPA attention, run per document when the forward passed `rlft_documents`: the boundaries
    (D + 1,) of D documents that tile the B x T positions of the batch taken row after row (no document crosses a
    row). All documents run through one flash-attention call where `flash_dtype` allows, else the documents of one
    length run as one SDPA batch; the mask the forward was given is not read. query (B, H, T, d) -> (B, T, H, d),
    as transformers' attention functions return it."""
    bounds = kwargs.pop(DOCUMENTS, None)
    if bounds is None:
        if is_unread(attention_mask):
            raise ModelError(f"{type(module).__name__} got a packed or flattened batch without its document "
                               f"boundaries (`{DOCUMENTS}`): its layers do not pass the forward's keywords on to "
                               "attention. Add its model type to KEYWORDS_DROPPED in rlft/models/varlen.py, or train "
                               "on padded rows (batch_flattening: false, sample_packing: false)")
        with short_rows_kernel(query, key):
            return sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                         scaling=scaling, is_causal=is_causal, **kwargs)
    if query.shape[2] != key.shape[2]:
        raise ValueError("packed or flattened rows attend per row only without a KV cache (use_cache=False)")
    if not (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        raise ModelError(f"{type(module).__name__} attends both ways (not causally), and packed or flattened rows attend "
                         "causally within each row: train on padded rows (batch_flattening: false, sample_packing: false)")
    window = layer_window(module, kwargs)
    rows, heads, width, size = query.shape
    tokens = lambda x: x.transpose(1, 2).reshape(rows * width, x.shape[1], x.shape[3])  # noqa: E731  (B·T, h, d)
    queries, keys, values = tokens(query), tokens(key), tokens(value)
    dtype = flash_dtype(query, key, value, dropout, kwargs)
    if dtype is not None:
        out = flash_documents(queries.to(dtype), keys.to(dtype), values.to(dtype), bounds, window, scaling)
        return out.view(rows, width, heads, size), None
    groups, inverse = document_groups(bounds)
    outputs = []
    for length, index in groups:
        mask = None
        if window is not None and length > window:  # causal, each query's keys fewer than `window` positions back
            mask = torch.ones(1, 1, length, length, dtype=torch.bool, device=query.device).tril().triu(1 - window)
        pick = lambda x: x[index].transpose(1, 2)  # noqa: E731  (n, h, L, d)
        out, _ = sdpa_attention.sdpa_attention_forward(module, pick(queries), pick(keys), pick(values), mask,
                                                       dropout=dropout, scaling=scaling, is_causal=mask is None, **kwargs)
        outputs.append(out.reshape(-1, heads, size))
    return torch.cat(outputs)[inverse].view(rows, width, heads, size), None


def short_rows_kernel(query: torch.Tensor, key: torch.Tensor):
    """SDPA's math path for a compiled forward on a CPU over at most MATH_KEYS keys: inductor fuses its products and
    softmax into the graph, where the CPU flash-attention kernel is a call of its own in the forward and the backward
    (a compiled SFT step at size S, rows of 11-14 tokens: 15.0 against 17.1 ms, `bench/short_rows.py`). Eager
    forwards, longer rows (whose (T, T) scores the math path holds whole) and other devices keep SDPA's choice. The
    bound is on the padded key length. Not where the compiled forward autotunes its GEMMs (SHORT_ROWS_MATH)."""
    if SHORT_ROWS_MATH and torch.compiler.is_compiling() and query.device.type == "cpu" and key.shape[2] <= MATH_KEYS:
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def flash_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float, kwargs: dict):
    """The precision PyTorch's variable-length flash-attention computes this layer's attention in, or None where it
    does not: on a CUDA GPU whose flash kernel runs (Ampere or newer, not ROCm: PyTorch's own check) in bf16 or fp16
    (autocast's, as SDPA would run: under autocast the rotary embedding leaves queries and keys in float32), head
    sizes flash-attention takes without padding, no dropout (it runs without), nothing SDPA would have added (a bias,
    sinks, soft-capping)."""
    extras = ("position_bias", "s_aux", "sinks", "softcap")
    if not query.is_cuda or dropout != 0.0 or any(kwargs.get(name) is not None for name in extras):
        return None
    autocast = torch.is_autocast_enabled("cuda")
    dtype = torch.get_autocast_dtype("cuda") if autocast else query.dtype
    if dtype not in (torch.bfloat16, torch.float16) or not autocast and not query.dtype == key.dtype == value.dtype:
        return None
    if not query.shape[-1] == key.shape[-1] == value.shape[-1] <= 256 or query.shape[-1] % 8 or torch.version.hip:
        return None
    stand_in = lambda x: x.new_empty((1, x.shape[1], 1, x.shape[-1]), dtype=dtype)  # noqa: E731  (device, heads, size)
    params = torch.backends.cuda.SDPAParams(stand_in(query), stand_in(key), stand_in(value), None, 0.0, True,
                                            key.shape[1] != query.shape[1])
    return dtype if torch.backends.cuda.can_use_flash_attention(params, False) else None


def flash_documents(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bounds: torch.Tensor,
                    window: int | None, scaling: float | None) -> torch.Tensor:
    """Causal attention within each document between `bounds`, all documents in one flash-attention call.
    queries (N, H, d), keys and values (N, H_kv, d) -> (N, H, d). A sliding window of W attends to W keys, the
    query's own among them, as transformers' masks do (flash-attention counts the W - 1 before it)."""
    starts, longest = flash_bounds(bounds)
    starts = starts.to(queries.device)
    return torch_varlen.varlen_attn(queries, keys, values, starts, starts, longest, longest, scale=scaling,
                                    window_size=(-1, 0) if window is None else (window - 1, 0),
                                    enable_gqa=keys.shape[1] != queries.shape[1])


def unread_mask(input_ids: torch.Tensor) -> torch.Tensor:
    """The attention mask a forward with `rlft_documents` passes: (B, 1, T, T) of True as a view of one element (no
    memory). transformers passes a 4-D mask on as it is, so it builds no (T, T) mask of its own (it would for
    sliding-window layers, quadratic in the micro-batch's length). No layer reads it: `documents_attention`
    refuses it in a layer that the boundaries did not reach."""
    rows, width = input_ids.shape
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=input_ids.device).expand(rows, 1, width, width)


def is_unread(mask) -> bool:
    """Whether `mask` is `unread_mask`'s: (T, T) of stride 0 (a one-token row's needs no telling apart)."""
    return isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-1] > 1 and mask.stride()[-2:] == (0, 0)


_last_bounds: tuple = (None, {})  # (bounds, what was derived from them): every layer of a forward gets the same tensor


def per_forward(make):
    """`make(bounds)` computed once per forward, not in every layer: reading the lengths waits for the device."""
    def cached(bounds: torch.Tensor):
        global _last_bounds
        seen, derived = _last_bounds
        if seen is not bounds:
            derived = {}
            _last_bounds = (bounds, derived)
        if make not in derived:
            derived[make] = make(bounds)
        return derived[make]
    return cached


@per_forward
def document_groups(bounds: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
    """The documents between `bounds` grouped by length: [(L, (n, L) positions of the n documents of length L)], and
    the permutation that puts the groups' outputs, taken one after the other, back in the order of the positions."""
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
    grouped = []
    for length in lengths.unique().tolist():
        first = starts[lengths == length]
        grouped.append((length, first[:, None] + torch.arange(length, device=first.device)))
    order = torch.cat([index.reshape(-1) for _, index in grouped])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return grouped, inverse


@per_forward
def flash_bounds(bounds: torch.Tensor) -> tuple[torch.Tensor, int]:
    """flash-attention's cumulative sequence lengths (int32) and the longest document."""
    return bounds.to(torch.int32), int((bounds[1:] - bounds[:-1]).max())


def install() -> bool:
    """Route transformers' "sdpa" attention through `documents_attention` (once per process). False, and nothing
    changed, where another library has already replaced that entry: the batch then runs under its block mask."""
    current = AttentionInterface._global_mapping.get("sdpa")
    if current is documents_attention:
        return True
    if (getattr(current, "__module__", None), getattr(current, "__name__", None)) != (
            "transformers.integrations.sdpa_attention", "sdpa_attention_forward"):
        return False
    AttentionInterface.register("sdpa", documents_attention)
    return True
