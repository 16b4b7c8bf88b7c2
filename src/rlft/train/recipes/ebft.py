"""EBFT recipes: energy-based fine-tuning by feature matching (https://arxiv.org/abs/2603.12248).

Structured mode is GRPO with the feature-matching reward in place of reward functions, plus what
Axolotl leaves out: `ce_coef` adds cross-entropy on the ground-truth completion (a no-op there),
and `adaptive_max_tokens` caps each generation batch by its ground-truth lengths in synchronous
training too. Strided mode lives in `EBFTStridedRecipe`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from rlft.config.settings import Settings
from rlft.data.batches import BatchPlan
from rlft.losses.ebft import cfm_loss, ebft_advantages, feature_matching_rewards, strided_ebft_loss
from rlft.models.features import feature_layer_indices, hidden_features, hidden_layer_count
from rlft.data.collate import completion_batch
from rlft.models.logprobs import completion_logps
from rlft.phase_ranges import phase_range
from rlft.rollout.feature_reward import layer_slices
from rlft.rollout.strided import generate_blocks, model_attention, strided_layout
from rlft.rollout.strided_scores import strided_scores
from rlft.rollout.types import SamplingParams, TrainingRow
from rlft.train.recipe import LossOutput, Recipe
from rlft.train.recipes.grpo import GRPORecipe


class EBFTHealth:
    """Warnings from the EBFT docs' healthy ranges, once each: diversity above 1 (samples collapsing onto each
    other) or alignment below 0.05 (samples unrelated to the ground truth) for 10 optimizer steps in a row."""

    def __init__(self):
        self.counts, self.warned = {"collapse": 0, "alignment": 0}, set()

    def check(self, metrics: dict[str, float]) -> list[str]:
        messages = []
        for name, bad, text in (
            ("collapse", metrics.get("ebft/diversity", 0.0) > 1.0,
             "ebft/diversity > 1 for 10 steps: the samples are collapsing onto each other; raise temperature or diversity_coef"),
            ("alignment", metrics.get("ebft/alignment", 1.0) < 0.05,
             "ebft/alignment < 0.05 for 10 steps: samples do not resemble the ground truth; check feature_layers and the data"),
        ):
            self.counts[name] = self.counts[name] + 1 if bad else 0
            if self.counts[name] == 10 and name not in self.warned:
                self.warned.add(name)
                messages.append(text)
        if metrics.get("ebft/whitening_fallbacks", 0.0) > 0 and "whitening" not in self.warned:
            self.warned.add("whitening")
            messages.append(f"ebft: whitening failed for {metrics['ebft/whitening_fallbacks']:.0f} group(s) (a singular SVD, "
                            "twice) and they were scored on their raw features, whose diversity terms can outweigh the "
                            "other groups' (ebft/whitening_fallbacks counts them); duplicate samples cause it: raise "
                            "temperature, or set ebft.use_whitening: false")
        return messages


def adaptive_sampling(ebft) -> Callable[[list[dict[str, Any]], SamplingParams], SamplingParams]:
    """Axolotl's adaptive_max_tokens rule per generation batch: min(max gt length * multiplier, max), floored at
    min(64, max)."""

    def sampling_for(prompts: list[dict[str, Any]], sampling: SamplingParams) -> SamplingParams:
        cap = sampling.max_new_tokens
        wanted = max(int(len(p["ground_truth_ids"]) * ebft.gt_length_multiplier) for p in prompts)
        return dataclasses.replace(sampling, max_new_tokens=min(cap, max(wanted, min(64, cap))))

    return sampling_for


class EBFTStructuredRecipe(GRPORecipe):
    """GRPO with the feature-matching scorer, plus ground-truth cross-entropy (`ce_coef`) and EBFT's eval."""

    def __init__(self, cfg, settings: Settings, data, tokenizer, scorer, reference, shard: tuple[int, int] = (0, 1), make_engine=None,
                 remote_engine: bool = False):
        super().__init__(cfg, settings, data, tokenizer, scorer, reference, shard,
                         sampling_for=adaptive_sampling(cfg.ebft) if cfg.ebft.adaptive_max_tokens else None,
                         make_engine=make_engine, remote_engine=remote_engine)
        self.name = "ebft"
        self.ebft = cfg.ebft
        self.health = EBFTHealth()

    def start(self, model) -> None:
        super().start(model)
        # the feature network may be the policy with its adapter disabled: on rank 0, which scores, a whole model (the
        # unwrapped one, or the full copy of a sharded one) that it can run alone
        self.scorer.attach_policy(self.engine.runnable(model))

    def step_metrics(self) -> dict[str, float]:
        metrics = super().step_metrics()
        self.pending += self.health.check(metrics)
        return metrics

    def rows_of(self, scored) -> list[TrainingRow]:
        rows = super().rows_of(scored)
        if self.ebft.ce_coef:
            rows = [dataclasses.replace(row, ground_truth_ids=scored.prompt_of(index)["ground_truth_ids"])
                    for index, row in enumerate(rows)]
        return rows

    def micro_batch(self, rows: list[TrainingRow]) -> dict[str, Any]:
        batch = super().micro_batch(rows)
        if self.ebft.ce_coef:
            # one ground-truth row per prompt of this micro-batch, not one per sample (same mean NLL, 1/G of the work)
            unique = {(tuple(r.prompt_ids), tuple(r.ground_truth_ids)): r for r in rows}.values()
            truth = [{"prompt_ids": r.prompt_ids, "completion_ids": r.ground_truth_ids, "loss_mask": [1] * len(r.ground_truth_ids),
                      "advantage": 0.0} for r in unique]
            batch.update({f"gt_{k}": v for k, v in completion_batch(truth, self.tokenizer.pad_token_id).items()})
        return batch

    def loss(self, model, batch: dict[str, Any]) -> LossOutput:
        out = super().loss(model, batch)
        if self.ebft.ce_coef:
            nll = ground_truth_nll(model, batch)
            # scaled by this micro-batch's units, so after the loop's division it is ce_coef * mean NLL
            out.loss_sum = out.loss_sum + self.ebft.ce_coef * nll * out.units
            out.metrics["ebft/ce_loss"] = float(nll.detach())
        return out

    def evaluate_with_engine(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Held-out ground-truth cross-entropy (teacher forced) and greedy exact match with the ground truth."""
        greedy = dataclasses.replace(self.sampling, temperature=0.0, max_new_tokens=self.settings.max_completion_length)
        nll_total, tokens, hits, count = 0.0, 0, 0, 0
        ends = {self.tokenizer.eos_token_id, *self.sampling.stop_token_ids}  # answers and ground truths, without end tokens
        for batch in batches:
            prompts = batch["prompts"]
            rows = [{"prompt_ids": p["prompt_ids"], "completion_ids": p["ground_truth_ids"], "loss_mask": [1] * len(p["ground_truth_ids"]),
                     "advantage": 0.0} for p in prompts]
            truth = {k: v.to(next(model.parameters()).device) if isinstance(v, torch.Tensor) else v
                     for k, v in completion_batch(rows, self.tokenizer.pad_token_id).items()}
            logps, _ = completion_logps(model, truth, 1.0, False)
            nll_total += float(-(logps * truth["loss_mask"]).sum())
            tokens += int(truth["loss_mask"].sum())
            engine = self.engine.producer.engine
            rollout = self.engine.feed.engine_call(lambda: engine.generate([p["prompt_ids"] for p in prompts], greedy, 1))
            for p, completion in zip(prompts, rollout.completion_ids):
                hits += [t for t in completion if t not in ends] == [t for t in p["ground_truth_ids"] if t not in ends]
            count += len(prompts)
        return {"eval/ce_loss": round(nll_total / max(1, tokens), 6), "eval/exact_match": round(hits / max(1, count), 6)}


def ground_truth_nll(model, batch: dict[str, Any]) -> torch.Tensor:
    """Mean next-token NLL of the ground-truth completions (temperature 1) under the policy."""
    truth = {k[3:]: v for k, v in batch.items() if k.startswith("gt_")}
    logps, _ = completion_logps(model, truth, 1.0, False)
    mask = truth["loss_mask"]
    return -(logps * mask).sum() / mask.sum().clamp_min(1)


class EBFTStridedRecipe(Recipe):
    """Strided EBFT on documents: blocks generated in parallel inside one sequence, rewarded per block.

    Per micro-batch of right-padded documents: anchors every `stride` tokens from the first anchor;
    `n_samples_per_prompt` rollouts of `generate_max_len` tokens for every block at once (strided
    attention mask, position ids of the ground-truth tokens they replace); the frozen network embeds
    generated and ground-truth blocks with the same mask; per-block feature-matching rewards and
    REF's leave-one-out baseline; loss = rl_coef * REINFORCE (log-probs read where sampling read
    them, at the sampling temperature, each token weighted by its own block's advantage)
    + ce_coef * document cross-entropy (pads excluded).
    """

    name = "ebft"

    def __init__(self, cfg, data, tokenizer, frozen, shard: tuple[int, int] = (0, 1)):
        self.cfg, self.ebft, self.tokenizer, self.frozen = cfg, cfg.ebft, tokenizer, frozen
        self.health = EBFTHealth()
        self.pending: list[str] = []
        self.step_health: list[dict[str, float]] = []  # this optimizer step's micro-batches, judged once per step
        collate = lambda rows: document_batch(rows, tokenizer.pad_token_id)  # noqa: E731
        lengths = [len(e["input_ids"]) for e in data.train]
        # every micro-batch samples from a generator of its own (its `sample_seed`): the same samples on 1 or N
        # processes and after a resume, whatever else drew random numbers before
        self.train_plan = BatchPlan(data.train, cfg.micro_batch_size, cfg.seed, tokenizer.pad_token_id, shard=shard,
                                    collate=collate, lengths=lengths, seed_batches=True)
        self.eval_plan = BatchPlan(data.eval, cfg.eval_batch_size or cfg.micro_batch_size, cfg.seed, tokenizer.pad_token_id,
                                   collate=collate)

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        return self.eval_plan.sequential() if self.eval_plan.items else []

    def messages(self) -> list[str]:
        pending, self.pending = self.pending, []
        return pending

    def _layout(self, batch: dict[str, Any]):
        e = self.ebft
        prompts = batch["prompt_length"]
        first = torch.where(prompts > 0, prompts + e.min_completion_prefix, torch.full_like(prompts, e.context_length))
        return strided_layout(batch["attention_mask"].sum(-1), batch["input_ids"].shape[1], stride=e.stride,
                              context_length=e.context_length, generate_max_len=e.generate_max_len,
                              first_anchor=first if bool((prompts > 0).any()) else None)

    def _rewards(self, model, rollout, layout, whiten: bool | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-block advantages (B·n, K) from the frozen network's features (`whiten` overrides use_whitening)."""
        e, n = self.ebft, self.ebft.n_samples_per_prompt
        with torch.no_grad(), self.frozen.view(model) as network:
            layers = feature_layer_indices(hidden_layer_count(network), list(e.feature_layers))
            attention = model_attention(getattr(network, "module", network), layout, rollout.doc_attention[::n], rollout.mask, n)
            hidden = hidden_features(network, rollout.sequences, None, layers, position_ids=rollout.position_ids,
                                     attention_4d=attention)
        rows, num_blocks, gen_len = hidden.size(0), layout.num_blocks, layout.generate_max_len
        truth_columns = layout.anchors[:, None].to(hidden.device) + torch.arange(gen_len, device=hidden.device)
        truth = hidden[::n][:, truth_columns.reshape(-1)].view(rows // n, num_blocks, gen_len, -1)
        generated = hidden[:, layout.token_columns().to(hidden.device).reshape(-1)].view(rows, num_blocks, gen_len, -1)
        pool = (lambda x: x[..., -1, :]) if e.embed_method == "last_token" else (lambda x: x.mean(-2))
        truth, generated = pool(truth).float(), pool(generated).float()
        samples = generated.view(rows // n, n, num_blocks, -1).permute(0, 2, 1, 3).reshape((rows // n) * num_blocks, n, -1)
        fm = feature_matching_rewards(samples, truth.reshape(-1, truth.size(-1)), alignment_coef=e.alignment_coef,
                                      diversity_coef=e.diversity_coef, use_whitening=e.use_whitening if whiten is None else whiten,
                                      layer_count=layer_slices(e))
        advantages = ebft_advantages(fm.rewards, estimator=e.advantage_estimator, alignment=fm.alignment, pairwise=fm.pairwise,
                                     alignment_coef=e.alignment_coef, diversity_coef=e.diversity_coef)
        # (docs·K, n) -> (docs, n, K) -> rows b·n + j, blocks k
        advantages = advantages.view(rows // n, num_blocks, n).permute(0, 2, 1).reshape(rows, num_blocks)
        valid = layout.block_valid.repeat_interleave(n, 0).to(hidden.device)
        real = layout.block_valid.to(hidden.device).reshape(-1)  # (docs·K,): padding blocks are not reported
        normalised = torch.nn.functional.normalize
        cfm = cfm_loss(normalised(samples, dim=-1), normalised(truth.reshape(-1, truth.size(-1)), dim=-1))
        mean = lambda values: float(values[real].mean()) if bool(real.any()) else 0.0  # noqa: E731
        metrics = {"ebft/alignment": mean(fm.alignment), "ebft/diversity": mean(fm.diversity), "ebft/cfm_loss": mean(cfm),
                   "ebft/reward": mean(fm.rewards), "ebft/num_blocks": float(layout.block_valid.sum()),
                   "ebft/whitening_fallbacks": float((~fm.whitened)[real].sum()),
                   "ebft/advantages_std": float(advantages[valid].std()) if int(valid.sum()) > 1 else 0.0}
        return advantages * valid, metrics

    def loss(self, model, batch: dict[str, Any]) -> LossOutput:
        """The loss is already a mean over this micro-batch: one unit."""
        e = self.ebft
        layout = self._layout(batch)
        if layout.num_blocks <= 0:
            zero = sum(p.sum() * 0 for p in model.parameters() if p.requires_grad)
            return LossOutput(zero, 1, {"ebft/num_blocks": 0.0})
        started = time.perf_counter()
        with phase_range("generate"):
            rollout = generate_blocks(getattr(model, "module", model), batch["input_ids"], batch["attention_mask"], layout,
                                      num_samples=e.n_samples_per_prompt, temperature=e.temperature, top_p=e.top_p,
                                      generator=seeded(batch["input_ids"].device, batch.get("sample_seed")))
        generated = time.perf_counter()
        with phase_range("reward"):
            advantages, metrics = self._rewards(model, rollout, layout)
        rewarded = time.perf_counter()
        scores = strided_scores(model, {"input_ids": rollout.sequences, "attention_mask": rollout.attention,
                                        "position_ids": rollout.position_ids})
        gen_logps = scores.generated_logps(rollout.sequences, layout, e.temperature, top_p=e.top_p)
        gen_mask = rollout.block_valid[..., None].expand_as(gen_logps).float()
        doc_nll = doc_mask = None
        if e.ce_coef:
            doc_ids = batch["input_ids"].repeat_interleave(e.n_samples_per_prompt, 0)
            # prompt+completion documents: cross-entropy on the completion only (target index i+1 >= prompt length)
            prompts = batch["prompt_length"].repeat_interleave(e.n_samples_per_prompt, 0).to(doc_ids.device)
            targets = torch.arange(1, doc_ids.size(1), device=doc_ids.device)
            doc_nll, doc_mask = scores.document_nll(doc_ids, rollout.doc_attention, keep=targets[None, :] >= prompts[:, None])
        loss, loss_metrics = strided_ebft_loss(gen_logps, gen_mask, advantages.detach(), doc_nll, doc_mask,
                                               rl_coef=e.rl_coef, ce_coef=e.ce_coef)
        metrics.update(loss_metrics)
        rows = rollout.sequences.shape[0]
        metrics.update({"time/generate": generated - started, "time/reward": rewarded - generated,
                        "ebft/generated_tokens": float(rows * layout.num_blocks * layout.generate_max_len),
                        "ebft/sequence_tokens": float(rows * layout.total_len)})
        if model.training:
            self.step_health.append({key: value for key, value in metrics.items()
                                     if key in ("ebft/diversity", "ebft/alignment", "ebft/whitening_fallbacks")})
        return LossOutput(loss, 1, metrics)

    def step_metrics(self) -> dict[str, float]:
        """Nothing to add to the step's line (the trainer averages the micro-batches' metrics); the health ranges are
        judged here, once per optimizer step, on the step's mean diversity and alignment and its whitening fallbacks."""
        seen, self.step_health = self.step_health, []
        step = {}
        for key in ("ebft/diversity", "ebft/alignment"):
            values = [m[key] for m in seen if key in m]
            if values:
                step[key] = sum(values) / len(values)
        step["ebft/whitening_fallbacks"] = sum(m.get("ebft/whitening_fallbacks", 0.0) for m in seen)
        if seen:
            self.pending += self.health.check(step)
        return {}

    def evaluate(self, model, batches: list[dict[str, Any]]) -> dict[str, float]:
        """Held-out document cross-entropy and the feature-matching (CFM) loss of fresh samples (normalised features)."""
        nll_total, tokens, cfm, blocks = 0.0, 0, 0.0, 0
        for index, batch in enumerate(batches):
            scores = strided_scores(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})
            nll, mask = scores.document_nll(batch["input_ids"], batch["attention_mask"])
            nll_total, tokens = nll_total + float(nll.sum()), tokens + int(mask.sum())
            layout = self._layout(batch)
            if layout.num_blocks > 0:
                rollout = generate_blocks(getattr(model, "module", model), batch["input_ids"], batch["attention_mask"], layout,
                                          num_samples=self.ebft.n_samples_per_prompt, temperature=self.ebft.temperature,
                                          top_p=self.ebft.top_p, generator=seeded(batch["input_ids"].device, self.cfg.seed + index))
                # on L2-normalised features: whitened magnitudes scale with 1/singular value, not comparable across steps
                _, metrics = self._rewards(model, rollout, layout, whiten=False)
                cfm, blocks = cfm + metrics["ebft/cfm_loss"] * len(batch["input_ids"]), blocks + len(batch["input_ids"])
        return {"eval/ce_loss": round(nll_total / max(1, tokens), 6), "eval/cfm_loss": round(cfm / max(1, blocks), 6)}


def seeded(device: torch.device, seed: int | None) -> torch.Generator | None:
    """A generator on `device` seeded with `seed` (None: sample from the global generator)."""
    return None if seed is None else torch.Generator(device=device).manual_seed(int(seed))


def document_batch(rows: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Right-padded documents with their prompt lengths (0 for unstructured text)."""
    width = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, r in enumerate(rows):
        input_ids[row, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        attention[row, : len(r["input_ids"])] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "num_tokens": int(attention.sum()),
            "prompt_length": torch.tensor([r.get("prompt_length", 0) for r in rows], dtype=torch.long)}


