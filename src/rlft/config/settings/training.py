"""What the training loop reads: the steps and what they write, the optimizer, the data's budgets, the losses' weights
and the processes. Each derived number is computed here or in the function named beside its field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlft.config.methods import method_spec
from rlft.config.parallel import launched, rows_per_step
from rlft.config.rl import orpo_lambda, preference_beta, trl_options
from rlft.config.rules.batching import prompt_sharing_problem


@dataclass(frozen=True)
class RunSettings:
    """How long a run trains and what it writes."""

    output_dir: str  # output_dir: checkpoints, metrics.jsonl and the final model
    seed: int  # seed
    max_steps: int | None  # max_steps: optimizer steps (wins over num_epochs)
    num_epochs: float  # num_epochs
    logging_steps: int  # logging_steps: a metrics line every N steps
    eval_steps: int | None  # eval_steps
    evals_per_epoch: int | None  # evals_per_epoch: evaluations an epoch, where eval_steps is unset
    eval_strategy: str | None  # eval_strategy: no, steps or epoch
    save_steps: int | None  # save_steps
    saves_per_epoch: int | None  # saves_per_epoch: checkpoints an epoch, where save_steps is unset
    save_strategy: str | None  # save_strategy: no, steps, epoch or best
    save_every_n_epochs: int  # save_every_n_epochs: a checkpoint every N epochs' end (0: off)
    save_mode: str  # save_mode: sync or async (written on a background thread)
    streamed: bool  # the training rows are streamed: no epochs, max_steps stand for one
    save_total_limit: int  # save_total_limit (-1: keep every checkpoint)
    save_only_model: bool  # save_only_model: checkpoints without optimizer state
    resume_from_checkpoint: str | None  # resume_from_checkpoint: a folder or auto


@dataclass(frozen=True)
class OptimSettings:
    """The optimizer and its learning-rate schedule."""

    optimizer: str  # optimizer: transformers' optimizer name
    learning_rate: float  # learning_rate: the peak
    adam_betas: tuple[float, float]  # (adam_beta1, adam_beta2)
    adam_epsilon: float  # adam_epsilon
    weight_decay: float  # weight_decay
    max_grad_norm: float  # max_grad_norm (0: no clipping)
    lr_scheduler: str  # lr_scheduler
    lr_scheduler_kwargs: dict[str, Any]  # lr_scheduler_kwargs
    cosine_min_lr_ratio: float  # cosine_min_lr_ratio
    warmup_steps: int | float | None  # warmup_steps as written: a count, or below 1 a fraction of the run's steps
    warmup_ratio: float | None  # warmup_ratio as written
    warmup_as_ratio: bool  # the method's unset warm-up is a ratio of the run's steps (GRPO, EBFT: MethodSpec.warmup_as_ratio)
    warmup_count_cap: int | None  # max_steps, where it caps the steps an unset warm-up is counted from (not for rl: methods)


@dataclass(frozen=True)
class DataSettings:
    """Lengths and layouts of the training rows."""

    sequence_len: int  # sequence_len
    prompt_budget: int | None  # tokens an online-RL prompt may use (`prompt_budget`); None: every prompt kept
    share_prompts: bool | None  # share_prompts as written (None: where it saves forward FLOPs)
    sharing_problem: str | None  # why this config's answers cannot share their prompt, or None (the model may still say no)


@dataclass(frozen=True)
class LossSettings:
    """The weights of the preference losses (the GRPO family's are in `rlft.config.rl.RLSettings`)."""

    preference_beta: float  # β of the DPO family, IPO, KTO, SimPO and CPO (`rlft.config.rl.preference_beta`)
    orpo_lambda: float  # ORPO's odds-ratio weight (`rlft.config.rl.orpo_lambda`)


@dataclass(frozen=True)
class ParallelSettings:
    """The training processes and the rows each optimizer step trains."""

    rank: int  # this process's rank (the launcher's RANK; `rlft.config.parallel.launched`)
    processes: int  # training processes (the launcher's WORLD_SIZE; 1 without a launcher)
    micro_batch_size: int  # micro_batch_size: rows per forward
    gradient_accumulation_steps: int  # gradient_accumulation_steps: micro-batches per optimizer step
    rows_per_step: int  # rows all processes train per step (`rlft.config.parallel.rows_per_step`)


def prompt_budget(cfg) -> int | None:
    """The tokens an online-RL prompt may use: `sequence_len - max_completion_length` where the config sets
    `sequence_len`; None (every prompt kept, as Axolotl keeps every GRPO prompt) where it leaves it at its default, or
    with `skip_prepare_dataset`. `rlft validate` refuses a set `sequence_len` that leaves no room."""
    if cfg.skip_prepare_dataset or "sequence_len" not in cfg.model_fields_set:
        return None
    return cfg.sequence_len - trl_options(cfg)["max_completion_length"]


def run_settings(cfg) -> RunSettings:
    return RunSettings(
        output_dir=cfg.output_dir, seed=cfg.seed, max_steps=cfg.max_steps, num_epochs=cfg.num_epochs,
        logging_steps=cfg.logging_steps, eval_steps=cfg.eval_steps, evals_per_epoch=cfg.evals_per_epoch,
        eval_strategy=cfg.eval_strategy, save_steps=cfg.save_steps, saves_per_epoch=cfg.saves_per_epoch,
        save_strategy=cfg.save_strategy, save_every_n_epochs=cfg.save_every_n_epochs, save_mode=cfg.save_mode,
        streamed=cfg.streamed,
        save_total_limit=cfg.save_total_limit, save_only_model=cfg.save_only_model,
        resume_from_checkpoint=cfg.resume_from_checkpoint,
    )


def optim_settings(cfg) -> OptimSettings:
    return OptimSettings(
        optimizer=cfg.optimizer, learning_rate=cfg.learning_rate, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
        adam_epsilon=cfg.adam_epsilon, weight_decay=cfg.weight_decay, max_grad_norm=float(cfg.max_grad_norm or 0.0),
        lr_scheduler=cfg.lr_scheduler, lr_scheduler_kwargs=dict(cfg.lr_scheduler_kwargs or {}),
        cosine_min_lr_ratio=cfg.cosine_min_lr_ratio, warmup_steps=cfg.warmup_steps, warmup_ratio=cfg.warmup_ratio,
        warmup_as_ratio=method_spec(cfg.method).warmup_as_ratio,
        warmup_count_cap=None if method_spec(cfg.method).rl else cfg.max_steps or None,
    )


def data_settings(cfg) -> DataSettings:
    return DataSettings(sequence_len=cfg.sequence_len, prompt_budget=prompt_budget(cfg), share_prompts=cfg.share_prompts,
                        sharing_problem=prompt_sharing_problem(cfg))


def loss_settings(cfg) -> LossSettings:
    return LossSettings(preference_beta=preference_beta(cfg), orpo_lambda=orpo_lambda(cfg))


def parallel_settings(cfg) -> ParallelSettings:
    rank, processes = launched()
    return ParallelSettings(rank=rank, processes=processes, micro_batch_size=cfg.micro_batch_size,
                            gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                            rows_per_step=rows_per_step(cfg, processes))
