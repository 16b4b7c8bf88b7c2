"""Loading `trl.reward_funcs` (+ `trl.reward_weights`) as RewardFunction objects.

An entry is a built-in's bare name (`boxed_math`, `single_choice`, `format`: rlft.rollout.rewards.builtin),
`module.fn`, a function in a .py file of the working directory (imported by rlft.usercode, as dataset
transforms are), or a trained reward-model folder (or hub id), scored on prompt + completion text by
RewardModelScorer. A name without a dot names a built-in or a folder; a folder named like a built-in is
refused as ambiguous (write `./name` for the folder). Signatures TRL's call cannot bind (no **kwargs,
positional-only parameters) are refused here, with the fix, rather than failing at every call.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlft.errors import ConfigError, ModelError
from rlft.models.reward import load_reward_for_scoring, score_texts
from rlft.rollout.rewards.builtin import BUILTIN_REWARDS, REQUIRES
from rlft.rollout.rewards.calling import RESERVED_ARGUMENTS, _invoke, completion_text
from rlft.usercode import UserCodeError, load_user_function


@dataclass
class RewardFunction:
    """One entry of `trl.reward_funcs`: `fn` is called with the TRL keywords (see rewards.calling).

    `name` is used in metrics (`rewards/<name>/mean`); `import_path` ("module.fn") lets worker
    processes import it themselves, None keeps it in this process (reward models)."""

    name: str
    weight: float
    source: str
    fn: Callable[..., Any]
    module_file: str | None = None
    import_path: str | None = None
    required_columns: tuple[str, ...] = ()

    def __call__(self, prompts: list, completions: list, completion_ids: list, **columns: Any) -> Any:
        return _invoke(self.fn, prompts, completions, completion_ids, columns)

    @property
    def where(self) -> str:
        return f"{self.source} ({self.module_file})" if self.module_file else self.source


def load_reward_functions(names: list[str], weights: list[float] | None = None, key: str = "trl.reward_funcs",
                          device: str = "cpu") -> list[RewardFunction]:
    """Resolve `trl.reward_funcs` (+ `trl.reward_weights`), or the config key `key` that names functions the same way
    (`validation.reward_function`): a built-in by name, `module.fn` from the working directory, or a trained
    reward-model folder (scored on prompt + completion text). Raises ConfigError with the fix, naming `key`."""
    names = list(names or [])
    if not names:
        raise ConfigError(f"{key} is empty: give at least one built-in ({BUILTIN_NAMES}), `module.fn` or "
                          "reward-model folder", [(key, "empty")])
    if weights is None:
        weights = [1.0] * len(names)
    weights = list(weights)
    if len(weights) != len(names):
        message = (
            f"trl.reward_weights has {len(weights)} value(s) but trl.reward_funcs has {len(names)} ({', '.join(names)}): "
            "give one weight per reward function, in the same order, or drop reward_weights (all 1.0)"
        )
        raise ConfigError(message, [("trl.reward_weights", message)])
    for index, weight in enumerate(weights):
        if not isinstance(weight, (int, float)) or not math.isfinite(weight):
            message = f"trl.reward_weights[{index}] = {weight!r} is not a finite number"
            raise ConfigError(message, [(f"trl.reward_weights[{index}]", message)])
    functions = [_load_one(name, float(weight), f"{key}[{index}]", device)
                 for index, (name, weight) in enumerate(zip(names, weights))]
    _make_names_unique(functions)
    return functions


def _make_names_unique(functions: list[RewardFunction]) -> None:
    """Two functions with the same `fn` name would share metric keys: use the full source for those."""
    counts: dict[str, int] = {}
    for function in functions:
        counts[function.name] = counts.get(function.name, 0) + 1
    seen: set[str] = set()
    for function in functions:
        if counts[function.name] > 1:
            function.name = function.source
        while function.name in seen:
            function.name += "_"
        seen.add(function.name)


# Axolotl's names of rewards rlft implements itself (a user's config runs unchanged)
ALIASES = {
    "axolotl.integrations.nemo_gym.rewards.reward_nemo_gym_verify": "rlft.rollout.envs.nemo_gym.reward_nemo_gym_verify",
    "axolotl.integrations.nemo_gym.rewards.reward_env": "rlft.rollout.envs.nemo_gym.reward_env",
}


BUILTIN_MODULE = "rlft.rollout.rewards.builtin"
BUILTIN_NAMES = ", ".join(BUILTIN_REWARDS)


def _load_one(name: str, weight: float, key: str, device: str) -> RewardFunction:
    name = ALIASES.get(name, name)
    if name in BUILTIN_REWARDS:
        name = _builtin_path(name, key)
    folder = Path(name).expanduser()
    if folder.is_dir():
        return _reward_model_function(name, folder, weight, key, device)
    looks_like_path = "/" in name or os.sep in name or name.startswith((".", "~"))
    module_name, _, attr = name.rpartition(".")
    if looks_like_path or not module_name or not attr:
        if looks_like_path:  # a hub id (org/name) or a folder that does not exist: the loader says which
            return _reward_model_function(name, folder, weight, key, device)
        close = difflib.get_close_matches(name, list(BUILTIN_REWARDS), n=1)
        hint = f"did you mean the built-in {close[0]!r}? " if close else ""
        _fail(key, f"{name!r} is neither a built-in reward ({BUILTIN_NAMES}), nor `module.fn` (a function in a .py "
                   f"file of {Path.cwd()}), nor a reward-model folder: {hint}write a function as e.g. `rewards.my_reward` "
                   "for my_reward in rewards.py")
    try:
        fn, module_file = load_user_function(name)
    except UserCodeError as exc:
        message = str(exc)
        if exc.reason == "no_module":
            message += ", or give the path of a reward-model folder"
        elif exc.reason == "not_callable":
            message += f"; a reward function is `def {attr}(completions, **kwargs) -> list[float]`"
        _fail(key, message)
    required = _check_signature(fn, name, module_file, key)
    return RewardFunction(name=attr, weight=weight, source=name, fn=fn, module_file=module_file,
                          import_path=name, required_columns=required)


def _builtin_path(name: str, key: str) -> str:
    """The import path of the built-in `name`, after checking that no folder claims the name and its package is there."""
    if Path(name).is_dir():
        _fail(key, f"{name!r} is both a built-in reward function and a folder in {Path.cwd()}: write `./{name}` for the "
                   f"folder (a reward model), or `{BUILTIN_MODULE}.{name}` for the built-in")
    module, install = REQUIRES.get(name, (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        _fail(key, f"the built-in reward {name!r} needs the {module} package, which is not installed: {install}")
    return f"{BUILTIN_MODULE}.{name}"


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"{key}: {message}", [(key, message)])



def _check_signature(fn: Callable, name: str, module_file: str | None, key: str) -> tuple[str, ...]:
    """Refuse signatures TRL's call cannot bind; return the required parameters that must be dataset columns."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return ()
    parameters = list(signature.parameters.values())
    convention = ("rlft calls reward functions as TRL does: fn(prompts=..., completions=..., completion_ids=..., "
                  "<every other dataset column>=...), so a reward function is `def f(completions, **kwargs)` "
                  "(named columns such as `answer` may be listed before **kwargs)")
    where = f"{name!r} ({module_file})" if module_file else repr(name)
    positional_only = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        _fail(key, f"{where}{signature}: parameter(s) {', '.join(positional_only)} are positional-only and cannot receive "
                   f"keywords. {convention}")
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        _fail(key, f"{where}{signature} has no **kwargs, so the call fails on the keywords it does not name "
                   f"(TRL also requires at least 2 parameters). {convention}: add **kwargs")
    return tuple(p.name for p in parameters
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty
                 and p.name not in RESERVED_ARGUMENTS)


class RewardModelScorer:
    """A trained sequence-classification reward model as a reward function: scores prompt + completion.

    The text matches reward-model training (rlft.data.preference): the chat-templated prompt with the
    generation prompt (or the plain prompt string), then the completion; `score_texts` appends EOS."""

    def __init__(self, model, tokenizer, batch_size: int = 32):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        texts = [self._prompt_text(p) + completion_text(c) for p, c in zip(prompts, completions)]
        return score_texts(self.model, self.tokenizer, texts, batch_size=self.batch_size)

    def _prompt_text(self, prompt: Any) -> str:
        if isinstance(prompt, list):
            if getattr(self.tokenizer, "chat_template", None):
                return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, Mapping))
        return str(prompt)


def _reward_model_function(name: str, folder: Path, weight: float, key: str, device: str) -> RewardFunction:
    if folder.is_dir():
        model_folder = folder / "model" if (folder / "model").is_dir() else folder
        if not any((model_folder / f).exists() for f in ("adapter_config.json", "config.json")):
            _fail(key, f"{name!r} is a folder ({folder.resolve()}) but holds no config.json or adapter_config.json, so it is "
                       "not a reward model; give a trained reward-model folder or a `module.fn` reward function")
    try:
        model, tokenizer = load_reward_for_scoring(name, device=device)
    except ModelError as exc:
        _fail(key, f"{name!r} is not an importable `module.fn` and cannot be loaded as a reward model: {exc}")
    except (OSError, ValueError) as exc:
        local = "" if folder.exists() else f" (there is no folder {folder.resolve()}, so it was read as a hub id)"
        _fail(key, f"{name!r}: loading it as a reward model (sequence classification, 1 label) failed{local}: {exc}")
    label = folder.name if folder.name not in ("", ".", "model") else Path(name).resolve().name
    return RewardFunction(name=label or name, weight=weight, source=name, fn=RewardModelScorer(model, tokenizer),
                          module_file=str(folder.resolve()) if folder.exists() else None)

