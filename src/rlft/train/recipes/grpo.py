"""Online RL recipe: GRPO and its family (GDPO, DAPO, GSPO, Dr. GRPO, RLOO, Cosmos-RL options).

Per optimizer step (`prepare_step`): draw prompts, sample G completions each with the rollout
engine, score them with the reward functions, compute group advantages, apply filters (dynamic
sampling, zero-advantage skip), compute old / reference log-probs when needed, and hand the loop
micro-batches of `micro_batch_size` completions. `loss` is then one forward and a pure policy loss.

Generation batches hold `steps_per_generation` optimizer steps of completions and are reused
`num_iterations` times (old log-probs cached from pass 0), as in TRL.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlft.errors import RolloutError
from rlft.losses.advantages import group_advantages, normalise_scale, overlong_penalty, zero_variance_groups
from rlft.losses.policy import policy_loss
from rlft.rollout.engine import LocalEngine, Rollout, SamplingParams
from rlft.train.batches import BatchPlan

# variant: Cosmos-RL shorthand -> the options it implies (only where the user did not set them)
VARIANTS = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group"},
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.0, "overlong_penalty": True, "filter_reward_metric": "reward"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4, "beta": 0.0},
}
ZERO_SIGNAL_WARN_STEPS = 10


def effective_options(cfg) -> dict[str, Any]:
    """`trl:` options with the documented defaults, the `variant` shorthand and `rl: gdpo` applied."""
    trl = cfg.trl
    options = {name: getattr(trl, name) for name in type(trl).model_fields}
    if trl.variant:
        for key, value in VARIANTS[trl.variant].items():
            if key not in trl.model_fields_set:
                options[key] = value
    defaults = {"num_generations": 8, "max_completion_length": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0, "num_iterations": 1, "steps_per_generation": 1, "scale_rewards": "group",
                "loss_type": "dapo", "epsilon": 0.2, "beta": 0.0, "multi_objective_aggregation": "sum_then_normalize",
                "advantage_estimator": "grpo", "importance_sampling_level": "token", "mask_truncated_completions": False}
    for key, value in defaults.items():
        if options.get(key) is None:
            options[key] = value
    if cfg.rl == "gdpo":
        options["multi_objective_aggregation"] = "normalize_then_sum"
    if options["advantage_estimator"] == "rloo" and "scale_rewards" not in trl.model_fields_set:
        options["scale_rewards"] = "none"  # RLOO (Ahmadian et al. 2024) and TRL's RLOOTrainer do not divide by a std
    options["scale_rewards"] = "none" if options["unbiased_advantage"] else normalise_scale(options["scale_rewards"])
    return options


class RolloutContext:
    """What a user `rollout_func(prompts, trainer)` receives as `trainer`."""

    def __init__(self, recipe: "GRPORecipe", model):
        self.model = model
        self.processing_class = recipe.tokenizer
        self.args = recipe.options
        self._recipe = recipe

    def generate(self, prompt_ids: list[list[int]], num_samples: int = 1) -> Rollout:
        """Sample with the run's sampling settings (for rollout functions that drive their own turns)."""
        return self._recipe.engine(self.model).generate(prompt_ids, num_samples, self._recipe.sampling)


class GRPORecipe:
    def __init__(self, cfg, data, tokenizer, rewards, reference, console, shard: tuple[int, int] = (0, 1)):
        self.cfg = cfg
        self.name = cfg.rl
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.reference = reference
        self.console = console
        self.options = o = effective_options(cfg)
        self.group = o["num_generations"]
        completions_per_step = o["generation_batch_size"] or cfg.micro_batch_size * cfg.gradient_accumulation_steps
        self.prompts_per_step = completions_per_step // self.group
        self.draws_per_step = 1  # one plan batch (prompts_per_step prompts) per optimizer step
        self.sampling = SamplingParams(
            max_new_tokens=o["max_completion_length"], temperature=o["temperature"], top_p=o["top_p"], top_k=o["top_k"] or 0,
            min_p=o["min_p"] or 0.0, repetition_penalty=o["repetition_penalty"], stop_token_ids=[tokenizer.eos_token_id],
            stop_strings=list((o["generation_kwargs"] or {}).get("stop", []) or []),
        )
        if o["generation_kwargs"] and set(o["generation_kwargs"]) - {"stop"}:
            raise RolloutError(f"trl.generation_kwargs: only `stop` is supported by the in-process engine, got {sorted(o['generation_kwargs'])}")
        self.rollout_func = load_rollout_func(o["rollout_func"]) if o["rollout_func"] else None
        identity = lambda rows: {"prompts": rows}  # noqa: E731
        self.train_plan = BatchPlan(data.train, self.prompts_per_step, cfg.seed, tokenizer.pad_token_id, shard=shard, collate=identity)
        self.eval_plan = BatchPlan(data.eval, cfg.eval_batch_size or 64, cfg.seed, tokenizer.pad_token_id, collate=identity)
        self.queue: list[list[list[dict[str, Any]]]] = []  # steps -> micro-batches -> completion rows, still to train on
        self.metrics: dict[str, float] = {}
        self.rollout_metrics: dict[str, float] = {}
        self.zero_signal_steps = 0
        self.steps_with_signal = 0
        self.steps_seen = 0
        self._engine: LocalEngine | None = None

    # ------------------------------------------------------------------ loop interface
    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        return self.eval_plan.sequential() if self.eval_plan.items else []

    def engine(self, model) -> LocalEngine:
        target = getattr(model, "module", model)
        if self._engine is None or self._engine.model is not target:
            self._engine = LocalEngine(target, self.tokenizer.pad_token_id, self.tokenizer)
        return self._engine

    def step_metrics(self) -> dict[str, float]:
        """This step's metrics; the rollout statistics (rewards, lengths) describe the batch being trained on,
        so they repeat on steps that reuse it (num_iterations / steps_per_generation), phase times do not."""
        fresh, self.metrics = self.metrics, {}
        self.rollout_metrics.update({k: v for k, v in fresh.items() if not k.startswith("time/")})
        return {**self.rollout_metrics, **fresh}

    def prepare_step(self, model, draw) -> list[dict[str, Any]]:
        if not self.queue:
            self._generate_windows(model, draw)
        window = self.queue.pop(0)
        if not window:
            self.metrics["skipped_zero_adv_batches"] = 1.0
        return [self._collate(rows) for rows in window]

    def _collate(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return completion_batch(rows, self.tokenizer.pad_token_id)

    def state_dict(self) -> dict[str, Any]:
        """Queued rollouts and health counters: a resume trains on exactly the rows an uninterrupted run would."""
        return {"queue": self.queue, "steps_seen": self.steps_seen, "zero_signal_steps": self.zero_signal_steps,
                "steps_with_signal": self.steps_with_signal, "rollout_metrics": self.rollout_metrics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue = state.get("queue", [])
        self.steps_seen = state.get("steps_seen", 0)
        self.zero_signal_steps = state.get("zero_signal_steps", 0)
        self.steps_with_signal = state.get("steps_with_signal", 0)
        self.rollout_metrics = state.get("rollout_metrics", {})

    def loss_units(self, batch: dict[str, Any]) -> float:
        mask = batch["completion_mask"]
        loss_type = self.options["loss_type"]
        if loss_type == "grpo":
            return float((mask.sum(-1) > 0).sum())
        if loss_type == "dr_grpo":
            return float(mask.size(0) * (self.options["unbiased_loss_max_tokens"] or self.options["max_completion_length"]))
        if loss_type == "bnpo":
            return 1.0
        return float(mask.sum())

    def loss(self, model, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        o = self.options
        need_entropy = True  # logged every step (TRL's `entropy`); with a gradient only when entropy_coeff > 0
        logps, entropy = completion_logps(model, batch, o["temperature"], need_entropy, grad_entropy=bool(o["entropy_coeff"]))
        result = policy_loss(
            logps, batch.get("old_logps", logps.detach()), batch["advantages"], batch["completion_mask"],
            loss_type=o["loss_type"], epsilon=o["epsilon"], epsilon_high=o["epsilon_high"], delta=o["delta"],
            lower_bound_ratio=o["lower_bound_ratio"], aipo_rho=o["aipo_rho"], importance_sampling_level=o["importance_sampling_level"],
            ref_logps=batch.get("ref_logps"), beta=o["beta"], entropy=entropy, entropy_coeff=o["entropy_coeff"] or 0.0,
            positive_nll_coef=o["positive_nll_coef"] or 0.0,
            max_completion_length=o["unbiased_loss_max_tokens"] or o["max_completion_length"],
        )
        return result.loss_sum, result.metrics

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Greedy completion per held-out prompt, scored by the reward functions: eval/reward (accuracy for 0/1 rewards)."""
        greedy = dataclasses.replace(self.sampling, temperature=0.0)
        totals, count = {}, 0
        for batch in batches:
            prompts = batch["prompts"]
            rollout = self.engine(model).generate([p["prompt_ids"] for p in prompts], 1, greedy)
            scores = self._score(model, prompts, rollout, 1)
            total = scores["total"]
            values = {"reward": float(torch.nan_to_num(total, 0.0).sum())}
            for name, column in scores["per_function"].items():
                values[f"rewards/{name}/mean"] = float(torch.nan_to_num(column, 0.0).sum())
            for key, value in values.items():
                totals[key] = totals.get(key, 0.0) + value
            count += len(prompts)
        return {f"eval/{key}": round(value / max(1, count), 6) for key, value in totals.items()}

    # ------------------------------------------------------------------ one generation batch
    def _generate_windows(self, model, draw) -> None:
        o = self.options
        self._maybe_update_reference(model)
        spg, needed = o["steps_per_generation"], self.prompts_per_step * o["steps_per_generation"]
        started = time.perf_counter()
        prompts, rollout, scores = self._sample_and_score(model, [p for _ in range(spg) for p in draw()["prompts"]])
        timings = {"time/generate": scores.pop("generate_time"), "time/reward": scores.pop("reward_time")}
        filter_metric = o["filter_reward_metric"]
        if filter_metric:  # DAPO dynamic sampling: keep groups whose filter reward varies, draw more (bounded)
            prompts, rollout, scores, retries = self._dynamic_sampling(model, draw, prompts, rollout, scores, filter_metric, needed)
            self.metrics["dynamic_sampling/retries"] = float(retries)
        advantages = group_advantages(scores["matrix"], scores["weights"], self.group, scale=o["scale_rewards"],
                                      aggregation=o["multi_objective_aggregation"], estimator=o["advantage_estimator"])
        rows = self._rows(prompts, rollout, advantages.advantages)
        self._record(scores, advantages, rollout, timings)
        if o["log_completions"]:
            self._log_completions(prompts, rollout, scores, advantages.advantages)
        logp_start = time.perf_counter()
        if o["num_iterations"] > 1 or spg > 1:  # the policy moves before these rows are used: cache old log-probs now
            self._attach_logps(model, rows, "old_logps", reference=False)
        if o["beta"]:
            self._attach_logps(model, rows, "ref_logps", reference=True)
        self.metrics["time/logprobs"] = round(time.perf_counter() - logp_start, 4)
        self.metrics["time/rollout_total"] = round(time.perf_counter() - started, 4)
        skip = o["skip_zero_advantage_batches"] and bool((advantages.advantages == 0).all())
        windows = [] if skip else self._windows(rows)
        if skip:
            windows = [[] for _ in range(spg)]
        self.queue = [window for _ in range(o["num_iterations"]) for window in windows]

    def _sample_and_score(self, model, prompts: list[dict[str, Any]]):
        started = time.perf_counter()
        if self.rollout_func is not None:
            rollout, extra = self._user_rollout(model, prompts)
        else:
            rollout, extra = self.engine(model).generate([p["prompt_ids"] for p in prompts], self.group, self.sampling), {}
        generated = time.perf_counter()
        scores = self._score(model, prompts, rollout, self.group, extra)
        scores["generate_time"] = round(generated - started, 4)
        scores["reward_time"] = round(time.perf_counter() - generated, 4)
        return prompts, rollout, scores

    def _score(self, model, prompts: list[dict[str, Any]], rollout: Rollout, group: int,
               extra: dict[str, list] | None = None) -> dict[str, Any]:
        """Reward matrix (N, K [+ overlong]) and the weighted total per completion."""
        if hasattr(self.rewards, "score_rollout"):  # a reward computed from token ids and the model (EBFT)
            result = self.rewards.score_rollout(model, prompts, rollout, group)
        else:
            texts = self.tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
            expanded = [p for p in prompts for _ in range(group)]
            conversational = [isinstance(p["prompt"], list) for p in expanded]
            completions = [[{"role": "assistant", "content": t}] if chat else t for t, chat in zip(texts, conversational)]
            columns: dict[str, list] = {}
            for name in expanded[0]["columns"] if expanded else []:
                columns[name] = [p["columns"].get(name) for p in expanded]
            columns.update(extra or {})
            result = self.rewards.score([p["prompt"] for p in expanded], completions, rollout.completion_ids, columns)
        for failure in result.failures:
            self.console.print(f"warning: reward function {failure['function']} failed: {failure['error']} "
                               f"(input: {failure['example']})", style="yellow", markup=False, soft_wrap=True)
        matrix, weights = result.values, torch.tensor([f.weight for f in self.rewards.functions], dtype=torch.float32)
        names = [f.name for f in self.rewards.functions]
        o = self.options
        if o["overlong_penalty"]:
            maximum = o["max_completion_length"]
            lengths = torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32)
            factor = 1.0 if o["overlong_penalty_factor"] is None else o["overlong_penalty_factor"]
            penalty = overlong_penalty(lengths, maximum, o["overlong_buffer_length"] or max(1, maximum // 4), factor)
            matrix, weights, names = torch.cat([matrix, penalty[:, None]], 1), torch.cat([weights, torch.ones(1)]), names + ["overlong"]
        total = (torch.nan_to_num(matrix, 0.0) * weights).sum(-1)
        total[torch.isnan(matrix).all(-1)] = float("nan")
        return {"matrix": matrix, "weights": weights, "total": total, "per_function": dict(zip(names, matrix.T)),
                "metrics": result.metrics}

    def _dynamic_sampling(self, model, draw, prompts, rollout, scores, metric: str, needed: int):
        kept_prompts, kept_rollouts, kept_scores = [], [], []
        retries = 0
        metrics = [metric] if isinstance(metric, str) else list(metric)
        while True:
            flat = None
            for name in metrics:  # a group is dropped when every listed metric is constant within it
                values = scores["total"] if name == "reward" else scores["per_function"].get(name)
                if values is None:
                    raise RolloutError(f"trl.filter_reward_metric {name!r} is not a reward function name "
                                       f"(have: {sorted(scores['per_function'])}) nor 'reward'")
                constant = zero_variance_groups(values, self.group)
                flat = constant if flat is None else flat & constant
            keep = (~flat).nonzero().flatten().tolist()
            kept_prompts += [prompts[g] for g in keep]
            rows = [g * self.group + i for g in keep for i in range(self.group)]
            kept_rollouts.append(_select_rollout(rollout, rows))
            kept_scores.append({k: (v[rows] if k in ("matrix", "total") else v) for k, v in scores.items() if k != "per_function"})
            if len(kept_prompts) >= needed or retries >= (self.options["dynamic_sampling_max_retries"] or 0):
                break
            retries += 1
            prompts, rollout, scores = self._sample_and_score(model, draw()["prompts"])
            scores.pop("generate_time"), scores.pop("reward_time")
        if not kept_prompts:  # nothing varied even after retries: train on the last batch (it will have zero advantages)
            kept_prompts, kept_rollouts, kept_scores = prompts, [rollout], [scores]
        kept_prompts = kept_prompts[:needed]
        rows = len(kept_prompts) * self.group
        rollout = _concat_rollouts(kept_rollouts, rows)
        matrix = torch.cat([s["matrix"] for s in kept_scores])[:rows]
        weights = kept_scores[0]["weights"]
        total = torch.cat([s["total"] for s in kept_scores])[:rows]
        names = list(scores["per_function"]) if "per_function" in scores else []
        merged = {"matrix": matrix, "weights": weights, "total": total, "per_function": dict(zip(names, matrix.T)),
                  "metrics": kept_scores[-1]["metrics"]}
        return kept_prompts, rollout, merged, retries

    def _rows(self, prompts, rollout: Rollout, advantages: torch.Tensor) -> list[dict[str, Any]]:
        mask_truncated = self.options["mask_truncated_completions"]
        rows = []
        for index, (prompt_ids, completion, truncated) in enumerate(zip(rollout.prompt_ids, rollout.completion_ids, rollout.truncated)):
            env_mask = getattr(rollout, "env_mask", None)
            mask = list(env_mask[index]) if env_mask is not None else [1] * len(completion)
            if mask_truncated and truncated:
                mask = [0] * len(completion)
            rows.append({"prompt_ids": prompt_ids, "completion_ids": completion, "mask": mask, "advantage": float(advantages[index])})
        return rows

    def _windows(self, rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """Split a generation batch into optimizer steps of gradient_accumulation_steps micro-batches."""
        size, per_step = self.cfg.micro_batch_size, self.cfg.micro_batch_size * self.cfg.gradient_accumulation_steps
        windows = []
        for start in range(0, len(rows), per_step):
            step_rows = rows[start : start + per_step]
            windows.append([step_rows[i : i + size] for i in range(0, len(step_rows), size)])
        return windows

    def _attach_logps(self, model, rows: list[dict[str, Any]], key: str, reference: bool) -> None:
        size = self.cfg.micro_batch_size
        device = next(model.parameters()).device
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in completion_batch(chunk, self.tokenizer.pad_token_id).items()}
            with torch.no_grad(), self._reference_context(model, reference) as scorer:
                logps, _ = completion_logps(scorer, batch, self.options["temperature"], False)
            for row, values in zip(chunk, logps):
                row[key] = values[: len(row["completion_ids"])].tolist()

    @contextmanager
    def _reference_context(self, model, reference: bool):
        if not reference:
            yield model
        elif self.reference is not None and self.reference.model is not None:
            yield self.reference.model
        else:
            with getattr(model, "module", model).disable_adapter():
                yield model

    def _maybe_update_reference(self, model) -> None:
        o = self.options
        ref = self.reference.model if self.reference is not None else None
        self.steps_seen += 1
        if ref is None:
            return
        due = lambda every: every and self.steps_seen > 1 and (self.steps_seen - 1) % every == 0  # noqa: E731
        if due(o["reference_reset_interval"]):
            ref.load_state_dict(_effective_weights(model))
        elif o["sync_ref_model"] and due(o["ref_model_sync_steps"] or 512):
            alpha = o["ref_model_mixup_alpha"] if o["ref_model_mixup_alpha"] is not None else 0.6
            weights = _effective_weights(model)
            with torch.no_grad():
                for name, ref_param in ref.state_dict().items():
                    ref_param.mul_(1 - alpha).add_(weights[name].to(ref_param), alpha=alpha)

    def _user_rollout(self, model, prompts: list[dict[str, Any]]):
        expanded = [p["prompt"] for p in prompts for _ in range(self.group)]
        result = self.rollout_func(copy.deepcopy(expanded), RolloutContext(self, getattr(model, "module", model)))
        missing = [key for key in ("prompt_ids", "completion_ids", "logprobs") if key not in (result or {})]
        if missing:
            raise RolloutError(f"trl.rollout_func {self.options['rollout_func']} returned no {', '.join(missing)}: it must return a "
                               "dict with prompt_ids, completion_ids and logprobs (one entry per prompt, G per prompt in order)")
        count = len(expanded)
        if any(len(result[key]) != count for key in ("prompt_ids", "completion_ids", "logprobs")):
            raise RolloutError(f"trl.rollout_func returned lists of the wrong length: expected {count} (prompts x num_generations)")
        rollout = Rollout(result["prompt_ids"], result["completion_ids"], result["logprobs"],
                          [self.tokenizer.eos_token_id not in ids for ids in result["completion_ids"]])
        if "env_mask" in result:
            rollout.env_mask = result["env_mask"]
        extra = {k: (v if isinstance(v, list) else [v] * count) for k, v in result.items()
                 if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        return rollout, extra

    def _record(self, scores, advantages, rollout: Rollout, timings) -> None:
        total = scores["total"]
        lengths = torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32)
        group_std = torch.nan_to_num(total.view(-1, self.group).std(-1), 0.0) if total.numel() >= self.group > 1 else torch.zeros(1)
        m = self.metrics
        m.update(timings)
        m["reward"] = float(torch.nan_to_num(total, 0.0).mean())
        m["reward_std"] = float(group_std.mean())
        m["frac_reward_zero_std"] = float(advantages.frac_zero_std)
        for name, column in scores["per_function"].items():
            finite = column[~torch.isnan(column)]
            m[f"rewards/{name}/mean"] = float(finite.mean()) if finite.numel() else float("nan")
            m[f"rewards/{name}/std"] = float(finite.std()) if finite.numel() > 1 else 0.0
        m.update({k: v for k, v in scores["metrics"].items() if k.endswith(("failures", "unscorable")) or not k.startswith("rewards/")})
        m["completions/mean_length"] = float(lengths.mean())
        m["completions/min_length"] = float(lengths.min())
        m["completions/max_length"] = float(lengths.max())
        m["completions/clipped_ratio"] = float(sum(rollout.truncated) / max(1, len(rollout.truncated)))
        generated = float(lengths.sum())
        m["generate_tokens_per_s"] = round(generated / max(timings["time/generate"], 1e-9), 1)
        self._health(m["frac_reward_zero_std"])

    def _log_completions(self, prompts, rollout: Rollout, scores, advantages: torch.Tensor) -> None:
        """Every completion of this generation batch to output_dir/completions.jsonl (TRL's log_completions)."""
        import json

        path = Path(self.cfg.output_dir) / "completions.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        texts = self.tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
        names = list(scores["per_function"])
        with open(path, "a") as handle:
            for index, text in enumerate(texts):
                prompt = prompts[index // self.group]["prompt"]
                rewards = {name: _finite_or_none(scores["per_function"][name][index]) for name in names}
                handle.write(json.dumps({"step": self.steps_seen, "prompt": prompt, "completion": text, "rewards": rewards,
                                         "advantage": round(float(advantages[index]), 6)}) + "\n")

    def _health(self, frac_zero_std: float) -> None:
        if frac_zero_std >= 1.0:
            self.zero_signal_steps += 1
            if self.zero_signal_steps == ZERO_SIGNAL_WARN_STEPS:
                self.console.print(
                    f"warning: no learning signal: every group's rewards were identical for {ZERO_SIGNAL_WARN_STEPS} generation "
                    "batches in a row (frac_reward_zero_std = 1.0). Check the reward functions on a few completions, raise "
                    "temperature or num_generations, or start from a model that sometimes succeeds",
                    style="bold yellow", markup=False, soft_wrap=True)
        else:
            self.zero_signal_steps = 0
            self.steps_with_signal += 1

    def final_warnings(self) -> list[str]:
        if self.steps_seen and not self.steps_with_signal:
            return ["all rewards were equal within every group for the whole run: the policy received no learning signal"]
        return []


def completion_batch(rows: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """[prompt left-padded | completion right-padded] rows with a completion mask and per-row values."""
    prompt_width = max(len(r["prompt_ids"]) for r in rows)
    completion_width = max(1, max(len(r["completion_ids"]) for r in rows))
    count = len(rows)
    input_ids = torch.full((count, prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((count, completion_width), dtype=torch.float32)
    for row, r in enumerate(rows):
        p, c = r["prompt_ids"], r["completion_ids"]
        input_ids[row, prompt_width - len(p) : prompt_width] = torch.tensor(p)
        attention[row, prompt_width - len(p) : prompt_width + len(c)] = 1
        if c:
            input_ids[row, prompt_width : prompt_width + len(c)] = torch.tensor(c)
            completion_mask[row, : len(c)] = torch.tensor(r["mask"], dtype=torch.float32)
    batch = {
        "input_ids": input_ids, "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
        "completion_mask": completion_mask, "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
        "completion_width": completion_width, "num_tokens": int(attention.sum()),
    }
    for key in ("old_logps", "ref_logps"):
        if all(key in r for r in rows):
            values = torch.zeros((count, completion_width), dtype=torch.float32)
            for row, r in enumerate(rows):
                values[row, : len(r[key])] = torch.tensor(r[key], dtype=torch.float32)
            batch[key] = values
    return batch


def completion_logps(model, batch: dict[str, Any], temperature: float, with_entropy: bool, grad_entropy: bool = False):
    """Per-token log-probs (B, C) of the completion tokens at `temperature`, and their entropy (or None)."""
    width = int(batch["completion_width"])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
                   logits_to_keep=width + 1, use_cache=False).logits[:, :-1]
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = batch["input_ids"][:, -width:]
    logps = log_probs.gather(-1, targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        context = torch.enable_grad() if grad_entropy else torch.no_grad()
        with context:
            entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropy


def load_rollout_func(name: str):
    """`module.fn` from the working directory (the same rule as dataset transforms and reward functions)."""
    module_name, _, fn_name = name.rpartition(".")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RolloutError(f"trl.rollout_func {name!r}: cannot import {module_name!r} from {Path.cwd()}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RolloutError(f"trl.rollout_func {name!r}: {module.__file__} has no function {fn_name!r}")
    return fn


def _effective_weights(model) -> dict[str, torch.Tensor]:
    """The policy's weights as a plain model's state dict (a LoRA adapter merged into a copy of its base)."""
    policy = getattr(model, "module", model)
    if hasattr(policy, "merge_and_unload"):
        return copy.deepcopy(policy).merge_and_unload().state_dict()
    return policy.state_dict()


def _finite_or_none(value: torch.Tensor) -> float | None:
    number = float(value)
    return None if number != number else round(number, 6)


def _select_rollout(rollout: Rollout, rows: list[int]) -> Rollout:
    return Rollout([rollout.prompt_ids[i] for i in rows], [rollout.completion_ids[i] for i in rows],
                   [rollout.logprobs[i] for i in rows], [rollout.truncated[i] for i in rows])


def _concat_rollouts(parts: list[Rollout], limit: int) -> Rollout:
    return Rollout(*[[item for part in parts for item in getattr(part, name)][:limit]
                     for name in ("prompt_ids", "completion_ids", "logprobs", "truncated")])
