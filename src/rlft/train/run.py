"""`rlft train`: compose config, data, model and a recipe; print the plan, run the loop, print the summary."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from accelerate.utils import set_seed
from rich.console import Console

from rlft.config.activation_checkpointing import checkpoints
from rlft.config.axolotl_keys import unsupported_settings
from rlft.config.methods import spec_of
from rlft.config.parallel import launched
from rlft.config.plugins import nemo_gym_enabled
from rlft.config.settings import Settings, resolve
from rlft.errors import ConfigError, ModelError, NotImplementedYet
from rlft.heap import collector_paused, release_heap
from rlft.models.base_changing import convert_folder, is_converted, save_initial_adapter
from rlft.models.freeze import freeze_except
from rlft.models.loading import base_model_source, check_context_length, hub_revision, load_tokenizer
from rlft.rollout.envs.nemo_gym_launch import GymServers
from rlft.train.best import copy_model_files, final_checkpoint
from rlft.train.engines import server_token
from rlft.train.methods import setup_of
from rlft.train.trainer import LoopResult, Trainer
from rlft.train.parallel import gathered_state_dict, make_accelerator, precision
from rlft.train.peak import device_peak
from rlft.train.policy import shards_parameters
from rlft.train.report import print_plan, print_summary
from rlft.train.unbuilt import refuse_unbuilt
from rlft.train.watch import SetupInterrupts


def train(cfg, console: Console | None = None) -> LoopResult:
    console = console or Console()
    refuse_unbuilt(cfg)
    strided_flex = spec_of(cfg).strided_blocks and cfg.effective_attn_implementation == "flex_attention"
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
    main = settings.parallel.rank == 0
    if settings.model.offload_activations and main:
        console.print("note: activation_offloading: " + (
            "each checkpointed layer's input waits in pinned host memory from the forward to the backward"
            if torch.cuda.is_available() else "without a CUDA GPU nothing is moved (on a CPU the activations already live "
            "in host memory)"),
            markup=False, highlight=False)
    derived = unsupported_settings(cfg)[1]
    if derived and main:
        console.print(f"note: {', '.join(derived)}: values Axolotl computes for itself; rlft does not read them", markup=False)
    if (cfg.adapter and cfg.lora_dropout and spec_of(cfg).generates and cfg.disable_dropout
            and "disable_dropout" not in cfg.model_fields_set and main):
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
    if not (nemo_gym_enabled(cfg) and cfg.nemo_gym_auto_start) or settings.parallel.rank != 0:
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
    set_seed(settings.run.seed)
    output_dir = Path(cfg.output_dir)
    tokenizer = load_tokenizer(settings.model)
    init_base = output_dir / "init-base" if cfg.random_init and cfg.adapter else None
    model, recipe, data = setup_of(cfg)(cfg, settings, tokenizer, accelerator, init_base, console)
    return accelerator, tokenizer, model, recipe, data, init_base


def _train(cfg, settings: Settings, console: Console) -> LoopResult:
    with collector_paused():  # the model and its data: no garbage to find (rlft/heap.py)
        accelerator, tokenizer, model, recipe, data, init_base = _setup(cfg, settings, console)
    if cfg.unfrozen_parameters:
        freeze_unmatched(cfg, model, console if accelerator.is_main_process else None)
    if cfg.neftune_noise_alpha:  # NEFTune: transformers' hook, so the noise is the one its Trainer (and Axolotl) adds
        from transformers.integrations.neftune import neftune_post_forward_hook  # NEFTune runs only

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
    peak = device_peak(accelerator.device, precision(cfg, accelerator), cfg.mfu_peak_flops)  # each process: its own device

    if accelerator.is_main_process:
        print_plan(console, cfg, settings, model, data, len(recipe.train_plan), accelerator, recipe.draws_per_step, recipe.plan_rows,
                   sharded, peak)
    try:
        result = Trainer(cfg, settings, recipe, model, tokenizer, accelerator, console, peak).run()
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
        print_summary(console, cfg, result, peak)
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
            raise ConfigError("nothing to evaluate: give eval data with val_set_size or test_datasets (online RL: or "
                              "validation.datasets)")
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
