"""The reference model a preference run names apart from its policy (`ref_model`)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlft.config.settings.model import ModelSettings
from rlft.errors import ModelError
from rlft.models.loading import hub_revision, model_config, model_source


def load_reference_model(settings: ModelSettings, tokenizer, policy):
    """The separate `ref_model` folder with as many embedding rows as the `policy`; refused unless each of its tokens has
    the policy's id (the run may have added tokens: `tokens:`, chat-template markers). Each row's logit counts in
    log-softmax's normaliser, so spare rows beyond the tokenizer (Qwen ships 151,936 for 151,665 tokens) are kept, and
    rows the policy grew for added tokens are copied from it: the same folder as policy and reference gives the same
    log-probs."""
    source = model_source(settings, settings.ref_model, "ref_model")
    ref_vocab, vocab = AutoTokenizer.from_pretrained(source, **hub_revision(settings, source)).get_vocab(), tokenizer.get_vocab()
    if any(vocab.get(token) != index for token, index in ref_vocab.items()):  # tokens the run added (tokens:) may follow
        raise ModelError(
            f"ref_model {source} has a different tokenizer vocabulary ({len(ref_vocab)} tokens) from the policy's "
            f"({len(tokenizer)}): log-prob ratios need the same tokens on both sides. Use a reference of the same family"
        )
    overrides = {"config": model_config(settings, source)} if settings.config_overrides else {}
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **overrides, **hub_revision(settings, source))
    own, rows = model.get_input_embeddings().num_embeddings, policy.get_input_embeddings().num_embeddings
    if own != rows:
        model.resize_token_embeddings(rows, mean_resizing=False)
        with torch.no_grad():
            for get in ("get_input_embeddings", "get_output_embeddings"):
                mine, theirs = getattr(model, get)(), getattr(policy, get)()
                if own < rows and mine is not None and theirs is not None:
                    mine.weight[own:] = theirs.weight[own:]
    return model.eval().requires_grad_(False)
