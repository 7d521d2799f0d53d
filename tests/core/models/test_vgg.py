"""VGG (Simonyan & Zisserman 2015) with BatchNorm, without normalisation, and as RescaleNet's
normalisation-free VGG (Shao et al. 2020): mean-shift biases before every conv and linear layer."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core.analysis import signal_propagation
from rescale_core.layers import MeanShiftBias


def _tiny(name, scheme=None, **kwargs):
    torch.manual_seed(0)
    extra = {} if scheme is None else {"scheme": scheme}
    return rescale_core.create_model(name, base_width=8, hidden_dim=32, num_classes=5, **extra, **kwargs)


def test_rescale_vgg_has_a_mean_shift_bias_before_every_conv_and_linear():
    model = _tiny("vgg19_rescale")
    seq = list(model.features) + list(model.classifier)
    weighted = [i for i, m in enumerate(seq) if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert len(weighted) == 16 + 3
    for i in weighted:
        shift = seq[i - 1]
        assert isinstance(shift, MeanShiftBias), i
        assert shift.num_channels == (seq[i].in_channels if isinstance(seq[i], nn.Conv2d) else seq[i].in_features)
        if isinstance(seq[i], nn.Conv2d):
            assert seq[i].bias is None  # the mean-shift bias replaces it
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert len(rescale_core.mean_shift_layers(model)) == 19


def test_rescale_vgg_init():
    torch.manual_seed(0)
    model = rescale_core.create_model("vgg16_rescale", num_classes=10)
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    for conv in convs[2:]:
        fan_in = conv.in_channels * 9
        assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / fan_in), rel=0.03)
    last = model.classifier[-1]
    assert float(last.weight.detach().std()) == pytest.approx(math.sqrt(1 / last.in_features), rel=0.03)
    assert torch.count_nonzero(last.bias) == 0


def test_bn_and_plain_vgg_layers():
    bn = _tiny("vgg11_bn")
    convs = [m for m in bn.features if isinstance(m, nn.Conv2d)]
    norms = [m for m in bn.features if isinstance(m, nn.BatchNorm2d)]
    assert len(convs) == len(norms) == 8 and all(c.bias is None for c in convs)
    plain = _tiny("vgg11", scheme="none")
    assert not any(isinstance(m, (nn.BatchNorm2d, MeanShiftBias)) for m in plain.modules())
    assert all(m.bias is not None for m in plain.features if isinstance(m, nn.Conv2d))
    assert _tiny("vgg11").scheme.name == "bn"


@pytest.mark.parametrize("scheme", ["skipinit", "fixup", "post_ln"])
def test_vgg_refuses_residual_schemes(scheme):
    with pytest.raises(ValueError, match="VGG supports"):
        _tiny("vgg11", scheme=scheme)


def test_vgg_has_no_residual_blocks():
    model = _tiny("vgg11_rescale")
    assert signal_propagation(model, torch.randn(2, 3, 32, 32)) == []
