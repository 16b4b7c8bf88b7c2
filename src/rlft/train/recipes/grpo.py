"""Online RL recipe: GRPO and its family (GDPO, DAPO, GSPO, Dr. GRPO, RLOO, Cosmos-RL options).

Three parts: the rollout side (`GRPOEngine`: the engine, its feed of scored generation batches, weight sync, rank 0's
full copy of a sharded policy), the row queue (`RowQueue`: one window of rows per optimizer step, staleness, cached
old and reference log-probs) and this recipe, which composes them: per generation batch it turns the ScoredBatch into
TrainingRows and queues them; per step it makes the window's micro-batches and their policy loss. After each
optimizer step the engine gets the new weights and the reference is reset or mixed when due.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import torch

from rlft.config.rl import GENERATION_KWARGS
from rlft.config.settings import Settings
from rlft.data.batches import BatchPlan, MicroBatch, PlanCursor
from rlft.data.collate import completion_batch, flatten_rows, pad_multiple
from rlft.data.tokenizer import end_ids
from rlft.errors import CheckpointError, RolloutError
from rlft.losses.importance import decoupled_weights, importance_weights, off_policy_sequence_mask
from rlft.losses.policy import policy_loss
from rlft.models.frozen import FrozenPolicy, ReferenceMoves
from rlft.models.loading import hub_revision
from rlft.models.logprobs import completion_scores, filters_active, sampled_logps, shared_completion_inputs
from rlft.phase_ranges import phase_range
from rlft.rollout.engine import RolloutEngine
from rlft.rollout.prefix_filter import shared_prefix_lengths
from rlft.rollout.producer import Environment
from rlft.rollout.scoring import Scorer
from rlft.rollout.types import BatchMetrics, SamplingParams, ScoredBatch, TrainingRow, sampling_params
from rlft.rollout.user_rollouts import load_rollout_func
from rlft.train.metrics import clock
from rlft.train.micro_batches import split_step
from rlft.train.parallel import broadcast_object
from rlft.train.recipe import LossOutput, Recipe
from rlft.train.recipes.completion_log import CompletionLog
from rlft.train.recipes.grpo_engine import GRPOEngine
from rlft.train.recipes.row_queue import RowQueue, row_length
from rlft.train.recipes.validation import Validation

ZERO_SIGNAL_WARN_STEPS = 10
LOGP_VALUES = ("old_logps", "old_sampled_logps", "ref_logps", "sampling_logps")


def training_rows(scored: ScoredBatch, mask_truncated: bool, ignored: list[int] | None = None) -> list[TrainingRow]:
    """One TrainingRow per sampled completion: its advantage, sampling log-probs and weight version come from
    `scored`; the loss mask is the rollout's env_mask (environment tokens never train), zeroed for truncated
    completions when `mask_truncated`, and over the first `ignored[i]` tokens of row i (the shared-prefix filter)."""
    rollout, rows = scored.rollout, []
    for index in range(len(rollout)):
        completion = rollout.completion_ids[index]
        mask = [0] * len(completion) if mask_truncated and rollout.truncated[index] else list(rollout.env_mask[index])
        if ignored and ignored[index]:
            mask[: ignored[index]] = [0] * min(ignored[index], len(mask))
        rows.append(TrainingRow(prompt_ids=rollout.prompt_ids[index], completion_ids=completion, loss_mask=mask,
                                advantage=float(scored.advantages[index]), sampling_logps=rollout.logprobs[index],
                                weight_version=rollout.weight_versions[index], replayed=index in scored.replayed_rows))
    return rows


def row_inputs(row: TrainingRow) -> dict[str, Any]:
    """The row's fields that `completion_batch` reads, by their names."""
    return {name: getattr(row, name) for name in ("prompt_ids", "completion_ids", "loss_mask", "advantage", *LOGP_VALUES)}


class GRPORecipe(Recipe):
    def __init__(self, cfg, settings: Settings, data, tokenizer, scorer: Scorer, reference: FrozenPolicy | None, shard: tuple[int, int] = (0, 1),
                 sampling_for: Callable[[list[dict[str, Any]], SamplingParams], SamplingParams] | None = None,
                 make_engine: Callable[..., RolloutEngine] | None = None, remote_engine: bool = False,
                 environment: Environment | None = None, sharing: tuple[bool, str] | None = None,
                 share_costs: tuple[int, int] | None = None, rows_apart: bool = False, validation: Validation | None = None):
        """`make_engine(policy, version)` builds the rollout engine in `start` (default: `GRPOEngine`'s in-process
        LocalEngine, sharing the policy's weights or holding a copy); `remote_engine`: that engine holds a plain model of its own
        (a rollout server, or vLLM colocated), which gets the checkpoint's weights before it samples; `environment`
        plays episodes in place of the engine's single answers (NeMo Gym's agents, calling that server; the Python
        tools of trl.multi_turn_config, sampling each turn from the engine). `sharing`: each
        group's prompt once in a micro-batch (`share_prompts`), and the plan's line; `share_costs`: the model's forward
        costs (share only where that takes fewer FLOPs); `rows_apart`: flattened rows attend each on its own;
        `validation`: the evaluation of `validation.enable` (None: one greedy completion per eval prompt). Of
        `settings` the recipe reads the trl: options (`settings.rl`, kept as `self.settings`), the model's source and
        compile options, and the rows per step."""
        self.cfg, self.name, self.tokenizer, self.scorer, self.reference = cfg, cfg.rl, tokenizer, scorer, reference
        self.share_prompts, self.share_costs, self.rows_apart = bool(sharing and sharing[0]), share_costs, rows_apart
        if sharing is not None:
            self.plan_rows = (("prompts", sharing[1]),)
        self.settings = s = settings.rl
        self.parallel = settings.parallel
        if s.max_token_len_per_mini_batch is not None:
            self.plan_rows += (("micro-batches", f"at most {s.max_token_len_per_mini_batch} prompt + completion tokens each, "
                                                 "the step's rows packed (trl.max_token_len_per_mini_batch)"),)
        self.reference_moves = ReferenceMoves(reference, s)  # Cosmos-RL's reset, TR-DPO's soft update
        self.completions = CompletionLog(cfg.output_dir, tokenizer, bool(s.log_completions), s.num_completions_to_print or 0)
        unknown = sorted(set(s.raw["generation_kwargs"] or {}) - set(GENERATION_KWARGS))
        if unknown:
            raise RolloutError(f"trl.generation_kwargs: {unknown} not supported by the in-process engine (it takes "
                               f"{', '.join(GENERATION_KWARGS)})")
        self.sampling = sampling_params(s, end_ids(cfg.base_model, tokenizer, **hub_revision(settings.model, cfg.base_model)))
        # the off-policy terms compare the trainer with the engine: with sampling filters on, on the filtered distribution
        self.compares_sampled = filters_active(self.sampling) and (
            s.needs_sampling_correction or s.off_policy_mask_threshold is not None)
        rollout_func = load_rollout_func(s.rollout_func, s) if s.rollout_func else None
        self.rank, self.world = shard
        identity = lambda rows: {"prompts": rows}  # noqa: E731
        # rank 0 draws every process's prompts (GRPOEngine)
        self.train_plan = BatchPlan(data.train, s.prompts_per_step, cfg.seed, tokenizer.pad_token_id, collate=identity)
        self.eval_plan = BatchPlan(data.eval, cfg.eval_batch_size or 64, cfg.seed, tokenizer.pad_token_id, collate=identity)
        # a generation batch (steps_per_generation plan batches) feeds ceil(its rows / one step's rows) steps, each
        # num_iterations times: the plan batches one optimizer step uses
        generation = s.steps_per_generation * s.prompts_per_step * s.num_generations
        steps_per_batch = s.num_iterations * max(1, -(-generation // self.step_rows))
        self.draws_per_step = Fraction(s.steps_per_generation, steps_per_batch)
        self.prompts = PlanCursor(self.train_plan)
        self.engine = GRPOEngine(cfg, s, settings.model, tokenizer, scorer, self.prompts, self.sampling, shard, sampling_for, make_engine,
                                 remote_engine, environment, rollout_func, steps_per_batch)
        self.queue = RowQueue(s, self.step_rows, self.parallel.micro_batch_size, shard, reference, self.sampling, self.compares_sampled,
                              self.micro_batch)
        self.model = None  # the trained module (unwrapped), for weight pushes at checkpoints and evaluation
        self.step = 0
        self.metrics = BatchMetrics()  # of the generation batch being trained on, and this step's own
        self.pending: list[str] = []  # warnings for the loop to print
        self.validation = validation
        if validation is not None:
            self.plan_rows = (*self.plan_rows, ("validation", validation.describe()))
        self.shown: list[str] = []  # sampled completions for the loop to print (trl.num_completions_to_print)
        self.zero_signal_steps = self.steps_with_signal = 0
        self.over_budget_noted = False  # the warning of a row above trl.max_token_len_per_mini_batch, once a run
        self._restored: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifecycle
    def before_wrap(self, model) -> None:
        self.engine.before_wrap(model)

    def engine_lost(self) -> None:
        self.engine.engine_lost()

    def start(self, model) -> None:
        self.model, self.step = model, self._restored.get("step", 0)
        self.engine.start(model, self._restored.get("weight_version", 0) or 0, self._restored.get("generations", 0),
                          self._restored.get("feed", {}), self.step)
        if self._restored and self.rank == 0:  # a resume generates the batches after its checkpoint again
            self.completions.resume(self.engine.generations)

    def after_optimizer_step(self, model, step: int, changed: bool = True) -> bool:
        """Weight sync, then the reference's move; True: the reference was reset and the optimizer's state must start
        again (reset_optimizer_with_reference)."""
        started = clock()
        self.step = step
        with phase_range("weight_sync"):
            main_thread = self.engine.after_optimizer_step(model, step, changed)
        reset = self.reference_moves.after_step(model, step)
        self.engine.add_sync_phases(self.metrics, clock() - started, main_thread)
        return reset and self.settings.reset_optimizer_with_reference

    def close(self) -> None:
        self.engine.close()
        if self.validation is not None:
            self.validation.close()

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        if self.validation is not None:
            return self.validation.batches()
        return self.eval_plan.sequential() if self.eval_plan.items else []

    def epochs_done(self, loop_epochs: float) -> float:
        return self.prompts.epochs_done

    def state_dict(self) -> dict[str, Any]:
        """Queued rows, the prompt position and health counters: a resume trains on exactly the rows an
        uninterrupted run would, sampled from an engine of the recorded weight version."""
        feed = self.engine.state_dict(self.model)
        return {"queue": self.queue.state_dict(), "prompts": self.prompts.state_dict(), "generations": self.engine.generations,
                "weight_version": feed.get("weight_version") or 0, "step": self.step, "feed": feed,
                "zero_signal_steps": self.zero_signal_steps, "steps_with_signal": self.steps_with_signal,
                "batch_metrics": self.metrics.batch, "empty_reason": self.queue.empty_reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and "prompts" not in state:
            raise CheckpointError("this checkpoint was written by an rlft version before typed rollouts (its queued rows "
                                  "lack sampling log-probs and weight versions) and cannot be resumed exactly: start a new "
                                  "run from its model/ folder (base_model: <checkpoint>/model)")
        self.queue.load_state_dict(state.get("queue", []))
        self.prompts.load_state_dict(state.get("prompts", {}))
        self.zero_signal_steps = state.get("zero_signal_steps", 0)
        self.steps_with_signal = state.get("steps_with_signal", 0)
        self.metrics = BatchMetrics(batch=state.get("batch_metrics", {}))
        self.queue.empty_reason = state.get("empty_reason", self.queue.empty_reason)
        self._restored = state

    # ------------------------------------------------------------------ a step
    def prepare_step(self, model) -> list[MicroBatch]:
        if not self.queue:
            self.fill_queue(model)
        window = self.queue.pop()
        if not window:
            self.metrics.note(self.queue.empty_reason)
        s, parallel = self.settings, self.parallel
        split = split_step(window, self.rank, self.world, parallel.micro_batch_size, parallel.gradient_accumulation_steps,
                           s.max_token_len_per_mini_batch, row_length,
                           (lambda row: sum(row.loss_mask)) if s.balance_dp_token else None)
        batches = [self.micro_batch(rows) for rows in split.mine]
        for batch, totals in zip(batches, split.totals):  # balance_dp_token: the place's rows and tokens on every process
            batch["across_ranks"] = totals
        if s.max_token_len_per_mini_batch is not None and window:
            self._note_token_budget(window, len(split.mine) + split.padding)
        # a process with fewer rows than the others runs padding micro-batches (weight 0): collectives stay in step
        padding = [MicroBatch.collated(self.micro_batch(window[:1]), padding=True)] * split.padding if split.padding else []
        return [MicroBatch.collated(batch) for batch in batches] + padding

    def _note_token_budget(self, window: list[TrainingRow], passes: int) -> None:
        """The step's forward passes (`batching/micro_batches`), and once a run a warning of a row above the budget."""
        budget = self.settings.max_token_len_per_mini_batch
        self.metrics.note("batching/micro_batches", passes)
        longest = max(row_length(row) for row in window)
        if longest > budget and not self.over_budget_noted:
            self.over_budget_noted = True
            self.pending.append(f"a row of {longest} tokens (prompt + completion) is longer than "
                                f"trl.max_token_len_per_mini_batch = {budget}: it trains in a micro-batch of its own, above "
                                "the budget. Raise the budget to the longest prompt + max_completion_length")

    def micro_batch(self, rows: list[TrainingRow]) -> dict[str, Any]:
        inputs, pad, multiple = [row_inputs(r) for r in rows], self.tokenizer.pad_token_id, pad_multiple(self.cfg)
        batch = completion_batch(inputs, pad, LOGP_VALUES, multiple)
        apart = self.rows_apart and self.cfg.flat_batches == "mask"
        shared = shared_completion_inputs(inputs, batch, pad, self.cfg.flat_batches == "mask" and not apart, multiple,
                                          self.share_costs, apart) if self.share_prompts else None
        if shared is not None:  # share_prompts: each group's prompt once, its completions after it
            batch.update(shared)
        elif self.cfg.flat_batches:  # batch_flattening: the rows as one sequence without padding
            batch.update(flatten_rows(batch["input_ids"], batch["attention_mask"], self.cfg.flat_batches == "mask"))
        return batch

    def loss(self, model, batch: dict[str, Any]) -> LossOutput:
        s = self.settings  # entropy is logged every step (TRL's `entropy`); with a gradient only when entropy_coeff > 0
        scores = completion_scores(model, batch)
        logps, entropy = scores.token_logps(s.temperature, True, grad_entropy=bool(s.entropy_coeff))
        # the current weights' filtered distribution: for the IS weights when old log-probs were not cached, and for OPSM
        wanted = self.compares_sampled and ("old_sampled_logps" not in batch or s.off_policy_mask_threshold is not None)
        sampled, dropped = sampled_logps(scores, batch, self.sampling, logps) if wanted else (None, None)
        router = scores.router  # an MoE router's load-balancing loss (model_config: {output_router_logits: true})
        del scores
        is_weights, keep, metrics = self.off_policy_terms(logps, batch, sampled)
        if dropped is not None:
            mask = batch["loss_mask"]
            metrics["sampling/outside_filters_fraction"] = round(float((dropped * mask).sum() / mask.sum().clamp_min(1)), 6)
        result = policy_loss(
            logps, batch.get("old_logps", logps.detach()), batch["advantage"], batch["loss_mask"],
            loss_type=s.loss_type, epsilon=s.epsilon, epsilon_high=s.epsilon_high, delta=s.delta,
            lower_bound_ratio=s.lower_bound_ratio, aipo_rho=s.aipo_rho, importance_sampling_level=s.importance_sampling_level,
            ref_logps=batch.get("ref_logps"), beta=s.beta, entropy=entropy, entropy_coeff=s.entropy_coeff,
            positive_nll_coef=s.positive_nll_coef, max_completion_length=s.unbiased_loss_max_tokens,
            is_weights=is_weights, sequence_keep=keep, bias_correction_kl=s.bias_correction_kl,
            across_ranks=batch.get("across_ranks"),
        )
        return LossOutput(result.loss_sum, float(result.units), {**result.metrics, **metrics}).plus_router_loss(router)

    def off_policy_terms(self, logps: torch.Tensor, batch: dict[str, Any], sampled: torch.Tensor | None = None):
        """The sampling correction (IS weights exp(old - sampling), or the decoupled loss's behaviour weights) and the
        off-policy sequence mask, from the engine's sampling log-probs and the trainer's old log-probs.

        The engine reports log-probs of the distribution it sampled from (after top-k, top-p, min-p and repetition
        penalty); with such filters on, the trainer's side of each comparison is taken from the same distribution
        (`sampled`: the current weights'; `old_sampled_logps`: cached at scoring time), so a ratio measures only
        the weights' difference and is 1 at zero staleness, not the filters' renormalisation."""
        s, mask = self.settings, batch["loss_mask"]
        current = sampled if sampled is not None else logps.detach()
        # not cached: the rows are trained on by the weights that scored them, so the old log-probs are the current ones
        old = batch.get("old_sampled_logps" if self.compares_sampled else "old_logps", current)
        sampling = batch.get("sampling_logps")
        weights = keep = None
        metrics: dict[str, float] = {}
        if s.needs_sampling_correction and sampling is not None:
            if s.decoupled_loss:
                weights, metrics = decoupled_weights(old, sampling, mask, s.behav_imp_weight_cap)
            else:
                weights, metrics = importance_weights(old, sampling, mask, level=s.is_level, mode=s.is_mode, cap=s.is_cap)
        if s.off_policy_mask_threshold is not None:
            reference = sampling if sampling is not None else old
            keep, masked = off_policy_sequence_mask(current, reference, batch["advantage"], mask, s.off_policy_mask_threshold)
            metrics.update(masked)
        return weights, keep, metrics

    def step_metrics(self) -> dict[str, float]:
        """The batch's rollout statistics repeat on steps that reuse it (num_iterations, steps_per_generation); phase
        times and skips belong to the step that had them."""
        return self.metrics.take_step()

    def reports(self) -> list[str]:
        shown, self.shown = self.shown, []
        return shown

    def messages(self) -> list[str]:
        pending, self.pending = self.pending, []
        return pending

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Rank 0 evaluates with the engine (on the weights being trained, not its older ones) for every process; a
        recipe that also runs the policy there (EBFT's teacher-forced loss) gets a whole one that runs alone: the
        unwrapped model, or the full copy of a sharded one (up to date once the engine is)."""
        whole = self.engine.synced_policy(self.model)
        return broadcast_object(self.evaluate_with_engine(whole, batches) if self.rank == 0 else None)

    def evaluate_with_engine(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Greedy completion per held-out prompt, scored by the reward functions: eval/reward (accuracy for 0/1 rewards);
        with `validation.enable`, the validation's samples, rewards and pass@k."""
        if self.validation is not None:
            metrics, notes = self.validation.evaluate(self.engine.producer, batches, self.sampling)
            self.pending += notes
            return metrics
        greedy = dataclasses.replace(self.sampling, temperature=0.0)
        totals, count = {}, 0
        for batch in batches:
            prompts = batch["prompts"]
            _, scores = self.engine.producer.evaluate(prompts, greedy)
            values = {"reward": float(torch.nan_to_num(scores.total, 0.0).sum())}
            for name in scores.names:
                values[f"rewards/{name}/mean"] = float(torch.nan_to_num(scores.column(name), 0.0).sum())
            for key, value in values.items():
                totals[key] = totals.get(key, 0.0) + value
            count += len(prompts)
        return {f"eval/{key}": round(value / max(1, count), 6) for key, value in totals.items()}

    def final_warnings(self) -> list[str]:
        if self.engine.generations and not self.steps_with_signal:
            return ["all rewards were equal within every group for the whole run: the policy received no learning signal"]
        return []

    # ------------------------------------------------------------------ one generation batch
    def fill_queue(self, model) -> None:
        """Sample and score the next generation batch and queue its rows."""
        scored = self.engine.next_batch()
        self._take_metrics(scored)
        rows = self.rows_of(scored)
        if self.completions.on and self.rank == 0:
            self.shown += self.completions.record(scored, self.engine.generations)
        self.queue.fill(model, rows, scored.skip, self.step, self.metrics)

    def rows_of(self, scored: ScoredBatch) -> list[TrainingRow]:
        s = self.settings
        if not s.min_filter_prefix_tokens:
            return training_rows(scored, s.mask_truncated_completions)
        ignored = shared_prefix_lengths(scored.rollout.completion_ids, scored.scores.total.tolist(), scored.group_size,
                                        s.min_filter_prefix_tokens, self.sampling.stop_token_ids)
        scored.metrics.describe({"prefix_filter/masked_rows": float(sum(1 for n in ignored if n)),
                                 "prefix_filter/masked_tokens": float(sum(ignored))})
        return training_rows(scored, s.mask_truncated_completions, ignored)

    def _take_metrics(self, scored: ScoredBatch) -> None:
        self.metrics = scored.metrics
        self.pending += scored.notes
        for failure in scored.scores.failures:
            self.pending.append(failure["summary"])
        if scored.metrics.batch["frac_reward_zero_std"] >= 1.0:
            self.zero_signal_steps += 1
            if self.zero_signal_steps == ZERO_SIGNAL_WARN_STEPS:
                self.pending.append(
                    f"no learning signal: every group's rewards were identical for {ZERO_SIGNAL_WARN_STEPS} generation batches "
                    "in a row (frac_reward_zero_std = 1.0). Check the reward functions on a few completions, raise "
                    "temperature or num_generations, or start from a model that sometimes succeeds")
        else:
            self.zero_signal_steps = 0
            self.steps_with_signal += 1

    @property
    def step_rows(self) -> int:
        """Rows of one optimizer step: micro_batch_size x gradient_accumulation_steps per process."""
        return self.parallel.rows_per_step

    def save_files(self, folder: Path) -> None:
        self.reference_moves.save(folder)

    def saved_files_bytes(self) -> int:
        return self.reference_moves.saved_bytes()

    def load_files(self, folder: Path) -> None:
        self.pending += self.reference_moves.load(folder)

