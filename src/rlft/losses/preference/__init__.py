"""Preference losses: the DPO family (dpo: IPO and 14 other loss types; weighting: WPO and LD-DPO), KTO, the
reference-free ORPO and CPO/SimPO, and the Bradley-Terry reward-model loss.

Every function is pure: it takes per-sequence log-probabilities (summed over the completion tokens, shape (B,)), completion
token counts where a loss needs per-token averages, and per-token log-probs with their masks only where a method needs them
(WPO, LD-DPO). Per-row losses come back with shape (B,); the recipe reduces them (mean over the batch, or a sum divided by
the accumulation window). Reference log-probs are treated as constants: they are detached here, whatever the caller passes.

Where TRL (v1.x, https://github.com/huggingface/trl) differs from the paper, the paper and its authors are followed and
the docstring says so.
"""
