"""Bradley-Terry reward model: one forward over chosen and rejected texts, scalar score each."""

from __future__ import annotations

from typing import Any

import torch

from rlft.losses.preference.reward_model import bradley_terry_loss
from rlft.models.reward import pair_scores
from rlft.train.parallel import eval_share, gather_objects
from rlft.train.recipe import LossOutput, Recipe
from rlft.data.collate import pad_multiple, padded_width
from rlft.train.recipes.preference import _weighted_eval, pair_collate, preference_plans


class RewardModelRecipe(Recipe):
    name = "reward_model"
    needs_reference = False

    def __init__(self, cfg, data, pad_id: int, shard: tuple[int, int] = (0, 1), sharing: tuple[bool, str] = (False, "twice per pair")):
        self.cfg, self.pad_id = cfg, pad_id
        self.plan_rows = (("prompts", sharing[1]),)
        collate = pair_collate(pad_id, sharing[0], width=padded_width(cfg), multiple=pad_multiple(cfg))
        self.train_plan, self.eval_plan = preference_plans(cfg, data, pad_id, shard, collate)

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        """Collated when asked: precomputed reference log-probs land in the examples after __init__."""
        return self.eval_plan.sequential() if self.eval_plan.items else []

    @staticmethod
    def _units(batch: dict[str, Any]) -> int:
        return batch["input_ids"].shape[0] // 2

    def loss(self, model, batch: dict[str, Any]) -> LossOutput:
        pairs = batch["input_ids"].shape[0] // 2
        scores = pair_scores(model, batch, self.pad_id)
        chosen, rejected = scores[:pairs], scores[pairs:]
        losses, correct = bradley_terry_loss(chosen, rejected, batch.get("margin"), self.cfg.center_rewards_coefficient)
        detached = scores.detach()
        return LossOutput(losses.sum(), self._units(batch), {
            "accuracy": float(correct.float().mean()),
            "margin": float((chosen - rejected).detach().mean()),
            "rewards/chosen": float(chosen.detach().mean()),
            "rewards/rejected": float(rejected.detach().mean()),
            "rewards/min": float(detached.min()),
            "rewards/mean": float(detached.mean()),
            "rewards/max": float(detached.max()),
        })

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        result = _weighted_eval(self, model, batches)
        scores = torch.cat([pair_scores(model, b, self.pad_id) for b, _ in eval_share(batches, self.train_plan.rank, self.train_plan.world)])
        # extremes over the whole eval set, not averages of per-batch extremes (padding batches repeat real ones)
        extremes = gather_objects([(float(scores.min()), float(scores.max()))])
        result.update({"eval/rewards/min": round(min(low for low, _ in extremes), 6),
                       "eval/rewards/max": round(max(high for _, high in extremes), 6)})
        return result
