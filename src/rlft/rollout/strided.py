"""Strided block-parallel generation for EBFT strided mode (https://arxiv.org/abs/2603.12248).

A document x of L tokens gets anchors a_k = A0 + k·s (k < K). Block k conditions on the whole
prefix x[0:a_k] (nested prefixes, not windows) and generates G tokens that stand in for the
ground truth x[a_k : a_k+G]. All K blocks are generated at once inside one sequence of length
T = L + K·G:

* layout is **step-major**: generated token (step t, block k) sits at column L + t·K + k;
* its position id is a_k + t, the position of the ground-truth token it replaces; document
  tokens keep 0..L−1;
* attention (query q may see key j iff one of):
  (a) q, j are document tokens and j ≤ q;
  (b) q is a token of block k and j is a document token with j < min(a_k, L − G);
  (c) j = q;
  (d) j is a token of the same block at an earlier step.
  Blocks never see each other. Padding keys are never attended (see `strided_attention`).

Generation reads the logits of token (t, k) at column a_k − 1 when t = 0 and at
L + (t−1)·K + k when t ≥ 1 (the previous token of the same block). The loss must read its
log-probs at exactly those columns, at the sampling temperature (`gather_generated_logps`):
the plain next-token shift over the interleaved layout scores token (t, k) from the hidden state
of an unrelated token (as Axolotl's strided trainer does). Each block's value (its advantage)
weights that block's own tokens, never those of a neighbouring block.

Documents are RIGHT-padded in this mode: anchors are shared columns, so every row's document
must start at column 0. Anchors in a row's padding are flagged invalid (`block_valid`).

The mask reaches the model in the form its attention implementation reads (`model_attention`):
a boolean (B, 1, T, T) tensor for SDPA, an additive float one for eager, and a flex_attention
BlockMask built from the same rule (`flex_block_mask`) for flex_attention. Training with
flex_attention needs a GPU (PyTorch has no flex_attention backward on a CPU):
on a CPU `rlft train` runs SDPA with the identical dense mask.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from rlft.models.logprobs import draw_tokens, process_logits
from rlft.models.attention import attention_implementation
from rlft.models.masks import model_attention_mask, per_layer_type, within_window
from rlft.rollout.types import SamplingParams


@dataclass(frozen=True)
class StridedLayout:
    """Where the K blocks of a batch of right-padded documents sit.

    anchors: (K,) long, a_k = first_anchor + k·stride, shared by every row of the batch.
    block_valid: (B, K) bool, a_k + G ≤ that row's valid length (False = the block's target runs
        into padding: it is still generated, so the layout stays rectangular, but the caller
        must mask it out of rewards and losses).
    """

    anchors: Tensor
    block_valid: Tensor
    seq_len: int  # L: width of the (padded) document part
    generate_max_len: int  # G
    stride: int
    first_anchor: int  # A0

    @property
    def num_blocks(self) -> int:  # K
        return int(self.anchors.numel())

    @property
    def total_len(self) -> int:  # T = L + K·G
        return self.seq_len + self.num_blocks * self.generate_max_len

    def token_columns(self) -> Tensor:
        """(K, G) long: column of generated token (t, k) in the sequence, L + t·K + k, indexed [k, t]."""
        steps = torch.arange(self.generate_max_len, device=self.anchors.device)
        blocks = torch.arange(self.num_blocks, device=self.anchors.device)
        return self.seq_len + steps[None, :] * self.num_blocks + blocks[:, None]

    def token_positions(self) -> Tensor:
        """(K, G) long: position id of generated token (t, k) = a_k + t, indexed [k, t]."""
        steps = torch.arange(self.generate_max_len, device=self.anchors.device)
        return self.anchors[:, None] + steps[None, :]

    def read_positions(self) -> Tensor:
        """(K, G) long: column whose logits predict token (t, k), indexed [k, t].

        a_k − 1 for t = 0 (the last document token the block sees); L + (t−1)·K + k for t ≥ 1
        (the block's own previous token). Sampling and the loss both read here.
        """
        columns = self.token_columns()
        return torch.cat([self.anchors[:, None] - 1, columns[:, :-1]], dim=1)

    def repeat(self, num_samples: int) -> StridedLayout:
        """The same layout with `block_valid` rows repeated n times (samples of one document consecutive)."""
        return StridedLayout(self.anchors, self.block_valid.repeat_interleave(num_samples, 0), self.seq_len,
                             self.generate_max_len, self.stride, self.first_anchor)


def strided_layout(valid_lengths: Tensor, seq_len: int, *, stride: int, context_length: int, generate_max_len: int,
                   first_anchor: Tensor | None = None) -> StridedLayout:
    """Anchors of a batch: a_k = A0 + k·s, K = ⌊(L_max − G − A0)/s⌋ + 1, with L_max the longest valid length.

    A0 = `context_length`; with `first_anchor` (B,) (per row: prompt_length + min_completion_prefix,
    structured data) A0 = max(context_length, max_b first_anchor[b]). The batch maximum keeps the
    anchors shared by all rows (axolotl does the same with max_prompt_len_in_batch), so no block
    of any row starts inside its prompt. K ≤ 0 gives a layout with K = 0 (the caller skips the
    batch: the loss is zero). `block_valid[b, k]` = a_k + G ≤ valid_lengths[b]: no anchors whose
    target reaches into padding.
    """
    if stride < 1 or generate_max_len < 1:
        raise ValueError(f"strided layout needs stride ≥ 1 and generate_max_len ≥ 1, got {stride}, {generate_max_len}")
    start = int(context_length)
    if first_anchor is not None and first_anchor.numel():
        start = max(start, int(first_anchor.max()))
    if start < 1:
        raise ValueError(f"the first anchor must be ≥ 1 (a block needs at least one context token), got {start}")
    valid_lengths = valid_lengths.long()
    longest = min(int(valid_lengths.max()), seq_len) if valid_lengths.numel() else 0
    num_blocks = max(0, (longest - generate_max_len - start) // stride + 1)
    anchors = start + stride * torch.arange(num_blocks, dtype=torch.long, device=valid_lengths.device)
    block_valid = anchors[None, :] + generate_max_len <= valid_lengths[:, None]
    return StridedLayout(anchors, block_valid, seq_len, generate_max_len, stride, start)


def _check_right_padded(doc_attention: Tensor) -> None:
    attention = doc_attention.long()
    if bool((attention[:, 1:] > attention[:, :-1]).any()):
        raise ValueError("strided mode needs right-padded documents (attention 1…1 0…0): anchors are shared columns")


def strided_mask_mod(layout: StridedLayout, doc_attention: Tensor, num_samples: int = 1, window: int | None = None):
    """The attention rule as a flex-style `mask_mod(b, h, q, j) -> bool`, vectorised with tensor ops; with a sliding
    `window`, limited to keys fewer than `window` positions (position ids) before the query.

    Row b of the (B·n)-row batch belongs to document b // n. Works on broadcast index tensors
    (the dense path) and under flex_attention's vmap (the block-mask path), so both paths share
    one definition of the rule.

    (b) uses j < min(a_k, L − G), as axolotl and REF do. Since a_{K−1} = A0 + (K−1)s ≤ L_max − G
    ≤ L − G by the definition of K, the clamp never binds for a block that exists: it is a guard
    (in axolotl, anchors come from a formula on the query index) and the rule is just j < a_k.
    """
    seq_len, gen_len, num_blocks = layout.seq_len, layout.generate_max_len, layout.num_blocks
    divisor = max(num_blocks, 1)  # K = 0: no generated columns exist, avoid a modulo by zero
    bound = torch.clamp(layout.anchors, max=seq_len - gen_len) if num_blocks else torch.zeros(1, dtype=torch.long,
                                                                                                device=doc_attention.device)
    bound = bound.to(doc_attention.device)
    doc_keys = doc_attention.bool()
    position = strided_positions(layout, doc_attention.device)

    def mask_mod(b, h, q, j):
        doc_q, doc_j = q < seq_len, j < seq_len
        gen_q, gen_j = (q - seq_len).clamp_min(0), (j - seq_len).clamp_min(0)
        block_q, block_j = gen_q % divisor, gen_j % divisor
        step_q, step_j = gen_q // divisor, gen_j // divisor
        key_ok = doc_keys[b // num_samples, j.clamp(max=seq_len - 1)] | ~doc_j
        rule_a = doc_q & doc_j & (j <= q)
        rule_b = ~doc_q & doc_j & (j < bound[block_q])
        rule_d = ~doc_q & ~doc_j & (block_q == block_j) & (step_j < step_q)
        allowed = (rule_a | rule_b | rule_d) & key_ok
        if window is not None:
            allowed = allowed & (position[q] - position[j] < window)
        return allowed | (q == j)  # (c)

    return mask_mod


def strided_attention(layout: StridedLayout, doc_attention: Tensor) -> tuple[Tensor, Tensor]:
    """Dense boolean mask (B, 1, T, T) (True = attend) and position ids (B, T) of the strided sequence.

    Rules (a)–(d) of the module docstring. Padding keys are never attended by any other query; a
    pad query attends itself (rule (c)) so every softmax row is non-empty — an all-masked row
    gives NaN, and 0·NaN in attention·V would leak into rows that never attend the pad.
    """
    _check_right_padded(doc_attention)
    batch, seq_len = doc_attention.shape
    if seq_len != layout.seq_len:
        raise ValueError(f"doc_attention has {seq_len} columns, the layout {layout.seq_len}")
    device = doc_attention.device
    total = layout.total_len
    index = torch.arange(total, device=device)
    rows = torch.arange(batch, device=device)[:, None, None]
    mask = strided_mask_mod(layout, doc_attention)(rows, None, index[None, :, None], index[None, None, :])
    return mask[:, None], strided_positions(layout, device)[None, :].expand(batch, total).clone()


def strided_positions(layout: StridedLayout, device) -> Tensor:
    """(T,) position ids of the strided sequence: the document's, then each generated token's (step-major)."""
    positions = torch.arange(layout.seq_len, device=device)
    if layout.num_blocks:
        generated = layout.token_positions().to(device).transpose(0, 1).reshape(-1)  # step-major: [t, k]
        positions = torch.cat([positions, generated])
    return positions


def deinterleave(values: Tensor, num_blocks: int) -> Tensor:
    """Step-major (B, K·G, ...) → (B, K, G, ...): entry [b, k, t] = values[b, t·K + k].

    The generated region sequences[:, L:] is step-major (all blocks' step 0, then step 1, ...).
    With K = 0 the result is (B, 0, 0, ...) (G cannot be read from an empty tensor).
    """
    if num_blocks == 0:
        return values.new_zeros((values.size(0), 0, 0, *values.shape[2:]))
    return values.unflatten(1, (-1, num_blocks)).transpose(1, 2)


def generated_targets(sequences: Tensor, layout: StridedLayout) -> Tensor:
    """(B, K, G) generated token ids, [b, k, t] = sequences[b, L + t·K + k]."""
    if layout.num_blocks == 0:
        return sequences.new_zeros((sequences.size(0), 0, layout.generate_max_len))
    return deinterleave(sequences[:, layout.seq_len: layout.total_len], layout.num_blocks)


def gather_generated_logps(logits: Tensor, sequences: Tensor, layout: StridedLayout, temperature: float, *,
                           top_p: float = 1.0) -> Tensor:
    """(B, K, G) log-probs of the generated tokens, differentiable, from full-sequence logits (B, T, V).

    log_softmax(logits / temperature) read at `layout.read_positions()`, the columns sampling
    read, at the sampling temperature (the reference code divides generated-token logits by T).
    temperature ≤ 0 (greedy) reads at T = 1, as sampling records it. With `top_p` < 1 the
    distribution is the renormalised nucleus, exactly what `generate_blocks` records; a sampled token
    that this forward's nucleus leaves out (its logits differ from sampling's in the last bits: another
    width, train mode, bf16) gets its temperature log-prob rather than minus infinity, which would
    make the loss infinite (as GRPO's `rlft.models.logprobs.sampled_logps` does).
    """
    batch, num_blocks, gen_len = logits.size(0), layout.num_blocks, layout.generate_max_len
    if num_blocks == 0:
        return logits.new_zeros((batch, 0, gen_len), dtype=torch.float32)
    picked = logits[:, layout.read_positions().to(logits.device).reshape(-1)]  # (B, K·G, V) in [k, t] order
    targets = generated_targets(sequences, layout).reshape(batch, -1)
    return nucleus_logps(picked, targets, temperature, top_p).view(batch, num_blocks, gen_len)


def nucleus_logps(logits: Tensor, targets: Tensor, temperature: float, top_p: float,
                  fallback: str = "when_needed") -> Tensor:
    """log_softmax of `process_logits` (temperature, then the top-p nucleus) read at `targets` (logits' shape without
    the vocabulary axis); a target outside the nucleus gets its temperature log-prob. `fallback="always"` computes
    those every time instead of only when a target fell out (no branch on the values)."""
    read = lambda p: torch.log_softmax(process_logits(logits, None, SamplingParams(  # noqa: E731
        max_new_tokens=1, temperature=temperature, top_p=p)), -1).gather(-1, targets[..., None]).squeeze(-1)
    logps = read(top_p)
    if top_p >= 1.0:
        return logps
    dropped = torch.isinf(logps)
    return torch.where(dropped, read(1.0), logps) if fallback == "always" or bool(dropped.any()) else logps


def document_nll(logits: Tensor, doc_ids: Tensor, doc_attention: Tensor) -> tuple[Tensor, Tensor]:
    """Next-token NLL of the document (B, L−1) at temperature 1, and its mask (pads excluded).

    `logits` may cover the whole strided sequence (B, T, V); only columns 0..L−2 are read
    (document tokens attend only the document, so these equal a plain causal forward).
    Masked entries are 0. For structured data AND the mask with labels ≠ −100.
    """
    seq_len = doc_ids.size(1)
    logps = torch.log_softmax(logits[:, : seq_len - 1].float(), -1).gather(-1, doc_ids[:, 1:, None]).squeeze(-1)
    mask = document_mask(doc_attention)
    return torch.where(mask, -logps, torch.zeros_like(logps)), mask


def document_mask(doc_attention: Tensor) -> Tensor:
    """(B, L−1) bool: the next-token targets `document_nll` counts (the target and the position before it not pads)."""
    return doc_attention[:, 1:].bool() & doc_attention[:, :-1].bool()


def model_attention(model, layout: StridedLayout, doc_attention: Tensor, mask: Tensor, num_samples: int,
                    length: int | None = None):
    """The strided mask of B·n rows as the model reads it: for flex_attention a BlockMask from `strided_mask_mod`
    (`doc_attention`: the B documents' (B, L) mask; the first `length` columns), so tiles of the T×T grid that no
    query may see are skipped; otherwise the dense `mask` (B·n, 1, T, T) in the implementation's form
    (`model_attention_mask`). Each limited to the sliding window of the layers that have one (`per_layer_type`)."""
    if attention_implementation(model) == "flex_attention":
        return per_layer_type(model, lambda window: flex_block_mask(layout, doc_attention, num_samples, length, window))
    positions = strided_positions(layout, mask.device)[None]
    return per_layer_type(model, lambda window: model_attention_mask(model, within_window(mask, positions, window)))


def _columns(attention, width: int):
    """The first `width` queries and keys of a dense mask, or of each layer type's."""
    if isinstance(attention, dict):
        return {kind: mask[:, :, :width, :width] for kind, mask in attention.items()}
    return attention[:, :, :width, :width]


@dataclass
class StridedRollout:
    """B·n rows (samples of one document consecutive), T = L + K·G columns."""

    sequences: Tensor  # (B·n, T) document then generated tokens, step-major
    position_ids: Tensor  # (B·n, T)
    mask: Tensor  # (B·n, 1, T, T) bool, True = attend
    attention: object  # the same mask as the model's attention implementation reads it (`model_attention`)
    generated: Tensor  # (B·n, K, G) token ids, [b, k, t]
    sampled_logps: Tensor  # (B·n, K, G) log-prob under the distribution sampled from
    block_valid: Tensor  # (B·n, K) bool; invalid blocks were sampled but must be masked by the caller
    doc_attention: Tensor  # (B·n, L)
    layout: StridedLayout  # the batch's layout (block_valid per document, B rows)


def _accepts_logits_to_keep(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@torch.no_grad()
def generate_blocks(model, doc_ids: Tensor, doc_attention: Tensor, layout: StridedLayout, *, num_samples: int,
                    temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None) -> StridedRollout:
    """Sample G tokens for every block of every document, n times, all in parallel.

    No KV cache: G full forwards over the growing sequence (step t sees columns < L + t·K and
    appends K tokens), each with the leading sub-block of the strided mask. Logits for block k
    are read at a_k − 1 (t = 0) or L + (t−1)·K + k (t ≥ 1), then temperature and top-p
    (`process_logits`, the same as the local engine) and a multinomial draw (argmax when
    temperature ≤ 0). `sampled_logps` are log-probs under that exact distribution. The model is
    put in eval mode for the call and restored.
    """
    _check_right_padded(doc_attention)
    device = doc_ids.device
    mask, positions = strided_attention(layout, doc_attention)
    mask = mask.repeat_interleave(num_samples, 0)
    positions = positions.repeat_interleave(num_samples, 0)
    rows, seq_len, num_blocks, gen_len = doc_ids.size(0) * num_samples, layout.seq_len, layout.num_blocks, layout.generate_max_len
    sequences = torch.cat([doc_ids.repeat_interleave(num_samples, 0),
                           doc_ids.new_zeros((rows, num_blocks * gen_len))], dim=1)
    sampled_logps = torch.zeros((rows, num_blocks * gen_len), dtype=torch.float32, device=device)
    params = SamplingParams(max_new_tokens=gen_len, temperature=temperature, top_p=top_p)
    flex = attention_implementation(model) == "flex_attention"
    dense = None if flex else model_attention(model, layout, doc_attention, mask, num_samples)  # cut to each step's width
    read = layout.read_positions().to(device)  # (K, G)
    keep_logits = _accepts_logits_to_keep(model)
    was_training = model.training
    model.eval()
    try:
        for step in range(gen_len if num_blocks else 0):
            width = seq_len + step * num_blocks
            columns = read[:, step]
            extra = {"logits_to_keep": columns} if keep_logits else {}
            attention = model_attention(model, layout, doc_attention, mask, num_samples, width) if flex else _columns(dense, width)
            logits = model(input_ids=sequences[:, :width], attention_mask=attention,
                           position_ids=positions[:, :width], use_cache=False, **extra).logits
            if not keep_logits:
                logits = logits[:, columns]
            scores = process_logits(logits.reshape(rows * num_blocks, -1), None, params)
            distribution = torch.log_softmax(scores, -1)
            if temperature > 0:
                chosen = draw_tokens(distribution, generator)
            else:
                chosen = scores.argmax(-1)
            sampled_logps[:, width - seq_len: width - seq_len + num_blocks] = \
                distribution.gather(-1, chosen[:, None]).view(rows, num_blocks)
            sequences[:, width: width + num_blocks] = chosen.view(rows, num_blocks)
    finally:
        model.train(was_training)
    return StridedRollout(sequences=sequences, position_ids=positions, mask=mask,
                          attention=model_attention(model, layout, doc_attention, mask, num_samples) if flex else dense,
                          generated=generated_targets(sequences, layout),
                          sampled_logps=sampled_logps.view(rows, gen_len, num_blocks).transpose(1, 2),
                          block_valid=layout.block_valid.repeat_interleave(num_samples, 0).to(device),
                          doc_attention=doc_attention.repeat_interleave(num_samples, 0), layout=layout)


def flex_block_mask(layout: StridedLayout, doc_attention: Tensor, num_samples: int = 1, length: int | None = None,
                    window: int | None = None):
    """flex_attention BlockMask with the same rule as `strided_attention`, for B·n rows and the first `length` columns.

    `doc_attention`: the B documents' (B, L) mask. The rule is `strided_mask_mod`, shared with the dense path; the
    mask_mod is index arithmetic, so any prefix of the sequence (generation's growing widths) uses the same rule.
    Imported lazily. Any device, but only a GPU trains with it: PyTorch has no flex_attention backward on a CPU.
    """
    from torch.nn.attention.flex_attention import create_block_mask  # only for flex_attention models

    _check_right_padded(doc_attention)
    total = layout.total_len if length is None else length
    layout = StridedLayout(layout.anchors.to(doc_attention.device), layout.block_valid, layout.seq_len,
                           layout.generate_max_len, layout.stride, layout.first_anchor)
    return create_block_mask(strided_mask_mod(layout, doc_attention, num_samples, window), B=doc_attention.size(0) * num_samples,
                             H=None, Q_LEN=total, KV_LEN=total, device=doc_attention.device)
