"""`rlft train`: compose config, data, model and a recipe; print the plan, run the loop, print the summary."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from accelerate.utils import set_seed
from rich.console import Console
from transformers.integrations.neftune import neftune_post_forward_hook

from rlft.config.activation_checkpointing import checkpoints
from rlft.config.axolotl_keys import unsupported_settings
from rlft.config.parallel import deepspeed_settings, fsdp_settings, launched
from rlft.config.plugins import nemo_gym_enabled
from rlft.config.settings import Settings, resolve
from rlft.config.settings.model import ModelSettings
from rlft.data.preference import assign_kl_completions
from rlft.data.prepare import ebft_steps, preference_steps, prepare_data, prepare_records, prepare_sft_data, prompt_steps
from rlft.data.stream import prepare_streamed_sft_data
from rlft.errors import ConfigError, DataError, ModelError, NotImplementedYet
from rlft.heap import collector_paused, release_heap
from rlft.losses.preference.kto import check_kto_labels, kto_imbalance_warning
from rlft.models.base_changing import convert_folder, is_converted, rewrites_base, save_initial_adapter
from rlft.models.freeze import freeze_except
from rlft.models.frozen import FrozenPolicy
from rlft.models.loading import (attach_adapter, base_model_source, check_context_length, disable_dropout, hub_revision,
                                 load_model, load_tokenizer)
from rlft.models.reference import load_reference_model
from rlft.models.reward import load_reward_model
from rlft.models.shared_prompts import forward_costs, group_sharing, prompt_sharing, reward_sharing
from rlft.models.varlen import rows_apart
from rlft.models.compile import compile_options
from rlft.rollout.envs.nemo_gym import agent_servers, resource_servers, task_rows
from rlft.rollout.envs.nemo_gym_episodes import NemoGymAgents
from rlft.rollout.envs.nemo_gym_launch import GymServers
from rlft.rollout.feature_reward import FeatureMatchingReward
from rlft.rollout.rewards.loading import load_reward_functions
from rlft.rollout.rewards.runner import RewardRunner
from rlft.rollout.scoring import FunctionScorer
from rlft.rollout.user_rollouts import load_rollout_func
from rlft.train.best import copy_model_files, final_checkpoint
from rlft.train.engines import engine_factory, server_token
from rlft.train.loop import LoopResult, run_loop
from rlft.train.parallel import gathered_state_dict, make_accelerator
from rlft.train.recipes.ebft import EBFTStridedRecipe, EBFTStructuredRecipe
from rlft.train.recipes.grpo import GRPORecipe
from rlft.train.recipes.preference import KTORecipe, PairRecipe, precompute_or_load
from rlft.train.recipes.reward_model import RewardModelRecipe
from rlft.train.recipes.sft import SFTRecipe
from rlft.train.report import print_plan, print_summary
from rlft.train.unbuilt import refuse_unbuilt
from rlft.train.watch import SetupInterrupts

def train(cfg, console: Console | None = None) -> LoopResult:
    console = console or Console()
    refuse_unbuilt(cfg)
    strided_flex = cfg.method == "ebft" and cfg.ebft.mode == "strided" and cfg.effective_attn_implementation == "flex_attention"
    if strided_flex and not torch.cuda.is_available():  # flex_attention has no backward on a CPU
        cfg = cfg.model_copy(update={"flex_attention": False, "attn_implementation": "sdpa"})
        if launched()[0] == 0:
            console.print("note: flex_attention: strided EBFT on a CPU runs with SDPA and the identical dense block mask "
                          "(PyTorch has no flex_attention backward on a CPU)", markup=False, highlight=False)
    elif strided_flex and launched()[0] == 0:
        console.print("note: flex_attention: strided EBFT runs flex_attention with the strided rule as a BlockMask. On an "
                      "H200 it was 2.5x slower per step than SDPA with the identical dense mask (1,016 columns; "
                      "bench/results/gpu_check-H200.json): flex_attention: false is faster and trains the same",
                      markup=False, highlight=False)
    settings = resolve(cfg)
    if settings.model.offload_activations and launched()[0] == 0:
        console.print("note: activation_offloading: " + (
            "each checkpointed layer's input waits in pinned host memory from the forward to the backward"
            if torch.cuda.is_available() else "without a CUDA GPU nothing is moved (on a CPU the activations already live "
            "in host memory)"),
            markup=False, highlight=False)
    derived = unsupported_settings(cfg)[1]
    if derived and launched()[0] == 0:
        console.print(f"note: {', '.join(derived)}: values Axolotl computes for itself; rlft does not read them", markup=False)
    if (cfg.adapter and cfg.lora_dropout and cfg.rl in ("grpo", "gdpo", "ebft") and cfg.disable_dropout
            and "disable_dropout" not in cfg.model_fields_set
            and launched()[0] == 0):
        console.print(f"note: lora_dropout {cfg.lora_dropout} is off in this run: disable_dropout is true by default for "
                      f"rl: {cfg.rl} (TRL's GRPO keeps dropout on; set disable_dropout: false to keep it)", markup=False,
                      soft_wrap=True)
    try:
        with SetupInterrupts(), nemo_gym_servers(cfg, settings, console):  # servers started for this run and stopped after it
            return _train(cfg, settings, console)
    finally:
        release_heap()


def nemo_gym_servers(cfg, settings: Settings, console: Console):
    """NeMo Gym's servers for this run when `nemo_gym_auto_start` asks for them, else nothing to start."""
    if not (nemo_gym_enabled(cfg) and cfg.nemo_gym_auto_start) or launched()[0] != 0:
        return contextlib.nullcontext()
    policy = None
    if cfg.nemo_gym_multi_turn:  # the Gym model server the agents ask points at rlft's rollout server
        s = settings.rl
        policy = {"base_url": f"http://{s.server_host}:{s.server_port}/v1", "model": str(cfg.base_model),
                  "api_key": server_token(cfg, s.server_port, s.server_host) or "EMPTY"}
    return GymServers(settings.nemo_gym, console, policy)


def _setup(cfg, settings: Settings, console: Console):
    """Accelerator, tokenizer, data, model and recipe of a run (the model not yet wrapped), and the frozen init base."""
    check_context_length(settings.model)
    accelerator = make_accelerator(cfg)
    set_seed(cfg.seed)
    output_dir = Path(cfg.output_dir)
    tokenizer = load_tokenizer(settings.model)
    init_base = output_dir / "init-base" if cfg.random_init and cfg.adapter else None
    shard = (accelerator.process_index, accelerator.num_processes)

    if cfg.method == "sft":
        data = prepare_streamed_sft_data(cfg, tokenizer) if cfg.streamed else prepare_sft_data(cfg, tokenizer)
        model = load_model(settings.model, tokenizer, accelerator.device.type, init_base_dir=init_base)
        recipe = SFTRecipe(cfg, data, tokenizer.pad_token_id, shard, tokenizer if cfg.streamed else None)
    elif cfg.method == "reward_model":
        data = prepare_data(cfg, tokenizer, preference_steps("reward_model"))
        model = load_reward_model(settings.model, tokenizer, accelerator.device.type, init_base_dir=init_base)
        if cfg.disable_dropout:
            disable_dropout(model)
        sharing = reward_sharing(settings.data, model, data.train + data.eval, compile_options(settings.model) is not None)
        recipe = RewardModelRecipe(cfg, data, tokenizer.pad_token_id, shard, sharing)
    elif cfg.method in ("grpo", "gdpo"):
        model, recipe, data = online_rl_setup(cfg, settings, tokenizer, accelerator, init_base, console)
    elif cfg.method == "ebft":
        model, recipe, data = ebft_setup(cfg, settings, tokenizer, accelerator, init_base, console)
    else:
        model, recipe, data = preference_setup(cfg, settings, tokenizer, accelerator, init_base, console)
    return accelerator, tokenizer, model, recipe, data, init_base


def _train(cfg, settings: Settings, console: Console) -> LoopResult:
    with collector_paused():  # the model and its data: no garbage to find (rlft/heap.py)
        accelerator, tokenizer, model, recipe, data, init_base = _setup(cfg, settings, console)
    if cfg.unfrozen_parameters:
        freeze_unmatched(cfg, model, console if accelerator.is_main_process else None)
    if cfg.neftune_noise_alpha:  # NEFTune: transformers' hook, so the noise is the one its Trainer (and Axolotl) adds
        embeddings = model.get_input_embeddings()
        embeddings.neftune_noise_alpha = cfg.neftune_noise_alpha
        embeddings.register_forward_hook(neftune_post_forward_hook)
    output_dir = Path(cfg.output_dir)
    if cfg.adapter:  # record where the frozen base lives, so the saved adapter loads on it
        base = str(init_base.resolve()) if init_base else base_model_source(settings.model)
        model.peft_config["default"].base_model_name_or_path = base
        model.peft_config["default"].revision = hub_revision(settings.model, base).get("revision")  # online: the hub id's revision
    sharded = shards_parameters(cfg, accelerator)
    init_adapter = save_initial_adapter(model, output_dir) if accelerator.is_main_process else None

    if accelerator.is_main_process:
        print_plan(console, cfg, settings.model, model, data, len(recipe.train_plan), accelerator, recipe.draws_per_step, recipe.plan_rows,
                   sharded)
        if compile_options(settings.model) is not None:
            engine = cfg.method in ("grpo", "gdpo") or (cfg.method == "ebft" and cfg.ebft.mode != "strided")
            decode = ("; the rollout engine decodes with a static KV cache and a compiled step" if engine and not
                      cfg.trl.use_vllm else "")
            console.print(f"note: torch_compile: the training forward is compiled{decode}; the first steps compile (seconds "
                          "to a minute), then run faster", markup=False)
    try:
        result = run_loop(cfg, recipe, model, tokenizer, accelerator, console)
    finally:
        recipe.close()  # reward worker processes, engines
    for warning in recipe.final_warnings():
        console.print(f"WARNING: {warning}", style="bold red", markup=False, soft_wrap=True)
    weights = gathered_state_dict(model)  # sharded over processes: gathered (a collective)
    if accelerator.is_main_process:
        warn = lambda message: console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)  # noqa: E731
        result.final_from = final_checkpoint(result.state, output_dir, warn)  # load_best_model_at_end, when not the last
        if result.final_from is not None:
            copy_model_files(result.final_from / "model", output_dir)  # as that checkpoint saved it (PiSSA's converted)
            if init_adapter is not None and not is_converted(output_dir):  # a checkpoint that kept the adapter unconverted
                convert_folder(output_dir, init_adapter)
        else:
            model.save_pretrained(output_dir, safe_serialization=True, state_dict=weights)
            tokenizer.save_pretrained(output_dir)
            if init_adapter is not None:  # PiSSA/OLoRA: a plain LoRA that loads on the original base
                convert_folder(output_dir, init_adapter)
        print_summary(console, cfg, result)
    return result


def evaluate(cfg, console: Console | None = None) -> dict[str, float]:
    """`rlft evaluate`: the eval metrics of the config's model (base_model: point it at a trained output or a
    checkpoint's model/ folder) on its eval data, with no training and nothing written. One process."""
    console = console or Console()
    refuse_unbuilt(cfg)
    if launched()[1] > 1:
        raise NotImplementedYet("rlft evaluate runs in one process: start it without a launcher")
    settings = resolve(cfg)
    with nemo_gym_servers(cfg, settings, console):
        accelerator, _, model, recipe, _, _ = _setup(cfg, settings, console)
        if not recipe.eval_batches:
            raise ConfigError("nothing to evaluate: give eval data with val_set_size or test_datasets")
        try:
            recipe.before_wrap(model)
            model = model.to(accelerator.device).eval()
            recipe.start(model)
            with torch.no_grad(), accelerator.autocast():
                batches = [{k: v.to(accelerator.device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                           for b in recipe.eval_batches]
                result = recipe.evaluate(model, batches)
        finally:
            recipe.close()
    for key, value in result.items():
        console.print(f"{key:<28} {value:.6g}", markup=False, highlight=False)
    return result


def preference_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """Policy, reference and recipe for dpo / ipo / kto / orpo / simpo."""
    method = cfg.method
    data = prepare_data(cfg, tokenizer, preference_steps(method))
    for report in data.reports:
        if report.dropped.get("identical"):
            console.print(f"warning: {report.name}: {report.dropped['identical']} pairs have chosen == rejected "
                          "and were dropped (they carry no preference)", style="yellow", soft_wrap=True, markup=False)
    if method == "kto":
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

    model = load_model(settings.model, tokenizer, accelerator.device.type, init_base_dir=init_base, with_adapter=False)
    # precomputed reference values are computed before any update (and before a checkpoint is loaded on resume): in
    # full fine-tuning the policy itself still holds the initial weights then, so no copy is needed
    model, reference = attach_with_frozen(cfg, settings.model, tokenizer, model, accelerator, need_frozen=method in ("dpo", "ipo", "kto"),
                                          unchanged_policy=bool(cfg.precompute_ref_log_probs))
    if cfg.disable_dropout:
        disable_dropout(model)
        if reference is not None and reference.model is not None:
            disable_dropout(reference.model)
    if reference is not None:
        reference.to(accelerator.device)
    shard = (accelerator.process_index, accelerator.num_processes)
    if method == "kto":
        recipe = KTORecipe(cfg, data, tokenizer.pad_token_id, reference, shard)
    else:
        sharing = prompt_sharing(settings.data, [model, reference.model if reference else None], data.train + data.eval)
        recipe = PairRecipe(cfg, data, tokenizer.pad_token_id, reference, shard, sharing, rows_apart(settings.model, model))
    if cfg.precompute_ref_log_probs:
        model.to(accelerator.device)
        identity = [cfg.base_model, cfg.revision_of_model, cfg.random_init and cfg.seed, cfg.ref_model, cfg.lora_model_dir,
                    cfg.rl_adapter_ref_model, cfg.dpo_ld_alpha, method]
        with accelerator.autocast():
            precompute_or_load(recipe, model, data, tokenizer.pad_token_id, accelerator.device,
                               cfg.eval_batch_size or cfg.micro_batch_size, Path(cfg.output_dir) / "ref_logps", identity, console)
        recipe.reference = None  # every example carries its reference log-probs: free the copy
    return model, recipe, data


def shards_parameters(cfg, accelerator) -> bool:
    """Whether the processes hold shards of the parameters (FSDP2 on several processes, DeepSpeed ZeRO-3)."""
    return (fsdp_settings(cfg) is not None and accelerator.num_processes > 1) or getattr(deepspeed_settings(cfg), "stage", 0) == 3


def keeps_initial_adapter(cfg, model_settings: ModelSettings, accelerator) -> bool:
    """Whether the frozen network is the policy with its adapter's initial tensors (FrozenPolicy.initial_trainables):
    an adapter whose init rewrote the base (PiSSA, OLoRA) with whole parameters, rather than a copy of the model.
    Sharded parameters live in the sharding's own tensors, which a view cannot swap: those keep the copy."""
    return (bool(cfg.adapter) and not cfg.rl_adapter_ref_model and rewrites_base(model_settings.adapter)
            and not shards_parameters(cfg, accelerator))


def attach_with_frozen(cfg, model_settings: ModelSettings, tokenizer, model, accelerator, *, need_frozen: bool,
                       unchanged_policy: bool = False):
    """The model with its adapter attached (where the config has one) and, when `need_frozen`, the frozen network of its
    initial weights: `ref_model`; the policy with its adapter disabled (no second model; PiSSA's and OLoRA's would be
    the residual base), or with its initial adapter for those (`keeps_initial_adapter`); the policy itself in full
    fine-tuning when `unchanged_policy` (read before any update); else a frozen copy, taken before the adapter."""
    initial = need_frozen and not cfg.ref_model and keeps_initial_adapter(cfg, model_settings, accelerator)
    frozen = None
    if need_frozen and not initial:
        if cfg.ref_model:
            frozen = FrozenPolicy(load_reference_model(model_settings, tokenizer, model))
        elif cfg.adapter and not cfg.rl_adapter_ref_model and not rewrites_base(model_settings.adapter):
            frozen = FrozenPolicy.adapter_disabled()
        elif unchanged_policy and not cfg.adapter:
            frozen = FrozenPolicy(model)
        else:
            frozen = FrozenPolicy.copy_of(model)
    if cfg.adapter:
        model = attach_adapter(model, model_settings)
        if initial:
            frozen = FrozenPolicy.initial_trainables(model)
    return model, frozen


def policy_and_frozen(cfg, model_settings: ModelSettings, tokenizer, accelerator, init_base: Path | None,
                      need_frozen: bool):
    """The trainable policy (adapter attached, dropout off) and, when `need_frozen`, a frozen network of the
    initial weights (`attach_with_frozen`), both on the device."""
    model = load_model(model_settings, tokenizer, accelerator.device.type, init_base_dir=init_base, with_adapter=False)
    model, frozen = attach_with_frozen(cfg, model_settings, tokenizer, model, accelerator, need_frozen=need_frozen)
    if cfg.disable_dropout:
        disable_dropout(model)
    model.to(accelerator.device)
    if frozen is not None:
        frozen.to(accelerator.device)
    return model, frozen


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
    data = nemo_gym_prompts(cfg, settings, tokenizer, console) if nemo_gym_enabled(cfg) else prepare_data(cfg, tokenizer, prompt_steps(cfg))
    environment = None
    if nemo_gym_enabled(cfg) and cfg.nemo_gym_multi_turn:
        gym = settings.nemo_gym
        environment = NemoGymAgents(tokenizer.eos_token_id, gym.run_timeout, gym.max_turns, settings.rl.max_completion_length)
    model, reference = policy_and_frozen(cfg, settings.model, tokenizer, accelerator, init_base, bool(settings.rl.beta))
    runner = RewardRunner(functions, num_workers=trl.reward_num_workers, timeout=trl.reward_timeout,
                          failure_score=trl.reward_failure_score)
    shard = (accelerator.process_index, accelerator.num_processes)
    sharing = group_sharing(settings.data, [model, reference.model if reference else None])
    recipe = GRPORecipe(cfg, data, tokenizer, FunctionScorer(runner, tokenizer), reference, shard, make_engine=make_engine,
                        remote_engine=remote, environment=environment, sharing=sharing,
                        share_costs=forward_costs(model) if sharing[0] and cfg.share_prompts is None else None,
                        rows_apart=rows_apart(settings.model, model))
    return model, recipe, data


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


def ebft_setup(cfg, settings: Settings, tokenizer, accelerator, init_base: Path | None, console: Console):
    """EBFT: the frozen feature network is the initial policy (adapter disabled, the initial adapter, or a frozen copy)."""
    make_engine, remote = engine_factory(cfg, settings, console) if cfg.ebft.mode == "structured" else (None, False)
    data = prepare_data(cfg, tokenizer, ebft_steps(cfg))
    model, frozen = policy_and_frozen(cfg, settings.model, tokenizer, accelerator, init_base, need_frozen=True)
    shard = (accelerator.process_index, accelerator.num_processes)
    if cfg.ebft.mode == "strided":
        return model, EBFTStridedRecipe(cfg, data, tokenizer, frozen, shard), data
    scorer = FeatureMatchingReward(cfg.ebft, tokenizer, frozen)
    reference = frozen if settings.rl.beta else None  # the same frozen initial policy serves the KL term
    return model, EBFTStructuredRecipe(cfg, data, tokenizer, scorer, reference, shard, make_engine, remote), data


def freeze_unmatched(cfg, model, console: Console | None) -> None:
    """`unfrozen_parameters`: freeze the parameters no pattern matches (rlft.models.freeze); warn of patterns that
    match none."""
    try:
        frozen = freeze_except(model, cfg.unfrozen_parameters)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if checkpoints(cfg):  # frozen embeddings: reentrant checkpointing needs inputs that require grad
        model.enable_input_require_grads()
    if console is not None:
        for text in frozen.unmatched:
            console.print(f"warning: unfrozen_parameters {text!r} matches no parameter name (a dot is a literal dot, and a "
                          "pattern matches from the start of the name)", style="yellow", markup=False, soft_wrap=True)
