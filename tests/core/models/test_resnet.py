"""ResNet families (He et al. 2016; Zagoruyko & Komodakis 2016; Hara et al. 2018) under every
residual scheme: every registered model trains, round-trips its state dict, and starts where
its paper says (RescaleNet, Shao et al. 2020; SkipInit, De & Smith 2020; Fixup, Zhang et al. 2019;
ReZero, Bachlechner et al. 2020)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import rescale_core
from rescale_core.analysis import residual_blocks, signal_propagation
from rescale_core.layers import MeanShiftBias, StridedAvgPool


# --------------------------------------------------------------- every model x every scheme
def test_tiny_configs_have_the_documented_depth(harness):
    assert rescale_core.create_model("cifar_resnet", **harness.tiny_kwargs("cifar_resnet")).num_blocks == 3
    assert rescale_core.create_model("wide_resnet", **harness.tiny_kwargs("wide_resnet")).num_blocks == 6
    assert rescale_core.create_model("resnet101", **harness.tiny_kwargs("resnet101")).num_blocks == 33


# --------------------------------------------------------------- signal propagation at init
@pytest.fixture(scope="module")
def resnet101_signal():
    """signal_propagation records of a full-width ResNet-101 at init, per scheme (cached)."""
    cache: dict[str, list[dict]] = {}

    def get(scheme: str) -> list[dict]:
        if scheme not in cache:
            torch.manual_seed(0)
            model = rescale_core.create_model("resnet101", scheme=scheme, num_classes=10)
            cache[scheme] = signal_propagation(model, torch.randn(16, 3, 64, 64))
        return cache[scheme]
    return get


def _stage3_var_out(records) -> np.ndarray:
    stage = [r for r in records if r["stage"] == "layer3"]
    assert [r["block"] for r in stage] == list(range(23))
    return np.array([r["var_out"] for r in stage])


def test_rescale_keeps_variance_flat_and_eta_small(resnet101_signal):
    records = resnet101_signal("rescale")
    v = _stage3_var_out(records)
    assert v.max() / v.min() < 2.5, v
    assert max(r["eta"] for r in records) < 0.05
    assert len(records) == 33


def test_no_normalisation_explodes(resnet101_signal):
    v = _stage3_var_out(resnet101_signal("none"))
    assert v[-1] / v[0] > 100, v


def test_batchnorm_variance_grows_linearly_with_depth(resnet101_signal):
    # SkipInit (De & Smith 2020): BN downscales the branches, Var[x_k] grows ~ linearly in k.
    v = _stage3_var_out(resnet101_signal("bn"))
    assert np.corrcoef(np.arange(len(v)), v)[0, 1] > 0.97  # measured: 0.9999
    assert 5 < v[-1] / v[0] < 40  # measured: 12.8
    assert np.all(np.diff(v) > 0)


@pytest.mark.parametrize("scheme", ["skipinit", "rezero"])
def test_zero_gain_blocks_are_the_identity_at_init(resnet101_signal, scheme):
    records = resnet101_signal(scheme)
    assert len(records) == 33
    for r in records:
        assert r["gain"] == 0.0
        assert r["var_branch"] == 0.0
        assert r["var_sum"] == r["var_skip"]


# --------------------------------------------------------------- RescaleNet init, per block
def _relative_std_tolerance(n: int) -> float:
    return max(0.03, 5.0 / math.sqrt(2.0 * n))  # 5 standard errors of a sample std


def _fan_in(w: torch.Tensor) -> int:
    return w.shape[1] * math.prod(w.shape[2:])


def _fan_out(w: torch.Tensor) -> int:
    return w.shape[0] * math.prod(w.shape[2:])


@pytest.mark.parametrize("arch, L", [("resnet50", 16), ("resnet101", 33)])
def test_rescale_merge_scales_and_branch_init(arch, L):
    torch.manual_seed(0)
    model = rescale_core.create_model(arch, scheme="rescale", num_classes=10)
    blocks = residual_blocks(model)
    assert len(blocks) == L
    pooled, count = 0.0, 0
    for k, (name, block) in enumerate(blocks, start=1):
        merge = block.merge
        assert (merge.k, merge.L) == (k, L)
        assert merge.skip_scale == pytest.approx(math.sqrt((k - 1 + L) / (k + L)), rel=1e-12)
        assert merge.branch_scale == pytest.approx(L ** -0.5, rel=1e-12)
        assert merge.gain.weight.shape == (1,) and float(merge.gain.weight.detach()) == 1.0
        for i in (1, 2, 3):
            w = getattr(block, f"conv{i}").weight.detach()
            expected = math.sqrt(2.0 / _fan_in(w)) * (L / (k + L)) ** (1 / 6)
            got = float(w.std())
            assert got == pytest.approx(expected, rel=_relative_std_tolerance(w.numel())), (name, i)
            pooled += float((w.double() ** 2).sum()) / expected ** 2
            count += w.numel()
            assert isinstance(getattr(block, f"shift{i}"), MeanShiftBias)
    # Pooled over all branch weights: tight enough to tell k + L from the official k - 1 + L
    # (which would make the variance >= 1% larger).
    assert pooled / count == pytest.approx(1.0, abs=2e-3)


def test_rescale_network_level_init():
    torch.manual_seed(0)
    model = rescale_core.create_model("resnet50", scheme="rescale", num_classes=10)
    assert isinstance(model.bn1, MeanShiftBias) and isinstance(model.pool_shift, MeanShiftBias)
    w = model.conv1.weight.detach()
    assert float(w.std()) == pytest.approx(math.sqrt(2 / _fan_in(w)), rel=0.05)
    assert float(model.fc.weight.detach().std()) == pytest.approx(math.sqrt(1 / 2048), rel=0.05)
    assert torch.count_nonzero(model.fc.bias) == 0
    for name, block in residual_blocks(model):
        if block.downsample is None:
            continue
        layers = list(block.downsample)
        stride = block.conv2.stride[0]
        kinds = [type(m) for m in layers]
        assert kinds == ([StridedAvgPool] if stride > 1 else []) + [MeanShiftBias, nn.Conv2d], name
        conv = layers[-1]
        assert conv.stride == (1, 1)
        assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(1 / _fan_in(conv.weight)),
                                                         rel=_relative_std_tolerance(conv.weight.numel()))


def _same_seed_pair(**options):
    """A ResNet-50 (stage-1 width 16) with the rescale defaults and one with ``options``, built
    from the same seed: their initial weights differ only by the init multipliers."""
    torch.manual_seed(0)
    ref = rescale_core.create_model("resnet50", scheme="rescale", base_width=16, num_classes=10)
    torch.manual_seed(0)
    other = rescale_core.create_model("resnet50", scheme="rescale", base_width=16, num_classes=10,
                                      scheme_options=options)
    return list(zip(residual_blocks(ref), residual_blocks(other)))


def _conv_ratios(a, b) -> list[torch.Tensor]:
    return [getattr(b, f"conv{i}").weight / getattr(a, f"conv{i}").weight for i in (1, 2, 3)]


def test_rescale_without_fixed_beta():
    L = 16
    for k, ((_, ref), (_, blk)) in enumerate(_same_seed_pair(fixed_beta=False), start=1):
        assert blk.merge.branch_scale == pytest.approx((k + L) ** -0.5, rel=1e-12)
        assert blk.merge.skip_scale == pytest.approx(math.sqrt((k - 1 + L) / (k + L)), rel=1e-12)
        for ratio in _conv_ratios(ref, blk):  # plain He init: no multiplier
            torch.testing.assert_close(ratio, torch.full_like(ratio, (L / (k + L)) ** (-1 / 6)))
        # the effective beta_k is the same in both forms
        assert blk.merge.branch_scale == pytest.approx(ref.merge.branch_scale * (L / (k + L)) ** 0.5)
    torch.manual_seed(0)
    plain = rescale_core.create_model("resnet50", scheme="rescale", num_classes=10,
                                      scheme_options={"fixed_beta": False})
    w = plain.layer3[5].conv2.weight.detach()
    assert float(w.std()) == pytest.approx(math.sqrt(2 / _fan_in(w)), rel=0.03)


def test_rescale_c_override():
    L, c = 16, 5.0
    for k, ((_, ref), (_, blk)) in enumerate(_same_seed_pair(c=c), start=1):
        assert blk.merge.skip_scale == pytest.approx(math.sqrt((k - 1 + c) / (k + c)), rel=1e-12)
        assert blk.merge.branch_scale == pytest.approx(L ** -0.5, rel=1e-12)
        for ratio in _conv_ratios(ref, blk):  # (L/(k+c))^(1/6) / (L/(k+L))^(1/6)
            torch.testing.assert_close(ratio, torch.full_like(ratio, ((k + L) / (k + c)) ** (1 / 6)))


def test_rescale_conv_dropout_multiplier_in_stages_3_and_4():
    for (name, ref), (_, blk) in _same_seed_pair(conv_dropout=0.1):
        stage = int(name[len("layer")])
        if stage in (3, 4):
            assert isinstance(blk.drop, nn.Dropout2d) and blk.drop.p == 0.1, name
            expected = math.sqrt(0.9)
        else:
            assert isinstance(blk.drop, nn.Identity), name
            expected = 1.0
        for ratio in _conv_ratios(ref, blk):
            torch.testing.assert_close(ratio, torch.full_like(ratio, expected))
        assert blk.merge.skip_scale == ref.merge.skip_scale


def test_conv_dropout_stages_are_configurable():
    torch.manual_seed(0)
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3,
                                      scheme_options={"conv_dropout": 0.2, "conv_dropout_stages": (1,)})
    drops = {name: isinstance(b.drop, nn.Dropout2d) for name, b in residual_blocks(model)}
    assert drops == {n: n.startswith("layer1.") for n in drops}


@pytest.mark.parametrize("options", [{"classifier_gain": 10.0}, {"zero_classifier": True}])
def test_classifier_init_options_without_a_classifier_are_refused(options):
    """num_classes=0 (a detection backbone, pooled features): before, the classifier's init options
    were accepted and initialised nothing."""
    (option, value), = options.items()
    with pytest.raises(rescale_core.schemes.SchemeOptionError) as refused:
        rescale_core.create_model("cifar_resnet", depth=8, base_width=4, num_classes=0, scheme="rescale",
                                  scheme_options=options)
    assert str(refused.value) == (f"scheme_options.{option}: {str(value).lower()} is not an option of a network "
                                  "without a classifier (num_classes=0: it initialises the classifier only; remove "
                                  "it) for scheme rescale")
    net = rescale_core.create_model("cifar_resnet", depth=8, base_width=4, num_classes=3, scheme="rescale",
                                    scheme_options=options)
    assert net.fc.weight.abs().max() > 0.5 if option == "classifier_gain" else not net.fc.weight.any()
    features = rescale_core.create_model("fixup50", base_width=8, num_classes=0)  # fixup's own zero_classifier
    assert isinstance(features.fc, nn.Identity)


@pytest.mark.parametrize("name, shape", [("resnet50", (2, 3, 32, 32)), ("resnet3d_18", (2, 3, 4, 32, 32))])
def test_vector_gains(name, shape):
    torch.manual_seed(0)
    model = rescale_core.create_model(name, scheme="rescale", base_width=8, num_classes=3,
                                      scheme_options={"gain": "vector"})
    d = len(shape) - 2
    for _, block in residual_blocks(model):
        out_channels = block.conv2.out_channels if block.kind == "basic" else block.conv3.out_channels
        assert block.merge.gain.weight.shape == (1, out_channels) + (1,) * d
        assert torch.all(block.merge.gain.weight == 1)
    out = model(torch.randn(shape))
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert model.layer1[0].merge.gain.weight.grad.shape == model.layer1[0].merge.gain.weight.shape


# --------------------------------------------------------------- Fixup init
@pytest.mark.parametrize("name, kwargs, L, m", [
    ("resnet50", {}, 16, 3),
    ("cifar_resnet", {"depth": 20}, 9, 2),
])
def test_fixup_init(name, kwargs, L, m):
    torch.manual_seed(0)
    model = rescale_core.create_model(name, scheme="fixup", num_classes=10, **kwargs)
    assert torch.count_nonzero(model.fc.weight) == 0 and torch.count_nonzero(model.fc.bias) == 0
    blocks = residual_blocks(model)
    assert len(blocks) == L
    for bname, block in blocks:
        assert block.num_convs == m
        assert torch.count_nonzero(getattr(block, f"conv{m}").weight) == 0, bname
        for i in range(1, m):
            w = getattr(block, f"conv{i}").weight.detach()
            expected = math.sqrt(2 / _fan_out(w)) * L ** (-1 / (2 * m - 2))
            assert float(w.std()) == pytest.approx(expected, rel=_relative_std_tolerance(w.numel())), (bname, i)
        assert float(block.merge.gain.weight.detach()) == 1.0
    scalars = [mod.bias for mod in model.modules() if isinstance(mod, rescale_core.ScalarBias)]
    assert scalars and all(float(b.detach()) == 0.0 for b in scalars)


# --------------------------------------------------------------- shapes the official code fails on
def test_rescale_shortcut_handles_odd_sizes():
    # the official avgpool(2) shortcut gives floor(n/2) where the strided conv gives ceil(n/2)
    torch.manual_seed(0)
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3)
    out = model(torch.randn(2, 3, 40, 56))  # stage 4 sees 5x7 -> 3x4
    assert out.shape == (2, 3) and torch.isfinite(out).all()


def test_rescale_3d_with_short_clips():
    # a 4-frame clip has 1 frame left from stage 3 on; the shortcut pool must not need 2
    torch.manual_seed(0)
    model = rescale_core.create_model("rescale3d_50", base_width=8, num_classes=3)
    feats = model.forward_features(torch.randn(2, 3, 4, 32, 32))
    assert feats.shape == (2, model.num_features, 1, 1, 1)


def test_stage_attributes():
    model = rescale_core.create_model("resnet50", scheme="rescale", base_width=8, num_classes=0)
    assert model.stage_names == ["layer1", "layer2", "layer3", "layer4"]
    assert model.out_channels_per_stage == [32, 64, 128, 256]
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 256)


@pytest.mark.parametrize("name, kwargs", [("resnet50", {"base_width": 8}), ("cifar_resnet", {"depth": 8}),
                                          ("resnet3d_18", {"base_width": 8})])
def test_dyt_puts_the_pointwise_layer_where_bn_has_batchnorm(name, kwargs):
    """DyT's ConvNet form (Zhu et al. 2025; the counter-example of docs/studies.md): every
    BatchNorm of the ``bn`` network (branch, projection shortcut, stem) is a channels-first
    ``PointwiseNorm`` with alpha at 0.5 (or ``norm_alpha``), weight 1 and bias 0; nothing else
    differs, the convolutions start equal."""
    from rescale_core.layers import PointwiseNorm

    torch.manual_seed(0)
    bn = rescale_core.create_model(name, scheme="bn", num_classes=3, **kwargs)
    torch.manual_seed(0)
    dyt = rescale_core.create_model(name, scheme="dyt", num_classes=3, **kwargs)
    norms = {n: type(m) for n, m in bn.named_modules() if isinstance(m, nn.modules.batchnorm._NormBase)}
    pointwise = {n: m for n, m in dyt.named_modules() if isinstance(m, PointwiseNorm)}
    assert norms and sorted(norms) == sorted(pointwise)
    for n, m in pointwise.items():
        assert m.kind == "dyt" and m.spatial_dims == int(norms[n].__name__[-2])  # BatchNorm2d: 2
        assert m.alpha.item() == 0.5 and bool((m.weight == 1).all()) and bool((m.bias == 0).all())
    convs = {n: p for n, p in dyt.named_parameters() if p.dim() > 2}
    assert convs and all(torch.equal(p, bn.get_parameter(n)) for n, p in convs.items())
    x = torch.randn(2, 3, *((4, 32, 32) if name.startswith("resnet3d") else (32, 32)))
    dyt.train()
    assert torch.isfinite(dyt(x)).all()
    again = rescale_core.create_model(name, scheme="dyt", scheme_options={"norm_alpha": 1.5}, num_classes=3, **kwargs)
    assert {m.alpha.item() for m in again.modules() if isinstance(m, PointwiseNorm)} == {1.5}


TRANSFORMER_ONLY_VALUES = {"norm_position": {"norm_position": "pre"}, "norm_alpha_attention": {"norm_alpha_attention": 0.3},
                           "norm_alpha_ffn": {"norm_alpha_ffn": 0.3}, "norm_alpha_final": {"norm_alpha_final": 0.3},
                           "layer_gain": {"layer_gain": True}}
#: the scheme each option is tried on: one whose network the option would change if a ResNet read it
TRANSFORMER_ONLY_BASE = {"layer_gain": "skipinit"}


def test_options_only_transformers_read_change_no_resnet_and_are_refused(monkeypatch):
    """Each of TRANSFORMER_ONLY_OPTIONS leaves a ResNet's weights and outputs as they were (so the
    list is right: built with the refusal lifted, under a scheme with a pointwise norm, where the
    alphas would matter), and given as a scheme option it is refused in one line naming it, rather
    than accepted and ignored."""
    from rescale_core import schemes
    from rescale_core.schemes import TRANSFORMER_ONLY_OPTIONS, SchemeOptionError

    assert set(TRANSFORMER_ONLY_VALUES) == TRANSFORMER_ONLY_OPTIONS
    x = torch.randn(2, 3, 16, 16)

    def built(scheme, options):
        torch.manual_seed(0)
        return rescale_core.create_model("cifar_resnet", depth=8, scheme=scheme, scheme_options=options,
                                         num_classes=3).eval()

    for scheme, option in ([(TRANSFORMER_ONLY_BASE.get(option, "dyt"), option) for option in TRANSFORMER_ONLY_VALUES]
                           + [("nf", "norm_position")]):
        with pytest.raises(SchemeOptionError, match=f"^scheme_options.{option}: .* is not an option of a conv "
                                                    "network") as refused:
            built(scheme, TRANSFORMER_ONLY_VALUES[option])
        assert refused.value.option == option
    with monkeypatch.context() as lifted:
        for option in TRANSFORMER_ONLY_OPTIONS:
            lifted.setitem(schemes.FIELD_READERS, option, frozenset({"conv", "transformer"}))
        for option, values in TRANSFORMER_ONLY_VALUES.items():
            plain = built(TRANSFORMER_ONLY_BASE.get(option, "dyt"), None)
            other = built(TRANSFORMER_ONLY_BASE.get(option, "dyt"), values)
            assert all(torch.equal(v, other.state_dict()[k]) for k, v in plain.state_dict().items()), option
            assert torch.equal(plain(x), other(x)), option
    assert built("dyt", {"norm_alpha": 0.3})  # DyT's alpha of a conv network
