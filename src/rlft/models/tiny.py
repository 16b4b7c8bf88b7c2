"""Tiny Llama-style model folders (config + byte tokenizer, no weights) for tests and the quickstart.

Sizes: XS trains a B8xT128 step in ~25 ms on 2 cores, S in ~50 ms.
Train them from random weights with `random_init: true`.
"""

from __future__ import annotations

from pathlib import Path

from transformers import LlamaConfig

from rlft.data.tokenizer import byte_tokenizer

SIZES = {
    "XS": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256),
    "S": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512),
    "M": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024),
    # for GPU benchmarks (bench/): about 100M parameters before the output layer
    "L": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8, intermediate_size=2816),
}


def write_tiny_model(folder: str | Path, size: str = "XS", max_positions: int = 1024) -> Path:
    """Write config.json and the byte tokenizer to `folder` and return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **SIZES[size],
    )
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
