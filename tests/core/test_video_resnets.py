"""The video ResNets of the literature (family ``video_resnet``): torchvision's R3D-18 (Tran et al.
2018) and its bottleneck R3D-50, SlowOnly 8x8 R50 and I3D 8x8 R50 of the SlowFast model zoo
(Feichtenhofer et al. 2019), built from the core's one residual block under every conv scheme;
their kernels and strides follow the recipes, and the fast path computes the reference function."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import rescale_core
from rescale_core import ResidualBlock
from rescale_core.plans import folded
from rescale_core.plans import folds as fp
from rescale_core.layers import StridedAvgPool
from rescale_core.models.resnet import VIDEO_RESNETS, ResNet, ResNetConfig
from rescale_core.testing import randomise_

VIDEO = ["r3d_18", "r3d_50", "slow_r50", "i3d_r50"]
CONV_SCHEMES = rescale_core.list_schemes("conv")


def _build(name: str, scheme: str, dtype=torch.float32, seed: int = 0, **options) -> ResNet:
    torch.manual_seed(seed)
    model = rescale_core.create_model(name, scheme=scheme, num_classes=5, base_width=8,
                                      scheme_options={"measure_batches": 2, **options})
    return model.to(dtype)


def _clip(batch: int = 2, frames: int = 4, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(batch, 3, frames, 32, 32, generator=torch.Generator().manual_seed(3), dtype=dtype) + 0.3


# --------------------------------------------------------------- registry and every scheme
def test_registered_as_their_own_family():
    assert set(rescale_core.list_models(family="video_resnet")) == set(VIDEO) | {
        "rescale_r3d_18", "rescale_r3d_50", "rescale_slow_r50", "rescale_i3d_r50"}
    assert rescale_core.create_model("rescale_slow_r50", base_width=8, num_classes=3).scheme.name == "rescale"
    # the Hara et al. 3D ResNets keep their names and their stem (3x7x7 conv, 3x3x3/2 max-pool)
    old = rescale_core.create_model("resnet3d_50", base_width=8, num_classes=3)
    assert old.conv1.kernel_size == (3, 7, 7) and old.maxpool.kernel_size == 3 and old.maxpool.stride == 2


@pytest.mark.parametrize("scheme", CONV_SCHEMES)
@pytest.mark.parametrize("name", VIDEO)
def test_every_scheme_trains_a_step(name, scheme):
    """Forward, loss and backward at init: logits of the right shape, finite gradients in every
    parameter (Fixup's zero classifier: only the classifier learns at step 1)."""
    model = _build(name, scheme).train()
    x = _clip()
    out = model(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    F.cross_entropy(out, torch.tensor([0, 3])).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), (name, scheme, pname)
    assert model.scheme.name == scheme and isinstance(model.layer1[0], ResidualBlock)


# --------------------------------------------------------------- the recipes' structure
def _stage_shapes(model: nn.Module, x: torch.Tensor) -> list[tuple[int, ...]]:
    shapes = []
    hooks = [getattr(model, n).register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
             for n in ("maxpool", "layer1", "layer2", "layer3", "layer4")]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return shapes


def test_slow_r50_follows_the_slowonly_recipe():
    model = _build("slow_r50", "rescale")
    assert model.conv1.kernel_size == (1, 7, 7) and model.conv1.stride == (1, 2, 2)
    assert model.conv1.padding == (0, 3, 3)
    assert model.maxpool.kernel_size == (1, 3, 3) and model.maxpool.stride == (1, 2, 2)
    for s, kt in zip((1, 2, 3, 4), (1, 1, 3, 3)):
        for block in getattr(model, f"layer{s}"):
            assert block.conv1.kernel_size == (kt, 1, 1) and block.conv1.padding == (kt // 2, 0, 0)
            assert block.conv2.kernel_size == (1, 3, 3) and block.conv2.padding == (0, 1, 1)
            assert block.conv3.kernel_size == (1, 1, 1)
            for conv in (block.conv1, block.conv2, block.conv3):
                assert conv.stride[0] == 1  # no temporal downsampling anywhere
        first = getattr(model, f"layer{s}")[0]
        assert first.conv2.stride == ((1, 1, 1) if s == 1 else (1, 2, 2))
    # no temporal downsampling: every stage keeps T; space halves from res3 on
    shapes = _stage_shapes(model.eval(), _clip(1, frames=6))
    assert [s[2] for s in shapes] == [6] * 5
    assert [s[3] for s in shapes] == [8, 8, 4, 2, 1]
    # the fast path declines the temporally padded conv's input-offset fold (inexact at the
    # clip's borders) and keeps it for the unpadded 1x1x1 convs
    big = 10 ** 9
    assert not fp.folds_input_offset(model.layer3[0].conv1, big)
    assert fp.folds_input_offset(model.layer1[0].conv1, big) and fp.folds_input_offset(model.layer3[0].conv3, big)


def test_i3d_r50_kernels_and_temporal_pool():
    model = _build("i3d_r50", "bn")
    assert model.conv1.kernel_size == (5, 7, 7) and model.conv1.padding == (2, 3, 3)
    kts = [[b.conv1.kernel_size[0] for b in getattr(model, f"layer{s}")] for s in (1, 2, 3, 4)]
    assert kts == [[3, 3, 3], [3, 1, 3, 1], [3, 1, 3, 1, 3, 1], [1, 3, 1]]
    children = [n for n, _ in model.named_children()]
    assert children.index("tpool2") == children.index("layer2") - 1  # torchvision's FPN runs children in order
    assert [s[2] for s in _stage_shapes(model.eval(), _clip(1, frames=8))] == [8, 8, 4, 4, 4]


def test_r3d_18_is_torchvisions():
    """Same parameter count as torchvision's ``r3d_18`` and the same stage shapes: no stem
    max-pool, stages 2-4 halve T, H and W."""
    from torchvision.models.video import r3d_18

    with torch.device("meta"):
        ours = rescale_core.create_model("r3d_18", scheme="bn", num_classes=400)
        theirs = r3d_18()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.empty(1, 3, 8, 112, 112, device="meta")
    got = _stage_shapes(ours, x)[1:]
    want = []
    hooks = [getattr(theirs, n).register_forward_hook(lambda m, i, o: want.append(tuple(o.shape)))
             for n in ("layer1", "layer2", "layer3", "layer4")]
    theirs(x)
    for h in hooks:
        h.remove()
    assert got == want == [(1, 64, 8, 56, 56), (1, 128, 4, 28, 28), (1, 256, 2, 14, 14), (1, 512, 1, 7, 7)]
    assert isinstance(ours.maxpool, nn.Identity)


def test_classifier_dropout_as_slowfast():
    with torch.device("meta"):
        model = rescale_core.create_model("slow_r50", scheme="rescale", num_classes=400,
                                          scheme_options={"classifier_dropout": 0.5})
    assert isinstance(model.dropout, nn.Dropout) and model.dropout.p == 0.5
    assert model.fc.out_features == 400 and model.fc.in_features == 2048


def test_temporal_options_are_checked():
    with pytest.raises(ValueError, match="spatial_dims=3"):
        ResNetConfig("basic", (1, 1), conv1_temporal=((1,), (1,)))
    with pytest.raises(ValueError, match="one tuple per stage"):
        replace(VIDEO_RESNETS["slow_r50"], conv1_temporal=((1,), (3,)))
    with pytest.raises(ValueError, match="stem_pool"):
        ResNetConfig("basic", (1,), stem_pool="avg")


def test_spatial_only_strided_pool():
    """RescaleNet's shortcut pool with stride (1, 2, 2): AvgPool3d on even sizes, the strided
    conv's ceil(n / 2) on odd ones."""
    x = torch.randn(2, 3, 3, 6, 5, dtype=torch.float64, requires_grad=True)
    pool = StridedAvgPool((1, 2, 2), 3)
    even = x[..., :4]
    torch.testing.assert_close(pool(even), F.avg_pool3d(even, (1, 2, 2)))
    out = pool(x)
    assert out.shape == (2, 3, 3, 3, 3)
    torch.testing.assert_close(out, F.avg_pool3d(x, (1, 2, 2), ceil_mode=True, count_include_pad=False))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("frames, size", [(4, 16), (5, 17)])
def test_a_bfloat16_rescale_clip_network_runs_on_every_plan(frames, size):
    """A CPU has no bfloat16 avg_pool3d: before, RescaleNet's 3D shortcut pool raised
    NotImplementedError in every evaluation without autograd on a fast plan (the frozen plan),
    and in training on clips whose sizes the stride does not divide, where the reference path
    evaluated. Each plan now trains a step and evaluates in bfloat16, as the reference does."""
    clip = _clip(frames=frames).to(torch.bfloat16)[..., :size, :size]
    outputs = {}
    for plan in ("reference", "folded", "lean"):
        model = rescale_core.set_plan(_build("r3d_18", "rescale", dtype=torch.bfloat16), plan).train()
        model(clip).float().square().sum().backward()  # (torch's bfloat16 conv3d backward on a CPU
        # can give non-finite weight gradients on small odd sizes, whatever the plan: not checked)
        model.eval()
        with torch.no_grad():
            outputs[plan] = model(clip)
        assert outputs[plan].dtype == torch.bfloat16
    reference = outputs["reference"].float()
    for plan in ("folded", "lean"):  # bfloat16 keeps 8 bits: 5% of the largest output
        torch.testing.assert_close(outputs[plan].float(), reference, rtol=0.05,
                                   atol=0.05 * reference.abs().max().item())
    assert StridedAvgPool((1, 2, 2), 3).pool(clip).dtype == torch.bfloat16


# --------------------------------------------------------------- fast path == reference path
def _run(model: nn.Module, x: torch.Tensor, seed: int):
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = model(x)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


FAST_CASES = [("slow_r50", "rescale"), ("slow_r50", "skipinit"), ("slow_r50", "fixup"),
              ("i3d_r50", "rescale"), ("r3d_18", "rescale"), ("r3d_50", "fixup"), ("r3d_18", "skipinit")]


@pytest.mark.parametrize("name, scheme", FAST_CASES, ids=[f"{n}-{s}" for n, s in FAST_CASES])
def test_fast_path_equals_reference(name, scheme):
    """Two measuring training steps, one after measuring, then eval: same outputs, input and
    parameter gradients and mean-shift state on both paths (float64)."""
    fused = _build(name, scheme, torch.float64)
    randomise_(fused, gain=0.15)
    ref = copy.deepcopy(fused)
    for m in ref.modules():
        if isinstance(getattr(m, "fused", None), bool):
            m.fused = False
    assert fused.fused and fused._fast_ok and all(b.fused and b._fast_ok for b in fused.layer3)
    calls = []
    hook = folded.folded_block
    folded.folded_block = lambda self, *a: calls.append(1) or hook(self, *a)
    try:
        x = _clip(2, frames=4, dtype=torch.float64)
        for step in range(3):
            fused.train(), ref.train()
            got, want = _run(fused, x + 0.1 * step, step), _run(ref, x + 0.1 * step, step)
            torch.testing.assert_close(got[0], want[0], rtol=1e-9, atol=1e-11)
            torch.testing.assert_close(got[1], want[1], rtol=1e-9, atol=1e-11)
            assert got[2].keys() == want[2].keys()
            for n in want[2]:
                scale = max(float(want[2][n].abs().max()), 1e-3)
                torch.testing.assert_close(got[2][n] / scale, want[2][n] / scale, rtol=1e-9, atol=1e-11,
                                           msg=lambda m: f"{name}/{scheme} step {step} grad of {n}: {m}")
        for a, b in zip(rescale_core.mean_shift_layers(fused), rescale_core.mean_shift_layers(ref)):
            assert a._count == b._count == 2
            torch.testing.assert_close(a.mu0, b.mu0, rtol=1e-9, atol=1e-11)
        fused.eval(), ref.eval()
        with torch.no_grad():
            torch.testing.assert_close(fused(x), ref(x), rtol=1e-9, atol=1e-11)
    finally:
        folded.folded_block = hook
    assert calls, "the fast path never ran"
