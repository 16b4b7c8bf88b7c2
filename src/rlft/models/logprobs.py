"""The one home of per-token log-probs and entropy of completions under a model.

Rows are [prompt left-padded | completion right-padded] (`completion_batch`); only the last
C + 1 positions' logits are computed (`logits_to_keep`), where C is the completion width.
"""

from __future__ import annotations

from typing import Any

import torch


def completion_batch(rows: list[dict[str, Any]], pad_id: int, values: tuple[str, ...] = ()) -> dict[str, Any]:
    """Model inputs for rows of {prompt_ids, completion_ids, mask, advantage}, and the per-token lists named in
    `values` (e.g. old_logps) as (B, C) tensors when every row has them."""
    prompt_width = max(len(r["prompt_ids"]) for r in rows)
    completion_width = max(1, max(len(r["completion_ids"]) for r in rows))
    count = len(rows)
    input_ids = torch.full((count, prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((count, completion_width), dtype=torch.float32)
    for row, r in enumerate(rows):
        p, c = r["prompt_ids"], r["completion_ids"]
        input_ids[row, prompt_width - len(p) : prompt_width] = torch.tensor(p)
        attention[row, prompt_width - len(p) : prompt_width + len(c)] = 1
        if c:
            input_ids[row, prompt_width : prompt_width + len(c)] = torch.tensor(c)
            completion_mask[row, : len(c)] = torch.tensor(r["mask"], dtype=torch.float32)
    batch = {
        "input_ids": input_ids, "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
        "completion_mask": completion_mask, "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
        "completion_width": completion_width, "num_tokens": int(attention.sum()),
    }
    for key in values:
        if all(r.get(key) is not None for r in rows):
            tensor = torch.zeros((count, completion_width), dtype=torch.float32)
            for row, r in enumerate(rows):
                tensor[row, : len(r[key])] = torch.tensor(r[key], dtype=torch.float32)
            batch[key] = tensor
    return batch


def completion_logps(model, batch: dict[str, Any], temperature: float, with_entropy: bool, grad_entropy: bool = False):
    """Per-token log-probs (B, C) of the completion tokens at `temperature`, and their entropy (or None)."""
    width = int(batch["completion_width"])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
                   logits_to_keep=width + 1, use_cache=False).logits[:, :-1]
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = batch["input_ids"][:, -width:]
    logps = log_probs.gather(-1, targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        context = torch.enable_grad() if grad_entropy else torch.no_grad()
        with context:
            entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropy
