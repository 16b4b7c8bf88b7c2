"""`rlft generate`, `rlft merge-lora` and `rlft score`: a trained model folder or checkpoint put to use."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.cli.consoles import console
from rlft.cli.exit import CommandState
from rlft.errors import ConfigError, RlftError
from rlft.models.generation import generate_texts
from rlft.models.loading import load_for_inference
from rlft.data.mistral_common import is_mistral_common
from rlft.models.reward import load_reward_for_scoring, score_texts


def generate(args: argparse.Namespace, state: CommandState) -> int:
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--num-samples", args.num_samples)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: give at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise ConfigError(f"--temperature {args.temperature} --top-p {args.top_p}: the temperature is 0 (greedy) or more, "
                          "top-p in (0, 1]")
    if args.num_samples > 1 and args.temperature == 0:
        raise ConfigError(f"--num-samples {args.num_samples} with --temperature 0 (greedy) would give the same answer "
                          f"{args.num_samples} times: add --temperature 0.8 (or another value above 0)")
    model, tokenizer = load_for_inference(args.model)
    prompts = args.prompt
    if args.chat:  # mistral-common's control tokens exist only as ids: its prompts are given as ids
        rendered = is_mistral_common(tokenizer)
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=rendered, add_generation_prompt=True,
                                                 **({"return_dict": False} if rendered else {})) for p in prompts]
    texts = generate_texts(model, tokenizer, prompts, args.max_new_tokens, args.temperature, args.top_p, args.num_samples, seed=args.seed,
                           add_special_tokens=not args.chat)
    for index, text in enumerate(texts):
        prompt = args.prompt[index // args.num_samples]
        console.print(f"[bold]{prompt}[/]{text}", highlight=False)
    return 0


def merge_lora(args: argparse.Namespace, state: CommandState) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise RlftError(f"{out} exists and is not empty: merging would overwrite what is there; pick another folder, or "
                        "add --force to replace it")
    model, tokenizer = load_for_inference(args.checkpoint)
    if not hasattr(model, "merge_and_unload"):
        raise RlftError(f"{args.checkpoint} holds a full model, not a LoRA adapter: there is nothing to merge")
    merged = model.merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    console.print(f"merged model written to {out.resolve()}")
    return 0


def score(args: argparse.Namespace, state: CommandState) -> int:
    model, tokenizer = load_reward_for_scoring(args.model)
    for text, score in zip(args.text, score_texts(model, tokenizer, args.text)):
        console.print(f"{score:+.4f}  {text}", highlight=False, markup=False)
    return 0
