"""The step's scaling and clipping folded into a fused optimizer's `grad_scale` (rlft.train.clipping) against the
explicit path (scale every gradient, `clip_grad_norm_`, step): the same norm, the same update."""

from types import SimpleNamespace

import pytest
import torch

from rlft.train.clipping import GradientClip, folds_scale

ACCELERATOR = SimpleNamespace(clip_grad_norm_=torch.nn.utils.clip_grad_norm_)


def model_and_grads(scale: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    params = list(model.parameters())
    for param in params:
        param.grad = torch.randn_like(param) * scale
    return params


def stepped(fused: bool, factor: float, max_norm: float | None, scale: float):
    params = model_and_grads(scale)
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=fused, foreach=False if not fused else None)
    clip = GradientClip(params, optimizer, ACCELERATOR, max_norm)
    assert clip.folded == fused
    norm = clip.norm(factor)
    optimizer.step()
    return norm, [p.detach().clone() for p in params], optimizer


@pytest.mark.parametrize("factor, max_norm, scale", [(0.25, 1.0, 1.0), (1.0, 1.0, 1.0), (0.5, None, 1.0), (2.0, 100.0, 1e-3)])
def test_folded_scale_and_clip_update_as_the_explicit_path(factor, max_norm, scale):
    """Clipped (the norm is about 6 before scaling), not clipped (max_norm None, or a norm far under it), and a
    factor above 1: the norms agree and the weights after one AdamW step agree to float32 rounding."""
    norm_folded, after_folded, optimizer = stepped(True, factor, max_norm, scale)
    # the explicit path, with the same fused kernel: only the scaling and the clipping move
    params = model_and_grads(scale)
    for param in params:
        param.grad.mul_(factor)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf")))
    reference = torch.optim.AdamW(params, lr=0.1, fused=True)
    reference.step()
    assert norm_folded == pytest.approx(norm, rel=1e-6)
    for got, want in zip(after_folded, params):
        torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=1e-7)
    assert optimizer.grad_scale.dtype == torch.float32 and optimizer.grad_scale.shape == (1,)


def test_the_scale_is_the_factor_and_the_clipping_coefficient():
    """grad_scale divides each gradient: 1 / (factor x min(1, max_norm / (norm + 1e-6)))."""
    params = model_and_grads(1.0)
    raw = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
    clip = GradientClip(params, optimizer, ACCELERATOR, 1.0)
    assert clip.norm(0.5) == pytest.approx(raw * 0.5, rel=1e-6)
    coefficient = 1.0 / (raw * 0.5 + 1e-6)
    assert float(optimizer.grad_scale) == pytest.approx(1.0 / (0.5 * coefficient), rel=1e-6)
    assert clip.norm(1e-9) == pytest.approx(raw * 1e-9, rel=1e-6)  # far under max_norm: no clipping, the factor alone
    assert float(optimizer.grad_scale) == pytest.approx(1e9, rel=1e-6)


def test_unfused_optimizers_and_sharded_parameters_keep_the_explicit_path():
    params = model_and_grads(1.0)
    assert not folds_scale(torch.optim.AdamW(params, lr=0.1, foreach=True), params)
    assert not folds_scale(torch.optim.SGD(params, lr=0.1), params)
    assert folds_scale(torch.optim.SGD(params, lr=0.1, fused=True), params)
    assert not folds_scale(SimpleNamespace(_step_supports_amp_scaling=True), params)  # not a torch optimizer
    assert not folds_scale(torch.optim.AdamW(params, lr=0.1, fused=True), [])
    norm, after, _ = stepped(False, 0.25, 1.0, 1.0)
    norm_folded, after_folded, _ = stepped(True, 0.25, 1.0, 1.0)
    assert norm == pytest.approx(norm_folded, rel=1e-6)
    for got, want in zip(after, after_folded):  # the foreach kernel against the fused one
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_no_gradients_is_a_zero_norm():
    params = model_and_grads(1.0)
    for param in params:
        param.grad = None
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
    assert GradientClip(params, optimizer, ACCELERATOR, 1.0).norm(1.0) == 0.0
