"""The one training loop. It knows no algorithm: a recipe (train/recipe.py) turns a micro-batch into a
LossOutput (loss sum, loss units, metrics).

Read `Trainer.run` top to bottom: `start` (a fresh run or a resumed one), then `train` (optimizer steps, with the
evaluations and checkpoints that fall due between them), then `finish` (the final evaluation and checkpoint).

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
from rlft.config.settings import Settings
from rlft.data.batches import MicroBatch, PlanCursor, StepBatches, to_device
from rlft.errors import RolloutError, TrainingDiverged, TrainingInterrupted
from rlft.models.base_changing import INIT_FOLDER, changes_base, resume_weights
from rlft.models.qat import fake_quant_schedule
from rlft.train import profiling, zero
from rlft.train.best import BestCheckpoint
from rlft.train.checkpoint import TrainState, agreed_resume, changed_learning_rate, load_checkpoint, load_weights, read_state
from rlft.train.checkpoint_folders import clean_staging
from rlft.train.checkpoint_save import CheckpointWriter
from rlft.train.clipping import GradientClip
from rlft.train.metrics import PhaseTimer, clock, flop_parameters, flops_per_token, peak_memory_mb, plain_line
from rlft.train.optim import advance_schedule, build_scheduler, optimizer_mode, reset_state, step_was_skipped, stepping_optimizer
from rlft.train.parallel import gradient_sync, max_across, mean_metrics, not_finite_anywhere, sum_across, unused_parameters_named
from rlft.train.peak import Peak
from rlft.train.recipe import Recipe
from rlft.train.run_log import open_metrics_log
from rlft.train.step_counts import (continue_position, epochs_steps, plan_batches, schedules, steps_per_epoch, total_steps_for,
                                    total_steps_resumed)
from rlft.train.watch import RunGuards, StopAfterStep, StopRequest
from rlft.train.wrap import compiled_forward, wrap


@dataclass
class LoopResult:
    state: TrainState
    checkpoint: Path | None
    wall_time: float
    history: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0  # time.perf_counter() when the loop began and ended, for callers that time the set-up
    ended_at: float = 0.0
    save_time: float = 0.0  # seconds training waited for checkpoint saves (save_mode: async: the snapshots, a write in flight)
    recipe: Any = None  # the recipe that ran (its plan and state), for tools that inspect a finished run
    final_from: Path | None = None  # load_best_model_at_end: the checkpoint the final model's weights came from


@dataclass
class StepTotals:
    """One optimizer step's sums over its counted micro-batches, then over processes (`sum_across`)."""

    units: float = 0.0  # loss units (target tokens, pairs, ...)
    loss: float = 0.0  # the loss sums
    tokens: int = 0  # trained tokens
    computed: int = 0  # tokens the forwards computed (a shared prompt once): what MFU counts
    metrics: dict[str, float] = field(default_factory=dict)  # the recipe's: phase times added up, the rest averaged
    scale: float | None = None  # what each micro-batch's loss sum was divided by before backward
    stopping: bool = False  # some process noted a Ctrl-C during the step


class Trainer:
    """Trains `model` with `recipe` as `settings` say (.run, .optim, .parallel, .model); `run()` returns the LoopResult."""

    def __init__(self, cfg, settings: Settings, recipe: Recipe, model, tokenizer, accelerator, console: Console, peak: Peak):
        self.cfg, self.settings, self.recipe, self.model, self.tokenizer = cfg, settings, recipe, model, tokenizer
        self.accelerator, self.console, self.output_dir = accelerator, console, Path(settings.run.output_dir)
        self.main, self.world = accelerator.is_main_process, accelerator.num_processes
        self.history: list[dict[str, Any]] = []
        self.early: dict[str, float] | None = None  # the evaluation that stopped the run early (early_stopping_patience)
        self.last_saved: Path | None = None  # the newest checkpoint saved or being written (save_mode: async)
        self.writer = CheckpointWriter(settings.run.save_mode, cfg.ddp_timeout)
        self.timer, self.peak = PhaseTimer(), peak.flops * self.world  # MFU's peak: all devices' FLOP/s

    def run(self) -> LoopResult:
        self.start()
        try:
            self.train()
            checkpoint = self.finish()
        except StopAfterStep:
            self.interrupted()
        except RolloutError as exc:  # a rollout server that died: keep the steps trained since the last checkpoint
            if self.world > 1 or self.state.global_step == 0 or self.settings.run.save_only_model:
                raise
            self.engine_lost(exc)
        except KeyboardInterrupt:  # a second Ctrl-C: at once, mid-step
            self.stopped_at_once()
        finally:
            self.stop.close()
            self.steps.close()
            self.writer.close(self._warn if self.main else None)  # the write in flight ends first (save_mode: async)
            self.log.close_file()  # whatever ended the loop (the trackers finish below, on a loop that returns)
        self.log.close()
        ended = time.perf_counter()
        return LoopResult(state=self.state, checkpoint=checkpoint, wall_time=ended - self.started, history=self.history,
                          started_at=self.started, ended_at=ended, save_time=self.writer.waited, recipe=self.recipe)

    # ------------------------------------------------------------------ start or resume
    def start(self) -> None:
        cfg, recipe, accelerator, run = self.cfg, self.recipe, self.accelerator, self.settings.run
        if self.main:
            clean_staging(self.output_dir)
        accelerator.wait_for_everyone()
        plan, accum = recipe.train_plan, self.settings.parallel.gradient_accumulation_steps
        self.draws = recipe.draws_per_step or accum  # plan batches per optimizer step
        self.total_steps = total_steps_for(run, len(plan), self.draws)
        self.eval_every, self.save_every = schedules(run, steps_per_epoch(len(plan), self.draws))
        self.resume_from = agreed_resume(run.resume_from_checkpoint, self.output_dir, self._warn if self.main else None)
        if self.resume_from is not None:  # the weights go in before the model is wrapped or sharded
            load_weights(accelerator.unwrap_model(self.model), resume_weights(self.resume_from))
            self.total_steps = total_steps_resumed(run, accum, recipe, read_state(self.resume_from), self.world, self.total_steps)
        self.prepare_model()
        self.load_state()
        self.log = open_metrics_log(self.cfg, self.output_dir, self.resume_from, self.state.global_step, self.moved, self.main,
                                    self.console)
        self.total_params, self.trainable_params = flop_parameters(self.unwrapped)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.clip = GradientClip(self.params, self.stepping, self.accelerator, self.settings.optim.max_grad_norm)
        self.started = time.perf_counter()
        self.cursor = PlanCursor(plan, self.state.epoch, self.state.batch_in_epoch)  # where recipes not drawing their own are
        # on a GPU the next step's batches collate while this one computes; on a CPU that would take the step's own cores
        self.steps = StepBatches(self.cursor, accum, ahead=accelerator.device.type != "cpu")
        recipe.start(self.unwrapped)
        self.fake_quant = fake_quant_schedule(cfg.qat)  # qat.fake_quant_after_n_steps
        self.fake_quant(self.unwrapped, self.state.global_step)  # also for the baseline evaluation
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
            disable=not (self.main and self.console.is_terminal),
        )
        self.task = self.progress.add_task(recipe.name, total=self.total_steps, completed=self.state.global_step, info="")
        self.stop = StopRequest(self.world, announce=self.main)

    def prepare_model(self) -> None:
        """Wrap or shard the model, and build its optimizer and learning-rate schedule."""
        recipe, settings = self.recipe, self.settings
        recipe.before_wrap(self.model)
        self.model, self.optimizer = wrap(self.cfg, settings, self.model, self.accelerator, self.console)
        self.deepspeed = zero.is_deepspeed(self.model)
        self.stepping = stepping_optimizer(self.optimizer)  # without accelerate's wrapper where it adds nothing (ZeRO's: as it is)
        self.scheduler = build_scheduler(settings.optim, self.optimizer.optimizer if self.deepspeed else self.stepping, self.total_steps,
                                         epochs_steps(settings.run, len(recipe.train_plan), self.draws))  # Axolotl's warm-up counts these
        self.unwrapped = self.accelerator.unwrap_model(self.model)
        self.runs = compiled_forward(settings.model, self.model)  # what the recipe calls: the model, or (torch_compile) its compiled forward
        # PiSSA, OLoRA: checkpoints convert the adapter
        self.initial = self.output_dir / INIT_FOLDER if changes_base(self.unwrapped) else None

    def load_state(self) -> None:
        """The training state: a fresh one, or the resumed checkpoint's (optimizer, schedule, recipe, guards)."""
        cfg, resume_from, run = self.cfg, self.resume_from, self.settings.run
        self.state = TrainState(total_steps=self.total_steps, world_size=self.world, plan_batches=plan_batches(self.recipe))
        if resume_from is not None:
            self.state = load_checkpoint(resume_from, self.model, self.optimizer, self.scheduler,
                                         getattr(self.accelerator, "scaler", None))
            self.state.total_steps = self.total_steps
            self.recipe.load_state_dict(self.state.recipe_state)
            self.recipe.load_files(resume_from)
            note = changed_learning_rate(resume_from, self.scheduler) + continue_position(run, self.state, self.recipe, self.world)
            self.console.print(f"[bold]Resumed[/] from {resume_from} at step {self.state.global_step}{note}")
        elif run.resume_from_checkpoint == "auto":
            self.console.print(f"resume_from_checkpoint: auto found no complete checkpoint in {self.output_dir}; starting fresh")
        state = self.state
        self.guards = guards = RunGuards(cfg, state.guards)
        if resume_from is not None and guards.stopped_early():  # e.g. a requeue script that always resumes with `auto`
            self.console.print(f"{resume_from} is where this run stopped early ({guards.key} had not improved on "
                               f"{guards.best:.4f} for {guards.stale} evaluations): nothing more to train")
            self.total_steps = state.global_step
        elif resume_from is not None and state.global_step >= self.total_steps:
            self.console.print(f"{resume_from} (step {state.global_step}) is at or past this run's last step "
                               f"({self.total_steps}): nothing more to train")
        # a finished run resumed (a requeue script that always resumes): its final evaluation and checkpoint exist already
        self.finished = resume_from is not None and state.global_step >= self.total_steps and (
            any(key.startswith("eval/") for key in state.last_metrics) or not has_eval_set(cfg) or run.eval_strategy == "no")
        # load_best_model_at_end, save_strategy: best; a best of another folder's run is not one of this folder's checkpoints
        self.moved = resume_from is not None and resume_from.parent.resolve() != self.output_dir.resolve()
        self.best = BestCheckpoint(cfg, None if self.moved else state.best)

    # ------------------------------------------------------------------ training
    def train(self) -> None:
        if self.state.global_step == 0:
            self.evaluate()  # the baseline, so the summary and metrics.jsonl show how far training moved it
        self.model.train()
        optimizer_mode(self.optimizer, training=True)
        with self.progress, profiling.window(self.settings, self.state.global_step, self.console) as profile:
            while self.state.global_step < self.total_steps:
                if self.world == 1 and self.stop.requested:  # Ctrl-C during an evaluation or a save
                    raise StopAfterStep
                if not self.step():
                    break
                profile.step()

    def step(self) -> bool:
        """One optimizer step, then the evaluation and checkpoint due after it. False: stop early."""
        state, step_start = self.state, time.perf_counter()
        self.fake_quant(self.unwrapped, state.global_step)
        batches = self.next_batches()
        lr = self.scheduler.get_last_lr()[0]
        totals = self.forward_backward(batches)
        loss_value = totals.loss / max(totals.units, 1)
        self.show_messages()
        breakdown = self.guards.loss_breakdown(loss_value)
        if breakdown or not math.isfinite(loss_value):
            raise TrainingDiverged(
                f"{breakdown} (step {state.global_step + 1}){self.last_good()}" if breakdown else
                f"loss is {loss_value} at step {state.global_step + 1}{self.last_good()}. Lower learning_rate, "
                "keep max_grad_norm set, or check the data for empty targets"
            )
        with self.timer("optimizer"):
            grad_norm, changed = self.update(bool(batches), totals)
        state.global_step += 1
        state.tokens_seen += totals.tokens
        if self.recipe.after_optimizer_step(self.unwrapped, state.global_step, changed):  # e.g. at a reference reset
            reset_state(self.model, self.optimizer)
        record = self.step_record(totals, loss_value, lr, grad_norm, time.perf_counter() - step_start)
        self.log_step(record, loss_value, lr, grad_norm)
        self.progress.update(self.task, completed=state.global_step)
        self.show_messages()
        if self.eval_every and state.global_step % self.eval_every == 0 and state.global_step < self.total_steps:
            if self.guards.stop_early(results := self.evaluate()):
                if self.main:
                    self.console.print(f"early stopping at step {state.global_step}: {self.guards.key} has not improved "
                                       f"on {self.guards.best:.4f} for {self.guards.stale} evaluations (early_stopping_patience)")
                self.early = results  # the run's final evaluation: not run (and logged) twice
                return False
        if ((self.save_every and state.global_step % self.save_every == 0) or self.best.save_now(state.global_step)) and \
                state.global_step < self.total_steps:
            if self.best.needs_eval(state.global_step):  # load_best_model_at_end chooses among evaluated checkpoints
                self.evaluate()
            self.save()
        # with several processes: the same sum on every one; at the last step the run ends as it would anyway
        if (totals.stopping or (self.world == 1 and self.stop.requested)) and state.global_step < self.total_steps:
            raise StopAfterStep
        return True

    def next_batches(self) -> list[MicroBatch]:
        """This step's micro-batches on the device: the recipe's (online RL: generate, score, log-probs) or its plan's."""
        began = clock()
        batches = self.recipe.prepare_step(self.runs)
        if batches is not None:
            self.timer.add(self.recipe.prepare_phase, clock() - began)
        else:
            with self.timer("data"):
                batches, (self.state.epoch, self.state.batch_in_epoch) = self.steps.next()
        return [batch.to(self.accelerator.device) for batch in batches]

    def forward_backward(self, batches: list[MicroBatch]) -> StepTotals:
        """Backpropagate every micro-batch's loss sum; the step's sums over the counted ones and over processes."""
        totals, device = StepTotals(), self.accelerator.device
        counted = [b for b in batches if not b.padding]
        for index, batch in enumerate(batches):
            weight = 0.0 if batch.padding else 1.0  # a padding batch keeps collectives in step, adds nothing
            last = index == len(batches) - 1
            with self.timer("forward_backward"), gradient_sync(self.model, last):
                with self.accelerator.autocast(), unused_parameters_named():
                    out = self.recipe.micro_batch_loss(self.runs, batch)
                # backward at the size of a mean (the first micro-batch's units, the largest over ranks: every
                # rank must scale alike), not of a sum: fp16 scalers stay in range
                totals.scale = totals.scale or max_across(max(float(out.units), 1.0), device)
                if self.deepspeed:
                    zero.backward(self.model, out.loss_sum * (weight / totals.scale), last=last)
                else:
                    self.accelerator.backward(out.loss_sum * (weight / totals.scale))
            if not weight:
                continue
            totals.units += out.units
            totals.loss += float(out.loss_sum.detach())
            totals.tokens += batch.num_tokens
            totals.computed += batch.model_tokens
            for key, value in out.metrics.items():  # phase times add up over micro-batches, the rest average
                share = value if key.startswith("time/") else value / len(counted)
                totals.metrics[key] = totals.metrics.get(key, 0.0) + share
        totals.units, totals.loss, tokens, totals.computed, stopping = sum_across(
            [totals.units, totals.loss, totals.tokens, totals.computed, float(self.stop.requested)], device)
        totals.tokens, totals.stopping = int(tokens), bool(stopping)
        totals.metrics = mean_metrics(totals.metrics)
        return totals

    def update(self, any_batches: bool, totals: StepTotals) -> tuple[float, bool]:
        """Scale, clip and apply the accumulated gradient, advance the schedule; (gradient norm, weights changed)."""
        if any_batches:
            # sum over the window (and ranks) -> mean per loss unit; DDP and FSDP average the gradients
            # over ranks, so multiply by the rank count: every rank steps with one large batch's gradient
            factor = totals.scale * self.world / max(totals.units, 1.0)
            if self.deepspeed:  # DeepSpeed scales, clips and updates in one call
                grad_norm = zero.step(self.model, factor)
            else:  # scaled and clipped, or (a fused optimizer) told to scale and clip in its step
                grad_norm = self.clip.norm(factor)
            if not math.isfinite(grad_norm) and self.accelerator.mixed_precision != "fp16":  # fp16: the scaler skips
                applied = "DeepSpeed applied the step" if self.deepspeed else "the step was not applied"
                raise TrainingDiverged(f"the gradient norm is {grad_norm} at step {self.state.global_step + 1} "
                                       f"({applied}){self.last_good()}. Lower learning_rate, keep max_grad_norm "
                                       "set, or check the data")
            if not self.deepspeed:
                self.stepping.step()
            skipped = step_was_skipped(self.optimizer)
        else:  # the recipe skipped this step (e.g. no learning signal): no update at all
            grad_norm, skipped = 0.0, False
        if not skipped:  # fp16's scaler skipped an overflowing step: the schedule waits, as in transformers
            advance_schedule(self.scheduler, updated=any_batches)
        self.stepping.zero_grad(set_to_none=True)
        return grad_norm, any_batches and not skipped

    def step_record(self, totals: StepTotals, loss_value: float, lr: float, grad_norm: float, step_time: float) -> dict:
        """The step's line of metrics.jsonl."""
        state, device = self.state, self.accelerator.device
        return {
            "loss": round(loss_value, 6),
            "learning_rate": lr,
            "grad_norm": round(grad_norm, 6),
            "epoch": round(self.recipe.epochs_done(self.cursor.epochs_at(state.epoch, state.batch_in_epoch)), 4),
            "tokens": totals.tokens,
            "tokens_per_s": round(totals.tokens / step_time, 1),  # trained tokens (for RL: prompt + completion rows)
            "step_time_s": round(step_time, 4),
            "mfu": round(totals.computed * flops_per_token(self.total_params, self.trainable_params) / step_time / self.peak, 5),
            "peak_memory_mb": round(peak_memory_mb(device), 1),
            **{k: round(v, 6) for k, v in totals.metrics.items()},
            **self.recipe.step_metrics(),
            **self.timer.pop(),
        }

    def log_step(self, record: dict[str, Any], loss_value: float, lr: float, grad_norm: float) -> None:
        state = self.state
        state.last_metrics = record
        if self.main and (state.global_step % self.settings.run.logging_steps == 0 or state.global_step == self.total_steps):
            self.log.write(state.global_step, record)
            self.history.append({"step": state.global_step, **record})
            info = f"loss {loss_value:.4f} | lr {lr:.2e} | {record['tokens_per_s']:.0f} tok/s"
            self.progress.update(self.task, info=info)
            if not self.console.is_terminal:  # a whole line per step (no wrapping to the width: easy to grep)
                plain_line(self.console, f"step {state.global_step}/{self.total_steps} | {info} | grad_norm {grad_norm:.3f}")

    # ------------------------------------------------------------------ evaluate
    def evaluate(self) -> dict[str, float]:
        recipe, state = self.recipe, self.state
        if not recipe.eval_batches or self.settings.run.eval_strategy == "no":
            return {}
        self.model.eval()
        optimizer_mode(self.optimizer, training=False)
        with torch.no_grad(), self.accelerator.autocast():
            result = recipe.evaluate(self.runs, [to_device(b, self.accelerator.device) for b in recipe.eval_batches])
        self.model.train()
        optimizer_mode(self.optimizer, training=True)
        self.best.note(state.global_step, result)
        self.guards.check(result)
        if self.main:
            self.log.write(state.global_step, result)
            self.history.append({"step": state.global_step, **result})
            self.console.print(f"step {state.global_step}/{self.total_steps} | "
                               + " | ".join(f"{k} {v:.4f}" for k, v in result.items()))
        return result

    # ------------------------------------------------------------------ save
    def save(self, last: bool = False) -> Path | None:
        """A checkpoint of this step; the `last` of the run is written whole before it returns (with no training after)."""
        state, recipe, optimizer = self.state, self.recipe, self.optimizer
        if not_finite_anywhere(self.params, self.accelerator.device):
            raise TrainingDiverged(f"the weights hold NaN or inf after step {state.global_step}{self.last_good()}. Lower "
                                   "learning_rate and keep max_grad_norm set")
        state.recipe_state = recipe.state_dict()
        state.guards = self.guards.state_dict()
        self.best.saving(state.global_step)
        state.best = self.best.state_dict()
        optimizer_mode(optimizer, training=False)  # schedule-free: the averaged weights are the ones to keep
        with self.timer("save"):
            self.last_saved = self.writer.save(
                self.output_dir, state, self.model, self.tokenizer, optimizer, self.scheduler, self.settings.run.save_total_limit,
                recipe.save_files, getattr(self.accelerator, "scaler", None), recipe.saved_files_bytes(),
                self.best.folder(self.output_dir), model_only=self.settings.run.save_only_model, initial_adapter=self.initial,
                wait=last)
        if not last:
            optimizer_mode(optimizer, training=True)
        return self.last_saved

    def last_good(self) -> str:
        latest = self.writer.finished() or self.resume_from  # a write in flight has ended: whole, or failed
        return f"; the last good checkpoint is {latest}" if latest else "; no checkpoint was saved"

    # ------------------------------------------------------------------ finish
    def finish(self) -> Path | None:
        """The final evaluation and checkpoint (a resumed finished run has both already); the final model's weights."""
        saves = self.settings.run.save_strategy != "no"
        if self.finished:
            checkpoint = self.resume_from if not self.moved else self.save(last=True) if saves else None
        else:
            final_eval = self.early if self.early is not None else self.evaluate()
            self.state.last_metrics.update(final_eval)
            checkpoint = self.save(last=True) if saves else None
        optimizer_mode(self.optimizer, training=False)  # the final model: a schedule-free optimizer's averaged weights
        return checkpoint

    def interrupted(self) -> None:
        """Ctrl-C: the step that was running has finished; save it and stop."""
        state = self.state
        done = self.last_saved is not None and self.last_saved.name == f"checkpoint-{state.global_step}"
        saved = (self.last_saved if done else self.save(last=True)) if state.global_step > 0 else None
        self.writer.wait()  # a write in flight of this step: whole before it is named
        self.log.close()
        resume = ("its weights only (save_only_model: true): a new run can start from them, none can resume"
                  if self.settings.run.save_only_model else "resume with --resume_from_checkpoint=auto")
        where = f"checkpoint saved to {saved}; {resume}" if saved else "no step had finished, nothing to save"
        raise TrainingInterrupted(f"interrupted at step {state.global_step}/{self.total_steps}: {where}") from None

    def engine_lost(self, exc: RolloutError) -> None:
        """The rollout server stopped answering: save the steps trained since the last checkpoint, then stop."""
        state = self.state
        done = self.last_saved is not None and self.last_saved.name == f"checkpoint-{state.global_step}"
        self.recipe.engine_lost()
        saved = self.last_saved if done else self.save(last=True)
        self.writer.wait()
        self.log.close()
        raise RolloutError(f"{exc}\nthe {state.global_step} steps trained are saved in {saved}: resume with "
                           "--resume_from_checkpoint=auto once it answers again (the rollouts in flight are sampled "
                           "again)") from None

    def stopped_at_once(self) -> None:
        """A second Ctrl-C: stop mid-step."""
        self.log.close()
        resume = "" if self.settings.run.save_only_model else "; resume with --resume_from_checkpoint=auto"
        raise TrainingInterrupted(f"stopped at once during step {self.state.global_step + 1}/{self.total_steps}, nothing "
                                  f"more saved{self.last_good()}{resume}") from None

    # ------------------------------------------------------------------ console
    def show_messages(self) -> None:
        for message in self.recipe.messages():
            if self.main:
                self._warn(message)
        for line in self.recipe.reports():
            if self.main:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _warn(self, message: str) -> None:
        self.console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)

