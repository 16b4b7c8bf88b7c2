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
import sysconfig
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import GenerationConfig

from rlft.errors import RolloutError
from rlft.models.head import without_router_logits
from rlft.data.collate import completion_batch
from rlft.models.logprobs import completion_scores, filters_active, sampled_logps
from rlft.rollout.types import Rollout, SamplingParams
from rlft.usercode import UserCodeError, load_user_function

LOGP_ROWS = 16  # completions per forward pass when computing their log-probs
FORMS = ("rollout_func(prompts, trainer) -> dict with prompt_ids, completion_ids and logprobs (TRL), or "
         "rollout_func(model, processing_class, prompts, generation_config=None) -> list of completion strings "
         "(the Axolotl guide)")


def rollout_form(fn: Callable, name: str) -> str:
    """"trainer" or "completions", from the signature; a RolloutError showing both forms for anything else.

    The guide's form has exactly three required positional parameters (model, processing_class, prompts), and
    takes generation_config as a fourth positional parameter, a keyword, or not at all."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, take TRL's form
        return "trainer"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) == 3:
        return "completions"
    if len(positional) >= 2 and len(required) <= 2 or any(p.kind == p.VAR_POSITIONAL for p in params):
        return "trainer"
    raise RolloutError(f"trl.rollout_func {name}{inspect.signature(fn)} takes neither accepted form: write {FORMS}")


def completions_arguments(fn: Callable, config) -> tuple[tuple, dict]:
    """How to hand generation_config to a guide-form function: 4th positional, keyword, or not at all."""
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 4:
        return (config,), {}
    if any(p.name == "generation_config" and p.kind == p.KEYWORD_ONLY for p in params) or any(
            p.kind == p.VAR_KEYWORD for p in params):
        return (), {"generation_config": config}
    return (), {}


def call_user(fn: Callable, name: str, *args, **kwargs) -> Any:
    """The user's function; an exception in it becomes a RolloutError naming the function, the error and where
    (the innermost frame in the user's own files: not rlft's, an installed package's or the standard library's)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's code: report it, with the place
        skip = (str(Path(__file__).resolve().parents[1]), sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])
        frames = [frame for frame in inspect.trace()[1:]
                  if not frame.filename.startswith(skip) and "site-packages" not in frame.filename]
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise RolloutError(f"trl.rollout_func {name} raised {type(exc).__name__}: {exc}{where}") from exc


def generation_config(params: SamplingParams, tokenizer):
    """The run's sampling settings as a transformers GenerationConfig (what the guide's functions pass to generate).

    Every filter is set explicitly, off included (top_k 0, min_p 0): `generate` fills unset fields from the model's
    generation_config.json or its own defaults (top_k 50), which would sample from another distribution than the
    one rlft computes the log-probs of."""
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens, do_sample=params.temperature > 0, temperature=params.temperature or 1.0,
        top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0, min_p=params.min_p,
        repetition_penalty=params.repetition_penalty, eos_token_id=list(params.stop_token_ids),
        pad_token_id=tokenizer.pad_token_id,
    )


def prompt_view(prompt: dict[str, Any], tokenizer) -> dict[str, Any]:
    """What a guide-style function reads of a prompt: its chat `messages`, the raw `prompt`, the dataset columns, and
    exactly what rlft trains on: `prompt_ids` and their text `prompt_text` (a string prompt is trained as it is,
    without a chat template; a chat prompt with the template applied, as `messages` + apply_chat_template gives)."""
    raw = prompt["prompt"]
    messages = raw if isinstance(raw, list) else [{"role": "user", "content": str(raw)}]
    return {**prompt.get("columns", {}), "prompt": raw, "messages": messages, "prompt_ids": list(prompt["prompt_ids"]),
            "prompt_text": tokenizer.decode(prompt["prompt_ids"])}


@torch.no_grad()
def completions_rollout(fn: Callable, name: str, model, tokenizer, prompts: list[dict[str, Any]], group: int,
                        params: SamplingParams, version: int) -> Rollout:
    """Run a guide-style function on each prompt G times and turn its texts into a Rollout with sampling log-probs."""
    expanded = [prompt for prompt in prompts for _ in range(group)]
    extra, keywords = completions_arguments(fn, generation_config(params, tokenizer))
    try:
        texts = call_user(fn, name, model, tokenizer, [prompt_view(p, tokenizer) for p in expanded], *extra, **keywords)
    except RolloutError as exc:
        if without_router_logits(model):  # the training model computes its router's loss in every forward
            raise RolloutError(f"{exc}. The model's config sets output_router_logits (model_config), so its forward computes "
                               "the router's loss, which a generate step's router logits do not fit: call "
                               "model.generate(..., output_router_logits=False); the loss is rlft's to add") from exc
        raise
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
    logprobs = []
    device = next(model.parameters()).device
    for start in range(0, len(expanded), LOGP_ROWS):  # a few rows at a time: (rows, C, V) logits stay small
        rows = [{"prompt_ids": p, "completion_ids": c, "loss_mask": [1] * len(c), "advantage": 0.0}
                for p, c in zip(prompt_ids[start:start + LOGP_ROWS], completions[start:start + LOGP_ROWS])]
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in completion_batch(rows, tokenizer.pad_token_id).items()}
        scores = completion_scores(model, batch)
        logps, _ = scores.token_logps(params.temperature, False)
        if filters_active(params):
            logps, _ = sampled_logps(scores, batch, params, logps)
        logprobs += [logps[row, : len(r["completion_ids"])].tolist() for row, r in enumerate(rows)]
    return Rollout(prompt_ids, completions, logprobs, truncated, weight_versions=[version] * len(expanded))


def load_rollout_func(name: str, settings) -> Callable:
    """The user's rollout function, checked before any model loads: importable, of an accepted form, and able to run
    with this engine and these sampling settings."""
    try:
        fn = load_user_function(name)[0]
    except UserCodeError as exc:
        raise RolloutError(f"trl.rollout_func {exc}") from None
    if rollout_form(fn, name) == "completions":
        if settings.use_vllm:
            raise RolloutError(f"trl.rollout_func {name} takes (model, processing_class, prompts, generation_config): it "
                               "generates with a local model, and trl.use_vllm samples on a server: use the (prompts, "
                               "trainer) form, whose trainer.generate(prompt_ids) samples through the server, or set "
                               "trl.use_vllm: false")
        if settings.ignore_eos or settings.stop_strings:
            raise RolloutError(f"trl.rollout_func {name} calls generate itself, which stops at EOS: trl.generation_kwargs "
                               "ignore_eos / stop cannot reach it; remove them, or use the (prompts, trainer) form, whose "
                               "trainer.generate applies them")
    return fn
