"""What the policy's forward over a strided rollout gives EBFT's loss: the generated tokens' log-probs and the
document's next-token NLL.

A strided row holds T = L + K·G columns (the document, then every block's generated tokens), and the step runs B·n
such rows, so the model's float logits (B·n, T, V) and their float32 log-softmax were the largest tensors of a strided
step (at a 128k vocabulary, 16 rows of 1,024 columns are 8 GiB each). Where the model's logits are exactly its output
layer applied to the last hidden state (`rlft.models.head`), `strided_scores` keeps the hidden state instead and
applies the output layer to the read positions only, a chunk of positions at a time in the forward and the backward
(`rlft.losses.linear_ce`); elsewhere (small vocabularies, soft-capped logits, sharded output layers) it reads the
model's logits as before. Both give the same values and gradients (tests/unit/test_strided_scores.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from rlft.losses.linear_ce import chunk_rows, linear_token_logps, linear_token_nll
from rlft.models.head import forward_hidden, output_layer
from rlft.rollout.strided import (StridedLayout, document_mask, document_nll, gather_generated_logps,
                                  generated_targets, nucleus_logps)


NUCLEUS_TENSORS = 8  # vocabulary-wide tensors per position in the nucleus (scores, sort, softmax, cumsum, masks...)


class StridedScores:
    """One forward's (B, T, V) logits, or its (B, T, H) last hidden state and the output layer to apply to it."""

    def __init__(self, logits: Tensor | None = None, hidden: Tensor | None = None, head: torch.nn.Linear | None = None):
        self.logits, self.hidden, self.head = logits, hidden, head

    def generated_logps(self, sequences: Tensor, layout: StridedLayout, temperature: float, *,
                        top_p: float = 1.0) -> Tensor:
        """(B, K, G) differentiable log-probs of the generated tokens, as `strided.gather_generated_logps` reads them."""
        if self.logits is not None:
            return gather_generated_logps(self.logits, sequences, layout, temperature, top_p=top_p)
        rows, num_blocks, gen_len = self.hidden.size(0), layout.num_blocks, layout.generate_max_len
        if num_blocks == 0:
            return self.hidden.new_zeros((rows, 0, gen_len), dtype=torch.float32)
        read = self.hidden[:, layout.read_positions().to(self.hidden.device).reshape(-1)].flatten(0, 1)  # (B·K·G, H)
        targets = generated_targets(sequences, layout).reshape(-1)
        weight, bias = self.head.weight, self.head.bias
        if top_p >= 1.0:
            logps, _ = linear_token_logps(read, weight, bias, targets, temperature, with_entropy=False)
        else:  # the nucleus is a sort per position: each chunk's logits are rebuilt in the backward, not kept
            chunk = max(1, chunk_rows(weight.size(0)) // NUCLEUS_TENSORS)
            logps = torch.cat([checkpoint(_chunk_nucleus_logps, read[start:start + chunk], weight, bias,
                                          targets[start:start + chunk], temperature, top_p, use_reentrant=False,
                                          preserve_rng_state=False)  # nothing random in it
                               for start in range(0, read.size(0), chunk)])
        return logps.view(rows, num_blocks, gen_len)

    def document_nll(self, doc_ids: Tensor, doc_attention: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, L−1) next-token NLL of the document and its mask, as `strided.document_nll` gives them, restricted to
        the targets where `keep` (B, L−1) is True; entries outside the mask are 0."""
        mask = document_mask(doc_attention)
        if keep is not None:
            mask = mask & keep
        if self.logits is not None:
            return document_nll(self.logits, doc_ids, doc_attention)[0] * mask, mask
        values = linear_token_nll(self.hidden[:, : doc_ids.size(1) - 1][mask], self.head.weight, self.head.bias,
                                  doc_ids[:, 1:][mask])
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_scatter(mask, values), mask


def _chunk_nucleus_logps(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                         top_p: float) -> Tensor:
    """`nucleus_logps` of a chunk of positions from their hidden states. The temperature fallback is always computed
    (no branch on the values), so the backward's recomputation takes the same path whatever the device's rounding."""
    logits = F.linear(hidden, weight, bias)
    return nucleus_logps(logits, targets, temperature, top_p, fallback="always")


def strided_scores(model, inputs: dict[str, Any]) -> StridedScores:
    """One forward of `model` over strided rows (`inputs`: input_ids, the model's attention mask, position_ids), through
    the output layer where that is exact and worth it, else with the model's logits."""
    head = output_layer(model)
    if head is not None:
        hidden, _ = forward_hidden(model, inputs, head)
        if hidden is not None:
            return StridedScores(hidden=hidden, head=head)
    return StridedScores(logits=model(**inputs, use_cache=False).logits)
