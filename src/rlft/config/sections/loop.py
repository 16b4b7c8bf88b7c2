"""Top-level keys of the training loop: batch sizes, optimizer and schedule, evaluation and checkpoint schedules,
stopping."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import field_validator

from rlft.config.base import Section, field, planned
from rlft.config.optimizers import check_optimizer

# transformers' schedules (`get_scheduler`), less the two that need a metric at every step
Scheduler = Literal["cosine", "linear", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial", "inverse_sqrt",
                    "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"]


class LoopFields(Section):
    """The training-loop keys of the config file."""

    # --- loop ---
    micro_batch_size: int = field(1, "Rows per forward pass per device.")
    eval_batch_size: Optional[int] = field(None, "Rows per evaluation forward pass (default: micro_batch_size).", ge=1)
    gradient_accumulation_steps: int = field(1, "Micro-batches per optimizer step.")
    num_epochs: float = field(1.0, "Passes over the training data (max_steps wins when set).", gt=0.0)
    max_steps: Optional[int] = field(None, "Stop after this many optimizer steps.", ge=1)
    optimizer: str = field("adamw_torch_fused", "transformers' optimizer name (adamw_torch_fused, adamw_torch, adafactor, adamw_bnb_8bit, "
                           "paged_adamw_8bit, lion_32bit, schedule_free_adamw, ...), or adamw / adam.")
    learning_rate: float = field(2e-5, "Peak learning rate.", gt=0.0, le=10.0)
    adam_beta1: float = field(0.9, "Adam beta1.", ge=0.0, lt=1.0)
    adam_beta2: float = field(0.999, "Adam beta2.", ge=0.0, lt=1.0)
    adam_epsilon: float = field(1e-8, "Adam epsilon.", gt=0.0)
    weight_decay: float = field(0.0, "Decoupled weight decay (not applied to biases and norms).", ge=0.0)
    max_grad_norm: Optional[float] = field(1.0, "Clip the global gradient norm to this (null or 0: no clipping).", ge=0.0)
    lr_scheduler: Scheduler = field("cosine", "Learning-rate schedule after warm-up.")
    lr_scheduler_kwargs: Optional[dict[str, Any]] = field(None, "Extra arguments of the schedule (transformers' "
                                                                "scheduler_specific_kwargs), e.g. {num_cycles: 2}.")
    cosine_min_lr_ratio: float = field(0.0, "cosine: final learning rate as a fraction of the peak (runs cosine_with_min_lr).",
                                       ge=0.0, le=1.0)
    warmup_steps: Optional[Union[int, float]] = field(
        None, "Linear warm-up steps (1 runs as 2, as in Axolotl); below 1, a fraction of the run's steps, as transformers "
              "reads it (ceil(fraction x steps)). Neither this nor warmup_ratio: 3 % of the steps, at most 100 (Axolotl's "
              "default).", ge=0)
    warmup_ratio: Optional[float] = field(None, "Linear warm-up as a fraction of all steps, rounded down.", ge=0.0, le=1.0)
    balance_dp_token: bool = planned(
        True, "Each step's loss is its summed loss divided by the loss units (SFT: target tokens) of all data-parallel ranks "
        "and micro-batches together, so every token weighs the same whichever rank holds it (Cosmos-RL's SFT key; default "
        "true, the only way rlft trains).", what="balance_dp_token: false, each rank's own token mean, averaged over ranks")
    seed: int = field(42, "Seed for weights (random_init), data order, dropout and sampling (numpy takes 0 to 2**32 - 1).",
                      ge=0, le=2**32 - 1)
    logging_steps: int = field(1, "Log every N optimizer steps.")
    eval_steps: Optional[int] = field(None, "Evaluate every N steps (default: at the end only).", ge=1)
    evals_per_epoch: Optional[int] = field(None, "Evaluate this many times per epoch, evenly spaced (instead of eval_steps); "
                                           "0 = at the end only.", ge=0)
    save_steps: Optional[int] = field(None, "Save a checkpoint every N steps (default: at the end only).", ge=1)
    saves_per_epoch: Optional[int] = field(None, "Save this many checkpoints per epoch, evenly spaced (instead of save_steps); "
                                           "0 = at the end only.", ge=0)
    eval_strategy: Optional[Literal["no", "steps", "epoch"]] = field(
        None, "Axolotl's evaluation schedule: steps (eval_steps or evals_per_epoch; the default), epoch (at each epoch's "
              "end), no (no evaluation at all, also not before the first step and at the end).")
    save_strategy: Optional[Literal["no", "steps", "epoch", "best"]] = field(
        None, "Axolotl's checkpoint schedule: steps (save_steps or saves_per_epoch; the default), epoch (at each epoch's "
              "end), best (after each evaluation whose metric_for_best_model is the best so far), no (no checkpoints, "
              "only the final model). A checkpoint of the last step is saved at the end unless no.")
    save_every_n_epochs: int = field(
        0, "Save a checkpoint at the end of every Nth epoch (implies save_strategy: epoch, which is N = 1; Cosmos-RL's "
           "train.ckpt.save_freq_in_epoch). 0 (the default): off.", ge=0)
    save_total_limit: int = field(4, "Keep only the newest N checkpoints (Axolotl's default 4; 0 also keeps 4, as in "
                                     "Axolotl; -1 keeps every one, as transformers reads a value below 0; Cosmos-RL's "
                                     "train.ckpt.max_keep).", ge=-1)
    save_mode: Literal["sync", "async"] = field(
        "sync", "How a checkpoint is written: sync (the default: training waits for the write) or async (the state is "
                "copied to host memory between two steps, then written on a background thread while training goes on; "
                "one write at a time; Cosmos-RL's train.ckpt.save_mode, whose default is async) "
                "(docs/checkpoints.md#asynchronous-saving).")
    save_only_model: bool = field(
        False, "Checkpoints hold the model's weights only, not the optimizer, schedule and RNG state (HF's and Axolotl's "
               "key): smaller and faster to write, but no run can resume from them (docs/checkpoints.md#what-a-checkpoint-holds).")
    output_dir: str = field("./model-out", "Where checkpoints, metrics.jsonl and the final model go (Axolotl's default).")
    resume_from_checkpoint: Optional[str] = field(None, "A checkpoint folder, or `auto` for the newest in output_dir.")
    loss_watchdog_threshold: Optional[float] = field(None, "Stop when the training loss stays above this for "
                                                     "loss_watchdog_patience steps in a row (about twice the first loss).", gt=0.0)
    loss_watchdog_patience: Optional[int] = field(None, "Steps in a row above loss_watchdog_threshold before stopping "
                                                  "(default 3).", ge=1)
    early_stopping_patience: Optional[int] = field(None, "Stop when eval/loss (metric_for_best_model) has not improved for "
                                                   "this many evaluations (the final model and a checkpoint are saved).", ge=1)
    load_best_model_at_end: Optional[bool] = field(
        None, "The final model is the checkpoint with the best eval metric, not the last step's weights; every "
              "checkpoint is evaluated while it is on. Unset: on with early_stopping_patience for SFT and reward models "
              "with an eval set, save_steps and eval_steps (save_steps a multiple of eval_steps), as in Axolotl.")
    metric_for_best_model: Optional[str] = field(
        None, "The eval metric load_best_model_at_end, early_stopping_patience and save_strategy: best watch (default "
              "loss: eval/loss), e.g. accuracy for eval/accuracy.")
    greater_is_better: Optional[bool] = field(
        None, "Whether a higher metric_for_best_model is better (default: false for metrics ending in loss, else true).")
    debug: bool = field(False, "`rlft preprocess` shows the first rows token by token with the trained tokens marked "
                               "(as `--debug`).")
    mfu_peak_flops: Optional[float] = field(
        None, "Peak FLOP/s of one device (one GPU, or a CPU process with its threads) that the MFU metric divides by; when "
              "set it wins. Unset: the data-sheet figure of a GPU rlft's table names (H200, H100, A100, L40S, A10G), else "
              "a matmul probe's measure of this machine, cached in ~/.cache/rlft (docs/training.md#mfu).", gt=0.0
    )

    @field_validator("warmup_steps")
    @classmethod
    def _steps_or_fraction(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, float) and value >= 1:
            if not value.is_integer():
                raise ValueError(f"{value!r} is neither a whole number of steps nor a fraction of the run below 1 (as 0.1)")
            return int(value)
        return value

    @field_validator("optimizer")
    @classmethod
    def _optimizer_known(cls, value: str) -> str:
        return check_optimizer(value)

    @field_validator("save_strategy", "eval_strategy", mode="before")
    @classmethod
    def _unquoted_no(cls, value: Any) -> Any:
        """YAML reads an unquoted `no` as false: it means "no" here."""
        return "no" if value is False else value

    @field_validator("save_total_limit")
    @classmethod
    def _zero_limit(cls, value: int) -> int:
        """Axolotl passes `save_total_limit or 4` on (core/builders/base.py): 0 keeps 4, not every checkpoint. -1
        reaches transformers, whose rotation keeps every checkpoint for a value below 0 (trainer_utils.rotate_checkpoints)."""
        return value or 4
