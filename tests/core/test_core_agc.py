"""Adaptive Gradient Clipping (``rescale_core.agc``) is the public implementation's function on the
same gradients: timm's ``timm.utils.agc.adaptive_clip_grad`` (the paper's code ported), for
kernels of 2D and 3D convolutions (contiguous and channels_last), linear weights, vectors,
scalars, zero weights and gradients, at thresholds that clip none, some or all units. Its
launches per call are counted in ``tests/benchmarks/test_opcount.py``."""
from __future__ import annotations

import copy

import pytest
import torch
from timm.utils.agc import adaptive_clip_grad

from rescale_core.agc import adaptive_clip_grad_, check_agc, unit_size

SHAPES = [(8, 3, 3, 3), (16, 8, 1, 1), (4, 2, 3, 3, 3), (10, 7), (7,), (), (1,), (5, 1), (1, 9), (3, 5, 2)]


def parameters(dtype: torch.dtype = torch.float64, seed: int = 0) -> list[torch.nn.Parameter]:
    """Parameters of every shape above with random gradients of several magnitudes, plus: zero
    weights (the eps floor), a zero gradient, channels_last kernel and gradient (2D and 3D), a
    gradient laid out unlike its weight, and a parameter without a gradient."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate(SHAPES):
        p = torch.nn.Parameter(torch.randn(shape, generator=g, dtype=dtype))
        p.grad = torch.randn(shape, generator=g, dtype=dtype) * 10.0 ** (i % 4 - 3)
        out.append(p)
    out[3].data.zero_()  # zero weights: max(||W_i||, eps)
    out[4].grad.zero_()
    for shape, fmt in (((6, 4, 3, 3), torch.channels_last), ((6, 4, 2, 3, 3), torch.channels_last_3d)):
        p = torch.nn.Parameter(torch.randn(shape, generator=g, dtype=dtype).contiguous(memory_format=fmt))
        p.grad = (torch.randn(shape, generator=g, dtype=dtype) * 0.05).contiguous(memory_format=fmt)
        out.append(p)
    p = torch.nn.Parameter(torch.randn(6, 4, 3, 3, generator=g, dtype=dtype))
    p.grad = torch.randn(4, 6, 3, 3, generator=g, dtype=dtype).transpose(0, 1) * 0.05  # dim 0 not outermost
    out.append(p)
    out.append(torch.nn.Parameter(torch.ones(3, dtype=dtype)))  # no gradient
    return out


def twins(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    copies = copy.deepcopy(params)
    for p, q in zip(params, copies):
        q.grad = None if p.grad is None else p.grad.clone(memory_format=torch.preserve_format)
    return copies


@pytest.mark.parametrize("clip", [1e-4, 0.01, 0.1, 1.0, 100.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_timm_on_the_same_gradients(clip, dtype):
    ours = parameters(dtype)
    theirs = twins(ours)
    before = [None if p.grad is None else p.grad.clone() for p in ours]
    adaptive_clip_grad(theirs, clip_factor=clip, eps=1e-3)
    adaptive_clip_grad_(ours, clip, eps=1e-3)
    changed = 0
    for p, q, b in zip(ours, theirs, before):
        if q.grad is None:
            assert p.grad is None
            continue
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=0)
        assert p.grad.stride() == q.grad.stride()  # written back in its own layout
        changed += not torch.equal(p.grad, b)
    # 1e-4 clips every gradient but the zero one; 100 only the zero weights' (their floor is eps)
    assert changed == {1e-4: len(SHAPES) + 2, 100.0: 1}.get(clip, changed) and 0 < changed
    assert clip == 1e-4 or changed < len(SHAPES) + 2


def test_the_papers_rule_unit_by_unit():
    """Eq. 3 written out for one kernel: a unit is rescaled to norm lambda * max(||W_i||, eps)
    exactly when its ratio exceeds lambda, the others are untouched."""
    w = torch.randn(6, 4, 3, 3, dtype=torch.float64)
    w[5] = 0.0  # its floor is eps
    p = torch.nn.Parameter(w)
    grad = torch.randn(6, 4, 3, 3, dtype=torch.float64) * torch.tensor([0.001, 1, 0.01, 10, 0.1, 1e-4]).view(6, 1, 1, 1)
    p.grad = grad.clone()
    adaptive_clip_grad_([p], clip=0.05, eps=1e-3)
    for i in range(6):
        ceiling = 0.05 * max(w[i].norm().item(), 1e-3)
        if grad[i].norm() / max(w[i].norm().item(), 1e-3) > 0.05:
            assert p.grad[i].norm().item() == pytest.approx(ceiling, rel=1e-12)
            torch.testing.assert_close(p.grad[i] / p.grad[i].norm(), grad[i] / grad[i].norm())
        else:
            assert torch.equal(p.grad[i], grad[i])
    assert unit_size(p) == 36 and unit_size(torch.zeros(5)) == 5 and unit_size(torch.zeros(())) == 1


def test_low_precision_parameters_are_clipped_with_float32_norms():
    ours = [p.to(torch.bfloat16) for p in parameters(torch.float32)[:6]]
    ours = [torch.nn.Parameter(p.detach()) for p in ours]
    reference = [torch.nn.Parameter(p.detach().float()) for p in ours]
    for p, r in zip(parameters(torch.float32)[:6], zip(ours, reference)):
        r[0].grad = p.grad.to(torch.bfloat16)
        r[1].grad = r[0].grad.float()
    adaptive_clip_grad_(ours, 0.01)
    adaptive_clip_grad(reference, 0.01)
    for p, r in zip(ours, reference):
        assert p.grad.dtype == torch.bfloat16
        torch.testing.assert_close(p.grad.float(), r.grad, rtol=1e-2, atol=0)


@pytest.mark.parametrize("clip,eps", [(0.0, 1e-3), (-0.01, 1e-3), (float("nan"), 1e-3), (float("inf"), 1e-3),
                                      (True, 1e-3), ("0.01", 1e-3), (0.01, 0.0), (0.01, -1.0)])
def test_bad_thresholds_are_refused(clip, eps):
    with pytest.raises(ValueError, match="AGC (clip|eps) must be a"):
        check_agc(clip, eps)
    with pytest.raises(ValueError):
        adaptive_clip_grad_(parameters()[:1], clip, eps)


def test_a_sparse_gradient_is_refused():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match="dense gradients"):
        adaptive_clip_grad_(emb.parameters(), 0.01)
