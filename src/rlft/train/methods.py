"""The train layer's method table: `SETUPS` maps each `MethodSpec` (rlft.config.methods; EBFT's strided spec its own
entry) to the setup that builds its run: the data, the policy and its frozen networks, and the recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from rich.console import Console

from rlft.config.methods import METHODS, MethodSpec, method_spec, spec_of
from rlft.config.plugins import nemo_gym_enabled
from rlft.config.settings import Settings
from rlft.data.preference import assign_kl_completions
from rlft.data.prepare import method_steps, prepare_data, prepare_records, prepare_sft_data, prompt_steps
from rlft.data.prepared import PreparedData
from rlft.data.stream import prepare_streamed_sft_data
from rlft.data.validation_sets import validation_sets
from rlft.errors import ConfigError, DataError
from rlft.losses.preference.kto import check_kto_labels, kto_imbalance_warning
from rlft.models.compile import compile_options
from rlft.models.loading import disable_dropout, load_model
from rlft.models.reward import load_reward_model
from rlft.models.shared_prompts import forward_costs, group_sharing, prompt_sharing, reward_sharing
from rlft.models.varlen import rows_apart
from rlft.rollout.envs.nemo_gym import agent_servers, resource_servers, task_rows
from rlft.rollout.envs.multi_turn import ToolEpisodes
from rlft.rollout.envs.nemo_gym_episodes import NemoGymAgents
from rlft.rollout.envs.python_tools import load_tools
from rlft.rollout.feature_reward import FeatureMatchingReward
from rlft.rollout.rewards.loading import load_reward_functions
from rlft.rollout.rewards.runner import RewardRunner
from rlft.rollout.scoring import FunctionScorer
from rlft.rollout.user_rollouts import load_rollout_func
from rlft.train.engines import engine_factory
from rlft.train.policy import attach_with_frozen, compile_frozen, policy_and_frozen
from rlft.train.recipe import Recipe
from rlft.train.recipes.ebft import EBFTStridedRecipe, EBFTStructuredRecipe
from rlft.train.recipes.grpo import GRPORecipe
from rlft.train.recipes.preference import KTORecipe, PairRecipe, precompute_or_load
from rlft.train.recipes.reward_model import RewardModelRecipe
from rlft.train.recipes.sft import SFTRecipe
from rlft.train.recipes.validation import Validation

# (cfg, settings, tokenizer, accelerator, init_base, console) -> (model, recipe, data); the model not yet wrapped
Setup = Callable[[Any, Any, Any, Optional[Path], Console], tuple[Any, Recipe, PreparedData]]


def _shard(accelerator) -> tuple[int, int]:
    return accelerator.process_index, accelerator.num_processes


def sft_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    data = prepare_streamed_sft_data(cfg, tokenizer) if cfg.streamed else prepare_sft_data(cfg, tokenizer)
    model = load_model(settings.model, tokenizer, accelerator.device.type, init_base_dir=init_base)
    recipe = SFTRecipe(cfg, settings, data, tokenizer.pad_token_id, _shard(accelerator), tokenizer if cfg.streamed else None)
    return model, recipe, data


def reward_model_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    data = prepare_data(cfg, tokenizer, method_steps(cfg))
    model = load_reward_model(settings.model, tokenizer, accelerator.device.type, init_base_dir=init_base)
    if cfg.disable_dropout:
        disable_dropout(model)
    sharing = reward_sharing(settings.data, model, data.train + data.eval, compile_options(settings.model) is not None)
    return model, RewardModelRecipe(cfg, data, tokenizer.pad_token_id, _shard(accelerator), sharing), data


def pair_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """Policy, reference and recipe for the pair methods: dpo / ipo / orpo / simpo."""
    data = _preference_data(cfg, tokenizer, console)
    model, reference = _preference_policy(cfg, settings, tokenizer, accelerator, init_base)
    sharing = prompt_sharing(settings.data, [model, reference.model if reference else None], data.train + data.eval)
    recipe = PairRecipe(cfg, settings, data, tokenizer.pad_token_id, reference, _shard(accelerator), sharing, rows_apart(settings.model, model))
    _reference_logps(cfg, recipe, model, data, tokenizer, accelerator, console)
    return model, recipe, data


def kto_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """Policy, reference and recipe for kto: both labels present, and each row's mismatched completion for the KL
    reference point."""
    data = _preference_data(cfg, tokenizer, console)
    desirable = sum(e["label"] for e in data.train)
    try:
        check_kto_labels(desirable, len(data.train) - desirable)
    except ValueError as exc:
        raise DataError(f"datasets: {exc}") from None
    warning = kto_imbalance_warning(desirable, len(data.train) - desirable, cfg.kto_desirable_weight, cfg.kto_undesirable_weight)
    if warning:
        console.print(f"warning: {warning}", style="yellow", soft_wrap=True, markup=False)
    assign_kl_completions(data.train)
    if data.eval:
        assign_kl_completions(data.eval)
    model, reference = _preference_policy(cfg, settings, tokenizer, accelerator, init_base)
    recipe = KTORecipe(cfg, settings, data, tokenizer.pad_token_id, reference, _shard(accelerator))
    _reference_logps(cfg, recipe, model, data, tokenizer, accelerator, console)
    return model, recipe, data


def _preference_data(cfg, tokenizer, console: Console) -> PreparedData:
    data = prepare_data(cfg, tokenizer, method_steps(cfg))
    for report in data.reports:
        if report.dropped.get("identical"):
            console.print(f"warning: {report.name}: {report.dropped['identical']} pairs have chosen == rejected "
                          "and were dropped (they carry no preference)", style="yellow", soft_wrap=True, markup=False)
    return data


def _preference_policy(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None):
    """The policy and, for the methods with a reference, its frozen initial network, on the device."""
    model = load_model(settings.model, tokenizer, accelerator.device.type, init_base_dir=init_base, with_adapter=False)
    # precomputed reference values are computed before any update (and before a checkpoint is loaded on resume): in
    # full fine-tuning the policy itself still holds the initial weights then, so no copy is needed
    model, reference = attach_with_frozen(cfg, settings.model, tokenizer, model, accelerator,
                                          need_frozen=method_spec(cfg.method).needs_reference,
                                          unchanged_policy=bool(cfg.precompute_ref_log_probs))
    if cfg.disable_dropout:
        disable_dropout(model)
        if reference is not None and reference.model is not None:
            disable_dropout(reference.model)
    if reference is not None:
        reference.to(accelerator.device)
    if not cfg.precompute_ref_log_probs:  # precomputed: the reference runs once, before training, uncompiled
        compile_frozen(settings.model, reference)
    return model, reference


def _reference_logps(cfg, recipe, model, data, tokenizer, accelerator, console: Console) -> None:
    """`precompute_ref_log_probs`: every example gets its reference log-probs now (or from an earlier run's file), and
    the recipe frees its reference."""
    if not cfg.precompute_ref_log_probs:
        return
    model.to(accelerator.device)
    identity = [cfg.base_model, cfg.revision_of_model, cfg.random_init and cfg.seed, cfg.ref_model, cfg.lora_model_dir,
                cfg.rl_adapter_ref_model, cfg.dpo_ld_alpha, cfg.method]
    with accelerator.autocast():
        precompute_or_load(recipe, model, data, tokenizer.pad_token_id, accelerator.device,
                           cfg.eval_batch_size or cfg.micro_batch_size, Path(cfg.output_dir) / "ref_logps", identity, console)
    recipe.reference = None  # every example carries its reference log-probs: free the copy


def online_rl_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """Policy, optional reference (beta > 0), reward functions and the GRPO-family recipe."""
    trl = cfg.trl
    if not trl.reward_funcs:
        raise ConfigError("trl.reward_funcs is empty: GRPO needs at least one reward function (`module.fn` in the working "
                          "directory, or a trained reward model folder)")
    make_engine, remote = engine_factory(cfg, settings, console)  # vllm_mode: colocate without vLLM stops here, before any loading
    if trl.rollout_func:  # import it and check its form now, not after the model has loaded
        load_rollout_func(trl.rollout_func, settings.rl)
    functions = load_reward_functions(trl.reward_funcs, trl.reward_weights)
    validating = settings.validation  # validation.enable's settings, else None
    own_rewards = None
    if validating is not None and validating.reward_funcs:  # loaded (and refused) before the model is
        own_rewards = load_reward_functions(list(validating.reward_funcs), list(validating.reward_weights),
                                            "validation.reward_function")
    environment, steps = None, prompt_steps(cfg)
    if settings.multi_turn.enabled:  # the tools load and the chat template is checked before any data or model
        environment, template_kwargs = tool_episodes(settings, tokenizer)
        steps = prompt_steps(cfg, template_kwargs, chat=True)
    data = nemo_gym_prompts(cfg, settings, tokenizer, console) if nemo_gym_enabled(cfg) else prepare_data(cfg, tokenizer, steps)
    sets = validation_sets(cfg, tokenizer, data.eval, steps) if validating is not None else []
    if nemo_gym_enabled(cfg) and cfg.nemo_gym_multi_turn:
        gym = settings.nemo_gym
        environment = NemoGymAgents(tokenizer.eos_token_id, gym.run_timeout, gym.max_turns, settings.rl.max_completion_length)
    model, reference = policy_and_frozen(cfg, settings.model, tokenizer, accelerator, init_base, bool(settings.rl.beta))
    compile_frozen(settings.model, reference)
    runner = RewardRunner(functions, num_workers=trl.reward_num_workers, timeout=trl.reward_timeout,
                          failure_score=trl.reward_failure_score)
    validation = None
    if validating is not None:
        own = FunctionScorer(RewardRunner(own_rewards, num_workers=trl.reward_num_workers, timeout=trl.reward_timeout,
                                          failure_score=trl.reward_failure_score), tokenizer) if own_rewards else None
        validation = Validation(sets, validating, own, cfg.eval_batch_size or 64, cfg.seed)
    sharing = group_sharing(settings.data, [model, reference.model if reference else None])
    recipe = GRPORecipe(cfg, settings, data, tokenizer, FunctionScorer(runner, tokenizer), reference, _shard(accelerator),
                        make_engine=make_engine, remote_engine=remote, environment=environment, sharing=sharing,
                        share_costs=forward_costs(model) if sharing[0] and cfg.share_prompts is None else None,
                        rows_apart=rows_apart(settings.model, model), validation=validation)
    return model, recipe, data


def tool_episodes(settings: Settings, tokenizer) -> tuple[ToolEpisodes, dict]:
    """The multi-turn environment of `trl.multi_turn_config` and the chat template arguments its prompts are rendered
    with: the tools' schemas, enable_thinking, and how the first turn opens."""
    turns = settings.multi_turn
    tools = load_tools(turns.tools)
    environment = ToolEpisodes(tokenizer, tools, turns.template_kwargs, turns.max_assistant_turns, turns.tool_timeout,
                               turns.add_generation_prompt)
    opening = {"continue_final_message": True, "add_generation_prompt": False} if turns.continue_final_message else {
        "add_generation_prompt": turns.add_generation_prompt}
    return environment, {**turns.template_kwargs, "tools": [tool.schema for tool in tools], **opening}


def nemo_gym_prompts(cfg, settings: Settings, tokenizer, console: Console):
    """Prompts from `nemo_gym_datasets` (they replace `datasets:`, as in Axolotl), routed to the resource servers the
    NeMo Gym head server names, tokenised and fitted as any prompt dataset."""
    if cfg.datasets:
        console.print("note: datasets: is replaced by nemo_gym_datasets (NeMo Gym is on), as in Axolotl", highlight=False,
                      markup=False)
    if cfg.nemo_gym_multi_turn:
        records = task_rows(settings.nemo_gym, {}, agent_servers(settings.nemo_gym.head_port))
    else:
        records = task_rows(settings.nemo_gym, resource_servers(settings.nemo_gym.head_port))
    return prepare_records(records, cfg, tokenizer, prompt_steps(cfg), "nemo_gym_datasets")


def ebft_structured_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """Structured EBFT: the frozen feature network is the initial policy (adapter disabled, the initial adapter, or a
    frozen copy); with beta > 0 it also serves the KL term."""
    make_engine, remote = engine_factory(cfg, settings, console)
    data = prepare_data(cfg, tokenizer, method_steps(cfg))
    model, frozen = policy_and_frozen(cfg, settings.model, tokenizer, accelerator, init_base, need_frozen=True)
    scorer = FeatureMatchingReward(cfg.ebft, tokenizer, frozen)
    reference = frozen if settings.rl.beta else None  # the same frozen initial policy serves the KL term
    return model, EBFTStructuredRecipe(cfg, settings, data, tokenizer, scorer, reference, _shard(accelerator), make_engine, remote), data


def ebft_strided_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """Strided EBFT: blocks generated inside each document; the frozen feature network is the initial policy."""
    data = prepare_data(cfg, tokenizer, method_steps(cfg))
    model, frozen = policy_and_frozen(cfg, settings.model, tokenizer, accelerator, init_base, need_frozen=True)
    return model, EBFTStridedRecipe(cfg, data, tokenizer, frozen, _shard(accelerator)), data


SETUPS: dict[MethodSpec, Setup] = {
    METHODS["sft"]: sft_setup,
    METHODS["dpo"]: pair_setup,
    METHODS["ipo"]: pair_setup,
    METHODS["kto"]: kto_setup,
    METHODS["orpo"]: pair_setup,
    METHODS["simpo"]: pair_setup,
    METHODS["reward_model"]: reward_model_setup,
    METHODS["grpo"]: online_rl_setup,
    METHODS["gdpo"]: online_rl_setup,
    METHODS["ebft"]: ebft_structured_setup,
    METHODS["ebft"].strided: ebft_strided_setup,
}


def setup_of(cfg) -> Setup:
    """The setup of the method this config trains (EBFT's in its mode)."""
    return SETUPS[spec_of(cfg)]
