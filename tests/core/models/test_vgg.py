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


@pytest.mark.parametrize("scheme,refusal", [
    ("skipinit", 'its gain "scalar" is not the null of none, the closest'),
    ("fixup", "its scalar_biases true is not the false of bn, the closest"),
    ("bn_scaled", "its block_scale 0.7071067811865476 is not the 1.0 of bn, the closest"),
    ("post_ln", "is for Transformers, not VGG")])
def test_vgg_refuses_residual_schemes(scheme, refusal):
    with pytest.raises(ValueError, match=refusal):
        _tiny("vgg11", scheme=scheme)


def test_vgg_builds_a_scheme_by_its_fields_not_its_name(monkeypatch):
    """Before, VGG refused by name a data-only variant of ``rescale`` registered under another
    name; now it builds one whose fields outside norm, mean_shift and measure_batches are those
    of bn, none or rescale, and refuses one naming the field it cannot build."""
    from rescale_core import schemes

    monkeypatch.setattr(schemes, "_SCHEMES", dict(schemes._SCHEMES))  # the registry as it was, after
    schemes.register_scheme(schemes.get_scheme("rescale").replace(name="rescale_ms2", measure_batches=2))
    variant = _tiny("vgg11", scheme="rescale_ms2")
    rescale = _tiny("vgg11_rescale", scheme_options={"measure_batches": 2})
    assert variant.state_dict().keys() == rescale.state_dict().keys()
    assert all(torch.equal(v, rescale.state_dict()[k]) for k, v in variant.state_dict().items())
    assert {m.measure_batches for m in rescale_core.mean_shift_layers(variant)} == {2}
    unregistered = _tiny("vgg11", scheme=schemes.Scheme("my_rescale", merge="rescale", gain="scalar", mean_shift=True,
                                                       init="rescale", measure_batches=2))
    assert all(torch.equal(v, rescale.state_dict()[k]) for k, v in unregistered.state_dict().items())
    schemes.register_scheme(schemes.get_scheme("rescale").replace(name="rescale_c2", c=2.0))
    with pytest.raises(ValueError, match="^VGG cannot build scheme 'rescale_c2': its c 2.0 is not the null of "
                                         "rescale, the closest of the schemes VGG builds"):
        _tiny("vgg11", scheme="rescale_c2")


def test_vgg_names_the_default_of_a_scheme_subclass_field_it_cannot_build():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Widened(rescale_core.Scheme):
        widths: tuple = dataclasses.field(default_factory=lambda: (1,))

    rescale = rescale_core.get_scheme("rescale")
    fields = {f.name: getattr(rescale, f.name) for f in dataclasses.fields(rescale_core.Scheme)}
    scheme = Widened(**{**fields, "name": "widened"}, widths=(2,))
    with pytest.raises(ValueError, match=r"^VGG cannot build scheme 'widened': its widths \[2\] is not the \[1\] of "
                                         "rescale, the closest"):
        _tiny("vgg11", scheme=scheme)


def test_vgg_has_no_residual_blocks():
    model = _tiny("vgg11_rescale")
    assert signal_propagation(model, torch.randn(2, 3, 32, 32)) == []
