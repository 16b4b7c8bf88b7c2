"""EBFT structured mode's reward: feature matching against the ground-truth completion.

For each prompt, the G sampled completions and the ground truth are embedded (prompt + completion)
by the frozen feature network (the policy with its LoRA adapter disabled or, for PiSSA and OLoRA, with its
initial adapter; or a frozen copy of the initial policy), pooled by `embed_method`, and scored with
`losses.ebft.feature_matching_rewards`:
r_j = alignment_coef * 2 cos(phi_j, phi_gt) - diversity_coef * 2/(n-1) sum_{j'!=j} phi_j . phi_j'.
It is a scorer in place of GRPO's reward functions, so advantages and the policy loss are GRPO's.
"""

from __future__ import annotations


import torch

from rlft.data.prompts import PromptRow
from rlft.losses.ebft import cfm_loss, feature_matching_rewards
from rlft.models.features import feature_layer_indices, hidden_features, hidden_layer_count, pool
from rlft.models.frozen import FrozenPolicy
from rlft.rollout.scoring import make_scores
from rlft.rollout.types import Scores


def layer_slices(ebft) -> int:
    """How many per-layer slices a pooled feature vector has (concat pools 3 positions of every layer)."""
    return len(ebft.feature_layers) * (3 if ebft.embed_method == "concat" else 1)


class FeatureMatchingReward:
    """A scorer (rollout/scoring.py) with one reward column, `feature_matching`."""

    def __init__(self, ebft, tokenizer, frozen: FrozenPolicy, batch_size: int = 32):
        self.ebft = ebft
        self.tokenizer = tokenizer
        self.frozen = frozen
        self.batch_size = batch_size
        self.names, self.weights = ["feature_matching"], [1.0]
        # a view (adapter disabled, or the initial adapter) runs the very module being trained: only where training runs,
        # never in a background thread
        self.needs_policy = not frozen.is_copy
        self.policy = None

    def attach_policy(self, policy) -> None:
        """The policy of which the feature network is a view (`FrozenPolicy.view`); also where features are computed."""
        self.policy = policy

    def close(self) -> None:
        """Nothing to release."""

    def embed(self, sequences: list[list[int]], completion_starts: list[int]) -> torch.Tensor:
        """Pooled features (N, D) of right-padded prompt+completion sequences, from the frozen network."""
        model = self.policy if self.policy is not None else self.frozen.model
        layers = feature_layer_indices(hidden_layer_count(model), list(self.ebft.feature_layers))
        device = next(model.parameters()).device
        pad = self.tokenizer.pad_token_id
        out = []
        with torch.no_grad(), self.frozen.view(model) as network:
            for start in range(0, len(sequences), self.batch_size):
                chunk = sequences[start : start + self.batch_size]
                width = max(len(s) for s in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=device)
                mask = torch.zeros((len(chunk), width), dtype=torch.long, device=device)
                for row, seq in enumerate(chunk):
                    ids[row, : len(seq)] = torch.tensor(seq, device=device)
                    mask[row, : len(seq)] = 1
                hidden = hidden_features(network, ids, mask, layers)
                starts = torch.tensor(completion_starts[start : start + self.batch_size], device=device)
                out.append(pool(hidden, mask, self.ebft.embed_method, starts).float())
        return torch.cat(out)

    def score(self, prompts: list[PromptRow], rollout, group: int, extra: dict[str, list] | None = None) -> Scores:
        """Rewards (N, 1) for N = len(prompts) * group completions, grouped per prompt."""
        generated = [p + c for p, c in zip(rollout.prompt_ids, rollout.completion_ids)]
        starts = [len(p) for p in rollout.prompt_ids]
        truths = [p["prompt_ids"] + p["ground_truth_ids"] for p in prompts]
        gt_starts = [len(p["prompt_ids"]) for p in prompts]
        features = self.embed(generated + truths, starts + gt_starts)
        samples = features[: len(generated)].view(len(prompts), group, -1)
        truth = features[len(generated):]
        # whitening per feature layer, as the paper's reference code does
        result = feature_matching_rewards(samples, truth, alignment_coef=self.ebft.alignment_coef,
                                          diversity_coef=self.ebft.diversity_coef, use_whitening=self.ebft.use_whitening,
                                          layer_count=layer_slices(self.ebft))
        metrics = {
            "ebft/alignment": float(result.alignment.mean()),
            "ebft/diversity": float(result.diversity.mean()),
            # on L2-normalised features: whitened magnitudes scale with 1/singular value
            "ebft/cfm_loss": float(cfm_loss(torch.nn.functional.normalize(samples, dim=-1),
                                            torch.nn.functional.normalize(truth, dim=-1)).mean()),
            "ebft/reward": float(result.rewards.mean()),
            # groups whose whitening failed twice (a singular SVD) and were scored on their raw features
            "ebft/whitening_fallbacks": float((~result.whitened).sum()),
        }
        return make_scores(result.rewards.reshape(-1, 1).float().cpu(), self.names, self.weights, metrics)
