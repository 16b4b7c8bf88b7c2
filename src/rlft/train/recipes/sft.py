"""SFT recipe: tokenised examples -> padded or packed batches -> next-token cross-entropy on targets."""

from __future__ import annotations

from typing import Any

import torch

from rlft.config.settings import Settings
from rlft.data.prepared import PreparedData
from rlft.data.batches import BatchPlan, MicroBatch, rows_collate
from rlft.data.collate import pad_multiple, packed_batch, padded_width
from rlft.data.stream import StreamedBatches, StreamPlan
from rlft.losses.linear_ce import linear_cross_entropy_sum
from rlft.losses.sft import IGNORE, sft_loss_sum
from rlft.models.head import forward_hidden, output_layer, router_loss
from rlft.models.liger import liger_linear_cross_entropy_sum, liger_loss
from rlft.models.masks import with_model_mask
from rlft.train.parallel import eval_share, sum_across
from rlft.train.recipe import LossOutput, Recipe

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "documents")


class SFTRecipe(Recipe):
    name = "sft"
    liger = False  # Liger's Triton kernel for the fused linear cross-entropy (CUDA; rlft.models.liger)
    prepare_phase = "data"  # a streamed run reads and tokenises its rows in prepare_step

    def __init__(self, cfg, settings: Settings, data: PreparedData, pad_id: int, shard: tuple[int, int] = (0, 1),
                 stream_tokenizer=None):
        """`stream_tokenizer`: the training rows are streamed (`pretraining_dataset`, `streaming: true`), read and
        tokenised with it as training goes (`rlft.data.stream`); `data` holds the eval rows only. Of `settings` the
        recipe reads the model's (its liger switch)."""
        capacity = cfg.sequence_len if cfg.sample_packing else None
        width = padded_width(cfg)
        # batch_flattening: each micro-batch's rows as one row, each document attending to itself (rlft.data.collate)
        mask = cfg.flat_batches == "mask"
        multiple = pad_multiple(cfg)
        flat = (lambda rows: packed_batch([rows], pad_id, width, mask, multiple)) if cfg.flat_batches and not capacity else None
        # sample_packing under flash-attention: a micro-batch's packed rows as one row, the documents found from the
        # position ids (transformers finds them only in a batch of one row)
        flash = cfg.effective_attn_implementation.startswith("flash_attention")
        packs = (lambda packs: packed_batch(packs, pad_id, width, False, multiple)) if flash else None
        flat = flat or (packs if capacity else None)
        lengths = [len(e["input_ids"]) for e in data.train] if cfg.group_by_length else None  # never with packing
        self.stream, self.accumulation, self._resume_note = None, cfg.gradient_accumulation_steps, None
        if stream_tokenizer is not None:
            collate = flat or rows_collate(bool(capacity), pad_id, width, multiple)
            self.stream = StreamedBatches(cfg, stream_tokenizer, collate, shard)
            self.train_plan = StreamPlan(cfg.max_steps * self.accumulation)
            self.plan_rows = (("data", self.stream.describe()),)
        else:
            self.train_plan = BatchPlan(data.train, cfg.micro_batch_size, cfg.seed, pad_id, capacity, shard, collate=flat,
                                        lengths=lengths, width=width, multiple=multiple)
        self.shard = shard
        self.liger = liger_loss(settings.model)
        packed_eval = cfg.sample_packing if cfg.eval_sample_packing is None else cfg.eval_sample_packing
        eval_plan = BatchPlan(data.eval, cfg.eval_batch_size or cfg.micro_batch_size, cfg.seed, pad_id,
                              cfg.sequence_len if packed_eval else None, width=width, multiple=multiple,
                              collate=packs if packed_eval else None,
                              lengths=None if packed_eval else [len(e["input_ids"]) for e in data.eval])  # shortest first
        self._eval_batches = eval_plan.sequential() if data.eval else []

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        return self._eval_batches

    def prepare_step(self, model: torch.nn.Module) -> list[MicroBatch] | None:
        """A streamed run's micro-batches for this step, else None (the loop draws them from `train_plan`)."""
        return None if self.stream is None else [MicroBatch.collated(b) for b in self.stream.step(self.accumulation)]

    def epochs_done(self, loop_epochs: float) -> float:
        return loop_epochs if self.stream is None else self.stream.epochs_done

    def state_dict(self) -> dict[str, Any]:
        return {} if self.stream is None else {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.stream is not None and "stream" in state:
            self.stream.load_state_dict(state["stream"])
        elif self.stream is not None or "stream" in state:
            self._resume_note = ("the checkpoint was written by a run that " + ("did not stream its data: the stream starts "
                                 "at its first row" if self.stream is not None else "streamed its data: these datasets "
                                 "start at their first batch"))

    def messages(self) -> list[str]:
        note, self._resume_note = self._resume_note, None
        return ([note] if note else []) + (self.stream.messages() if self.stream is not None else [])

    def final_warnings(self) -> list[str]:
        return [] if self.stream is None else self.stream.warnings()

    @staticmethod
    def _units(batch: dict[str, Any]) -> int:
        """Target tokens (the first position is never a target)."""
        return int((batch["labels"][:, 1:] != -100).sum())

    def _loss_sum(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """Sum of the target tokens' NLL."""
        return self._losses(model, batch)[0]

    def _losses(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, tuple | None]:
        """(Sum of the target tokens' NLL, an MoE router's load-balancing loss and its weight, or None). The output layer is
        applied to the target positions only, in chunks (rlft.losses.linear_ce), unless the model's logits are not
        plain `lm_head(hidden)` or its weights are sharded: then the model's own (B, T, V) logits."""
        inputs = with_model_mask(model, {k: batch[k] for k in MODEL_INPUTS if k in batch})  # packed rows' mask for eager
        head = output_layer(model)
        hidden, outputs = forward_hidden(model, inputs, head) if head is not None else (None, None)
        if hidden is not None:
            targets = batch["labels"][:, 1:]
            keep = targets != IGNORE
            loss_sum = liger_linear_cross_entropy_sum if self.liger else linear_cross_entropy_sum
            return loss_sum(hidden[:, :-1][keep], head.weight, head.bias, targets[keep]), router_loss(model, outputs)
        outputs = model(**inputs, use_cache=False)
        return sft_loss_sum(outputs.logits, batch["labels"])[0], router_loss(model, outputs)

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> LossOutput:
        """With an MoE router's loss (model_config: {output_router_logits: true}) the step's loss is the mean NLL plus
        router_aux_loss_coef x aux_loss, transformers' loss, its micro-batches weighted by their target tokens."""
        nll, router = self._losses(model, batch)
        return LossOutput(nll, self._units(batch)).plus_router_loss(router)

    def evaluate(self, model: torch.nn.Module, batches: list[dict[str, Any]]) -> dict[str, float]:
        total, count = 0.0, 0.0
        for batch, weight in eval_share(batches, *self.shard):  # every world-th batch here; the sums are gathered
            total, count = total + float(self._loss_sum(model, batch)) * weight, count + self._units(batch) * weight
        total, count = sum_across([total, count], batches[0]["labels"].device)
        loss = total / max(count, 1)
        return {"eval/loss": round(loss, 6), "eval/perplexity": round(float(torch.exp(torch.tensor(min(loss, 50.0)))), 4)}
