"""NF-ResNets (Brock, De & Smith, ICLR 2021) as a scheme of the one block (docs/nf_resnets.md):
Scaled Weight Standardization in 1D/2D/3D, ReLU's gamma, the ``nf`` / ``nf_skipinit`` schemes'
fields, the same function as timm's ``NormFreeNet`` (outputs and every gradient in float64 on
real photos, and 50 SGD steps in lockstep on the digits), the stream variance following the
analytic ``beta_l^2`` at init, the training plans falling back to the reference and the frozen
plan evaluating them."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
import torch.nn.functional as F
from timm.layers import ScaledStdConv2d as TimmScaledStdConv2d
from timm.models.nfnet import _nonlin_gamma
from torch import nn

import rescale_core
from rescale_core import ResidualBlock, get_scheme, plans
from rescale_core.analysis import residual_blocks, signal_propagation
from rescale_core.layers import (RELU_GAMMA, RELU_GAMMA_EXACT, ScaledStdConv1d, ScaledStdConv2d,
                                 ScaledStdConv3d, StridedAvgPool)
from rescale_core.schemes import SchemeOptionError
from rescale_core.testing import randomise_
from tools import nf_timm_check

F64 = torch.float64


# --------------------------------------------------------------- gamma and the standardized conv
def test_relu_gamma_closed_form_and_the_published_constant():
    """``1 / std(relu(z))``, z ~ N(0, 1), integrated numerically, equals the closed form; the
    constant in use is the official code's and timm's, 0.064% above it."""
    mean = integrate.quad(lambda z: z * stats.norm.pdf(z), 0, np.inf)[0]
    square = integrate.quad(lambda z: z * z * stats.norm.pdf(z), 0, np.inf)[0]
    assert (square - mean ** 2) ** -0.5 == pytest.approx(RELU_GAMMA_EXACT, rel=1e-10)
    assert RELU_GAMMA_EXACT == pytest.approx(1.7128585, abs=1e-7)
    assert RELU_GAMMA == _nonlin_gamma["relu"]
    assert RELU_GAMMA / RELU_GAMMA_EXACT - 1 == pytest.approx(6.4e-4, abs=0.1e-4)


def _formula(conv: nn.Module) -> torch.Tensor:
    """``gain * gamma * (W - mean) / (sqrt(var + eps) * sqrt(fan_in))`` per output channel."""
    w = conv.weight.reshape(conv.out_channels, -1)
    var, mean = torch.var_mean(w, dim=1, correction=0, keepdim=True)
    scale = conv.gain[:, None] * conv.gamma / math.sqrt(w.shape[1])
    return ((w - mean) / torch.sqrt(var + conv.eps) * scale).reshape_as(conv.weight)


@pytest.mark.parametrize("cls, functional, shape", [
    (ScaledStdConv1d, F.conv1d, (2, 4, 9)), (ScaledStdConv2d, F.conv2d, (2, 4, 7, 6)),
    (ScaledStdConv3d, F.conv3d, (2, 4, 3, 5, 5))])
def test_scaled_std_conv_is_the_formula(cls, functional, shape):
    """Every spatial rank, grouped and strided, with bias: the output and the gradients of the
    raw weight, the gain and the bias equal a plain convolution with the formula's weight."""
    torch.manual_seed(0)
    conv = cls(4, 6, 3, stride=2, padding=1, groups=2, bias=True, gamma=RELU_GAMMA).to(F64)
    with torch.no_grad():
        conv.gain.uniform_(0.5, 1.5)
        conv.bias.normal_()
    x = torch.randn(shape, dtype=F64)
    assert conv.gain.shape == (6,) and conv.fan_in == 2 * 3 ** (len(shape) - 2)
    got = conv(x)
    ref = copy.deepcopy(conv)
    want = functional(x, _formula(ref), ref.bias, stride=2, padding=1, groups=2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got.square().sum().backward()
    want.square().sum().backward()
    for name in ("weight", "gain", "bias"):
        torch.testing.assert_close(getattr(conv, name).grad, getattr(ref, name).grad, rtol=1e-10, atol=1e-12)
    # standardized: each output channel's weights have mean 0 and sum of squares
    # gain^2 gamma^2 var / (var + eps)
    w = conv.standardized_weight().reshape(6, -1)
    var = conv.weight.reshape(6, -1).var(1, correction=0)
    torch.testing.assert_close(w.mean(1), torch.zeros(6, dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(w.square().sum(1), (conv.gain * RELU_GAMMA) ** 2 * var / (var + 1e-5),
                               rtol=1e-12, atol=0)


def test_scaled_std_conv2d_equals_timms():
    torch.manual_seed(0)
    ours = ScaledStdConv2d(5, 7, 3, padding=1, bias=True, gamma=RELU_GAMMA, eps=1e-5).to(F64)
    theirs = TimmScaledStdConv2d(5, 7, 3, padding=1, bias=True, gamma=RELU_GAMMA, eps=1e-5).to(F64)
    with torch.no_grad():
        ours.gain.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
        theirs.gain.copy_(ours.gain.reshape(7, 1, 1, 1))
    x = torch.randn(2, 5, 8, 8, dtype=F64)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------- the scheme's fields
def test_nf_schemes_and_their_validation():
    nf, skip = get_scheme("nf"), get_scheme("nf_skipinit")
    assert (nf.layout, nf.nf_alpha, nf.scaled_ws, nf.conv_bias, nf.zero_gamma, nf.init, nf.gain) == (
        "preact", 0.2, True, True, True, "nf", None)
    assert (skip.zero_gamma, skip.gain, skip.gain_init) == (False, "scalar", 0.0)
    assert nf.branch_scale(3, 16) == 0.2 and nf.skip_scale(3, 16) == 1.0
    assert get_scheme("bn").layout == "v1" and get_scheme("bn").nf_alpha is None
    assert get_scheme("nf", nf_alpha="0.5").nf_alpha == 0.5  # a config's string, read as a number
    with pytest.raises(SchemeOptionError, match="nf_alpha"):
        get_scheme("nf", nf_alpha=None)
    with pytest.raises(SchemeOptionError, match="nf_alpha"):
        get_scheme("nf", nf_alpha=-0.1)
    with pytest.raises(SchemeOptionError, match="null outside layout preact"):
        get_scheme("bn", nf_alpha=0.2)
    with pytest.raises(SchemeOptionError, match="layout"):
        get_scheme("nf", layout="post")
    with pytest.raises(ValueError, match="merge='rescale'"):
        get_scheme("nf", merge="rescale")
    with pytest.raises(ValueError, match="mean_shift=True"):
        get_scheme("nf", mean_shift=True)
    # the fast plans were not written for them: listed with the v1 values only
    assert plans.unimplemented(nf) == plans.unimplemented(skip) == ["scaled_ws", "layout", "init"]
    assert not plans.unimplemented(get_scheme("bn", init="he_fan_in"))


def _convs(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]


@pytest.mark.parametrize("name, kwargs, x_shape", [
    ("resnet50", dict(base_width=8), (2, 3, 32, 32)),
    ("resnext50_32x4d", dict(base_width=16), (2, 3, 32, 32)),
    ("cifar_resnet", dict(depth=8, base_width=8), (2, 3, 16, 16)),
    ("wide_resnet", dict(depth=10, width=2, base_width=4), (2, 3, 16, 16)),
    ("r3d_18", dict(base_width=8), (2, 3, 4, 16, 16)),
    ("slow_r50", dict(base_width=8), (2, 3, 4, 16, 16))])
def test_every_conv_family_builds_the_nf_layout(name, kwargs, x_shape):
    """Every conv is Scaled-WS with a bias; the stem has no activation and the head one; the
    betas follow the rule (1 after a transition, + alpha^2 per block); the last conv gain of every
    branch is 0 (so each block is its shortcut at init)."""
    torch.manual_seed(0)
    model = rescale_core.create_model(name, scheme="nf", num_classes=5, **kwargs)
    d = len(x_shape) - 2
    cls = {2: ScaledStdConv2d, 3: ScaledStdConv3d}[d]
    assert all(type(c) is cls and c.bias is not None for c in _convs(model))
    assert isinstance(model.relu, nn.Identity) and isinstance(model.final_act, nn.ReLU)
    expected = 1.0
    for _, block in residual_blocks(model):
        assert block.input_var == pytest.approx(expected) and block.preact
        assert torch.count_nonzero(getattr(block, f"conv{block.num_convs}").gain) == 0
        if block.downsample is not None and any(s != 1 for s in np.atleast_1d(block.conv2.stride)):
            assert isinstance(block.downsample[0], StridedAvgPool)
        expected = (1.0 if block.downsample is not None else expected) + 0.2 ** 2
        assert block.output_var == pytest.approx(expected)
    x = torch.randn(x_shape)
    out = model(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()


def test_block_in_1d_and_its_preact_function():
    """A 1D bottleneck transition block computes ``downsample(h) + alpha * F(h)``, ``h = relu(x) / beta``."""
    torch.manual_seed(0)
    block = ResidualBlock(get_scheme("nf", zero_gamma=False), 6, 4, stride=2, kind="bottleneck", k=2, L=5,
                          spatial_dims=1, input_var=1.3).to(F64)
    assert type(block.conv1) is ScaledStdConv1d and block.input_scale == pytest.approx(1.3 ** -0.5)
    x = torch.randn(3, 6, 11, dtype=F64)
    h = torch.relu(x) / math.sqrt(1.3)
    branch = block.conv3(torch.relu(block.conv2(torch.relu(block.conv1(h)))))
    torch.testing.assert_close(block(x), block.downsample(h) + 0.2 * branch, rtol=1e-12, atol=1e-12)
    assert block.output_var == pytest.approx(1.04)


# --------------------------------------------------------------- against timm's NormFreeNet
@pytest.mark.parametrize("scheme", ["nf", "nf_skipinit"])
def test_same_outputs_and_gradients_as_timm(scheme):
    """float64, timm's weights moved off their init (the zero gains made non-zero) and mapped
    into ours, timm's ``nf_resnet50`` config at our ``resnet50(base_width=8)``'s widths, on real
    photos: logits and the gradient of every parameter equal to 1e-6 of their scale. Measured:
    4e-16 (logits) and 2e-13 (worst gradient); the full ``nf_resnet50`` at 224x224 in
    ``python -m tools.nf_timm_check``."""
    result = nf_timm_check.compare(scheme)
    assert result["parameters"] == 161 + (16 if scheme == "nf_skipinit" else 0)
    assert result["output"] <= 1e-6 and result["grad"] <= 1e-6, result


def test_fifty_sgd_steps_in_lockstep_with_timm():
    """From timm's init, the same 50 digit batches (Nesterov SGD, lr 0.02): the losses agree to
    1e-9 relative at every step. Measured: |difference| <= 2e-14, the loss falling from 2.29 to
    0.91; 300 steps of both schemes in ``python -m tools.nf_timm_check``."""
    losses = nf_timm_check.lockstep("nf", steps=50)
    for theirs, ours in losses:
        assert abs(theirs - ours) <= 1e-9 * abs(theirs)
    assert losses[-1][0] < 0.6 * losses[0][0]  # it learns: the comparison is not of two stuck runs


# --------------------------------------------------------------- signal propagation at init
def test_stream_variance_follows_the_analytic_beta_squared():
    """The paper's signal propagation (Sec. 3, its Fig. 2) at init, measured by the probe
    (:func:`rescale_core.analysis.signal_propagation`, the variance of each block's output) on
    white-noise inputs, branches on (``zero_gamma=False``): ResNet-56 for CIFAR, 9 blocks a stage.

    The stream in units of the stem output's variance (ReLU's gamma sits in the stem conv, as in
    timm: ``gamma^2`` on unit-variance noise) is ``beta_l^2`` up to sampling (16 channels) in
    stage 1, which no transition precedes. Stages 2-3 restart at their transition, whose
    shortcut average-pools 2x2 first (timm's): that divides white noise's variance by 4 where the
    analytic rule assumes a variance-preserving shortcut (the official code's strided 1x1 conv;
    docs/nf_resnets.md), so the level there is about 1/4 of the analytic one; from it on, the
    stream grows as ``beta_l^2``. Measured (this seed): stage 1 within 3.1% of ``beta_l^2``,
    the transitions 0.256 and 0.273 of the level before, the growth within 0.6% (stage 2) and
    5.0% (stage 3, 8x8 maps, where the convs' zero padding takes variance) of ``beta_l^2``'s; over
    seeds 0-3, at most 8.9%, 0.256-0.297 and 5.0%."""
    torch.manual_seed(0)
    model = rescale_core.create_model("cifar_resnet", depth=56, scheme="nf", num_classes=10,
                                      scheme_options={"zero_gamma": False})
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    stem = {}
    hook = model.bn1.register_forward_hook(lambda m, args, out: stem.__setitem__("var", out.var().item()))
    records = signal_propagation(model, x)
    hook.remove()
    assert stem["var"] == pytest.approx(RELU_GAMMA ** 2, rel=0.05)
    blocks = [block for _, block in residual_blocks(model)]
    ratio = np.array([r["var_out"] / stem["var"] / b.output_var for r, b in zip(records, blocks)])
    stages = np.array([r["stage"] for r in records])
    assert np.all(np.abs(ratio[stages == "layer1"] - 1) < 0.10), ratio
    previous = 1.0
    for stage in ("layer2", "layer3"):
        r = ratio[stages == stage]
        assert 0.2 < r[0] / previous < 0.35, (stage, r[0] / previous)  # the 2x2 average pool on noise
        assert np.all(np.abs(r / r[0] - 1) < 0.08), (stage, r)
        previous = r[0]


@pytest.mark.parametrize("options", [{"skip_alpha": 1.1}, {"block_scale": 0.9}])
def test_beta_follows_a_shortcut_multiplier(options):
    """``skip_alpha`` (or ``block_scale``) under the pre-activation layout multiplies the stream
    each block carries, so the analytic variance the next block divides by is ``s^2 beta_l^2 +
    alpha^2`` (s: the shortcut's multiplier): measured on white noise, as the test above, the
    stream of stage 1 stays within 10% of it (it drifts 2.4-fold from ``beta_l^2 + alpha^2`` over the
    9 blocks at skip_alpha 1.1); the last block's beta is the analytic one."""
    torch.manual_seed(0)
    model = rescale_core.create_model("cifar_resnet", depth=56, scheme="nf", num_classes=10,
                                      scheme_options={"zero_gamma": False, **options})
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    stem = {}
    hook = model.bn1.register_forward_hook(lambda m, args, out: stem.__setitem__("var", out.var().item()))
    records = signal_propagation(model, x)
    hook.remove()
    blocks = [block for _, block in residual_blocks(model)]
    skip = options.get("skip_alpha", 1.0) * options.get("block_scale", 1.0)
    alpha = 0.2 * options.get("block_scale", 1.0)
    var = 1.0
    for block, record in list(zip(blocks, records))[:9]:  # stage 1: no transition
        assert block.input_var == pytest.approx(var)
        var = skip ** 2 * var + alpha ** 2
        assert block.output_var == pytest.approx(var)
        assert record["var_out"] / stem["var"] == pytest.approx(var, rel=0.10), record["name"]


# --------------------------------------------------------------- every plan: the reference
@pytest.mark.parametrize("scheme", ["nf", "nf_skipinit"])
def test_every_plan_computes_the_reference(scheme):
    """The training plans do not implement the NF fields: under every plan the network trains on
    its reference, bit for bit the same step (logits, every gradient) as under
    :func:`rescale_core.reference_path`; evaluation without autograd runs the frozen plan on
    every fast plan, equal to the reference's to rounding."""
    torch.manual_seed(0)
    model = rescale_core.create_model("resnet18", scheme=scheme, base_width=8, num_classes=5)
    randomise_(model)
    model = model.to(F64)
    planned = [m for m in model.modules() if isinstance(m, plans.Planned)]
    assert not any(m.fused for m in planned) and all(m.frozen_ok for m in planned)
    x, y = nf_timm_check.photos(), torch.tensor([0, 1, 2, 3])

    def run(net):
        net.train()
        net.zero_grad()
        out = net(x)
        F.cross_entropy(out, y).backward()
        net.eval()
        with torch.no_grad():
            evaluated = net(x)
        return evaluated, [out.detach(), *(p.grad for p in net.parameters())]

    ref = copy.deepcopy(model)
    with rescale_core.reference_path(ref):
        want_eval, want = run(ref)
    for plan in plans.PLANS:
        net = rescale_core.set_plan(copy.deepcopy(model), plan)
        assert plans.running_plan(net.train(), x) == "reference"
        with torch.no_grad():
            assert plans.running_plan(net.eval(), x) == ("reference" if plan == "reference" else plans.FROZEN)
        got_eval, got = run(net)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), plan
        torch.testing.assert_close(got_eval, want_eval, rtol=1e-12, atol=1e-12)


FROZEN_NETS = [("resnet50", dict(base_width=8), (2, 3, 32, 32)),
               ("cifar_resnet", dict(depth=8), (2, 3, 16, 16)),
               ("r3d_18", dict(base_width=8), (2, 3, 4, 16, 16))]


@pytest.mark.parametrize("scheme, options", [("nf", {}), ("nf_skipinit", {}), ("nf", {"scalar_biases": True}),
                                             ("nf_skipinit", {"scalar_biases": True})],
                         ids=["nf", "nf_skipinit", "nf-scalar_biases", "nf_skipinit-scalar_biases"])
@pytest.mark.parametrize("arch, kwargs, shape", FROZEN_NETS, ids=[a for a, _, _ in FROZEN_NETS])
def test_frozen_plan_evaluates_nf_networks(arch, kwargs, shape, scheme, options):
    """The frozen plan (each conv's standardized weight computed once, the pre-activation layout
    as a plain conv/ReLU network) equals the reference in float64 on a bottleneck ResNet, a CIFAR
    ResNet and a 3D ResNet: logits, features, every stage's output (a detection backbone's) and a
    block called on its own; a weight or gain changed after a forward is seen by the next. With
    Fixup's scalar biases too (before, the frozen plan declined them and evaluation ran the
    reference): the first one, after the block's ReLU and before its padded first conv, an add."""
    torch.manual_seed(0)
    model = rescale_core.create_model(arch, scheme=scheme, scheme_options=options, num_classes=5, **kwargs)
    randomise_(model)
    model = model.to(F64).eval()
    x = torch.randn(shape, dtype=F64)
    block = model.layer2[0]
    with torch.no_grad():
        with rescale_core.reference_path(model):
            want = model(x), model.forward_features(x), model.stage_outputs(x)
            h = want[2][0]  # layer1's output: layer2[0]'s input
            want_block = block(h)
        assert plans.running_plan(model, x) == plans.FROZEN and plans.running_plan(block, h) == plans.FROZEN
        got = model(x), model.forward_features(x), model.stage_outputs(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(block(h), want_block, rtol=1e-12, atol=1e-12)
        model.conv1.gain.mul_(1.5)
        model.layer1[0].conv1.weight.add_(0.1)
        with rescale_core.reference_path(model):
            want = model(x)
        torch.testing.assert_close(model(x), want, rtol=1e-12, atol=1e-12)
