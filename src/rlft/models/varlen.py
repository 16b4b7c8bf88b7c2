"""SDPA over each document of a packed or flattened batch on its own: variable-length attention without flash-attention.

A packed or flattened batch (`sample_packing`, `batch_flattening`, `dpo_padding_free`) holds several documents per
row. flash-attention's variable-length kernels attend within each document and compute nothing else. SDPA has no such
kernel: under the block-diagonal mask it computes every (query, key) pair of the whole row and masks most of them, and
building the (T, T) mask is itself quadratic in the row's length. Here the documents' queries, keys and
values are cut out of the rows, and the documents of each length run through SDPA as one batch (causal, and limited
to the layer's sliding window where it has one). Attention then costs the sum of the squares of the documents'
lengths, in as many SDPA calls as there are distinct lengths, and no (T, T) mask is built.

It works through transformers' attention interface: `install` wraps the "sdpa" entry, and the wrapper takes this
path only when a forward passes `rlft_documents` (the boundaries from `rlft.data.collate.document_bounds`); every
other forward, in rlft or not, gets transformers' SDPA unchanged. A model whose layers do not pass the forward's
keywords on to attention would silently attend across documents, so only model types checked to pass them
(`DOCUMENT_MODELS`, tests/unit/test_varlen.py) run this way; the others get the block mask.
"""

from __future__ import annotations

import torch

DOCUMENTS = "rlft_documents"  # the forward keyword that carries the boundaries down to the attention function
KEYWORDS_DROPPED = ("stablelm",)  # its decoder layers call attention without the forward's keywords


def runs_documents(model) -> bool:
    """Whether `model`'s forward can attend per document here: SDPA, a model type checked to pass the forward's
    keywords to its attention, not a compiled forward (which would recompile for every new set of lengths), and
    transformers' own SDPA in place (`install`)."""
    from rlft.models.masks import attention_implementation
    from rlft.models.shared_prompts import SHARED_PROMPT_MODELS

    kind = getattr(getattr(getattr(model, "module", model), "config", None), "model_type", None)
    return (attention_implementation(model) == "sdpa" and kind in SHARED_PROMPT_MODELS and kind not in KEYWORDS_DROPPED
            and not hasattr(model, "_orig_mod") and install())


def layer_window(module) -> int | None:
    """The sliding window of the attention layer `module` (None: full attention)."""
    from rlft.models.masks import sliding_window

    window, everywhere = sliding_window(module)
    if window is None or everywhere:
        return window
    return window if module.config.layer_types[module.layer_idx] == "sliding_attention" else None


def documents_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs):
    """transformers' SDPA attention, run per document when the forward passed `rlft_documents`: the boundaries
    (D + 1,) of D documents that tile the B x T positions of the batch taken row after row (no document crosses a
    row). Documents of one length run as one SDPA batch; the 2-D mask the forward was given is not read. query
    (B, H, T, d) -> (B, T, H, d), as transformers' attention functions return it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop(DOCUMENTS, None)
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if query.shape[2] != key.shape[2]:
        raise ValueError("packed or flattened rows attend per row only without a KV cache (use_cache=False)")
    window = layer_window(module)
    rows, heads, width, size = query.shape
    tokens = lambda x: x.transpose(1, 2).reshape(rows * width, x.shape[1], x.shape[3])  # noqa: E731  (B·T, h, d)
    queries, keys, values = tokens(query), tokens(key), tokens(value)
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
    outputs, order = [], []
    for length in lengths.unique().tolist():
        first = starts[lengths == length]
        index = first[:, None] + torch.arange(length, device=first.device)  # (n, L) positions of n documents
        mask = None
        if window is not None and length > window:  # causal, each query's keys fewer than `window` positions back
            mask = torch.ones(1, 1, length, length, dtype=torch.bool, device=query.device).tril().triu(1 - window)
        pick = lambda x: x[index].transpose(1, 2)  # noqa: E731  (n, h, L, d)
        out, _ = sdpa_attention_forward(module, pick(queries), pick(keys), pick(values), mask, dropout=dropout,
                                        scaling=scaling, is_causal=mask is None, **kwargs)
        outputs.append(out.reshape(-1, heads, size))
        order.append(index.reshape(-1))
    order = torch.cat(order)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return torch.cat(outputs)[inverse].view(rows, width, heads, size), None


def install() -> bool:
    """Route transformers' "sdpa" attention through `documents_attention` (once per process). False, and nothing
    changed, where another library has already replaced that entry: the batch then runs under its block mask."""
    from transformers import AttentionInterface

    current = AttentionInterface._global_mapping.get("sdpa")
    if current is documents_attention:
        return True
    if (getattr(current, "__module__", None), getattr(current, "__name__", None)) != (
            "transformers.integrations.sdpa_attention", "sdpa_attention_forward"):
        return False
    AttentionInterface.register("sdpa", documents_attention)
    return True
