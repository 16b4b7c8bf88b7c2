"""A user's `trl.rollout_func`, in either of the two forms users write.

* TRL's: `rollout_func(prompts, trainer) -> dict` with `prompt_ids`, `completion_ids`, `logprobs` (and optional
  `env_mask` and extra columns), one entry per prompt, each prompt given G times in a row.
* The Axolotl guide's: `rollout_func(model, processing_class, prompts, generation_config=None) -> list[str]`, one
  completion text per prompt dict (`messages`, `prompt` and the dataset columns; each prompt G times in a row).
  The function generates with `model` (the engine's own copy of the weights, never the module being trained),
  using `generation_config` (the run's sampling settings as a transformers GenerationConfig). rlft tokenises the
  texts (cut at `max_completion_length`; an EOS closes a completion that was not cut) and computes their
  sampling log-probs with the same weights under the same sampling settings, so they train like any rollout.

The form is read from the function's signature when the run starts, before any model loads.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import torch

from rlft.errors import RolloutError
from rlft.models.logprobs import completion_batch, completion_logits, filters_active, logps_from_logits, sampled_logps
from rlft.rollout.types import Rollout, SamplingParams

FORMS = ("rollout_func(prompts, trainer) -> dict with prompt_ids, completion_ids and logprobs (TRL), or "
         "rollout_func(model, processing_class, prompts, generation_config=None) -> list of completion strings "
         "(the Axolotl guide)")


def rollout_form(fn: Callable, name: str) -> str:
    """"trainer" or "completions", from the signature; a RolloutError showing both forms for anything else."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, take TRL's form
        return "trainer"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(positional) in (3, 4) and len(required) >= 3:
        return "completions"
    if len(positional) >= 2 and len(required) <= 2 or any(p.kind == p.VAR_POSITIONAL for p in params):
        return "trainer"
    raise RolloutError(f"trl.rollout_func {name}{inspect.signature(fn)} takes neither accepted form: write {FORMS}")


def call_user(fn: Callable, name: str, *args) -> Any:
    """The user's function; an exception in it becomes a RolloutError naming the function, the error and where."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the user's code: report it, with the place
        ours = str(Path(__file__).resolve().parents[1])
        frames = [frame for frame in inspect.trace()[1:]
                  if not frame.filename.startswith(ours) and "site-packages" not in frame.filename]
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise RolloutError(f"trl.rollout_func {name} raised {type(exc).__name__}: {exc}{where}") from exc


def generation_config(params: SamplingParams, tokenizer):
    """The run's sampling settings as a transformers GenerationConfig (what the guide's functions pass to generate)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=params.max_new_tokens, do_sample=params.temperature > 0, temperature=params.temperature or None,
        top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else None, min_p=params.min_p or None,
        repetition_penalty=params.repetition_penalty, eos_token_id=list(params.stop_token_ids) or None,
        pad_token_id=tokenizer.pad_token_id,
    )


def prompt_view(prompt: dict[str, Any]) -> dict[str, Any]:
    """What a guide-style function reads of a prompt: its chat `messages`, the raw `prompt` and the dataset columns."""
    raw = prompt["prompt"]
    messages = raw if isinstance(raw, list) else [{"role": "user", "content": str(raw)}]
    return {**prompt.get("columns", {}), "prompt": raw, "messages": messages}


@torch.no_grad()
def completions_rollout(fn: Callable, name: str, model, tokenizer, prompts: list[dict[str, Any]], group: int,
                        params: SamplingParams, version: int) -> Rollout:
    """Run a guide-style function on each prompt G times and turn its texts into a Rollout with sampling log-probs."""
    expanded = [prompt for prompt in prompts for _ in range(group)]
    texts = call_user(fn, name, model, tokenizer, [prompt_view(p) for p in expanded], generation_config(params, tokenizer))
    if not isinstance(texts, (list, tuple)) or len(texts) != len(expanded) or not all(isinstance(t, str) for t in texts):
        got = f"a list of {len(texts)}" if isinstance(texts, (list, tuple)) else type(texts).__name__
        raise RolloutError(f"trl.rollout_func {name} returned {got}: the (model, processing_class, prompts, generation_config) "
                           f"form returns one completion string per prompt it is given ({len(expanded)} here: each prompt "
                           f"{group} times)")
    eos, limit = tokenizer.eos_token_id, params.max_new_tokens
    completions, truncated = [], []
    for text in texts:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        cut = len(ids) >= limit
        ids = ids[:limit] if cut else ids + ([eos] if eos is not None else [])
        completions.append(ids)
        truncated.append(cut)
    prompt_ids = [p["prompt_ids"] for p in expanded]
    rows = [{"prompt_ids": p, "completion_ids": c, "mask": [1] * len(c), "advantage": 0.0} for p, c in zip(prompt_ids, completions)]
    batch = {k: v.to(next(model.parameters()).device) if isinstance(v, torch.Tensor) else v
             for k, v in completion_batch(rows, tokenizer.pad_token_id).items()}
    logits = completion_logits(model, batch)
    logps, _ = logps_from_logits(logits, batch, params.temperature, False)
    if filters_active(params):
        logps, _ = sampled_logps(logits, batch, params, logps)
    logprobs = [logps[row, : len(ids)].tolist() for row, ids in enumerate(completions)]
    return Rollout(prompt_ids, completions, logprobs, truncated, weight_versions=[version] * len(expanded))
