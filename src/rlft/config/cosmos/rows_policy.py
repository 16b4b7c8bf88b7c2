"""Rows of Cosmos-RL's `[train.train_policy]`: the method (GRPO or SFT), its dataset, and GRPO's loss and rollouts."""

from __future__ import annotations

from typing import Any

from rlft.config.cosmos.rows import Row, View, refused_when, rows_to, to, unused
from rlft.config.cosmos.rows_train import BATCHES, batches, batches_refused, steps_per_batch
from rlft.config.reward_weights import names_and_weights

P = "train.train_policy"
# rlft's built-in rewards (rlft.rollout.rewards.builtin, which the config layer does not import; a unit test holds the two
# lists together)
BUILTIN_REWARDS = ("boxed_math", "single_choice", "format")
LOSSES = ("token-mean", "seq-mean-token-mean")
LOADER = "rlft builds batches in the training process (no DataLoader workers or prefetching)"
TRAINERS = {"grpo", "sft"}
SYNCHRONOUS = ("read while allowed_outdated_steps holds rollouts sampled ahead back, and this run samples each generation "
               "batch when it trains (on_policy, or allowed_outdated_steps leaves no room to sample ahead)")


def _splits(view: View, prefix: str) -> list[str]:
    split = view.get(f"{prefix}.dataset.split")
    return ([split] if isinstance(split, str) else list(split or [])) or [""]


def _datasets(value: Any, view: View) -> dict[str, Any]:
    """One rlft dataset entry per split of the Cosmos-RL dataset: a local file or folder, or a hub id (online only)."""
    if not value:
        return {}
    return {"datasets": [{"path": value} for _ in _splits(view, P)]}


def _no_dataset(value: Any, view: View) -> str | None:
    if value:
        return None
    return ("no dataset.name: Cosmos-RL then takes the dataset from its launch script, and rlft reads datasets from files "
            "or the hub: set train.train_policy.dataset.name to a local file, folder or hub id")


def _every(key: str):
    return lambda value, view: {f"datasets[*].{key}": value} if value else {}


def _split(value: Any, view: View) -> dict[str, Any]:
    return {f"datasets[{i}].split": split for i, split in enumerate(_splits(view, P)) if split}


def _column(rlft_name: str, key: str):
    """A column Cosmos-RL names: rlft reads `rlft_name` itself, another name through the dataset key `key`."""
    return lambda value, view: {} if value in ("", rlft_name) else {f"datasets[*].{key}": value}


def _rewards(value: Any, view: View) -> dict[str, Any]:
    """A name or a list; a mapping {name: weight} gives trl.reward_weights in its order (what rlft makes of the same
    mapping written in trl.reward_funcs)."""
    if isinstance(value, dict):
        names, weights = names_and_weights(value)
        return {"trl.reward_funcs": names, "trl.reward_weights": weights}
    return {"trl.reward_funcs": [value] if isinstance(value, str) else value}


def _unbuilt_rewards(value: Any, view: View) -> str | None:
    if isinstance(value, dict):
        try:
            names_and_weights(value)
        except ValueError as exc:
            return str(exc)
    names = [value] if isinstance(value, str) else list(value)
    missing = [name for name in names if name not in BUILTIN_REWARDS]
    if missing:
        return (f"{', '.join(missing)}: not built into rlft (its built-ins are {', '.join(BUILTIN_REWARDS)}): write the "
                "reward as a Python function `module.fn` (docs/grpo.md#reward-functions) and name it in trl.reward_funcs")
    return None


def _variant(value: Any, view: View) -> dict[str, Any]:
    """Cosmos-RL's variants change no loss_type: gspo takes the importance ratio per sequence without the dual clip, dapo
    drops groups whose filter rewards are all equal (dynamic sampling); written out, not as rlft's `trl.variant`,
    which also sets loss_type and clip ranges."""
    if value == "gspo":
        return {"trl.importance_sampling_level": "sequence", "trl.lower_bound_ratio": None}
    return {}


def _dynamic_sampling(value: Any, view: View) -> dict[str, Any]:
    if view.get(f"{P}.variant") != "dapo":
        return {}
    return {"trl.filter_reward_metric": value or "reward"}


def _one_temperature(value: Any, view: View) -> str | None:
    sampling = "rollout.sampling_config.temperature"
    if view.given(f"{P}.temperature") and view.given(sampling) and view.get(sampling) != view.get(f"{P}.temperature"):
        return (f"train_policy.temperature {view.get(f'{P}.temperature')} and {sampling} {view.get(sampling)} differ: rlft "
                "samples and computes log-probs at one temperature (trl.temperature); give both the same value")
    return None


def _temperature(value: Any, view: View) -> dict[str, Any]:
    return {} if view.given("rollout.sampling_config.temperature") else {"trl.temperature": value}


def _depth(view: View) -> int:
    """Generation batches sampled ahead so that no row is older than allowed_outdated_steps optimizer steps when it
    trains (0: synchronous): each batch serves `steps_per_batch` steps, and a weight push waits sync_weight_interval."""
    if view.get(f"{P}.on_policy"):
        return 0
    age = (view.get(f"{P}.allowed_outdated_steps") or 0) - (view.get("train.sync_weight_interval") or 1) + 1
    return max(0, age // steps_per_batch(view))


def _asynchronous(view: View) -> bool:
    return _depth(view) >= 1


def _on_policy(value: Any, view: View) -> dict[str, Any]:
    if value:
        return {"trl.on_policy": True}
    if not _asynchronous(view):
        return {}
    return {"trl.async_prefetch": True, "trl.prefetch_depth": _depth(view)}


def _when_asynchronous(key: str):
    return lambda value, view: {key: value} if _asynchronous(view) else {}


def _overlong(key: str):
    return lambda value, view: {key: value} if view.get(f"{P}.overlong_reward.enable_overlong_penalty") else {}


def _trainer(value: Any, view: View) -> str | None:
    if value in TRAINERS:
        return None
    return f"trainer_type {value!r} is a trainer that a Cosmos-RL launch script registers; rlft runs its own GRPO and SFT"


def _grpo(path: str, *args: Any, **kwargs: Any) -> Row:
    return to(f"{P}.{path}", *args, method="grpo", **kwargs)


DATASET_ROWS: list[Row] = [
    Row(f"{P}.dataset.name", ("datasets[*].path",), _datasets, refuse=_no_dataset, carry=True,
        note="one dataset entry per split: a local file or folder, or a hub id (online)"),
    rows_to(f"{P}.dataset.subset", ("datasets[*].name",), _every("name"), carry=True),
    rows_to(f"{P}.dataset.revision", ("datasets[*].revision",), _every("revision"), carry=True),
    rows_to(f"{P}.dataset.split", ("datasets[*].split",), _split, carry=True),
    rows_to(f"{P}.dataset.test_size", ("val_set_size",), lambda value, view: {} if not view.get(
        "validation.enable") or view.get("validation.dataset.name") else {"val_set_size": 0.1 if value is None else value},
            note="with validation on and no validation.dataset.name: the rows held out for it (Cosmos-RL: 0.1)"),
    refused_when(f"{P}.dataloader_shuffle", lambda value: value is False,
                 "rlft draws each epoch's rows in a seeded random order (train.seed) and has no key that keeps the "
                 "dataset's order: set dataloader_shuffle = true (what rlft does), or remove it",
                 otherwise="true: rlft draws each epoch's rows in a seeded random order, as a shuffling loader does",
                 note="true: what rlft does (a seeded random order each epoch); false is refused (no rlft key keeps "
                      "the dataset's order)"),
    unused(f"{P}.enable_dataset_cache", "rlft keeps tokenised data in dataset_prepared_path when that is set"),
    unused(f"{P}.dataloader_num_workers", LOADER),
    unused(f"{P}.dataloader_prefetch_factor", LOADER),
    unused(f"{P}.dataloader_batch_size", LOADER, method="grpo"),
    Row(f"{P}.mini_batch", BATCHES, batches, refuse=batches_refused, carry=True,
        note="rows per micro-batch (with train.train_batch_per_replica)"),
    Row(f"{P}.trainer_type", refuse=_trainer, unused="rlft's own trainer"),
]

SFT_ROWS: list[Row] = [
    Row(f"{P}.type", convert=lambda value, view: {}, method="sft", carry=True, note="SFT: rlft's `rl` unset"),
    rows_to(f"{P}.conversation_column_name", ("datasets[*].type", "datasets[*].field_messages"),
            lambda value, view: {"datasets[*].type": "chat_template", "datasets[*].field_messages": value},
            method="sft", carry=True, note="a column of message lists, rendered by the chat template"),
    rows_to(f"{P}.system_prompt", ("datasets[*].system_prompt",), _every("system_prompt"), method="sft"),
    Row(f"{P}.balance_dp_token", ("balance_dp_token",), lambda value, view: {"balance_dp_token": value}, method="sft",
        refuse=lambda value, view: None if value else ("balance_dp_token = false (each process's own token mean) is not "
                                                       "built: rlft divides by the step's tokens over every process"),
        note="true: the step's loss is divided by its target tokens over every process"),
]

GRPO_ROWS: list[Row] = [
    Row(f"{P}.type", convert=lambda value, view: {"rl": "grpo"}, targets=("rl",), method="grpo", carry=True),
    Row(f"{P}.variant", ("trl.importance_sampling_level", "trl.lower_bound_ratio"), _variant, method="grpo",
        note="grpo: nothing; gspo: sequence-level ratio, no dual clip; dapo: see filter_reward_metric"),
    Row(f"{P}.prompt_column_name", ("datasets[*].field_prompt",), _column("prompt", "field_prompt"), method="grpo",
        note="`prompt` (or unset): rlft's own column"),
    Row(f"{P}.response_column_name", ("datasets[*].field_response",), _column("answer", "field_response"), method="grpo",
        note="`answer` (or unset): the column rlft's built-in rewards read"),
    Row(f"{P}.reward_function", ("trl.reward_funcs", "trl.reward_weights"), _rewards, refuse=_unbuilt_rewards,
        method="grpo", carry=True,
        note="a name, a list or {name: weight}"),
    Row(f"{P}.filter_reward_metric", ("trl.filter_reward_metric",), _dynamic_sampling, method="grpo", carry=True,
        note="with variant dapo (unset: the total reward); Cosmos-RL filters only then"),
    Row(f"{P}.temperature", ("trl.temperature",), _temperature, refuse=_one_temperature, method="grpo",
        note="rlft samples at it too, where rollout.sampling_config.temperature is unset"),
    _grpo("epsilon_low", "trl.epsilon", carry=True),
    _grpo("epsilon_high", "trl.epsilon_high", carry=True),
    _grpo("positive_nll_coef", "trl.positive_nll_coef"),
    _grpo("lower_bound_ratio", "trl.lower_bound_ratio", carry=True),
    _grpo("loss_type", "trl.loss_type", carry=True,
          refuse=lambda value, view: None if value in LOSSES else (
              f"loss_type {value!r} is not built in rlft (it has {' and '.join(LOSSES)}, and dr_grpo: a sum over tokens "
              "divided by a constant, with unbiased_loss_max_tokens)")),
    _grpo("unbiased_loss_max_tokens", "trl.unbiased_loss_max_tokens"),
    _grpo("unbiased_advantage", "trl.unbiased_advantage"),
    _grpo("overlong_reward.enable_overlong_penalty", "trl.overlong_penalty"),
    Row(f"{P}.overlong_reward.buffer_length", ("trl.overlong_buffer_length",), _overlong("trl.overlong_buffer_length"),
        method="grpo", carry=True),
    Row(f"{P}.overlong_reward.penalty_factor", ("trl.overlong_penalty_factor",), _overlong("trl.overlong_penalty_factor"),
        method="grpo", carry=True),
    _grpo("kl_beta", "trl.beta", carry=True),
    _grpo("aipo_rho", "trl.aipo_rho"),
    _grpo("mu_iterations", "trl.num_iterations", carry=True),
    Row(f"{P}.batch_size_per_optimize", BATCHES, batches, refuse=batches_refused, method="grpo",
        note="rows per optimizer step: one generation batch serves several steps"),
    _grpo("max_token_len_per_mini_batch", "trl.max_token_len_per_mini_batch"),
    _grpo("entropy_coeff", "trl.entropy_coeff"),
    Row(f"{P}.on_policy", ("trl.on_policy", "trl.async_prefetch", "trl.prefetch_depth"), _on_policy, method="grpo",
        carry=True, note="true: trl.on_policy (which rlft runs with train.sync_weight_interval = 1 only, and refuses with "
                         "another; Cosmos-RL takes both); false: rollouts sampled ahead by as many generation batches as "
                         "allowed_outdated_steps leaves room for"),
    Row(f"{P}.allowed_outdated_steps", ("trl.allowed_outdated_steps",), _when_asynchronous("trl.allowed_outdated_steps"),
        method="grpo", carry=True),
    Row(f"{P}.outdated_rollout_fetch_batch_size", ("trl.outdated_rollout_fetch_batch_size",),
        _when_asynchronous("trl.outdated_rollout_fetch_batch_size"), method="grpo", carry=True, unused=SYNCHRONOUS,
        note="with rollouts sampled ahead (on_policy false, room in allowed_outdated_steps)"),
    _grpo("min_filter_prefix_tokens", "trl.min_filter_prefix_tokens"),
    Row(f"{P}.max_retry_for_on_policy", ("trl.max_retry_for_on_policy",), lambda value, view: {
        "trl.max_retry_for_on_policy": value} if view.get(f"{P}.variant") == "dapo" else {}, method="grpo",
        unused="draws of dynamic sampling, which runs with variant dapo only",
        note="with variant dapo: how many times dynamic sampling draws prompts to fill a generation batch"),
    _grpo("reference_reset_interval", "trl.reference_reset_interval"),
    Row(f"{P}.reset_optimizer_with_reference", ("trl.reset_optimizer_with_reference",),
        lambda value, view: {"trl.reset_optimizer_with_reference": value} if view.get(f"{P}.reference_reset_interval") else {},
        method="grpo"),
    Row(f"{P}.balance_dp_token", ("trl.balance_dp_token",), lambda value, view: {"trl.balance_dp_token": value} if view.get(
        f"{P}.loss_type") == "token-mean" else {}, method="grpo", unused=lambda value, view: None if view.get(
        f"{P}.loss_type") == "token-mean" else "Cosmos-RL reads it with loss_type token-mean only",
        note="with loss_type token-mean, which alone reads it"),
    _grpo("use_decoupled_loss", "trl.use_decoupled_loss"),
    _grpo("behav_imp_weight_cap", "trl.behav_imp_weight_cap"),
    unused(f"{P}.rollout_as_token_ids", "rlft's rollouts are token ids whatever this says", method="grpo"),
    refused_when(f"{P}.use_rollout_logprobs_for_loss", bool, "the engine's log-probs as the old log-probs have no rlft "
                 "key: rlft recomputes them with the trainer, and corrects for the engine with "
                 "trl.vllm_importance_sampling_correction", method="grpo"),
]

POLICY_ROWS = DATASET_ROWS + SFT_ROWS + GRPO_ROWS
