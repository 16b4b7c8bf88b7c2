"""The one training loop. It knows no algorithm: a recipe (train/recipe.py) turns a micro-batch into a
LossOutput (loss sum, loss units, metrics).

Gradient accumulation is done here, not by accelerate: each micro-batch's loss *sum* is backpropagated
and the accumulated gradient is divided by the loss units (target tokens, pairs, ...) of the whole
accumulation window, so it equals the gradient of one large batch whatever the split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlft.config.best_model import has_eval_set
from rlft.config.parallel import deepspeed_settings, fsdp_settings
from rlft.config.settings.model import model_settings
from rlft.errors import RolloutError, TrainingDiverged, TrainingInterrupted
from rlft.data.batches import PlanCursor, StepBatches
from rlft.train.checkpoint import (TrainState, agreed_resume, changed_learning_rate, checkpoint_problem, load_checkpoint,
                                   load_weights, read_state, save_checkpoint)
from rlft.train.checkpoint_folders import clean_staging, set_aside_earlier_run, set_aside_later_checkpoints
from rlft.train.metrics import MetricsLog, PhaseTimer, clock, flop_parameters, flops_per_token, peak_flops, peak_memory_mb
from rlft.train.optim import (advance_schedule, build_optimizer, build_scheduler, optimizer_mode, step_was_skipped,
                              stepping_optimizer)
from rlft.models import varlen
from rlft.models.base_changing import INIT_FOLDER, changes_base, resume_weights
from rlft.models.qat import fake_quant_schedule
from rlft.models.compile import RECOMPILE_LIMIT, compile_options
from rlft.train import zero
from rlft.train.best import BestCheckpoint, check_logged_metric
from rlft.train.parallel import (gradient_sync, max_across, mean_metrics, precision, shard_model, sum_across,
                                 trains_in_bf16, unused_parameters_named)
from rlft.train.recipe import Recipe
from rlft.train.step_counts import (continue_position, epochs_steps, plan_batches, schedules, steps_per_epoch, total_steps_for,
                                    total_steps_resumed)
from rlft.train.watch import RunGuards, StopRequest


@dataclass
class LoopResult:
    state: TrainState
    checkpoint: Path | None
    wall_time: float
    history: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0  # time.perf_counter() when the loop began and ended, for callers that time the set-up
    ended_at: float = 0.0
    save_time: float = 0.0  # seconds spent writing checkpoints
    recipe: Any = None  # the recipe that ran (its plan and state), for tools that inspect a finished run
    final_from: Path | None = None  # load_best_model_at_end: the checkpoint the final model's weights came from


class _StopAfterStep(Exception):
    """Ctrl-C was noted and the step in progress has finished: save and stop."""


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def wrap(cfg, model, accelerator, console: Console):
    """The model as the processes train it (as it is, DDP, sharded with FSDP2, or a DeepSpeed engine) and its
    optimizer."""
    ds = deepspeed_settings(cfg)
    if ds is not None:  # also on one process: the same engine, so that runs compare across process counts
        return zero.initialize(ds, cfg, model, build_optimizer(cfg, model), accelerator.num_processes, trains_in_bf16(cfg))
    settings = fsdp_settings(cfg)
    if settings is not None and accelerator.is_main_process:
        for note in settings.notes if accelerator.num_processes > 1 else ("fsdp with one process: nothing to shard",):
            console.print(f"note: {note}", markup=False, highlight=False)
    if settings is None or accelerator.num_processes == 1:
        return accelerator.prepare(model, build_optimizer(cfg, model))
    shard_model(model.to(accelerator.device), settings)
    return model, accelerator.prepare(build_optimizer(cfg, model))


def compiled_forward(cfg, model):
    """`torch_compile`: the trained model behind `torch.compile` (inductor; shapes that vary between batches make it
    compile a dynamic graph after the second one), else the model itself. Checkpoints, gradient sync and weight
    pushes keep using the model. Short rows on a CPU attend through SDPA's math path (`rlft.models.varlen`), unless
    the mode autotunes GEMMs."""
    options = compile_options(model_settings(cfg))
    if options is None:
        return model
    varlen.install()
    mode, backend = options
    # torch._inductor is imported only for torch_compile (seconds)
    from torch._inductor import config as inductor  # TORCHINDUCTOR_MAX_AUTOTUNE(_GEMM)=1 autotunes without a mode
    from torch._inductor import list_mode_options

    varlen.SHORT_ROWS_MATH = not (list_mode_options(mode or "default").get("max_autotune") or inductor.max_autotune
                                  or inductor.max_autotune_gemm)
    return torch.compile(model, backend=backend, mode=mode, recompile_limit=RECOMPILE_LIMIT)


def run_loop(cfg, recipe: Recipe, model, tokenizer, accelerator, console: Console) -> LoopResult:
    output_dir = Path(cfg.output_dir)
    main = accelerator.is_main_process
    if main:
        clean_staging(output_dir)
    accelerator.wait_for_everyone()
    plan = recipe.train_plan
    total_steps = total_steps_for(cfg, len(plan), recipe.draws_per_step)
    epoch_steps = steps_per_epoch(cfg, len(plan), recipe.draws_per_step)
    eval_every, save_every = schedules(cfg, epoch_steps)
    world = accelerator.num_processes
    warn = (lambda message: console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)) if main else None
    resume_from = agreed_resume(cfg.resume_from_checkpoint, output_dir, warn)
    if resume_from is not None:  # the weights go in before the model is wrapped or sharded
        load_weights(accelerator.unwrap_model(model), resume_weights(resume_from))
        total_steps = total_steps_resumed(cfg, recipe, read_state(resume_from), world, total_steps)
    recipe.before_wrap(model)
    model, optimizer = wrap(cfg, model, accelerator, console)
    deepspeed = zero.is_deepspeed(model)
    stepping = stepping_optimizer(optimizer)  # without accelerate's wrapper where it adds nothing (ZeRO's: as it is)
    scheduler = build_scheduler(cfg, optimizer.optimizer if deepspeed else stepping, total_steps,
                                epochs_steps(cfg, len(plan), recipe.draws_per_step))  # Axolotl's warm-up counts these
    unwrapped = accelerator.unwrap_model(model)
    runs = compiled_forward(cfg, model)  # what the recipe calls: the model, or (torch_compile) its compiled forward
    initial = output_dir / INIT_FOLDER if changes_base(unwrapped) else None  # PiSSA, OLoRA: checkpoints convert the adapter

    state = TrainState(total_steps=total_steps, world_size=world, plan_batches=plan_batches(recipe))
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scheduler, getattr(accelerator, "scaler", None))
        state.total_steps = total_steps
        recipe.load_state_dict(state.recipe_state)
        recipe.load_files(resume_from)
        note = changed_learning_rate(resume_from, scheduler) + continue_position(cfg, state, recipe, world)
        console.print(f"[bold]Resumed[/] from {resume_from} at step {state.global_step}{note}")
    elif cfg.resume_from_checkpoint == "auto":
        console.print(f"resume_from_checkpoint: auto found no complete checkpoint in {output_dir}; starting fresh")

    guards = RunGuards(cfg, state.guards)
    if resume_from is not None and guards.stopped_early():  # e.g. a requeue script that always resumes with `auto`
        console.print(f"{resume_from} is where this run stopped early ({guards.key} had not improved on {guards.best:.4f} for "
                      f"{guards.stale} evaluations): nothing more to train")
        total_steps = state.global_step
    elif resume_from is not None and state.global_step >= total_steps:
        console.print(f"{resume_from} (step {state.global_step}) is at or past this run's last step ({total_steps}): nothing "
                      "more to train")
    # a finished run resumed (a requeue script that always resumes): its final evaluation and checkpoint exist already
    finished = resume_from is not None and state.global_step >= total_steps and (
        any(key.startswith("eval/") for key in state.last_metrics) or not has_eval_set(cfg) or cfg.eval_strategy == "no")
    # load_best_model_at_end, save_strategy: best; a best of another folder's run is not one of this folder's checkpoints
    moved = resume_from is not None and resume_from.parent.resolve() != output_dir.resolve()
    best = BestCheckpoint(cfg, None if moved else state.best)
    log = MetricsLog(cfg, output_dir, enabled=main)
    if resume_from is not None:  # every process, before the log is cut back: a refused resume changes nothing
        check_logged_metric(cfg, log.path)
    if main and resume_from is None and (aside := set_aside_earlier_run(output_dir)):  # with its metrics.jsonl
        resumable = any(checkpoint_problem(path) is None for path in aside.glob("checkpoint-*"))
        console.print(f"note: {output_dir} held an earlier run's checkpoints: moved to {aside} ("
                      + ("to go on with that run, resume from there)" if resumable else
                         "they cannot resume: a new run can start from their weights)"), markup=False, soft_wrap=True)
    elif main and resume_from is not None:  # what was logged after the checkpoint is trained again: log it once
        if not moved and (aside := set_aside_later_checkpoints(output_dir, state.global_step)):
            console.print(f"note: {output_dir} held checkpoints after step {state.global_step}, the continuation this run "
                          f"replaces: moved to {aside}, with the logs as they were", markup=False, soft_wrap=True)
        log.truncate_after(state.global_step)
    if main and resume_from is None and log.path.exists():  # a run that saved nothing: keep its log aside, do not mix
        log.path.rename(log.path.with_name("metrics.previous.jsonl"))
    timer = PhaseTimer()
    total_params, trainable_params = flop_parameters(unwrapped)
    peak = peak_flops(accelerator.device, precision(cfg, accelerator), cfg.mfu_peak_flops) * accelerator.num_processes
    params = [p for p in model.parameters() if p.requires_grad]
    ga = cfg.gradient_accumulation_steps
    history: list[dict[str, Any]] = []
    early: dict[str, float] | None = None  # the evaluation that stopped the run early (early_stopping_patience)
    last_saved: Path | None = None
    started = time.perf_counter()
    save_time = 0.0
    cursor = PlanCursor(plan, state.epoch, state.batch_in_epoch)  # the data position of recipes that do not draw their own
    # on a GPU the next step's batches collate while this one computes; on a CPU that would take the step's own cores
    steps = StepBatches(cursor, ga, ahead=accelerator.device.type != "cpu")
    recipe.start(unwrapped)
    fake_quant = fake_quant_schedule(cfg.qat)  # qat.fake_quant_after_n_steps
    fake_quant(unwrapped, state.global_step)  # also for the baseline evaluation

    def next_batches() -> list[dict[str, Any]]:
        began = clock()
        batches = recipe.prepare_step(runs)
        if batches is not None:  # the recipe built the step (online RL: generate, score, log-probs)
            timer.totals[recipe.prepare_phase] = timer.totals.get(recipe.prepare_phase, 0.0) + clock() - began
        else:
            with timer("data"):
                batches, (state.epoch, state.batch_in_epoch) = steps.next()
        return [_to_device(b, accelerator.device) for b in batches]

    def save(training_after: bool = True) -> Path | None:
        nonlocal last_saved, save_time
        local = [p.to_local() if hasattr(p, "to_local") else zero.local_values(p) for p in params]
        if sum_across([float(any(not torch.isfinite(values).all() for values in local))], accelerator.device)[0]:
            raise TrainingDiverged(f"the weights hold NaN or inf after step {state.global_step}{last_good()}. Lower "
                                   "learning_rate and keep max_grad_norm set")
        state.recipe_state = recipe.state_dict()
        state.guards = guards.state_dict()
        best.saving(state.global_step)
        state.best = best.state_dict()
        began = time.perf_counter()
        optimizer_mode(optimizer, training=False)  # schedule-free: the averaged weights are the ones to keep
        with timer("save"):
            last_saved = save_checkpoint(output_dir, state, model, tokenizer, optimizer, scheduler, cfg.save_total_limit,
                                         recipe.save_files, getattr(accelerator, "scaler", None), recipe.saved_files_bytes(),
                                         best.folder(output_dir), model_only=cfg.save_only_model, initial_adapter=initial)
        if training_after:
            optimizer_mode(optimizer, training=True)
        save_time += time.perf_counter() - began
        return last_saved

    def last_good() -> str:
        latest = last_saved or resume_from
        return f"; the last good checkpoint is {latest}" if latest else "; no checkpoint was saved"

    def show_messages() -> None:
        for message in recipe.messages():
            if main:
                console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)
        for line in recipe.reports():
            if main:
                console.print(line, markup=False, highlight=False, soft_wrap=True)

    def evaluate() -> dict[str, float]:
        if not recipe.eval_batches or cfg.eval_strategy == "no":
            return {}
        model.eval()
        optimizer_mode(optimizer, training=False)
        with torch.no_grad(), accelerator.autocast():
            result = recipe.evaluate(runs, [_to_device(b, accelerator.device) for b in recipe.eval_batches])
        model.train()
        optimizer_mode(optimizer, training=True)
        best.note(state.global_step, result)
        guards.check(result)
        if main:
            log.write(state.global_step, result)
            history.append({"step": state.global_step, **result})
            console.print(f"step {state.global_step}/{total_steps} | " + " | ".join(f"{k} {v:.4f}" for k, v in result.items()))
        return result

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, disable=not (main and console.is_terminal),
    )
    task = progress.add_task(recipe.name, total=total_steps, completed=state.global_step, info="")
    stop = StopRequest(world, announce=main)
    try:
        if state.global_step == 0:
            evaluate()  # the baseline, so the summary and metrics.jsonl show how far training moved it
        model.train()
        optimizer_mode(optimizer, training=True)
        with progress:
            while state.global_step < total_steps:
                if world == 1 and stop.requested:  # Ctrl-C during an evaluation or a save
                    raise _StopAfterStep
                step_start = time.perf_counter()
                fake_quant(unwrapped, state.global_step)
                batches = next_batches()
                units, loss_total, step_metrics, tokens, computed, scale = 0.0, 0.0, {}, 0, 0, None
                lr = scheduler.get_last_lr()[0]
                counted = [b for b in batches if not b.get("padding")]
                for index, batch in enumerate(batches):
                    weight = 0.0 if batch.get("padding") else 1.0  # a padding batch keeps collectives in step, adds nothing
                    with timer("forward_backward"), gradient_sync(model, index == len(batches) - 1):
                        with accelerator.autocast(), unused_parameters_named():
                            out = recipe.loss(runs, batch)
                        # backward at the size of a mean (the first micro-batch's units, the largest over ranks: every
                        # rank must scale alike), not of a sum: fp16 scalers stay in range
                        scale = scale or max_across(max(float(out.units), 1.0), accelerator.device)
                        if deepspeed:
                            zero.backward(model, out.loss_sum * (weight / scale), last=index == len(batches) - 1)
                        else:
                            accelerator.backward(out.loss_sum * (weight / scale))
                    if not weight:
                        continue
                    units += out.units
                    loss_total += float(out.loss_sum.detach())
                    tokens += int(batch["num_tokens"])
                    computed += int(batch.get("model_tokens", batch["num_tokens"]))  # a shared prompt once (MFU)
                    for key, value in out.metrics.items():  # phase times add up over micro-batches, the rest average
                        share = value if key.startswith("time/") else value / len(counted)
                        step_metrics[key] = step_metrics.get(key, 0.0) + share
                units, loss_total, tokens, computed, stopping = sum_across(
                    [units, loss_total, tokens, computed, float(stop.requested)], accelerator.device)
                tokens = int(tokens)
                step_metrics = mean_metrics(step_metrics)
                loss_value = loss_total / max(units, 1)
                show_messages()
                breakdown = guards.loss_breakdown(loss_value)
                if breakdown or not math.isfinite(loss_value):
                    raise TrainingDiverged(
                        f"{breakdown} (step {state.global_step + 1}){last_good()}" if breakdown else
                        f"loss is {loss_value} at step {state.global_step + 1}{last_good()}. Lower learning_rate, "
                        "keep max_grad_norm set, or check the data for empty targets"
                    )
                with timer("optimizer"):
                    if batches:
                        # sum over the window (and ranks) -> mean per loss unit; DDP and FSDP average the gradients
                        # over ranks, so multiply by the rank count: every rank steps with one large batch's gradient
                        factor = scale * accelerator.num_processes / max(units, 1.0)
                        if deepspeed:  # DeepSpeed scales, clips and updates in one call
                            grad_norm = zero.step(model, factor)
                        else:
                            if factor != 1.0:  # one micro-batch on one process: the sum is already the mean's scale
                                for param in params:
                                    if param.grad is not None:
                                        param.grad.mul_(factor)
                            max_norm = cfg.max_grad_norm if cfg.max_grad_norm else float("inf")
                            norm = accelerator.clip_grad_norm_(params, max_norm)
                            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: a DTensor
                        if not math.isfinite(grad_norm) and accelerator.mixed_precision != "fp16":  # fp16: the scaler skips
                            applied = "DeepSpeed applied the step" if deepspeed else "the step was not applied"
                            raise TrainingDiverged(f"the gradient norm is {grad_norm} at step {state.global_step + 1} "
                                                   f"({applied}){last_good()}. Lower learning_rate, keep max_grad_norm "
                                                   "set, or check the data")
                        if not deepspeed:
                            stepping.step()
                        skipped = step_was_skipped(optimizer)
                    else:  # the recipe skipped this step (e.g. no learning signal): no update at all
                        grad_norm, skipped = 0.0, False
                    if not skipped:  # fp16's scaler skipped an overflowing step: the schedule waits, as in transformers
                        advance_schedule(scheduler, updated=bool(batches))
                    stepping.zero_grad(set_to_none=True)
                state.global_step += 1
                state.tokens_seen += tokens
                recipe.after_optimizer_step(unwrapped, state.global_step)
                step_time = time.perf_counter() - step_start
                record = {
                    "loss": round(loss_value, 6),
                    "learning_rate": lr,
                    "grad_norm": round(grad_norm, 6),
                    "epoch": round(recipe.epochs_done(cursor.epochs_at(state.epoch, state.batch_in_epoch)), 4),
                    "tokens": tokens,
                    "tokens_per_s": round(tokens / step_time, 1),  # trained tokens (for RL: prompt + completion rows)
                    "step_time_s": round(step_time, 4),
                    "mfu": round(computed * flops_per_token(total_params, trainable_params) / step_time / peak, 5),
                    "peak_memory_mb": round(peak_memory_mb(accelerator.device), 1),
                    **{k: round(v, 6) for k, v in step_metrics.items()},
                    **recipe.step_metrics(),
                    **timer.pop(),
                }
                state.last_metrics = record
                if main and (state.global_step % cfg.logging_steps == 0 or state.global_step == total_steps):
                    log.write(state.global_step, record)
                    history.append({"step": state.global_step, **record})
                    info = f"loss {loss_value:.4f} | lr {lr:.2e} | {record['tokens_per_s']:.0f} tok/s"
                    progress.update(task, info=info)
                    if not console.is_terminal:
                        console.print(f"step {state.global_step}/{total_steps} | {info} | grad_norm {grad_norm:.3f}", markup=False,
                                      highlight=False)
                progress.update(task, completed=state.global_step)
                show_messages()
                if eval_every and state.global_step % eval_every == 0 and state.global_step < total_steps:
                    if guards.stop_early(results := evaluate()):
                        if main:
                            console.print(f"early stopping at step {state.global_step}: {guards.key} has not improved on "
                                          f"{guards.best:.4f} for {guards.stale} evaluations (early_stopping_patience)")
                        early = results  # the run's final evaluation: not run (and logged) twice
                        break
                if ((save_every and state.global_step % save_every == 0) or best.save_now(state.global_step)) and \
                        state.global_step < total_steps:
                    if best.needs_eval(state.global_step):  # load_best_model_at_end chooses among evaluated checkpoints
                        evaluate()
                    save()
                # with several processes: the same sum on every one; at the last step the run ends as it would anyway
                if (stopping or (world == 1 and stop.requested)) and state.global_step < total_steps:
                    raise _StopAfterStep
        if finished:
            checkpoint = resume_from if not moved else save(training_after=False) if cfg.save_strategy != "no" else None
        else:
            final_eval = early if early is not None else evaluate()
            state.last_metrics.update(final_eval)
            checkpoint = save(training_after=False) if cfg.save_strategy != "no" else None
        optimizer_mode(optimizer, training=False)  # the final model: a schedule-free optimizer's averaged weights
    except _StopAfterStep:
        done = last_saved is not None and last_saved.name == f"checkpoint-{state.global_step}"
        saved = (last_saved if done else save()) if state.global_step > 0 else None
        log.close()
        resume = ("its weights only (save_only_model: true): a new run can start from them, none can resume"
                  if cfg.save_only_model else "resume with --resume_from_checkpoint=auto")
        where = f"checkpoint saved to {saved}; {resume}" if saved else "no step had finished, nothing to save"
        raise TrainingInterrupted(f"interrupted at step {state.global_step}/{total_steps}: {where}") from None
    except RolloutError as exc:  # a rollout server that died: keep the steps trained since the last checkpoint
        if world > 1 or state.global_step == 0 or cfg.save_only_model:
            raise
        done = last_saved is not None and last_saved.name == f"checkpoint-{state.global_step}"
        recipe.engine_lost()
        saved = last_saved if done else save()
        log.close()
        raise RolloutError(f"{exc}\nthe {state.global_step} steps trained are saved in {saved}: resume with "
                           "--resume_from_checkpoint=auto once it answers again (the rollouts in flight are sampled "
                           "again)") from None
    except KeyboardInterrupt:  # a second Ctrl-C: at once, mid-step
        log.close()
        resume = "" if cfg.save_only_model else "; resume with --resume_from_checkpoint=auto"
        raise TrainingInterrupted(f"stopped at once during step {state.global_step + 1}/{total_steps}, nothing more "
                                  f"saved{last_good()}{resume}") from None
    finally:
        stop.close()
        steps.close()
    log.close()
    ended = time.perf_counter()
    return LoopResult(state=state, checkpoint=checkpoint, wall_time=ended - started, history=history, started_at=started,
                      ended_at=ended, save_time=save_time, recipe=recipe)
