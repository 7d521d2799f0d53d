"""The generic residual block and merge: ResNet v1 blocks (He et al. 2016) under every scheme, and
the Transformer sublayer (post-LN, pre-LN, RescaleNet of Shao et al. 2020, ReZero, SkipInit)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rescale_core import (MeanShiftBias, ResidualBlock, ResidualMerge, ResidualSublayer,
                          ScalarBias, get_scheme, list_schemes)
from rescale_core.blocks import pre_conv_bias
from rescale_core.init import rescale_conv_multiplier
from rescale_core.layers import StridedAvgPool


def test_merge_math_rescale():
    merge = ResidualMerge(get_scheme("rescale"), k=3, L=10, channel_shape=(1, 4, 1, 1))
    with torch.no_grad():
        merge.gain.weight.fill_(1.7)
    s, f = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    alpha, beta = math.sqrt(12 / 13), 10 ** -0.5
    assert (merge.skip_scale, merge.branch_scale) == (pytest.approx(alpha), pytest.approx(beta))
    torch.testing.assert_close(merge(s, f), alpha * s + beta * 1.7 * f)
    torch.testing.assert_close(merge.skip_term(s) + merge.branch_term(f), merge(s, f))


def test_merge_math_fixup_vector_and_scaled():
    fixup = ResidualMerge(get_scheme("fixup"), 1, 4, (1, 4, 1, 1))
    assert isinstance(fixup.bias, ScalarBias)
    with torch.no_grad():
        fixup.gain.weight.fill_(2.0)
        fixup.bias.bias.fill_(0.25)
    s, f = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    torch.testing.assert_close(fixup(s, f), s + 2 * f + 0.25)
    vec = ResidualMerge(get_scheme("rezero", gain="vector"), 1, 4, (1, 4, 1, 1))
    assert vec.gain.weight.shape == (1, 4, 1, 1) and torch.count_nonzero(vec.gain.weight) == 0
    torch.testing.assert_close(vec(s, f), s)
    scaled = ResidualMerge(get_scheme("bn_scaled"), 1, 4, (1, 4, 1, 1))
    torch.testing.assert_close(scaled(s, f), math.sqrt(0.5) * (s + f))
    plain = ResidualMerge(get_scheme("none"), 1, 4, (1, 4, 1, 1))
    assert plain.gain is None and plain.bias is None
    torch.testing.assert_close(plain(s, f), s + f)


@pytest.mark.parametrize("scheme", list_schemes("conv"))
@pytest.mark.parametrize("kind, planes, out", [("basic", 8, 8), ("bottleneck", 4, 16)])
def test_block_shapes_and_layout(scheme, kind, planes, out):
    torch.manual_seed(0)
    block = ResidualBlock(get_scheme(scheme), 6, planes, stride=2, kind=kind, k=2, L=5)
    y = block(torch.randn(2, 6, 9, 9))
    s = get_scheme(scheme)
    assert y.shape == (2, out, 5, 5)
    assert torch.all(y >= 0) == (s.layout == "v1")  # ReLU after the merge (v1), none in NF's pre-activation
    assert block.downsample is not None and block.num_convs == (2 if kind == "basic" else 3)
    shift = block.shift1
    expected = MeanShiftBias if s.mean_shift else ScalarBias if s.scalar_biases else nn.Identity
    assert type(shift) is expected
    assert isinstance(block.bn1, (nn.BatchNorm2d, nn.GroupNorm)) == (s.norm in ("bn", "gn"))
    assert isinstance(block.merge_norm, nn.BatchNorm2d) == s.merge_norm
    assert (block.conv1.bias is not None) == s.conv_bias
    if s.mean_shift:
        assert [type(m) for m in block.downsample] == [StridedAvgPool, MeanShiftBias, nn.Conv2d]


def test_block_without_downsample_and_3d():
    block = ResidualBlock(get_scheme("rescale"), 8, 8, kind="basic", k=1, L=1, spatial_dims=3)
    assert block.downsample is None and isinstance(block.conv1, nn.Conv3d)
    assert block(torch.randn(1, 8, 3, 4, 4)).shape == (1, 8, 3, 4, 4)
    assert block.merge.gain.weight.shape == (1,)


def test_bottleneck_grouped_width():
    block = ResidualBlock(get_scheme("bn"), 64, 64, kind="bottleneck", groups=32, base_width=4)
    assert block.conv2.groups == 32 and block.conv2.in_channels == 128 and block.conv3.out_channels == 256


def test_block_argument_errors():
    with pytest.raises(ValueError, match="unknown block kind"):
        ResidualBlock(get_scheme("bn"), 8, 8, kind="inverted")
    with pytest.raises(ValueError, match="basic blocks"):
        ResidualBlock(get_scheme("bn"), 8, 8, kind="basic", groups=2)
    with pytest.raises(ValueError, match="larger base_width"):
        ResidualBlock(get_scheme("bn"), 8, 8, kind="bottleneck", groups=32, base_width=4)


def test_zero_gamma_block_is_identity_plus_relu():
    torch.manual_seed(0)
    block = ResidualBlock(get_scheme("bn", zero_gamma=True), 8, 8, kind="basic").train()
    x = torch.randn(4, 8, 5, 5)
    assert torch.all(block.bn2.weight == 0)
    torch.testing.assert_close(block(x), torch.relu(x))


@pytest.mark.parametrize("scheme, kind, cin, planes", [
    ("skipinit", "basic", 8, 8), ("skipinit_reg", "basic", 8, 8), ("rezero", "basic", 8, 8),
    ("fixup", "bottleneck", 32, 8), ("fixup", "basic", 8, 8)])
def test_zero_init_blocks_are_identity_plus_relu(scheme, kind, cin, planes):
    torch.manual_seed(0)
    block = ResidualBlock(get_scheme(scheme), cin, planes, kind=kind, k=1, L=4)
    x = torch.randn(2, cin, 5, 5)
    torch.testing.assert_close(block(x), torch.relu(x))


def test_pre_conv_bias():
    assert isinstance(pre_conv_bias(get_scheme("rescale", measure_batches=3), 4, 2), MeanShiftBias)
    assert pre_conv_bias(get_scheme("rescale", measure_batches=3), 4, 2).measure_batches == 3
    assert isinstance(pre_conv_bias(get_scheme("fixup"), 4, 2), ScalarBias)
    assert isinstance(pre_conv_bias(get_scheme("bn"), 4, 2), nn.Identity)


# --------------------------------------------------------------- Transformer sublayer
def _sublayer(scheme, k=2, L=6, **kw):
    torch.manual_seed(0)
    fn = nn.Linear(8, 8)
    return ResidualSublayer(get_scheme(scheme), 8, fn, k, L, **kw), fn


def test_sublayer_schemes():
    x = torch.randn(3, 5, 8)
    for scheme in ("rezero", "skipinit"):
        sub, _ = _sublayer(scheme)
        torch.testing.assert_close(sub(x), x)
    post, fn = _sublayer("post_ln")
    torch.testing.assert_close(post(x), nn.functional.layer_norm(x + fn(x), (8,)))
    pre, fn = _sublayer("pre_ln")
    torch.testing.assert_close(pre(x), x + fn(nn.functional.layer_norm(x, (8,))))


def test_sublayer_rescale_scales_listed_layers():
    torch.manual_seed(0)
    reference = nn.Linear(8, 8)
    torch.manual_seed(0)
    fn = nn.Linear(8, 8)
    sub = ResidualSublayer(get_scheme("rescale"), 8, fn, 2, 6, scaled_layers=[fn])
    mult = rescale_conv_multiplier(2, 6, 1)  # m = 1 listed layer: (L / (k + L))^(1/2)
    assert mult == pytest.approx((6 / 8) ** 0.5)
    torch.testing.assert_close(fn.weight, reference.weight * mult)
    assert torch.equal(fn.bias, reference.bias)
    x = torch.randn(2, 8)
    torch.testing.assert_close(sub(x), math.sqrt(7 / 8) * x + 6 ** -0.5 * fn(x))
    torch.manual_seed(0)
    untouched = nn.Linear(8, 8)
    ResidualSublayer(get_scheme("rescale"), 8, untouched, 2, 6)
    assert torch.equal(untouched.weight, reference.weight)


def test_sublayer_refuses_conv_only_schemes():
    with pytest.raises(ValueError, match="no Transformer form"):
        ResidualSublayer(get_scheme("bn"), 8, nn.Linear(8, 8), 1, 1)


def test_a_block_takes_the_schemes_conv_dropout():
    """Before: a block built from a scheme with conv_dropout (a network of one's own, from the
    generic block) had no dropout and no init compensation unless the argument repeated it."""
    scheme = get_scheme("rescale", conv_dropout=0.3)
    torch.manual_seed(0)
    block = ResidualBlock(scheme, 64, 64, k=1, L=1)
    torch.manual_seed(0)
    explicit = ResidualBlock(scheme, 64, 64, k=1, L=1, conv_dropout=0.3)
    assert isinstance(block.drop, nn.Dropout2d) and block.drop.p == 0.3
    assert torch.equal(block.conv1.weight, explicit.conv1.weight)  # the init's sqrt(1 - p) too
    assert isinstance(ResidualBlock(scheme, 8, 8, conv_dropout=0.0).drop, nn.Identity)  # a stage without
