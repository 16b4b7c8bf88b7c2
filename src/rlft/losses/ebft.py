"""EBFT (energy-based fine-tuning by feature matching): whitening, feature-matching rewards, advantages, strided loss.

Paper: Jelassi et al., "Energy-Based Fine-Tuning", https://arxiv.org/abs/2603.12248. Reference code ("REF"):
github.com/sjelassi/ebft_openrlhf.

A frozen feature network maps context + completion to a vector phi. The conditional feature-matching loss is
    L_CFM(theta) = E_(c,y) || E_{y^ ~ p_theta(.|c)} phi(y^) - phi(y) ||^2,
and the unbiased n-sample estimate of its negative gradient gives each of n samples of one context the reward (eq. 7)
    r_j = 2 phi(y^_j)^T phi(y) - 2/(n-1) sum_{j' != j} phi(y^_j)^T phi(y^_j'),
used with REINFORCE and a leave-one-out baseline. The variant used by the paper's runs (eq. 49) takes a cosine for the
alignment term and raw dot products of whitened features for the diversity term.

Every function is pure: features, rewards, log-probs and masks in, tensors out. Feature tensors are (G, n, D): G groups
(one context each, or one (document, block) pair in strided mode), n samples per group, D features (the selected hidden
layers concatenated). Rewards are computed without gradient (the inputs are detached).

Where Axolotl (`core/trainers/ebft`, https://github.com/axolotl-ai-cloud/axolotl) and REF differ, REF is followed unless
the docstring says why not.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

WHITEN_TOLERANCE = 1e-5
WHITEN_NOISE_SCALE = 1e-6
GRPO_EPS = 1e-8
ZERO_STD_ATOL = 1e-8
ESTIMATORS = ("rloo", "grpo", "reinforce")
ESTIMATOR_ALIASES = {"group_norm": "grpo"}


class FMOutput(NamedTuple):
    """Feature-matching rewards of G groups of n samples (all detached, in the features' float dtype).

    rewards: (G, n) alignment_coef * alignment - diversity_coef * diversity    (log the mean as `ebft/reward`)
    alignment: (G, n) 2 cos(phi~_j, g~)                                         (`ebft/alignment`)
    diversity: (G, n) 2/(n-1) sum_{j' != j} phi~_j^T phi~_j'; 0 when n = 1     (`ebft/diversity`)
    cfm: (G,) || mean_j phi~_j - g~ ||^2                                        (`ebft/cfm_loss`, a diagnostic)
    pairwise: (G, n, n) phi~_j^T phi~_j' (the diagonal holds squared norms; diversity ignores it), for the RLOO baseline
    whitened: (G,) bool, False where whitening was requested but fell back to the raw features (all True without it)
    """

    rewards: torch.Tensor
    alignment: torch.Tensor
    diversity: torch.Tensor
    cfm: torch.Tensor
    pairwise: torch.Tensor
    whitened: torch.Tensor


def _float(tensor: torch.Tensor) -> torch.Tensor:
    """Detached, in float64 when given float64 (exact tests), else float32 (SVD in bf16 is neither stable nor supported)."""
    tensor = tensor.detach()
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def _check_whiten_shapes(samples: torch.Tensor, ground_truth: torch.Tensor) -> None:
    if samples.dim() != 3 or ground_truth.dim() != 2 or ground_truth.shape != (samples.shape[0], samples.shape[2]):
        raise ValueError(
            f"whitening expects samples (G, n, D) and ground truth (G, D), got {tuple(samples.shape)} and "
            f"{tuple(ground_truth.shape)}"
        )
    if samples.shape[1] < 2:
        raise ValueError("whitening needs at least 2 samples per group")


def _whiten_svd(samples: torch.Tensor, ground_truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The D-space operator on float tensors (G, n, D), (G, D); raises torch.linalg.LinAlgError when the SVD fails.

    svd(Phi) = V S U^T (torch's U, S, Vh = V, S, U^T), so W = U diag(1/s) U^T with the pseudo-inverse cut-off, and
    Phi W = ((Phi U) diag(1/s)) U^T, g W likewise: W (D x D) is never formed."""
    _, singular, right = torch.linalg.svd(samples, full_matrices=False)  # right: (G, r, D), rows = U^T
    largest = singular.max(dim=-1, keepdim=True).values
    keep = singular > WHITEN_TOLERANCE * largest
    inverse = torch.where(keep, 1.0 / torch.where(keep, singular, torch.ones_like(singular)), torch.zeros_like(singular))
    basis = right.transpose(-1, -2)  # (G, D, r) = U
    samples_w = ((samples @ basis) * inverse.unsqueeze(-2)) @ right
    gt_w = ((ground_truth.unsqueeze(-2) @ basis) * inverse.unsqueeze(-2)) @ right
    if not (torch.isfinite(samples_w).all() and torch.isfinite(gt_w).all()):
        raise torch.linalg.LinAlgError("whitening produced non-finite values")
    return samples_w, gt_w.squeeze(-2)


def _whiten_one(samples: torch.Tensor, ground_truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One group (1, n, D), (1, D) in float: SVD, then SVD of a slightly perturbed copy, then give up (inputs, False)."""
    try:
        return (*_whiten_svd(samples, ground_truth), True)
    except torch.linalg.LinAlgError:
        pass
    if torch.isfinite(samples).all():
        # A fixed generator: the retry must not move the global RNG (runs stay reproducible).
        generator = torch.Generator(device=samples.device).manual_seed(0)
        noise = torch.randn(samples.shape, generator=generator, dtype=samples.dtype, device=samples.device)
        try:
            scale = WHITEN_NOISE_SCALE * samples.abs().mean()
            return (*_whiten_svd(samples + scale * noise, ground_truth), True)
        except torch.linalg.LinAlgError:
            pass
    return samples, ground_truth, False


def whiten_groups(samples: torch.Tensor, ground_truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whiten each group's n sample features and its ground-truth feature; samples (G, n, D), gt (G, D).

    Returns (samples_w (G, n, D), gt_w (G, D), ok (G,) bool) in the inputs' dtype. See `whiten` for the operator; the
    batched SVD runs once, and only when it fails are groups retried one by one with the fallback. Raises ValueError
    for n < 2 ("whitening needs at least 2 samples per group") or mismatched shapes.
    """
    _check_whiten_shapes(samples, ground_truth)
    dtype = samples.dtype
    phi, gt = _float(samples), _float(ground_truth)
    try:
        phi_w, gt_w = _whiten_svd(phi, gt)
        ok = torch.ones(phi.shape[0], dtype=torch.bool, device=phi.device)
    except torch.linalg.LinAlgError:
        results = [_whiten_one(phi[i : i + 1], gt[i : i + 1]) for i in range(phi.shape[0])]
        phi_w = torch.cat([r[0] for r in results])
        gt_w = torch.cat([r[1] for r in results])
        ok = torch.tensor([r[2] for r in results], dtype=torch.bool, device=phi.device)
    return phi_w.to(dtype), gt_w.to(dtype), ok


def whiten(samples: torch.Tensor, ground_truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Whiten n sample features (n, D) and the ground-truth feature (D,) with the samples' second moment (D-space).

        Phi^T = U S V^T (thin SVD, D x r),  s^+_i = 1/s_i if s_i > 1e-5 max(s) else 0,  W = U diag(s^+) U^T (D x D)
        Phi~ = Phi W,  g~ = g W                                   (no renormalisation afterwards)

    W = ((Phi^T Phi)^+)^{1/2}, the pseudo-inverse square root of the uncentred second moment (paper appendix:
    phi~ = (Sigma^+)^{1/2} phi, Sigma = Phi^T Phi / n). Phi~ = V U^T: with n independent samples its rows are
    orthonormal, so whitened sample-sample dot products are 0 and the diversity term only penalises (near-)duplicates.

    Choice: the ground truth is whitened in D-space, g~ = g U S^+ U^T (g projected onto the samples' span,
    rescaled per direction), as the paper appendix and Axolotl do. REF instead applies the n x n operator to n copies of
    g, which gives a scalar multiple of the raw g: under the cosine of the alignment term, REF compares whitened samples
    with the unwhitened ground-truth direction. The appendix form is the defined one; a g orthogonal to every sample
    has g~ = 0 and gets alignment 0.

    Rank-deficient groups (duplicates, collinear samples, n > D): directions with s_i <= 1e-5 max(s) are dropped, so
    Phi~ = V_r U_r^T stays finite, and Phi~ Phi~^T = V_r V_r^T is the projection onto the range of Phi in R^n. With k
    identical samples among otherwise independent ones, the duplicates get norm^2 1/k and pairwise dot products 1/k
    (> 0: a penalised duplicate) while every other pair has 0. All n samples collinear, phi_j = c_j u (rank 1):
    phi~_j = (c_j / ||c||) u, pairwise dots c_j c_j' / ||c||^2, and every alignment is +-2 (or 0 when g is orthogonal
    to u). All-zero samples give zeros (the pseudo-inverse of 0 is 0).

    Scale: the 1/n of Sigma is left out (as Axolotl and REF), so Phi~ is 1/sqrt(n) times the appendix's and whitened
    dot products are 1/n of appendix eq. 48 (a duplicate pair at n = 4 has diversity 1/3, not 4/3). With n fixed this
    is a constant factor on diversity_coef; the cosine alignment is unaffected.

    Fallback: if the SVD fails (LinAlgError, non-finite result), it is retried once on samples + 1e-6 mean|Phi| noise
    (fixed seed); if that fails too the inputs come back unchanged with ok False (the caller logs it).
    Raises ValueError("whitening needs at least 2 samples per group") for n = 1: a single sample has no second moment
    worth whitening by (Phi~ would be x/||x||, dropping all magnitude information, and diversity is undefined).
    """
    if samples.dim() != 2 or ground_truth.dim() != 1 or ground_truth.shape[0] != samples.shape[1]:
        raise ValueError(
            f"whiten expects samples (n, D) and ground truth (D,), got {tuple(samples.shape)} and "
            f"{tuple(ground_truth.shape)}"
        )
    if samples.shape[0] < 2:
        raise ValueError("whitening needs at least 2 samples per group")
    dtype = samples.dtype
    samples_w, gt_w, ok = _whiten_one(_float(samples).unsqueeze(0), _float(ground_truth).unsqueeze(0))
    return samples_w[0].to(dtype), gt_w[0].to(dtype), ok


def cfm_loss(samples: torch.Tensor, ground_truth: torch.Tensor) -> torch.Tensor:
    """Conditional feature-matching loss per group: || mean_j phi_j - g ||^2; samples (G, n, D), gt (G, D) -> (G,).

    Pass the features the rewards used (normalised or whitened). A diagnostic (`ebft/cfm_loss`, the mean over groups):
    it differs from the true L_FM by a theta-independent variance term and is never differentiated."""
    return (samples.mean(dim=1) - ground_truth).pow(2).sum(dim=-1)


def _whiten_per_layer(
    samples: torch.Tensor, ground_truth: torch.Tensor, layer_count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, n, dim = samples.shape
    if layer_count < 1 or dim % layer_count:
        raise ValueError(f"feature dim {dim} does not split into {layer_count} equal layer slices")
    width = dim // layer_count
    per_layer = samples.reshape(groups, n, layer_count, width).permute(0, 2, 1, 3).reshape(groups * layer_count, n, width)
    samples_w, gt_w, ok = whiten_groups(per_layer, ground_truth.reshape(groups * layer_count, width))
    samples_w = samples_w.reshape(groups, layer_count, n, width).permute(0, 2, 1, 3).reshape(groups, n, dim)
    return samples_w, gt_w.reshape(groups, dim), ok.reshape(groups, layer_count).all(dim=1)


def feature_matching_rewards(
    samples: torch.Tensor,
    ground_truth: torch.Tensor,
    *,
    alignment_coef: float = 1.0,
    diversity_coef: float = 1.0,
    use_whitening: bool = False,
    layer_count: int = 1,
) -> FMOutput:
    """Feature-matching rewards (paper eq. 7, variant (i) eq. 49); samples (G, n, D), ground_truth (G, D).

    Features phi~, g~:
        use_whitening false: phi~ = phi / ||phi||, g~ = g / ||g||, the WHOLE concatenated vector normalised jointly as
            REF (`critic.py`). Axolotl strided normalises each layer then concatenates (norm sqrt(n_layers)), which
            over-weights diversity by up to n_layers against the cosine alignment; Axolotl structured does
            not normalise per layer either, so both readings agree here.
        use_whitening true: phi~, g~ = `whiten_groups` (D-space, see `whiten`); n = 1 raises ValueError.
            layer_count > 1 splits D into that many equal slices (one per hidden layer) and whitens each on its own,
            as REF's `whiten_embeddings_batched` does per layer; 1 whitens the concatenation, as Axolotl. Pass the
            number of feature layers to follow REF.

    Per sample j of a group:
        alignment_j = 2 cos(phi~_j, g~)                                (0 when either vector is 0)
        diversity_j = 2/(n-1) sum_{j' != j} phi~_j^T phi~_j'           (dot products, not cosines; 0 when n = 1)
        reward_j    = alignment_coef * alignment_j - diversity_coef * diversity_j
        cfm         = || mean_j phi~_j - g~ ||^2 per group
    `pairwise` (G, n, n) holds phi~_j^T phi~_j' for `ebft_advantages`' leave-one-out baseline.
    A group whose whitening fell back uses its raw (unnormalised) features; `whitened` flags it.
    """
    if samples.dim() != 3 or ground_truth.dim() != 2 or ground_truth.shape != (samples.shape[0], samples.shape[2]):
        raise ValueError(
            f"feature_matching_rewards expects samples (G, n, D) and ground truth (G, D), got {tuple(samples.shape)} "
            f"and {tuple(ground_truth.shape)}"
        )
    phi, gt = _float(samples), _float(ground_truth)
    n = phi.shape[1]
    if use_whitening:
        if n < 2:
            raise ValueError("whitening needs at least 2 samples per group")
        phi, gt, whitened = _whiten_per_layer(phi, gt, layer_count)
    else:
        phi, gt = F.normalize(phi, dim=-1), F.normalize(gt, dim=-1)
        whitened = torch.ones(phi.shape[0], dtype=torch.bool, device=phi.device)
    alignment = 2.0 * F.cosine_similarity(phi, gt.unsqueeze(1).expand_as(phi), dim=-1)
    pairwise = phi @ phi.transpose(-1, -2)
    if n > 1:
        others = pairwise.sum(dim=-1) - torch.diagonal(pairwise, dim1=-2, dim2=-1)
        diversity = 2.0 / (n - 1) * others
    else:
        diversity = torch.zeros_like(alignment)
    rewards = alignment_coef * alignment - diversity_coef * diversity
    return FMOutput(rewards, alignment, diversity, cfm_loss(phi, gt), pairwise, whitened)


def ebft_advantages(
    rewards: torch.Tensor,
    *,
    estimator: str,
    alignment: torch.Tensor | None = None,
    pairwise: torch.Tensor | None = None,
    alignment_coef: float = 1.0,
    diversity_coef: float = 1.0,
) -> torch.Tensor:
    """Advantages of n samples per group; rewards (..., n) -> (..., n). `advantage_estimator`:

    rloo (REF `ebft_experience_maker.py::compute_baseline`): A_j = r_j - b_j, a true leave-one-out baseline for BOTH
        terms, so b_j depends on no quantity of sample j:
            b_j = alignment_coef * (sum_i a_i - a_j)/(n-1)
                  - diversity_coef * 2 * mean_{i < i', i, i' != j} phi~_i^T phi~_i'
        (a = `alignment`, already x2; the second term is the diversity reward the others would get among themselves;
        REF writes it (sum_i d_i - 2 d_j)/(n-2)). Needs `alignment` (..., n) and, unless diversity_coef is 0,
        `pairwise` (..., n, n) from `feature_matching_rewards` (the diagonal is ignored; an asymmetric matrix is read
        as the sum of both directions / 2).
        n = 2: no pair is left without j, so the diversity baseline is 0 (as REF) and b_j = alignment_coef * a_other.
        n = 1: no baseline at all, A = r (reinforce), as REF and Axolotl.
        Axolotl's rloo, r_j - (sum_i r_i - r_j)/(n-1), puts s_ij into the baseline of sample j: its
        baseline is not independent of the sample, which biases the gradient. Not followed.
    grpo (alias group_norm, Axolotl strided): A = (r - mean r) / (std r + 1e-8), std Bessel-corrected; exactly 0 for a
        group of equal rewards (std <= 1e-8) and for n = 1. REF's group_norm divides by a std over the block axis
        after its rloo baseline, which looks unintended; Axolotl's is followed.
    reinforce: A = r.
    Inputs are detached: advantages are constants to the loss.
    """
    estimator = ESTIMATOR_ALIASES.get(estimator, estimator)
    if estimator not in ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of rloo, grpo (group_norm), reinforce, got {estimator!r}")
    rewards = rewards.detach()
    n = rewards.shape[-1]
    if estimator == "reinforce" or (estimator == "rloo" and n == 1):
        return rewards.clone()
    if estimator == "grpo":
        if n == 1:
            return torch.zeros_like(rewards)
        centred = rewards - rewards.mean(dim=-1, keepdim=True)
        std = rewards.std(dim=-1, keepdim=True)
        advantages = centred / (std + GRPO_EPS)
        return torch.where(std <= ZERO_STD_ATOL, torch.zeros_like(advantages), advantages)

    if alignment is None:
        raise ValueError("the rloo advantage needs the alignment rewards (the leave-one-out baseline is per term)")
    alignment = alignment.detach()
    if alignment.shape != rewards.shape:
        raise ValueError(f"alignment {tuple(alignment.shape)} must have the shape of rewards {tuple(rewards.shape)}")
    baseline = alignment_coef * (alignment.sum(dim=-1, keepdim=True) - alignment) / (n - 1)
    if diversity_coef != 0.0 and n > 2:
        if pairwise is None:
            raise ValueError("the rloo advantage with diversity_coef != 0 needs the pairwise similarities")
        pairwise = pairwise.detach()
        if pairwise.shape != (*rewards.shape, n):
            raise ValueError(f"pairwise {tuple(pairwise.shape)} must be rewards' shape + ({n},)")
        off_diagonal = pairwise - torch.diag_embed(torch.diagonal(pairwise, dim1=-2, dim2=-1))
        total = off_diagonal.sum(dim=(-2, -1)).unsqueeze(-1)  # every ordered pair i != i'
        involving = off_diagonal.sum(dim=-1) + off_diagonal.sum(dim=-2)  # ordered pairs with j on either side
        mean_others = (total - involving) / ((n - 1) * (n - 2))
        baseline = baseline - diversity_coef * 2.0 * mean_others
    return rewards - baseline


def _row_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over rows of each row's masked mean; rows without tokens take no part; 0 (with a graph) when none has."""
    flat_values = values.reshape(values.shape[0], -1)
    flat_mask = mask.reshape(mask.shape[0], -1).to(flat_values.dtype)
    counts = flat_mask.sum(dim=1)
    per_row = (flat_values * flat_mask).sum(dim=1) / counts.clamp_min(1.0)
    present = counts > 0
    if not bool(present.any()):
        return (flat_values * flat_mask).sum()
    return per_row[present].mean()


def strided_ebft_loss(
    gen_logps: torch.Tensor,
    gen_mask: torch.Tensor,
    advantages: torch.Tensor,
    doc_nll: torch.Tensor | None,
    doc_mask: torch.Tensor | None,
    *,
    rl_coef: float = 1.0,
    ce_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Strided-mode EBFT loss (REF `models/loss.py::EBFTPolicyLoss`), on-policy REINFORCE plus document CE.

    gen_logps (B, K, Gt): log-prob of generated token t of block k in row b, read where sampling read its logits and
        at the sampling temperature (the recipe's job: `rlft.rollout.strided`). gen_mask (B, K, Gt): 1 for real tokens.
    advantages (B, K): one per block, applied to that block's own tokens only: A[b, k] weights gen_logps[b, k, :].
        (Axolotl expanded block-major over a step-major layout, giving token (t, k) the advantage of block
        floor((tK + k)/G). Keeping the block axis explicit here makes that mapping impossible.)
    doc_nll (B, L-1), doc_mask (B, L-1): per-token NLL of the document (next-token targets) and where it counts
        (no pads, and only the completion for prompt/completion data). May be None when ce_coef is 0.

        rl = mean_b [ sum_{k,t} -logp[b,k,t] A[b,k] m[b,k,t] / sum_{k,t} m[b,k,t] ]
        ce = mean_b [ sum_i nll[b,i] m'[b,i] / sum_i m'[b,i] ]
        loss = rl_coef * rl + ce_coef * ce

    Per-row masked means, then the mean over rows, as REF (Axolotl takes one global token mean); rows without
    tokens take no part. The gradient is -A grad logp, as REF's ratio = exp(logp - logp.detach()) form. The value
    differs: REF's rl is -mean A (ratio = 1); this one is the REINFORCE surrogate -logp A, which Axolotl also logs.
    Advantages are detached. Metrics: `ebft/rl_loss`, `ebft/ce_loss` (0 when doc_nll is None).
    """
    if gen_logps.dim() != 3 or gen_mask.shape != gen_logps.shape:
        raise ValueError(
            f"gen_logps and gen_mask must both be (B, K, Gt), got {tuple(gen_logps.shape)} and {tuple(gen_mask.shape)}"
        )
    if advantages.shape != gen_logps.shape[:2]:
        raise ValueError(f"advantages must be (B, K) = {tuple(gen_logps.shape[:2])}, got {tuple(advantages.shape)}")
    token_advantages = advantages.detach().to(gen_logps.dtype).unsqueeze(-1)  # (B, K, 1): block k -> its own tokens
    rl = _row_masked_mean(-gen_logps * token_advantages, gen_mask)
    loss = rl_coef * rl
    ce_value = 0.0
    if doc_nll is not None:
        if doc_nll.dim() != 2 or doc_nll.shape[0] != gen_logps.shape[0]:
            raise ValueError(f"doc_nll must be (B, L-1) with B = {gen_logps.shape[0]}, got {tuple(doc_nll.shape)}")
        if doc_mask is None:
            doc_mask = torch.ones_like(doc_nll)
        elif doc_mask.shape != doc_nll.shape:
            raise ValueError(f"doc_mask {tuple(doc_mask.shape)} must have doc_nll's shape {tuple(doc_nll.shape)}")
        ce = _row_masked_mean(doc_nll, doc_mask)
        if ce_coef != 0.0:
            loss = loss + ce_coef * ce
        ce_value = float(ce.detach())
    elif ce_coef != 0.0:
        raise ValueError("ce_coef != 0 needs the document NLL (doc_nll)")
    return loss, {"ebft/rl_loss": float(rl.detach()), "ebft/ce_loss": ce_value}
