"""Preference recipes: DPO family / IPO, ORPO, SimPO-CPO (pairs) and KTO (unpaired).

Pairs go through the policy in one forward (chosen rows, then rejected rows); sequence log-probs
are sums over completion tokens only. Reference log-probs come from the policy with its LoRA
adapter disabled or with its initial PiSSA/OLoRA adapter (no second model), from a frozen copy, or were
precomputed once into the examples.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlft.config.methods import method_spec
from rlft.config.settings import Settings
from rlft.data.preference import example_length, kto_batch, pair_batch, shared_pair_inputs
from rlft.losses.preference.dpo import bco_reward_mean_update, dpo_loss
from rlft.losses.preference.kto import kto_loss
from rlft.losses.preference.reference_free import cpo_loss, orpo_loss
from rlft.losses.preference.rows import chosen_nll
from rlft.losses.preference.weighting import ld_dpo_logps, token_log_sum_squared_probs, wpo_weights
from rlft.losses.linear_ce import linear_token_nll
from rlft.losses.sft import IGNORE, token_nll
from rlft.models.head import forward_hidden, output_layer, router_loss
from rlft.models.logprobs import masked_rows, model_inputs, padded
from rlft.models.frozen import FrozenPolicy
from rlft.models.masks import with_model_mask
from rlft.data.batches import BatchPlan, MicroBatch
from rlft.data.collate import flatten_rows, pad_multiple, padded_width
from rlft.train.parallel import barrier, eval_share, gather_objects, sum_dicts
from rlft.train.metrics import clock
from rlft.train.recipe import LossOutput, Recipe

INPUTS = ("input_ids", "attention_mask")


@dataclass
class SequenceLogps:
    """Per-sequence results of one forward over prompt+completion rows."""

    logps: torch.Tensor  # (N,) sum of completion-token log-probs
    lengths: torch.Tensor  # (N,) completion tokens
    token_logps: torch.Tensor  # (N, T-1)
    mask: torch.Tensor  # (N, T-1) completion-token positions
    mean_logits: torch.Tensor  # (N,) mean logit over completion positions (TRL's logits/* metric), detached
    log_sum_sq_probs: torch.Tensor | None = None  # (N, T-1) WPO alignment term, only when asked for
    sequence_logps: torch.Tensor | None = None  # (rows,) log-prob of every token after the first (prompt included)
    sequence_lengths: torch.Tensor | None = None  # (rows,) those tokens
    router: tuple[torch.Tensor, float] | None = None  # an MoE forward's load-balancing loss and its weight (head.router_loss)


def _through_output_layer(model, batch: dict[str, Any], prefix: str) -> SequenceLogps | None:
    """Completion-token log-probs with the output layer applied to the completion positions only, in chunks
    (`rlft.losses.linear_ce`, see `rlft.models.head`), or None where the model's own logits must be used."""
    head = output_layer(model)
    hidden, outputs = forward_hidden(model, with_model_mask(model, model_inputs(batch, prefix, INPUTS)), head) \
        if head is not None else (None, None)
    if hidden is None:
        return None
    hidden = padded(hidden, batch, prefix)
    targets = batch[prefix + "labels"][:, 1:]
    mask = targets != IGNORE
    picked = masked_rows(hidden, torch.nn.functional.pad(mask, (0, 1)))  # position t predicts target t + 1
    nll = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(
        mask, linear_token_nll(picked, head.weight, head.bias, targets[mask]))
    lengths = mask.sum(-1)
    # the mean logit over the vocabulary is h . mean(W) (+ mean(b)): no logits needed; in float32 under bf16 autocast too
    with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
        mean_row = head.weight.mean(0, dtype=torch.float32)  # no float32 copy of the (V, H) weight
        per_token = picked.float() @ mean_row + (head.bias.float().mean() if head.bias is not None else 0.0)
        per_position = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(mask, per_token)
        mean_logits = per_position.sum(-1) / lengths.clamp_min(1)
    return SequenceLogps(-nll.sum(-1), lengths, -nll, mask, mean_logits, router=router_loss(model, outputs))


def sequence_logps(model, batch: dict[str, Any], prefix: str = "", wpo: bool = False, whole_rows: int = 0) -> SequenceLogps:
    """`whole_rows`: also the log-prob of the whole text (prompt and answer) of the first `whole_rows` rows."""
    if not wpo and not whole_rows:  # both need every position's distribution
        fused = _through_output_layer(model, batch, prefix)
        if fused is not None:
            return fused
    outputs = model(**with_model_mask(model, model_inputs(batch, prefix, INPUTS)), use_cache=False)
    logits = padded(outputs.logits, batch, prefix)
    nll, mask = token_nll(logits, batch[prefix + "labels"])
    lengths = mask.sum(-1)
    whole = whole_lengths = None
    if whole_rows:
        ids, attention = batch[prefix + "input_ids"][:whole_rows], batch[prefix + "attention_mask"][:whole_rows]
        whole_nll, whole_mask = token_nll(logits[:whole_rows], torch.where(attention.bool(), ids, -100))
        whole, whole_lengths = -whole_nll.sum(-1), whole_mask.sum(-1)
    with torch.no_grad():
        per_position = logits[:, :-1].float().mean(-1)
        mean_logits = (per_position * mask).sum(-1) / lengths.clamp_min(1)
        sum_sq = token_log_sum_squared_probs(logits[:, :-1]) if wpo else None
    return SequenceLogps(-nll.sum(-1), lengths, -nll, mask, mean_logits, sum_sq, whole, whole_lengths, router_loss(model, outputs))


def reference_logps(reference: FrozenPolicy, policy, batch: dict[str, Any], prefix: str = "") -> SequenceLogps:
    with torch.no_grad(), reference.view(policy) as network:
        return sequence_logps(network, batch, prefix)


def pair_collate(pad_id: int, share: bool, one_sequence: bool = False, width: int = 0, multiple: int = 1):
    """Rows -> `pair_batch`, with each prompt shared by its two answers when `share` (`shared_pair_inputs`)."""
    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pair_batch(rows, pad_id, width, multiple)
        if share:
            batch.update(shared_pair_inputs(rows, batch["input_ids"].shape[1], pad_id, one_sequence, multiple))
        return batch
    return collate


class PairRecipe(Recipe):
    """DPO (every loss type) / IPO, ORPO and SimPO-CPO on (prompt, chosen, rejected) pairs."""

    def __init__(self, cfg, settings: Settings, data, pad_id: int, reference: FrozenPolicy | None, shard: tuple[int, int] = (0, 1),
                 sharing: tuple[bool, str] = (False, "twice per pair"), rows_apart: bool = False):
        """`rows_apart`: flattened rows attend each on its own (per-row SDPA, `rlft.models.varlen`); pairs sharing their
        prompt are then one sequence each, not the whole micro-batch in one sequence under one mask. Of `settings` the
        recipe reads the losses' weights."""
        self.cfg, self.weights = cfg, settings.loss
        self.method = cfg.method
        self.name = self.method
        self.reference = reference
        self.precompute_time = 0.0  # seconds computing reference log-probs before training (precompute_ref_log_probs)
        self.loss_types = list(cfg.dpo_loss_type or method_spec(self.method).default_loss_types)
        self.bco_mean, self.bco_count = 0.0, 0
        self.share_prompt = sharing[0]
        self.plan_rows = (("prompts", sharing[1]),)
        # dpo_padding_free with a mask (eager attention) and shared prompts: every pair of the micro-batch in one sequence
        collate = pair_collate(pad_id, self.share_prompt, cfg.flat_batches == "mask" and not rows_apart, padded_width(cfg),
                               pad_multiple(cfg))
        self.train_plan, self.eval_plan = preference_plans(cfg, data, pad_id, shard, collate,
                                                           flat=() if self.share_prompt else ("",))

    @property
    def needs_reference(self) -> bool:
        return method_spec(self.method).needs_reference

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        """Collated when asked: precomputed reference log-probs land in the examples after __init__."""
        return self.eval_plan.sequential() if self.eval_plan.items else []

    @staticmethod
    def _units(batch: dict[str, Any]) -> int:
        return batch["input_ids"].shape[0] // 2

    def _split(self, out: SequenceLogps, pairs: int, ld_alpha: float | None):
        if ld_alpha is not None:
            return ld_dpo_logps(out.token_logps[:pairs], out.mask[:pairs], out.token_logps[pairs:], out.mask[pairs:], ld_alpha)
        return out.logps[:pairs], out.logps[pairs:]

    def reference_logps(self, policy, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if "ref_chosen" in batch:
            return batch["ref_chosen"], batch["ref_rejected"]
        out = reference_logps(self.reference, policy, batch)
        return self._split(out, batch["input_ids"].shape[0] // 2, self.cfg.dpo_ld_alpha)

    def micro_batch_loss(self, model, batch: MicroBatch) -> LossOutput:
        """A padding micro-batch (weight 0) leaves BCO's running mean as it is."""
        return self.loss(model, batch.inputs, counted=not batch.padding)

    def loss(self, model, batch: dict[str, Any], counted: bool = True) -> LossOutput:
        cfg = self.cfg
        pairs = batch["input_ids"].shape[0] // 2
        spec = method_spec(self.method)
        whole = spec.odds_ratio and cfg.orpo_nll_span == "sequence"  # TRL's span: prompt and answer
        out = sequence_logps(model, batch, wpo=cfg.dpo_use_weighting, whole_rows=pairs if whole else 0)
        lengths_c, lengths_r = out.lengths[:pairs].float(), out.lengths[pairs:].float()
        nll = (chosen_nll(out.sequence_logps, out.sequence_lengths, cfg.chosen_nll_average) if whole else
               chosen_nll(out.logps[:pairs], lengths_c, cfg.chosen_nll_average))
        if spec.needs_reference:  # the DPO family (IPO is one of its loss types): margins over the reference
            chosen, rejected = self._split(out, pairs, cfg.dpo_ld_alpha)
            started = clock()
            ref_chosen, ref_rejected = self.reference_logps(model, batch)
            reference_time = None if "ref_chosen" in batch else clock() - started
            weights = None
            if cfg.dpo_use_weighting:  # the paper's calibrated weight (log sum p^2 per position), as TRL
                weights = wpo_weights(out.token_logps[:pairs], out.mask[:pairs], out.token_logps[pairs:], out.mask[pairs:],
                                      chosen_token_log_sum_sq_probs=out.log_sum_sq_probs[:pairs],
                                      rejected_token_log_sum_sq_probs=out.log_sum_sq_probs[pairs:])
            if model.training:  # evaluation must not move the running mean
                beta = self.weights.preference_beta
                self._bco_update(beta * (chosen - ref_chosen.to(chosen)), beta * (rejected - ref_rejected.to(rejected)),
                                 counted=counted)
            result = dpo_loss(chosen, rejected, ref_chosen.to(chosen), ref_rejected.to(chosen), loss_types=self.loss_types,
                              beta=self.weights.preference_beta, loss_weights=cfg.dpo_loss_weights, label_smoothing=cfg.dpo_label_smoothing,
                              chosen_lengths=lengths_c, rejected_lengths=lengths_r, chosen_nll=nll,
                              bco_running_mean=self._bco_mean(), discopop_tau=cfg.dpo_discopop_tau, sample_weights=weights)
            losses, chosen_rewards, rejected_rewards = result.losses, result.chosen_rewards, result.rejected_rewards
        elif spec.odds_ratio:
            weight = self.weights.orpo_lambda
            result = orpo_loss(out.logps[:pairs] / lengths_c.clamp_min(1), out.logps[pairs:] / lengths_r.clamp_min(1),
                               nll, alpha=weight)
            losses = result.losses
            # TRL's ORPO rewards: beta * average log-prob of each completion
            chosen_rewards = (weight * out.logps[:pairs] / lengths_c.clamp_min(1)).detach()
            rejected_rewards = (weight * out.logps[pairs:] / lengths_r.clamp_min(1)).detach()
        else:  # simpo / cpo
            loss_type = cfg.cpo_loss_type or "simpo"
            result = cpo_loss(out.logps[:pairs], out.logps[pairs:], lengths_c, lengths_r, loss_type=loss_type, beta=self.weights.preference_beta,
                              gamma=cfg.simpo_gamma, label_smoothing=cfg.dpo_label_smoothing, cpo_alpha=cfg.cpo_alpha,
                              chosen_nll=nll)
            losses, chosen_rewards, rejected_rewards = result.losses, result.chosen_rewards, result.rejected_rewards
        metrics = pair_metrics(chosen_rewards, rejected_rewards, out, pairs)
        if spec.odds_ratio:
            metrics["log_odds_ratio"] = float(result.log_odds_ratio.detach().mean())
            metrics["nll_loss"] = float(nll.detach().mean())
        if spec.needs_reference and reference_time is not None:
            metrics["time/reference"] = reference_time  # reference forwards, inside time/forward_backward
        # an MoE router's load-balancing loss (model_config: {output_router_logits: true}) of the pairs' forward
        return LossOutput(losses.sum(), self._units(batch), metrics).plus_router_loss(out.router)

    def state_dict(self) -> dict[str, Any]:
        """Recipe state that a checkpoint must carry for an exact resume (BCO's running reward mean)."""
        return {"bco_mean": self.bco_mean, "bco_count": self.bco_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bco_mean, self.bco_count = state.get("bco_mean", 0.0), state.get("bco_count", 0)

    def _bco_mean(self) -> float | None:
        return self.bco_mean if "bco_pair" in self.loss_types else None

    def _bco_update(self, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, counted: bool = True) -> None:
        """BCO's running reward mean includes this batch before its loss is computed (the paper's delta), over every
        process's micro-batch, so that all processes shift by the same mean; a padding micro-batch (an uneven split of
        the last batches) adds nothing."""
        if "bco_pair" in self.loss_types:
            rewards = torch.cat([chosen_rewards, rejected_rewards]).detach().reshape(-1).tolist() if counted else []
            gathered = torch.tensor(gather_objects(rewards), dtype=torch.float64)
            self.bco_mean, self.bco_count = bco_reward_mean_update(self.bco_mean, self.bco_count, gathered)

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        return _weighted_eval(self, model, batches)

    def precompute_reference(self, policy, examples: list[dict[str, Any]], pad_id: int, device, batch_size: int) -> None:
        _store_reference(self, policy, examples, pair_collate(pad_id, self.share_prompt), ("ref_chosen", "ref_rejected"), device, batch_size)


class KTORecipe(Recipe):
    """KTO on (prompt, completion, desirable?) rows; the KL reference point uses mismatched pairs."""

    name = "kto"
    needs_reference = True

    def __init__(self, cfg, settings: Settings, data, pad_id: int, reference: FrozenPolicy, shard: tuple[int, int] = (0, 1)):
        self.cfg, self.weights = cfg, settings.loss  # of `settings`, the losses' weights
        self.reference = reference
        self.precompute_time = 0.0
        # eval in data order: the KL reference point z0 is a mean over each batch's mismatched rows, so batches sorted
        # by length would change what the eval measures, not only its padding
        self.train_plan, self.eval_plan = preference_plans(cfg, data, pad_id, shard, lambda rows: kto_batch(rows, pad_id, padded_width(cfg), pad_multiple(cfg)),
                                                           flat=("", "kl_"), eval_by_length=False)

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        """Collated when asked: precomputed reference log-probs land in the examples after __init__."""
        return self.eval_plan.sequential() if self.eval_plan.items else []

    @staticmethod
    def _units(batch: dict[str, Any]) -> int:
        return batch["input_ids"].shape[0]

    def reference_logps(self, policy, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if "ref_logps" in batch:
            return batch["ref_logps"], batch["ref_kl_logps"]
        return reference_logps(self.reference, policy, batch).logps, reference_logps(self.reference, policy, batch, "kl_").logps

    def loss(self, model, batch: dict[str, Any]) -> LossOutput:
        out = sequence_logps(model, batch)
        with torch.no_grad():
            kl_policy = sequence_logps(model, batch, "kl_").logps
        started = clock()
        ref, ref_kl = self.reference_logps(model, batch)
        reference_time = None if "ref_logps" in batch else clock() - started
        result = kto_loss(out.logps, ref.to(out.logps), batch["desirable"], kl_policy, ref_kl.to(out.logps), beta=self.weights.preference_beta,
                          desirable_weight=self.cfg.kto_desirable_weight, undesirable_weight=self.cfg.kto_undesirable_weight)
        desirable, logps = batch["desirable"], out.logps.detach()
        metrics = {"kl": float(result.kl.detach())}
        if desirable.any():
            metrics.update({"rewards/chosen": float(result.chosen_rewards.mean()), "logps/chosen": float(logps[desirable].mean())})
        if (~desirable).any():
            metrics.update({"rewards/rejected": float(result.rejected_rewards.mean()), "logps/rejected": float(logps[~desirable].mean())})
        if desirable.any() and (~desirable).any():
            metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
        if reference_time is not None:
            metrics["time/reference"] = reference_time  # reference forwards, inside time/forward_backward
        # an MoE router's load-balancing loss of the completions' forward (the KL rows' is without gradient)
        return LossOutput(result.losses.sum(), self._units(batch), metrics).plus_router_loss(out.router)

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        return _weighted_eval(self, model, batches)

    def precompute_reference(self, policy, examples: list[dict[str, Any]], pad_id: int, device, batch_size: int) -> None:
        _store_reference(self, policy, examples, lambda rows: kto_batch(rows, pad_id), ("ref_logps", "ref_kl_logps"), device, batch_size)


def _store_reference(recipe, policy, examples, collate, keys: tuple[str, str], device, batch_size: int) -> None:
    """Write the reference log-probs of every example into it under `keys` (computed, never read from a cache)."""
    for start in range(0, len(examples), batch_size):
        rows = examples[start : start + batch_size]
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in collate(rows).items() if k not in keys}
        first, second = recipe.reference_logps(policy, batch)
        for example, a, b in zip(rows, first.tolist(), second.tolist()):
            example[keys[0]], example[keys[1]] = a, b


def preference_plans(cfg, data, pad_id: int, shard: tuple[int, int], collate, flat: tuple[str, ...] = (),
                     eval_by_length: bool = True) -> tuple[BatchPlan, BatchPlan]:
    """Length-grouped training batches and eval batches of preference-style examples (shortest first when
    `eval_by_length`); with `dpo_padding_free`, the rows under each prefix in `flat` also as one sequence without
    padding."""
    if cfg.flat_batches and flat:
        padded_collate, block_mask = collate, cfg.flat_batches == "mask"

        def collate(rows):
            batch = padded_collate(rows)
            for prefix in flat:
                batch.update(flatten_rows(batch[prefix + "input_ids"], batch[prefix + "attention_mask"], block_mask, prefix))
            return batch
    lengths = [example_length(e) for e in data.train]
    train = BatchPlan(data.train, cfg.micro_batch_size, cfg.seed, pad_id, shard=shard, collate=collate, lengths=lengths)
    evaluation = BatchPlan(data.eval, cfg.eval_batch_size or cfg.micro_batch_size, cfg.seed, pad_id, collate=collate,
                           lengths=[example_length(e) for e in data.eval] if eval_by_length else None)
    return train, evaluation


PAIR_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
                "logits/chosen", "logits/rejected")


def pair_metrics(chosen_rewards, rejected_rewards, out: SequenceLogps, pairs: int) -> dict[str, float]:
    """TRL's metric names for preference pairs, each a mean over the pairs: the eight means as one tensor, read once
    (a float() per mean is an operator of its own, and on a GPU a wait)."""
    with torch.no_grad():
        chosen, rejected = chosen_rewards, rejected_rewards
        columns = (chosen, rejected, chosen > rejected, chosen - rejected, out.logps[:pairs], out.logps[pairs:],
                   out.mean_logits[:pairs], out.mean_logits[pairs:])
        means = torch.stack([column.float() for column in columns]).mean(-1).tolist()
    return dict(zip(PAIR_METRICS, means))


def _weighted_eval(recipe, model, batches: list[dict[str, Any]]) -> dict[str, float]:
    """Loss and metrics over all eval batches, weighted by loss units; names prefixed `eval/`. Each process evaluates
    every world-th batch and the sums are gathered."""
    totals: dict[str, float] = {}
    for batch, weight in eval_share(batches, recipe.train_plan.rank, recipe.train_plan.world):
        out = recipe.loss(model, batch)
        units = out.units * weight
        totals["loss"] = totals.get("loss", 0.0) + float(out.loss_sum) * weight
        totals["units/loss"] = totals.get("units/loss", 0) + units
        for key, value in out.metrics.items():
            if key.startswith("time/"):
                continue
            totals[key] = totals.get(key, 0.0) + value * units
            totals[f"units/{key}"] = totals.get(f"units/{key}", 0) + units
    totals = sum_dicts(totals)
    return {f"eval/{key}": round(totals[key] / max(1, totals[f"units/{key}"]), 6) for key in totals if not key.startswith("units/")}


def data_fingerprint(examples: list[dict[str, Any]], *parts: Any) -> str:
    """Identifies tokenised data (+ whatever else the cached values depend on) for the reference cache."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    for example in examples:
        digest.update(json.dumps({k: v for k, v in example.items() if not k.startswith("ref_")}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def precompute_or_load(recipe, policy, data, pad_id: int, device, batch_size: int, cache_dir: Path, identity: Any, console) -> None:
    """Reference log-probs for every train/eval example, computed once and cached under output_dir.

    The cache file name is a fingerprint of the tokenised data and the reference identity, so a
    changed dataset (or model, or LD-DPO alpha) on resume is recomputed, never reused stale.
    """
    for split, examples in (("train", data.train), ("eval", data.eval)):
        if not examples:
            continue
        path = cache_dir / f"ref_logps-{split}-{data_fingerprint(examples, identity)}.json"
        if path.exists():
            values = json.loads(path.read_text())
            for example, cached in zip(examples, values):
                example.update(cached)
            console.print(f"reference log-probs ({split}): reused {path}")
            continue
        was_training, started = policy.training, time.perf_counter()
        policy.eval()
        rank, world = recipe.train_plan.rank, recipe.train_plan.world  # each process computes every world-th row
        # shortest first: each batch holds rows of similar lengths, so little of it is padding (the values land in
        # the examples themselves, whatever the order)
        recipe.precompute_reference(policy, sorted(examples[rank::world], key=example_length), pad_id, device, batch_size)
        policy.train(was_training)
        shared = gather_objects([{k: v for k, v in e.items() if k.startswith("ref_")} for e in examples[rank::world]])
        order = [index for part in range(world) for index in range(part, len(examples), world)]
        for index, values in zip(order, shared):
            examples[index].update(values)
        recipe.precompute_time += time.perf_counter() - started
        if rank == 0:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps([{k: v for k, v in e.items() if k.startswith("ref_")} for e in examples]))
            tmp.rename(path)
            console.print(f"reference log-probs ({split}): computed for {len(examples)} rows, cached in {path}")
        barrier()  # the cache is whole before any process looks for it again
