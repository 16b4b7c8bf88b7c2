"""EBFT recipes: energy-based fine-tuning by feature matching (https://arxiv.org/abs/2603.12248).

Structured mode is GRPO with the feature-matching reward in place of reward functions, plus what
Axolotl leaves out: `ce_coef` adds cross-entropy on the ground-truth completion (a no-op there),
and `adaptive_max_tokens` caps each generation batch by its ground-truth lengths in synchronous
training too. Strided mode lives in `EBFTStridedRecipe`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rlft.train.recipes.grpo import GRPORecipe, completion_batch, completion_logps


class EBFTStructuredRecipe(GRPORecipe):
    def __init__(self, cfg, data, tokenizer, scorer, reference, console, shard: tuple[int, int] = (0, 1)):
        super().__init__(cfg, data, tokenizer, scorer, reference, console, shard)
        self.name = "ebft"
        self.ebft = cfg.ebft

    def _sample_and_score(self, model, prompts: list[dict[str, Any]]):
        if self.ebft.adaptive_max_tokens:  # Axolotl's rule: min(len(gt) * multiplier, max), floored at min(64, max)
            cap = self.options["max_completion_length"]
            wanted = max(int(len(p["ground_truth_ids"]) * self.ebft.gt_length_multiplier) for p in prompts)
            self.sampling = dataclasses.replace(self.sampling, max_new_tokens=min(cap, max(wanted, min(64, cap))))
        return super()._sample_and_score(model, prompts)

    def _rows(self, prompts, rollout, advantages):
        rows = super()._rows(prompts, rollout, advantages)
        if self.ebft.ce_coef:
            for index, row in enumerate(rows):
                row["ground_truth_ids"] = prompts[index // self.group]["ground_truth_ids"]
        return rows

    def _collate(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super()._collate(rows)
        if self.ebft.ce_coef:
            truth = [{"prompt_ids": r["prompt_ids"], "completion_ids": r["ground_truth_ids"], "mask": [1] * len(r["ground_truth_ids"]),
                      "advantage": 0.0} for r in rows]
            batch.update({f"gt_{k}": v for k, v in completion_batch(truth, self.tokenizer.pad_token_id).items()})
        return batch

    def loss(self, model, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        loss_sum, metrics = super().loss(model, batch)
        if self.ebft.ce_coef:
            nll = ground_truth_nll(model, batch)
            # scaled by this micro-batch's units, so after the loop's division it is ce_coef * mean NLL
            loss_sum = loss_sum + self.ebft.ce_coef * nll * self.loss_units(batch)
            metrics["ebft/ce_loss"] = float(nll.detach())
        return loss_sum, metrics

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Held-out ground-truth cross-entropy (teacher forced) and greedy exact match with the ground truth."""
        greedy = dataclasses.replace(self.sampling, temperature=0.0, max_new_tokens=self.options["max_completion_length"])
        nll_total, tokens, hits, count = 0.0, 0, 0, 0
        eos = self.tokenizer.eos_token_id
        for batch in batches:
            prompts = batch["prompts"]
            rows = [{"prompt_ids": p["prompt_ids"], "completion_ids": p["ground_truth_ids"], "mask": [1] * len(p["ground_truth_ids"]),
                     "advantage": 0.0} for p in prompts]
            truth = {k: v.to(next(model.parameters()).device) if isinstance(v, torch.Tensor) else v
                     for k, v in completion_batch(rows, self.tokenizer.pad_token_id).items()}
            logps, _ = completion_logps(model, truth, 1.0, False)
            nll_total += float(-(logps * truth["completion_mask"]).sum())
            tokens += int(truth["completion_mask"].sum())
            rollout = self.engine(model).generate([p["prompt_ids"] for p in prompts], 1, greedy)
            for p, completion in zip(prompts, rollout.completion_ids):
                hits += [t for t in completion if t != eos] == [t for t in p["ground_truth_ids"] if t != eos]
            count += len(prompts)
        return {"eval/ce_loss": round(nll_total / max(1, tokens), 6), "eval/exact_match": round(hits / max(1, count), 6)}


def ground_truth_nll(model, batch: dict[str, Any]) -> torch.Tensor:
    """Mean next-token NLL of the ground-truth completions (temperature 1) under the policy."""
    truth = {k[3:]: v for k, v in batch.items() if k.startswith("gt_")}
    logps, _ = completion_logps(model, truth, 1.0, False)
    mask = truth["completion_mask"]
    return -(logps * mask).sum() / mask.sum().clamp_min(1)
