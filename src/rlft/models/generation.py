"""Sampling text from a model with `transformers.generate` (left padding, batched)."""

from __future__ import annotations

import torch

from rlft.models.head import without_router_logits
from rlft.data.tokenizer import end_ids


def generate_texts(model, tokenizer, prompts: list[str] | list[list[int]], max_new_tokens: int = 64, temperature: float = 0.0,
                   top_p: float = 1.0, num_samples: int = 1, batch_size: int = 64, seed: int | None = None,
                   add_special_tokens: bool = True) -> list[str]:
    """Completions (prompt excluded, special tokens removed), `num_samples` per prompt, prompt-major.

    temperature 0 means greedy decoding. Pass add_special_tokens=False for prompts rendered with the
    chat template: the template holds any BOS, so the ids are exactly those training saw. Prompts given as ids are
    used as they are.
    """
    if seed is not None:
        torch.manual_seed(seed)
    device = next(model.parameters()).device
    outputs: list[str] = []
    ends = end_ids(model, tokenizer)  # the tokenizer's EOS and the generation config's, as the rollout engine stops
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        encoded_chunks = [(tokenizer.pad({"input_ids": chunk}, return_tensors="pt", padding=True) if chunk and not isinstance(chunk[0], str)
                           else tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)).to(device)
                          for chunk in (prompts[start : start + batch_size] for start in range(0, len(prompts), batch_size))]
    finally:
        tokenizer.padding_side = side  # the caller's tokenizer as it was
    for encoded in encoded_chunks:
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            # an MoE checkpoint saved with output_router_logits (its training's setting) would compute the router's
            # loss at every token, from a mask its one-token steps do not fit
            generated = model.generate(**encoded, max_new_tokens=max_new_tokens, num_return_sequences=num_samples,
                                       pad_token_id=tokenizer.pad_token_id, eos_token_id=list(ends), **sampling,
                                       **without_router_logits(model))
        for row in generated[:, encoded["input_ids"].shape[1]:].tolist():  # up to its end: a finished row is padded
            cut = next((index for index, token in enumerate(row) if token in ends), len(row))  # (Mistral's v7 pads with <unk>)
            outputs.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return outputs
