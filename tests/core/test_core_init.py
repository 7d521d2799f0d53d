"""Initialisers: He et al. 2015 (Eq. 10), RescaleNet's multiplier (Shao et al. 2020, rebuttal [R4])
and Fixup's rescaling (Zhang et al. 2019, Sec. 3)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rescale_core import get_scheme
from rescale_core.init import (fixup_multiplier, he_normal_, init_branch, init_classifier,
                               init_shortcut, init_stem, rescale_conv_multiplier)


@pytest.mark.parametrize("mode, fan", [("fan_in", 64 * 9), ("fan_out", 128 * 9)])
def test_he_normal_std(mode, fan):
    torch.manual_seed(0)
    w = torch.empty(128, 64, 3, 3)
    he_normal_(w, mode)
    assert float(w.std()) == pytest.approx(math.sqrt(2 / fan), rel=0.01)
    assert abs(float(w.mean())) < 0.01 * math.sqrt(2 / fan) * 5
    he_normal_(w, mode, gain=1.0, multiplier=0.5)
    assert float(w.std()) == pytest.approx(0.5 / math.sqrt(fan), rel=0.01)


def test_he_normal_grouped_conv_counts_one_group():
    torch.manual_seed(0)
    conv = nn.Conv2d(256, 256, 3, groups=32, bias=False)  # weight (256, 8, 3, 3)
    he_normal_(conv.weight, "fan_in")
    assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / (8 * 9)), rel=0.02)


def test_a_weight_on_the_meta_device_draws_nothing(monkeypatch):
    """A network built on the meta device (the config checks build every full-size network so) has
    no values to draw: the init leaves its weights alone instead of running PyTorch's Python
    reference of ``normal_`` on them; a real weight is drawn as before."""
    drawn = []
    real_normal = torch.Tensor.normal_
    monkeypatch.setattr(torch.Tensor, "normal_", lambda self, *a, **k: drawn.append(self.device.type)
                        or real_normal(self, *a, **k))
    w = torch.empty(8, 4, 3, 3, device="meta")
    assert he_normal_(w) is w and w.is_meta and drawn == []
    he_normal_(torch.empty(8, 4, 3, 3))
    assert drawn == ["cpu"]


def test_rescale_conv_multiplier():
    L = 16
    for k in (1, 8, 16):
        assert rescale_conv_multiplier(k, L, 3) == pytest.approx((L / (k + L)) ** (1 / 6))
        assert rescale_conv_multiplier(k, L, 2) == pytest.approx((L / (k + L)) ** (1 / 4))
        assert rescale_conv_multiplier(k, L, 3, c=4.0) == pytest.approx((L / (k + 4.0)) ** (1 / 6))
        assert rescale_conv_multiplier(k, L, 3, dropout=0.1) == pytest.approx(
            (L / (k + L)) ** (1 / 6) * math.sqrt(0.9))
        assert rescale_conv_multiplier(k, L, 3, fixed_beta=False) == 1.0
        assert rescale_conv_multiplier(k, L, 3, dropout=0.19, fixed_beta=False) == pytest.approx(0.9)


def test_fixup_multiplier():
    assert fixup_multiplier(16, 3) == pytest.approx(16 ** -0.25)
    assert fixup_multiplier(9, 2) == pytest.approx(1 / 3)
    assert fixup_multiplier(9, 1) == 1.0


def _convs(m=3, width=64):
    torch.manual_seed(0)
    return [nn.Conv2d(width, width, 3, bias=True) for _ in range(m)]


def test_init_branch_rescale():
    convs = _convs()
    init_branch(get_scheme("rescale"), convs, [nn.Identity()] * 3, k=4, L=16, dropout=0.1)
    expected = math.sqrt(2 / (64 * 9)) * (16 / 20) ** (1 / 6) * math.sqrt(0.9)
    for conv in convs:
        assert float(conv.weight.detach().std()) == pytest.approx(expected, rel=0.02)
        assert torch.count_nonzero(conv.bias) == 0


def test_init_branch_fixup():
    convs = _convs()
    init_branch(get_scheme("fixup"), convs, [nn.Identity()] * 3, k=2, L=16)
    assert torch.count_nonzero(convs[-1].weight) == 0
    for conv in convs[:-1]:
        assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / (64 * 9)) * 16 ** -0.25, rel=0.02)


def test_init_branch_norms_and_zero_gamma():
    convs = _convs(2)
    norms = [nn.BatchNorm2d(64), nn.BatchNorm2d(64)]
    with torch.no_grad():
        for n in norms:
            n.weight.fill_(3.0)
            n.bias.fill_(3.0)
    init_branch(get_scheme("bn", zero_gamma=True), convs, norms, k=1, L=8)
    assert torch.all(norms[0].weight == 1) and torch.all(norms[1].weight == 0)
    assert torch.all(norms[0].bias == 0) and torch.all(norms[1].bias == 0)
    for conv in convs:  # torchvision: fan-out He normal
        assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.02)


def test_shortcut_stem_classifier():
    torch.manual_seed(0)
    conv = nn.Conv2d(256, 512, 1, bias=False)
    init_shortcut(get_scheme("rescale"), conv)
    assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(1 / 256), rel=0.02)
    init_shortcut(get_scheme("fixup"), conv)
    assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / 512), rel=0.02)
    stem = nn.Conv2d(3, 64, 7, bias=False)
    init_stem(get_scheme("bn"), stem)
    assert float(stem.weight.detach().std()) == pytest.approx(math.sqrt(2 / (64 * 49)), rel=0.03)
    init_stem(get_scheme("rescale"), stem)
    assert float(stem.weight.detach().std()) == pytest.approx(math.sqrt(2 / (3 * 49)), rel=0.03)
    fc = nn.Linear(2048, 100)
    init_classifier(get_scheme("fixup"), fc)
    assert torch.count_nonzero(fc.weight) == 0 and torch.count_nonzero(fc.bias) == 0
    init_classifier(get_scheme("rescale"), fc)
    assert float(fc.weight.detach().std()) == pytest.approx(math.sqrt(1 / 2048), rel=0.02)
    assert torch.count_nonzero(fc.bias) == 0


def test_shortcut_and_classifier_gains_replace_the_inits_gain():
    """``shortcut_gain`` / ``classifier_gain`` (docs/studies.md, the basic-block yardstick): the He
    gain of the projection shortcut and of the classifier; without them every scheme keeps its
    paper's init."""
    torch.manual_seed(0)
    conv, fc = nn.Conv2d(256, 512, 1, bias=False), nn.Linear(2048, 100)
    for name, mode_fan in (("rescale", 256), ("skipinit", 256), ("bn", 512)):
        init_shortcut(get_scheme(name, shortcut_gain=2.0), conv)
        assert float(conv.weight.detach().std()) == pytest.approx(2.0 / math.sqrt(mode_fan), rel=0.02)
    init_classifier(get_scheme("rescale", classifier_gain=10.0), fc)
    assert float(fc.weight.detach().std()) == pytest.approx(10.0 / math.sqrt(2048), rel=0.02)
    assert torch.count_nonzero(fc.bias) == 0
    init_classifier(get_scheme("bn", classifier_gain=3.0), fc)  # He normal instead of PyTorch's uniform
    assert float(fc.weight.detach().std()) == pytest.approx(3.0 / math.sqrt(2048), rel=0.02)


@pytest.mark.parametrize("overrides, message", [
    ({"classifier_gain": 0.0}, "positive"), ({"shortcut_gain": float("nan")}, "positive"),
    ({"shortcut_gain": -1.0}, "positive"),
])
def test_gains_must_be_positive(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_scheme("rescale", **overrides)


def test_classifier_gain_refused_with_a_zero_classifier():
    with pytest.raises(ValueError, match="zero_classifier"):
        get_scheme("fixup", classifier_gain=2.0)
