"""Reward models: a sequence-classification model with one output (the score of the last real token)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from rlft.config.settings.model import ModelSettings
from rlft.errors import ModelError
from rlft.models.checkpointing import enable_checkpointing
from rlft.models.head import score_head
from rlft.models.liger import apply_liger, check_liger
from rlft.models.loading import (adapter_base, attach_adapter, base_model_source, check_attention, check_router_loss,
                                 fit_embeddings, hub_revision, model_config, resolve_source)
from rlft.models.logprobs import model_inputs
from rlft.models.masks import with_model_mask


def load_reward_model(settings: ModelSettings, tokenizer, device_type: str, init_base_dir: Path | None = None):
    """`AutoModelForSequenceClassification` with num_labels=1 on base_model (or random init), adapter optional."""
    attention = settings.attention
    check_attention(attention, training=True, device_type=device_type)
    check_liger(settings, device_type)
    source = base_model_source(settings)
    kwargs = {"num_labels": 1, "attn_implementation": attention, "trust_remote_code": settings.trust_remote_code, "dtype": torch.float32}
    if init_base_dir is not None and (init_base_dir / "config.json").exists():
        model = AutoModelForSequenceClassification.from_pretrained(init_base_dir, **kwargs)
    elif settings.random_init:
        config = model_config(settings, source, num_labels=1)
        with torch.random.fork_rng():
            torch.manual_seed(settings.seed)
            model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attention, dtype=torch.float32)
        if init_base_dir is not None and settings.adapter.kind:
            model.save_pretrained(init_base_dir)
    else:
        if settings.config_overrides:
            kwargs["config"] = model_config(settings, source, num_labels=1)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(source, **kwargs, **hub_revision(settings, source))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot load a reward model (sequence classification, 1 label) from {source}: {exc}") from None
    model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last non-pad token
    fit_embeddings(model, settings, tokenizer)
    check_router_loss(settings, model, device_type)
    apply_liger(model, settings)
    if settings.checkpointing:
        enable_checkpointing(model, settings, device_type)
    if settings.adapter.kind:
        model = attach_adapter(model, settings, task_type="SEQ_CLS")
    return model


def pair_scores(model, batch: dict, pad_id: int) -> torch.Tensor:
    """(2B,) float scores of `pair_batch`'s rows (chosen, then rejected), each at its last token that is not padding,
    as transformers' sequence classification pools them. With each prompt shared (`shared_pair_inputs`) one sequence
    holds both answers, so the model's own pooling would see only the rejected one: the scores of every position are
    read from the score head as the forward computes them, and each row's is taken at the same token."""
    if "flat_input_ids" not in batch:
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits[:, 0].float()
    seen: list[torch.Tensor] = []
    handle = score_head(model).register_forward_hook(lambda _module, _inputs, output: seen.append(output))
    try:
        model(**with_model_mask(model, model_inputs(batch)), use_cache=False)
    finally:
        handle.remove()
    ids = batch["input_ids"]
    last = (torch.arange(ids.size(1), device=ids.device) * (ids != pad_id)).argmax(-1)
    return seen[-1][..., 0].flatten()[batch["flat_index"].gather(1, last[:, None])[:, 0]].float()


def load_reward_for_scoring(path: str, device: str = "cpu"):
    """A trained reward model folder (full or LoRA) and its tokenizer, ready to score."""
    folder = Path(path).expanduser()
    if (folder / "model").is_dir():  # an rlft checkpoint: weights live in checkpoint/model
        folder = folder / "model"
    source = resolve_source(str(folder) if folder.exists() else path, "reward model")
    adapter_file = Path(source) / "adapter_config.json"
    if adapter_file.exists():
        base_source, revision = adapter_base(Path(source))
        base = AutoModelForSequenceClassification.from_pretrained(base_source, num_labels=1, **revision)
        from peft import PeftModel  # adapters only

        model = PeftModel.from_pretrained(base, source)
    else:
        architectures = AutoConfig.from_pretrained(source).architectures or []
        if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
            raise ModelError(f"{source} is a {architectures[0]}, not a reward model: train one with `reward_model: true` "
                             "(a sequence-classification model with one output)")
        model = AutoModelForSequenceClassification.from_pretrained(source)
    if model.config.num_labels != 1:
        raise ModelError(f"{source} has {model.config.num_labels} outputs; a reward model has one")
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def score_texts(model, tokenizer, texts: list[str], batch_size: int = 32) -> list[float]:
    """One scalar score per text (higher = preferred).

    Training scored every answer at its EOS token (completions end with EOS), so EOS is appended
    here too when a text does not already end with it.
    """
    tokenizer.padding_side = "right"
    device = next(model.parameters()).device
    eos = tokenizer.eos_token or ""
    texts = [text if not eos or text.endswith(eos) else text + eos for text in texts]
    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            scores.extend(model(**encoded).logits[:, 0].float().tolist())
    return scores
