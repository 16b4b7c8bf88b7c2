"""Online RL recipe: GRPO and its family (GDPO, DAPO, GSPO, Dr. GRPO, RLOO, Cosmos-RL options).

The producer (rollout/producer.py) samples, scores, filters and computes advantages; this recipe is
the consumer. Per generation batch it turns the ScoredBatch into TrainingRows, caches old log-probs
(when the policy moves before the rows are used up) and reference log-probs (beta > 0), and splits
the rows into optimizer steps of micro-batches. Generation batches hold `steps_per_generation`
optimizer steps of completions and are reused `num_iterations` times, as in TRL. After each
optimizer step the engine gets the new weights (WeightSync) and the reference is reset or mixed
when due.
"""

from __future__ import annotations

import copy
import dataclasses
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import torch

from rlft.config.parallel import partitioned
from rlft.config.rl import GENERATION_KWARGS, rl_settings
from rlft.config.settings.model import model_settings
from rlft.data.batches import BatchPlan, PlanCursor
from rlft.errors import CheckpointError, RolloutError
from rlft.losses.importance import decoupled_weights, importance_weights, off_policy_sequence_mask
from rlft.losses.policy import policy_loss
from rlft.models.frozen import FrozenPolicy, ReferenceMoves
from rlft.data.collate import completion_batch, flatten_rows, pad_multiple
from rlft.models.logprobs import completion_logps, completion_scores, filters_active, sampled_logps, shared_completion_inputs
from rlft.models.loading import hub_revision
from rlft.data.tokenizer import end_ids
from rlft.rollout.engine import RolloutEngine
from rlft.models.compile import compile_options
from rlft.rollout.local import LocalEngine
from rlft.rollout.producer import Environment, RolloutProducer
from rlft.rollout.scoring import Scorer
from rlft.rollout.types import SamplingParams, ScoredBatch, TrainingRow, sampling_params
from rlft.rollout.user_rollouts import load_rollout_func
from rlft.train.metrics import clock
from rlft.train.recipe import LossOutput, Recipe
from rlft.train.recipes.completion_log import CompletionLog
from rlft.train.parallel import broadcast_object, gather_objects, gathered_state_dict, max_across, my_micro_batches
from rlft.train.rollout_feed import RolloutFeed
from rlft.train.weight_sync import WeightSync, sync_due

ZERO_SIGNAL_WARN_STEPS = 10
LOGP_VALUES = ("old_logps", "old_sampled_logps", "ref_logps", "sampling_logps")


def training_rows(scored: ScoredBatch, mask_truncated: bool) -> list[TrainingRow]:
    """One TrainingRow per sampled completion: its advantage, sampling log-probs and weight version come from
    `scored`; the loss mask is the rollout's env_mask (environment tokens never train), zeroed for truncated
    completions when `mask_truncated`."""
    rollout, rows = scored.rollout, []
    for index in range(len(rollout)):
        completion = rollout.completion_ids[index]
        mask = [0] * len(completion) if mask_truncated and rollout.truncated[index] else list(rollout.env_mask[index])
        rows.append(TrainingRow(prompt_ids=rollout.prompt_ids[index], completion_ids=completion, loss_mask=mask,
                                advantage=float(scored.advantages[index]), sampling_logps=rollout.logprobs[index],
                                weight_version=rollout.weight_versions[index], replayed=index in scored.replayed_rows))
    return rows


def row_inputs(row: TrainingRow) -> dict[str, Any]:
    return {"prompt_ids": row.prompt_ids, "completion_ids": row.completion_ids, "mask": row.loss_mask,
            "advantage": row.advantage, "old_logps": row.old_logps, "old_sampled_logps": row.old_sampled_logps,
            "ref_logps": row.ref_logps, "sampling_logps": row.sampling_logps}


class GRPORecipe(Recipe):
    def __init__(self, cfg, data, tokenizer, scorer: Scorer, reference: FrozenPolicy | None, shard: tuple[int, int] = (0, 1),
                 sampling_for: Callable[[list[dict[str, Any]], SamplingParams], SamplingParams] | None = None,
                 make_engine: Callable[..., RolloutEngine] | None = None, remote_engine: bool = False,
                 environment: Environment | None = None, sharing: tuple[bool, str] | None = None,
                 share_costs: tuple[int, int] | None = None, rows_apart: bool = False):
        """`make_engine(policy, version)` builds the rollout engine in `start` (default: an in-process LocalEngine
        holding its own copy of the trained weights); `remote_engine`: that engine holds a plain model of its own
        (a rollout server, or vLLM colocated), which gets the checkpoint's weights before it samples; `environment`
        plays episodes in place of the engine's single answers (NeMo Gym's agents, calling that server). `sharing`: each
        group's prompt once in a micro-batch (`share_prompts`), and the plan's line; `share_costs`: the model's forward
        costs (share only where that takes fewer FLOPs); `rows_apart`: flattened rows attend each on its own."""
        self.cfg, self.name, self.tokenizer, self.scorer, self.reference = cfg, cfg.rl, tokenizer, scorer, reference
        self.share_prompts, self.share_costs, self.rows_apart = bool(sharing and sharing[0]), share_costs, rows_apart
        if sharing is not None:
            self.plan_rows = (("prompts", sharing[1]),)
        self.settings = s = rl_settings(cfg)
        self.reference_moves = ReferenceMoves(reference, s)  # Cosmos-RL's reset, TR-DPO's soft update
        self.completions = CompletionLog(cfg.output_dir, tokenizer, bool(s.log_completions), s.num_completions_to_print or 0)
        unknown = sorted(set(s.raw["generation_kwargs"] or {}) - set(GENERATION_KWARGS))
        if unknown:
            raise RolloutError(f"trl.generation_kwargs: {unknown} not supported by the in-process engine (it takes "
                               f"{', '.join(GENERATION_KWARGS)})")
        self.sampling = sampling_params(s, end_ids(cfg.base_model, tokenizer, **hub_revision(model_settings(cfg), cfg.base_model)))
        # the off-policy terms compare the trainer with the engine: with sampling filters on, on the filtered distribution
        self.compares_sampled = filters_active(self.sampling) and (
            s.needs_sampling_correction or s.off_policy_mask_threshold is not None)
        self.sampling_for = sampling_for
        self.make_engine = make_engine or (lambda policy, version: LocalEngine.from_policy(
            policy, tokenizer.pad_token_id, tokenizer, version=version, compiled=compile_options(model_settings(cfg))))
        self.rollout_func = load_rollout_func(s.rollout_func, s) if s.rollout_func else None
        self.environment = environment
        identity = lambda rows: {"prompts": rows}  # noqa: E731
        # rank 0 draws, samples and scores every process's prompts (prompts_per_step counts them all) and broadcasts the
        # scored batch: one engine, one prompt order, the same batch as one process with the same global batch size
        self.rank, self.world = shard
        self.train_plan = BatchPlan(data.train, s.prompts_per_step, cfg.seed, tokenizer.pad_token_id, collate=identity)
        self.eval_plan = BatchPlan(data.eval, cfg.eval_batch_size or 64, cfg.seed, tokenizer.pad_token_id, collate=identity)
        # a generation batch (steps_per_generation plan batches) feeds ceil(its rows / one step's rows) steps, each
        # num_iterations times: the plan batches one optimizer step uses
        generation = s.steps_per_generation * s.prompts_per_step * s.num_generations
        self.draws_per_step = Fraction(s.steps_per_generation, s.num_iterations * max(1, -(-generation // self.step_rows)))
        self.prompts = PlanCursor(self.train_plan)
        self.remote_engine = remote_engine
        self.producer: RolloutProducer | None = None  # made in start(), from the loaded policy
        self.feed: RolloutFeed | None = None
        self.model = None  # the trained module (unwrapped), for weight pushes at checkpoints and evaluation
        self.step = 0
        self.queue: list[list[TrainingRow]] = []  # each optimizer step's rows (all processes'), still to train on
        self.twin = None  # rank 0's full copy of a sharded (FSDP2, ZeRO-3) policy, which the engine and weight sync read
        self.batch_metrics: dict[str, float] = {}  # describe the generation batch being trained on
        self.fresh: dict[str, float] = {}  # this step's own (phase times, skips)
        self.pending: list[str] = []  # warnings for the loop to print
        self.shown: list[str] = []  # sampled completions for the loop to print (trl.num_completions_to_print)
        self.empty_reason = "skipped_zero_adv_batches"  # the metric of a step with nothing to train on
        self.zero_signal_steps = self.steps_with_signal = 0
        self._restored: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifecycle
    def before_wrap(self, model) -> None:
        if self.rank == 0 and partitioned(self.cfg, self.world):
            self.twin = copy.deepcopy(model)  # taken before sharding: a plain model, refreshed by `whole`

    def whole(self, model):
        """The policy with whole weights, for the engine and weight sync (on rank 0); gathers a sharded one (every rank
        must call it together)."""
        weights = gathered_state_dict(model)
        if weights is None:  # whole on every rank already
            return model
        if self.twin is not None:
            self.twin.load_state_dict(weights)
        return self.twin

    def current(self, model):
        """The policy to bring the engine up to date from (evaluation, checkpoints): gathered only when rank 0's engine
        serves older weights than these, which rank 0 tells every process."""
        behind = broadcast_object(self.feed.weight_sync.pushed != self.feed.step if self.feed else None)
        return self.whole(model) if behind else model

    def engine_lost(self) -> None:
        if self.feed is not None:
            self.feed.lost = True

    def start(self, model) -> None:
        s, version = self.settings, self._restored.get("weight_version", 0) or 0
        self.model, self.step = model, self._restored.get("step", 0)
        policy = self.whole(model)
        if self.rank != 0:  # the other processes train on what rank 0 broadcasts
            return
        engine = self.make_engine(policy, version)
        # the in-process engine copies only what trains (the adapter, for LoRA) already: vllm_lora_sync is its default
        lora_folder = Path(self.cfg.output_dir) / "lora_sync" if s.lora_sync and self.remote_engine else None
        sync = WeightSync(engine, every=s.sync_interval, plain=self.remote_engine, lora_folder=lora_folder)
        self.feed = RolloutFeed(lambda **hooks: RolloutProducer(
            engine, self.scorer, self.prompts, s, self.tokenizer, self.sampling, self.rollout_func, self.sampling_for,
            seed=self.cfg.seed, environment=self.environment, **hooks), sync, s, self.cfg.max_steps, self.cfg.seed)
        self.producer = self.feed.producer
        self.producer.generations = self._restored.get("generations", 0)
        if self._restored:  # a resume generates the batches after its checkpoint again
            self.completions.resume(self.producer.generations)
        self.feed.load_state_dict(self._restored.get("feed", {}), self.step)
        if self.remote_engine:  # it serves whatever it held before (another run's weights or adapter): send all of ours
            sync.reset(policy, version)

    def after_optimizer_step(self, model, step: int) -> None:
        started = clock()
        self.step = step
        policy = self.whole(model) if sync_due(step, self.settings.sync_interval) else model
        main_thread = self.feed.after_optimizer_step(policy, step) if self.feed else 0.0
        self.reference_moves.after_step(model, step)
        self.fresh["time/weight_sync"] = round(clock() - started if not (self.feed and self.feed.depth) else main_thread, 4)
        if self.feed and self.feed.depth and self.feed.weight_sync.seconds:
            self.fresh["async/weight_load_s"] = round(self.feed.weight_sync.seconds, 4)

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        self.scorer.close()

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        return self.eval_plan.sequential() if self.eval_plan.items else []

    def epochs_done(self, loop_epochs: float) -> float:
        return self.prompts.epochs_done

    def state_dict(self) -> dict[str, Any]:
        """Queued rows, the prompt position and health counters: a resume trains on exactly the rows an
        uninterrupted run would, sampled from an engine of the recorded weight version."""
        policy = self.current(self.model) if self.model is not None else None
        feed = self.feed.state_dict(policy) if self.feed else {}
        return {"queue": [[row.to_state() for row in window] for window in self.queue],
                "prompts": self.prompts.state_dict(), "generations": self.producer.generations if self.producer else 0,
                "weight_version": feed.get("weight_version") or 0, "step": self.step, "feed": feed,
                "zero_signal_steps": self.zero_signal_steps, "steps_with_signal": self.steps_with_signal,
                "batch_metrics": self.batch_metrics, "empty_reason": self.empty_reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and "prompts" not in state:
            raise CheckpointError("this checkpoint was written by an rlft version before typed rollouts (its queued rows "
                                  "lack sampling log-probs and weight versions) and cannot be resumed exactly: start a new "
                                  "run from its model/ folder (base_model: <checkpoint>/model)")
        # a window is a list of rows (earlier versions: of micro-batches of rows)
        self.queue = [[TrainingRow.from_state(row) for row in _flat(window)] for window in state.get("queue", [])]
        self.prompts.load_state_dict(state.get("prompts", {}))
        self.zero_signal_steps = state.get("zero_signal_steps", 0)
        self.steps_with_signal = state.get("steps_with_signal", 0)
        self.batch_metrics = state.get("batch_metrics", {})
        self.empty_reason = state.get("empty_reason", self.empty_reason)
        self._restored = state

    # ------------------------------------------------------------------ a step
    def prepare_step(self, model) -> list[dict[str, Any]]:
        if not self.queue:
            self._fill_queue(model)
        window = self.queue.pop(0)
        if not window:
            self.fresh[self.empty_reason] = 1.0
        mine, count = my_micro_batches(window, self.rank, self.world, self.cfg.micro_batch_size, self.cfg.gradient_accumulation_steps)
        # a process with fewer rows than the others runs padding micro-batches (weight 0): collectives stay in step
        padding = [{**self.micro_batch(window[:1]), "padding": True}] * count if count else []
        return [self.micro_batch(rows) for rows in mine] + padding

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
            mask = batch["completion_mask"]
            metrics["sampling/outside_filters_fraction"] = round(float((dropped * mask).sum() / mask.sum().clamp_min(1)), 6)
        result = policy_loss(
            logps, batch.get("old_logps", logps.detach()), batch["advantages"], batch["completion_mask"],
            loss_type=s.loss_type, epsilon=s.epsilon, epsilon_high=s.epsilon_high, delta=s.delta,
            lower_bound_ratio=s.lower_bound_ratio, aipo_rho=s.aipo_rho, importance_sampling_level=s.importance_sampling_level,
            ref_logps=batch.get("ref_logps"), beta=s.beta, entropy=entropy, entropy_coeff=s.entropy_coeff,
            positive_nll_coef=s.positive_nll_coef, max_completion_length=s.unbiased_loss_max_tokens,
            is_weights=is_weights, sequence_keep=keep, bias_correction_kl=s.bias_correction_kl,
        )
        return LossOutput(result.loss_sum, float(result.units), {**result.metrics, **metrics}).plus_router_loss(router)

    def off_policy_terms(self, logps: torch.Tensor, batch: dict[str, Any], sampled: torch.Tensor | None = None):
        """The sampling correction (IS weights exp(old - sampling), or the decoupled loss's behaviour weights) and the
        off-policy sequence mask, from the engine's sampling log-probs and the trainer's old log-probs.

        The engine reports log-probs of the distribution it sampled from (after top-k, top-p, min-p and repetition
        penalty); with such filters on, the trainer's side of each comparison is taken from the same distribution
        (`sampled`: the current weights'; `old_sampled_logps`: cached at scoring time), so a ratio measures only
        the weights' difference and is 1 at zero staleness, not the filters' renormalisation."""
        s, mask = self.settings, batch["completion_mask"]
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
            keep, masked = off_policy_sequence_mask(current, reference, batch["advantages"], mask, s.off_policy_mask_threshold)
            metrics.update(masked)
        return weights, keep, metrics

    def step_metrics(self) -> dict[str, float]:
        """The batch's rollout statistics repeat on steps that reuse it (num_iterations, steps_per_generation); phase
        times and skips belong to the step that had them."""
        fresh, self.fresh = self.fresh, {}
        return {**self.batch_metrics, **fresh}

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
        policy = self.current(self.model)
        if self.rank == 0:
            self.feed.sync_now(policy)
        whole = self.twin if self.twin is not None else self.model
        return broadcast_object(self.evaluate_with_engine(whole, batches) if self.rank == 0 else None)

    def evaluate_with_engine(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Greedy completion per held-out prompt, scored by the reward functions: eval/reward (accuracy for 0/1 rewards)."""
        greedy = dataclasses.replace(self.sampling, temperature=0.0)
        totals, count = {}, 0
        for batch in batches:
            prompts = batch["prompts"]
            _, scores = self.producer.evaluate(prompts, greedy)
            values = {"reward": float(torch.nan_to_num(scores.total, 0.0).sum())}
            for name in scores.names:
                values[f"rewards/{name}/mean"] = float(torch.nan_to_num(scores.column(name), 0.0).sum())
            for key, value in values.items():
                totals[key] = totals.get(key, 0.0) + value
            count += len(prompts)
        return {f"eval/{key}": round(value / max(1, count), 6) for key, value in totals.items()}

    def final_warnings(self) -> list[str]:
        if self.producer and self.producer.generations and not self.steps_with_signal:
            return ["all rewards were equal within every group for the whole run: the policy received no learning signal"]
        return []

    # ------------------------------------------------------------------ one generation batch
    def _fill_queue(self, model) -> None:
        s = self.settings
        scored = broadcast_object(self.feed.next_batch() if self.rank == 0 else None)  # on the main thread, as every collective
        self._take_metrics(scored)
        rows = self._within_staleness(self.rows_of(scored))
        if self.completions.on and self.rank == 0:
            self.shown += self.completions.record(scored, self.producer.generations)
        # no update on these steps: no learning signal, or every row older than allowed_outdated_steps
        self.empty_reason = "skipped_zero_adv_batches" if scored.skip else "async/stale_batches_skipped"
        windows = [[] for _ in range(s.steps_per_generation)] if scored.skip or not rows else self._windows(rows)
        self.queue = [window for _ in range(s.num_iterations) for window in windows]
        trained = [row for window in windows for row in window]
        started = clock()
        recorded = [row for row in trained if row.replayed and not s.replay_recompute_logps]
        # Old log-probs are cached when the policy moves before these rows are used up (several optimizer steps:
        # num_iterations, steps_per_generation, a generation_batch_size above one step's rows), or when replayed rows
        # keep their recorded ones. Otherwise the loss's own log-probs are the old ones (same weights), for free.
        if sum(1 for window in self.queue if window) > 1 or recorded:
            for row in recorded:  # replay_recompute_logps: false keeps the log-probs recorded with the group
                row.old_logps = list(row.sampling_logps)
                row.old_sampled_logps = list(row.sampling_logps) if self.compares_sampled else None
            self._attach_logps(model, [row for row in trained if row.old_logps is None], "old_logps", reference=False)
        if s.beta:
            self._attach_logps(model, trained, "ref_logps", reference=True)
        self.fresh["time/logprobs"] = round(clock() - started, 4)
        self.fresh["time/rollout_total"] = round(self.fresh["time/rollout_total"] + self.fresh["time/logprobs"], 4)

    def _within_staleness(self, rows: list[TrainingRow]) -> list[TrainingRow]:
        """Rows sampled more than `allowed_outdated_steps` steps ago (replayed ones can be) are dropped, and counted."""
        bound = self.settings.allowed_outdated_steps
        if bound is None:
            return rows
        kept = [row for row in rows if self.step - row.weight_version <= bound]
        if len(kept) < len(rows):
            self.fresh["async/stale_rows_dropped"] = float(len(rows) - len(kept))
        return kept

    def rows_of(self, scored: ScoredBatch) -> list[TrainingRow]:
        return training_rows(scored, self.settings.mask_truncated_completions)

    def _take_metrics(self, scored: ScoredBatch) -> None:
        self.batch_metrics = {k: v for k, v in scored.metrics.items() if not k.startswith("time/")}
        self.fresh.update({k: v for k, v in scored.metrics.items() if k.startswith("time/")})
        self.pending += scored.notes
        for failure in scored.scores.failures:
            self.pending.append(failure["summary"])
        if scored.metrics["frac_reward_zero_std"] >= 1.0:
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
        return self.cfg.micro_batch_size * self.cfg.gradient_accumulation_steps * self.world

    def _windows(self, rows: list[TrainingRow]) -> list[list[TrainingRow]]:
        """Split a generation batch into optimizer steps of `step_rows` rows."""
        return [rows[start : start + self.step_rows] for start in range(0, len(rows), self.step_rows)]

    def _attach_logps(self, model, rows: list[TrainingRow], field: str, reference: bool) -> None:
        """Each process computes the log-probs of a contiguous share of the rows (a group's rows stay together, so they
        can share their prompt; the same number of forward passes on each, for FSDP's collectives), and all processes
        get all of them."""
        size = self.cfg.micro_batch_size
        device = next(model.parameters()).device
        bounds = [len(rows) * rank // self.world for rank in range(self.world + 1)]
        mine = rows[bounds[self.rank] : bounds[self.rank + 1]]
        passes = int(max_across(-(-len(mine) // size), device))
        values: list[tuple[list[float], list[float] | None]] = []
        for start in range(0, passes * size, size):
            chunk = mine[start : start + size] or rows[:1]  # a pass with nothing of its own: computed and dropped
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.micro_batch(chunk).items()}
            sampled = None
            with torch.no_grad():
                if reference:
                    with self.reference.view(model) as network:
                        logps, _ = completion_logps(network, batch, self.settings.temperature, False)
                else:
                    scores = completion_scores(model, batch)
                    logps, _ = scores.token_logps(self.settings.temperature, False)
                    sampled = sampled_logps(scores, batch, self.sampling, logps)[0] if self.compares_sampled else None
            if start < len(mine):
                values += [(logps[index, : len(row.completion_ids)].tolist(),
                            sampled[index, : len(row.completion_ids)].tolist() if sampled is not None else None)
                           for index, row in enumerate(chunk)]
        shared = gather_objects(values)  # rank order: rank r's are rows[bounds[r]:bounds[r + 1]], so all rows in order
        for index, (logps, sampled) in enumerate(shared):
            setattr(rows[index], field, logps)
            if sampled is not None:
                rows[index].old_sampled_logps = sampled

    def save_files(self, folder: Path) -> None:
        self.reference_moves.save(folder)

    def saved_files_bytes(self) -> int:
        return self.reference_moves.saved_bytes()

    def load_files(self, folder: Path) -> None:
        self.pending += self.reference_moves.load(folder)


def _flat(window: list) -> list:
    return [row for item in window for row in (item if isinstance(item, list) else [item])]
