"""What `rlft train` prints before and after training: the plan and the summary tables."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from rlft.config.best_model import best_metric, loads_best_model
from rlft.config.methods import method_spec, spec_of
from rlft.config.settings import Settings
from rlft.config.settings.profiling import PROFILE_FOLDER, ProfileSettings
from rlft.config.settings.training import OptimSettings
from rlft.config.plugins import cut_cross_entropy
from rlft.models.compile import compile_plan
from rlft.models.head import logits_reason, loss_path
from rlft.models.liger import liger_summary
from rlft.models.qat import describe
from rlft.train.trainer import LoopResult
from rlft.train.step_counts import epochs_steps, steps_per_epoch, total_steps_for
from rlft.train.optim import warmup_steps
from rlft.train.parallel import precision, strategy
from rlft.train.peak import Peak


def _key_value_table(title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # paths are shown whole, never cut with an ellipsis
    return table


def schedule(optim: OptimSettings, steps: int, epoch_steps: int) -> str:
    """The learning rate, its schedule and the warm-up (`rlft.train.optim.warmup_steps`), and where an unset warm-up's
    count comes from."""
    if optim.lr_scheduler == "constant":  # transformers' constant schedule has no warm-up
        return f"learning rate {optim.learning_rate:g}, constant"
    warmup = warmup_steps(optim, steps, epoch_steps)
    source = "" if optim.warmup_steps is not None or optim.warmup_ratio is not None else \
        " (Axolotl's default for this config; set warmup_steps to choose)"
    return f"learning rate {optim.learning_rate:g}, {optim.lr_scheduler}, {warmup} warm-up step{'s' * (warmup != 1)}{source}"


def print_plan(console: Console, cfg, settings: Settings, model, data, micro_batches: int, accelerator, draws_per_step=None,
               rows: tuple[tuple[str, str], ...] = (), sharded: bool = False, peak: Peak | None = None) -> None:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    parallel, model_settings = settings.parallel, settings.model
    draws = draws_per_step or parallel.gradient_accumulation_steps  # plan batches per optimizer step
    steps = total_steps_for(settings.run, micro_batches, draws)
    per_epoch = steps_per_epoch(micro_batches, draws)
    table = _key_value_table(f"rlft train: {cfg.method}")
    table.add_row("model", f"{cfg.base_model}{' (random init)' if cfg.random_init else ''}")
    if cfg.qat:
        table.add_row("qat", describe(cfg.qat))
    if cfg.uses_mistral_common:
        table.add_row("tokenizer", "mistral-common: each chat encoded by its own instruct tokenizer, no chat template" + (
            "" if cfg.tokenizer_use_mistral_common else " (on for a Magistral model, as in Axolotl; set "
                                                        "tokenizer_use_mistral_common: false for its transformers tokenizer)"))
    table.add_row("parameters", f"{total:,} total, {trainable:,} trainable" + (f" ({cfg.adapter} r={cfg.lora_r})" if cfg.adapter else "")
                  + (" (unfrozen_parameters; a row range counts its whole tensor)" if cfg.unfrozen_parameters else ""))
    for report in data.reports:
        info = report.summary()
        table.add_row("data", f"{info['dataset']}: {info['kept']}/{info['rows']} rows kept "
                              f"(dropped: {report.dropped_text()}; {info['truncated']} truncated)")
    table.add_row("train / eval rows", f"{'streamed' if cfg.streamed else len(data.train)} / {len(data.eval)}")
    per_epoch = "max_steps: a stream has no epochs" if cfg.streamed else f"{per_epoch} per epoch"
    table.add_row("steps", f"{steps} ({per_epoch}{', packed rows' if cfg.sample_packing else ''})")
    table.add_row("effective batch", f"{parallel.rows_per_step} = {parallel.micro_batch_size} micro x "
                                     f"{parallel.gradient_accumulation_steps} accumulation x {parallel.processes} process(es)")
    table.add_row("schedule", schedule(settings.optim, steps, epochs_steps(settings.run, micro_batches, draws)))
    if cfg.deepspeed:  # DeepSpeed holds the weights in bf16 and an fp32 copy in the optimizer
        table.add_row("device", f"{accelerator.device} ({'bf16 weights' if precision(cfg, accelerator) == 'bf16' else 'fp32'})")
    else:
        table.add_row("device", f"{accelerator.device} ({accelerator.mixed_precision} mixed precision)" if accelerator.mixed_precision != "no" else f"{accelerator.device} (fp32)")
    if peak is not None:
        table.add_row("MFU peak", peak.describe())
    if compiling := compile_plan(model_settings, bool(spec_of(cfg).engine) and not cfg.trl.use_vllm):
        table.add_row("compile", compiling)
    if model_settings.liger:
        table.add_row("kernels", liger_summary(model_settings, model.config.model_type, logits_reason(model, sharded)))
    if cut_cross_entropy(cfg):
        table.add_row("loss", "cut_cross_entropy: " + ("a reward model's score head has one output, no vocabulary to cut"
                                                       if method_spec(cfg.method).sequence_classification else loss_path(model, sharded)))
    if shared := strategy(cfg, accelerator.num_processes):
        table.add_row("processes", f"{accelerator.num_processes}: {shared}")
    for name, value in rows:
        table.add_row(name, value)
    if loads_best_model(cfg):
        key, higher = best_metric(cfg)
        default = "" if cfg.load_best_model_at_end else ", on with early_stopping_patience as in Axolotl"
        table.add_row("final model", f"the checkpoint with the {'highest' if higher else 'lowest'} {key}, each checkpoint "
                                     f"evaluated (load_best_model_at_end{default})")
    if settings.profile.on:
        table.add_row("profile", profile_plan(settings.profile, Path(cfg.output_dir)))
    table.add_row("output", str(Path(cfg.output_dir).resolve()))
    console.print(table)


def profile_plan(profile: ProfileSettings, output_dir: Path) -> str:
    """What the profiler records, of which steps and ranks, and where (`rlft.train.profiling`)."""
    first, last = profile.recorded_steps(0)
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    ranks = ", ".join(str(rank) for rank in profile.ranks)
    held = ", ".join(name for name, on in (("shapes", profile.record_shapes), ("memory", profile.profile_memory),
                                           ("stacks", profile.with_stack)) if on)
    held = f" ({held})" if held else ""
    parts = []
    if profile.trace:
        parts.append(f"torch.profiler trace{held} in {(output_dir / PROFILE_FOLDER).resolve()}")
    if profile.memory_snapshot:
        parts.append("a CUDA memory snapshot" if torch.cuda.is_available() else "no CUDA memory snapshot (no CUDA GPU)")
    if profile.nsys:
        parts.append("NVTX ranges and nsys's cudaProfilerStart/Stop capture range")
    return (f"{'; '.join(parts)}: {steps} of this run (after {profile.wait} waiting and {profile.warmup} warm-up), "
            f"rank {ranks} ({profile.keys})")


def print_summary(console: Console, cfg, result: LoopResult, peak: Peak | None = None) -> None:
    metrics = result.state.last_metrics
    speeds = [h["tokens_per_s"] for h in result.history if "tokens_per_s" in h]
    table = _key_value_table("rlft train: done")
    final = str(Path(cfg.output_dir).resolve())
    if result.final_from is not None:  # load_best_model_at_end
        best = result.state.best
        final += f" (the weights of {result.final_from.name}: best {best['key']} {best['value']:.4f}; load_best_model_at_end)"
    table.add_row("final model", final)
    table.add_row("checkpoint", str(result.checkpoint.resolve()) if result.checkpoint else "-")
    table.add_row("steps", f"{result.state.global_step}")
    table.add_row("final loss", f"{metrics.get('loss', float('nan')):.4f}")
    if "eval/loss" in metrics:
        table.add_row("eval loss", f"{metrics['eval/loss']:.4f}")
    if speeds:
        table.add_row("mean tokens/s", f"{sum(speeds) / len(speeds):,.0f}")
    if (mfus := [h["mfu"] for h in result.history if "mfu" in h]) and peak is not None:
        table.add_row("mean MFU", f"{sum(mfus) / len(mfus):.4g} against {peak.describe()}")
    table.add_row("wall time", f"{result.wall_time:.1f} s")
    table.add_row("metrics", str((Path(cfg.output_dir) / "metrics.jsonl").resolve()))
    if written := profile_files(Path(cfg.output_dir) / PROFILE_FOLDER):
        table.add_row("profile", written)
    console.print(table)


def profile_files(folder: Path) -> str | None:
    """The profiler's files in `folder` and what opens them, or None when there are none."""
    traces, snapshots = sorted(folder.glob("*.pt.trace.json")), sorted(folder.glob("*.memory_snapshot.pickle"))
    if not traces and not snapshots:
        return None
    opened = ([f"traces: https://ui.perfetto.dev, or tensorboard --logdir {folder.resolve()} with torch-tb-profiler"]
              if traces else []) + (["snapshots: https://pytorch.org/memory_viz"] if snapshots else [])
    return f"{folder.resolve()}: {', '.join(path.name for path in traces + snapshots)} ({'; '.join(opened)})"
