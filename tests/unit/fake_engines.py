"""A rollout engine for tests of the async pipeline: the real recipe, producer, feed and weight sync run around it."""

from __future__ import annotations

import threading
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.rollout.types import Rollout


class VersionedEngine:
    """Completion [p0, 20 + version, 10 + j] of prompt [p0, ...]; `calls` records each call's first prompt tokens and the
    weight version it sampled with. `delay`: seconds per call, so sampling overlaps training."""

    def __init__(self, delay: float = 0.0):
        self.version, self.calls, self.delay = 0, [], delay
        self.lock = threading.Lock()

    def generate(self, prompt_ids, params, num_samples=1, seed=None):
        with self.lock:
            time.sleep(self.delay)
            self.calls.append(([p[0] for p in prompt_ids], self.version))
            expanded = [p for p in prompt_ids for _ in range(num_samples)]
            completions = [[p[0], 20 + self.version, 10 + j % num_samples] for j, p in enumerate(expanded)]
            return Rollout(expanded, completions, [[-0.5] * 3 for _ in expanded], [False] * len(expanded),
                           weight_versions=[self.version] * len(expanded))

    def load_weights(self, weights, version):
        with self.lock:
            self.version = version

    def health(self):
        return {"ok": True, "version": self.version}


def tiny_llama_model() -> LlamaForCausalLM:
    """A seeded one-layer Llama of hidden size 16 over 64 tokens."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64,
                                        pad_token_id=0, eos_token_id=1))
