"""Cross-entropy of the output layer's logits, chunked and fused, without a (B, T, V) logits tensor.

    loss = sum_i [ logsumexp(W h_i + b) - (W h_i + b)[y_i] ]            over the N target positions i

A language model's forward builds float logits for every position, (B, T, V): at a 128k vocabulary and 8 x 2048
tokens that is 8 GiB before the loss even starts. Here only the N target positions are projected, `chunk` rows
at a time, and each chunk's gradient is computed in the forward (d loss / d logits = softmax - onehot), so no
chunk's logits are kept for the backward. The backward only scales the stored gradients by the incoming one.
This is the fused linear cross-entropy of Liger Kernel and Apple's Cut Cross-Entropy (Wijmans et al. 2024,
arXiv:2411.09009), in plain torch: every device, every dtype (logits in float32, as the plain path computes them).

Mixed precision: the products run in the dtype autocast gives them, in the forward and, for the functions that
recompute a chunk's logits in their backward, in the backward too (the backward re-enters the forward's autocast
state, as `torch.amp.custom_bwd` does). Without that a bf16 forward's log-normaliser would meet float32 logits in the
backward, and the softmax built from them would not sum to one. A chunk's gradient is cast once to that dtype and
feeds both products; the weight's gradient is kept in the product's dtype while there is one chunk (no float32
zeros of the weight's size, no float32 copy per chunk) and summed in float32 from the second chunk on.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

LOGIT_BYTES = 2**28  # float32 logits per chunk: 256 MiB (512 positions at a 128k vocabulary)


def chunk_rows(vocab: int) -> int:
    return max(1, LOGIT_BYTES // (4 * vocab))


def _autocast_state(device: torch.device) -> tuple[str, bool, torch.dtype]:
    return device.type, torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)


def _product_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype F.linear / @ give the (rows, V) x (V, H) products here: autocast's, else the hidden state's."""
    _, enabled, dtype = _autocast_state(hidden.device)
    return dtype if enabled else hidden.dtype


def _in_forward_autocast(backward):
    """A Function's backward run under the autocast state its forward saved in `ctx.autocast` (the loop calls
    backward() outside its autocast block), so a recomputed chunk's logits are the forward's."""
    @functools.wraps(backward)
    def wrapped(ctx, *grads):
        kind, enabled, dtype = ctx.autocast
        with torch.autocast(kind, dtype, enabled=enabled):
            return backward(ctx, *grads)
    return wrapped


def _add_weight_grad(total: torch.Tensor | None, grad: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """total + grad.T @ h: the first chunk's product as it comes, later ones summed in float32."""
    part = grad.t() @ h
    return part if total is None else total.float().add_(part)


def _scaled_float(grad: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """grad * scale in float32; a lower-precision grad's float32 copy is scaled in place (one weight-sized tensor)."""
    return grad * scale if grad.dtype == torch.float32 else grad.float().mul_(scale)


def _chunk(hidden, weight, bias, targets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float logits of one chunk, their logsumexp and each row's NLL."""
    logits = F.linear(hidden, weight, bias).float()
    lse = logits.logsumexp(-1)
    return logits, lse, lse - logits.gather(-1, targets[:, None]).squeeze(-1)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk):
        need_h, need_w = hidden.requires_grad, weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for start in range(0, hidden.size(0), chunk):
            h, t = hidden[start:start + chunk], targets[start:start + chunk]
            logits, lse, nll = _chunk(h, weight, bias, t)
            total += nll.sum()
            if need_h or need_w or need_b:
                grad = logits.sub_(lse[:, None]).exp_()  # softmax, in the logits' memory
                del logits  # the float32 chunk goes once grad is cast
                grad[torch.arange(t.numel(), device=t.device), t] -= 1.0
                if need_b:
                    grad_b += grad.sum(0)
                grad = grad.to(_product_dtype(hidden))
                if need_h:
                    grad_h[start:start + chunk] = grad @ weight
                if need_w:
                    grad_w = _add_weight_grad(grad_w, grad, h)
        if need_w and grad_w is None:  # no rows
            grad_w = torch.zeros_like(weight, dtype=torch.float32)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        return (None if grad_h is None else grad_h * grad_out.to(grad_h.dtype),
                None if grad_w is None else _scaled_float(grad_w, grad_out).to(weight_dtype),
                None if grad_b is None else (grad_b * grad_out).to(bias_dtype), None, None)


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             targets: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Sum over rows of -log softmax(hidden @ weight.T + bias)[target]: hidden (N, H), weight (V, H), targets (N,).

    Equal to `F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="sum")`, with the same
    gradients for hidden, weight and bias, but at most `chunk` rows of logits exist at once. Without grad mode
    (evaluation) nothing is kept for a backward.
    """
    chunk = chunk or chunk_rows(weight.size(0))
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.size(0), chunk):
        total += _chunk(hidden[start:start + chunk], weight, bias, targets[start:start + chunk])[2].sum()
    return total


class _LinearTokenNLL(torch.autograd.Function):
    """Per-row NLL; the backward recomputes each chunk's logits (the incoming gradient differs per row, so the
    forward cannot fold it in as `_LinearCrossEntropy` does)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk):
        out = torch.cat([_chunk(hidden[s:s + chunk], weight, bias, targets[s:s + chunk])[2]
                         for s in range(0, hidden.size(0), chunk)]) if hidden.size(0) else hidden.new_zeros(0).float()
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.chunk, ctx.autocast = chunk, _autocast_state(hidden.device)
        return out

    @staticmethod
    @_in_forward_autocast
    def backward(ctx, grad_out):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for start in range(0, hidden.size(0), ctx.chunk):
            h, t = hidden[start:start + ctx.chunk], targets[start:start + ctx.chunk]
            logits, lse, _ = _chunk(h, weight, bias, t)
            grad = logits.sub_(lse[:, None]).exp_()
            del logits  # the float32 chunk goes once grad is cast
            grad[torch.arange(t.numel(), device=t.device), t] -= 1.0
            grad.mul_(grad_out[start:start + ctx.chunk, None].float())
            if need_b:
                grad_b += grad.sum(0)
            grad = grad.to(_product_dtype(hidden))
            if need_h:
                grad_h[start:start + ctx.chunk] = grad @ weight
            if need_w:
                grad_w = _add_weight_grad(grad_w, grad, h)
        if need_w and grad_w is None:
            grad_w = torch.zeros_like(weight)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None)


def linear_token_nll(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                     chunk: int | None = None) -> torch.Tensor:
    """(N,) float32 -log softmax(hidden @ weight.T + bias)[target] per row, at most `chunk` rows of logits at once
    (forward and backward). For losses that weigh rows differently (sequence log-prob sums of preference pairs)."""
    return _LinearTokenNLL.apply(hidden, weight, bias, targets, chunk or chunk_rows(weight.size(0)))


def _scaled_logits(hidden, weight, bias, temperature):
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class _LinearTokenLogps(torch.autograd.Function):
    """Per-row target log-prob and (optionally) entropy at a temperature; the backward recomputes each chunk's logits
    and takes the log-normaliser saved by the forward.

    With z = (W h + b) / T, lse = logsumexp(z), log p = z - lse and H = -sum_j p_j log p_j = lse - sum_j p_j z_j:
        d log p_y / d z = onehot(y) - p            d H / d z_j = -p_j (log p_j + H)
    and d z / d(W h + b) = 1 / T.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy, grad_entropy):
        logps, entropy, lses = [], [], []
        for start in range(0, hidden.size(0), chunk):
            logp = _scaled_logits(hidden[start:start + chunk], weight, bias, temperature)
            lse = logp.logsumexp(-1)
            logp.sub_(lse[:, None])  # log p, in the logits' memory
            logps.append(logp.gather(-1, targets[start:start + chunk, None]).squeeze(-1))
            lses.append(lse)
            if with_entropy:  # in float32: under autocast vecdot would sum V products in bf16
                with torch.autocast(logp.device.type, enabled=False):
                    entropy.append(-torch.linalg.vecdot(logp.exp(), logp))
        empty = hidden.new_zeros(0, dtype=torch.float32)  # no rows, or no entropy asked for
        logps, lses = (torch.cat(logps), torch.cat(lses)) if logps else (empty, empty)
        entropy = torch.cat(entropy) if entropy else empty.clone()  # a tensor of its own: outputs must not alias
        ctx.save_for_backward(hidden, weight, bias, targets, lses, entropy)
        ctx.temperature, ctx.chunk, ctx.grad_entropy = temperature, chunk, grad_entropy
        ctx.autocast = _autocast_state(hidden.device)
        if not grad_entropy:
            ctx.mark_non_differentiable(entropy)
        return logps, entropy

    @staticmethod
    @_in_forward_autocast  # the forward's logits, which the saved lses normalise
    def backward(ctx, grad_logps, grad_entropy):
        hidden, weight, bias, targets, lses, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        use_entropy = ctx.grad_entropy and grad_entropy is not None
        if grad_logps is None:
            grad_logps = torch.zeros_like(lses)
        for start in range(0, hidden.size(0), ctx.chunk):
            end = start + ctx.chunk
            h, t, g = hidden[start:end], targets[start:end], grad_logps[start:end, None].float()
            logp = _scaled_logits(h, weight, bias, ctx.temperature).sub_(lses[start:end, None])
            if use_entropy:  # -p (log p + H) g_H - p g, in log p's memory
                p = logp.exp()
                grad = logp.add_(entropy[start:end, None]).mul_(p).mul_(-grad_entropy[start:end, None].float())
                grad.sub_(p.mul_(g))
                del p
            else:
                grad = logp.exp_().mul_(-g)  # -p g
            del logp  # the float32 chunk goes once grad is cast
            grad[torch.arange(t.numel(), device=t.device), t] += g[:, 0]
            if ctx.temperature != 1.0:
                grad.div_(ctx.temperature)
            if need_b:
                grad_b += grad.sum(0)
            grad = grad.to(_product_dtype(hidden))
            if need_h:
                grad_h[start:end] = grad @ weight
            if need_w:
                grad_w = _add_weight_grad(grad_w, grad, h)
        if need_w and grad_w is None:
            grad_w = torch.zeros_like(weight)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def linear_token_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                       temperature: float = 1.0, with_entropy: bool = True, grad_entropy: bool = False,
                       chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) float32 log softmax((hidden @ weight.T + bias) / temperature)[target] per row, and (N,) the entropy of
    that distribution (None unless `with_entropy`; with a gradient only when `grad_entropy`), at most `chunk` rows of
    logits at once in the forward and the backward. For the policy-gradient losses: per-token log-probs of sampled
    completions, without a (B, T, V) logits block."""
    scale = temperature if temperature > 0 else 1.0  # temperature 0 (greedy) scores with the raw logits, as logps_from_logits
    logps, entropy = _LinearTokenLogps.apply(hidden, weight, bias, targets, float(scale), chunk or chunk_rows(weight.size(0)),
                                             with_entropy, with_entropy and grad_entropy)
    return logps, entropy if with_entropy else None
