"""The model registry: the papers' networks by name (RescaleNet, Shao et al. 2020; SkipInit's
Wide-ResNet 1000-2, De & Smith 2020; Fixup, Zhang et al. 2019), with helpful errors."""
from __future__ import annotations

import pytest
import torch

import rescale_core
from rescale_core import create_model, get_scheme, list_models, register_model
from rescale_core.analysis import residual_blocks
from rescale_core.registry import _REGISTRY, model_entry

KNOWN_FAMILIES = {"resnet", "resnet3d", "cifar_resnet", "wide_resnet", "vgg", "transformer",
                  "video_resnet"}  # video_resnet: its matrix is tests/core/test_video_resnets.py


def test_every_family_is_covered_by_a_test_matrix():
    # tests/core/models/test_{resnet,vgg}.py run every model of these families under every
    # scheme; the transformer family has its own tests. A new family needs its own matrix.
    families = {model_entry(n).family for n in list_models()}
    assert families <= KNOWN_FAMILIES, families - KNOWN_FAMILIES


def test_list_models_filters():
    assert "resnet50" in list_models() and "rescale101" in list_models()
    assert list_models("vgg19*") == ["vgg19", "vgg19_bn", "vgg19_rescale"]
    assert set(list_models(family="resnet3d")) == {"resnet3d_18", "resnet3d_34", "resnet3d_50",
                                                   "resnet3d_101", "rescale3d_50"}
    assert list_models(family="no-such-family") == []


def test_unknown_model_suggests_close_matches():
    with pytest.raises(KeyError) as exc:
        create_model("resnet5")
    assert "Did you mean" in str(exc.value) and "resnet50" in str(exc.value)


def test_unknown_scheme_suggests_close_matches():
    with pytest.raises(KeyError) as exc:
        create_model("resnet18", scheme="rescal")
    assert "rescale" in str(exc.value) and "Did you mean" in str(exc.value)


def test_bad_scheme_option_lists_the_options():
    with pytest.raises(ValueError) as exc:
        create_model("resnet18", scheme="rescale", base_width=8, scheme_options={"measure_batch": 2})
    message = str(exc.value)
    assert "measure_batch" in message and "options are" in message
    for option in ("measure_batches", "conv_dropout", "fixed_beta", "gain", "c"):
        assert repr(option) in message
    # name and families say which scheme this is: refused as options, so not listed among them
    listed = message.split("options are ", 1)[1]
    assert "'name'" not in listed and "'families'" not in listed, message


def test_duplicate_registration_refused():
    builder = model_entry("resnet50").builder
    with pytest.raises(ValueError, match="already registered"):
        register_model("resnet50", builder, "resnet", arch="resnet18")
    assert model_entry("resnet50").defaults == {"arch": "resnet50"}


def test_register_new_model():
    name = "test_core_registry_tiny"
    try:
        register_model(name, lambda **kw: torch.nn.Linear(2, kw.get("num_classes", 3)), "test")
        assert name in list_models(family="test")
        assert create_model(name, num_classes=4).out_features == 4
    finally:
        _REGISTRY.pop(name, None)
    assert name not in list_models()


def test_resnet101_rescale():
    model = create_model("resnet101", scheme="rescale")
    assert model.scheme.name == "rescale" and model.num_blocks == 33
    assert model.fc.in_features == 2048 and model.fc.out_features == 1000
    assert len(rescale_core.mean_shift_layers(model)) == 2 + 3 * 33 + 4


def test_wide_resnet_1000_2_skipinit():
    model = create_model("wide_resnet", depth=1000, width=2, scheme="skipinit", num_classes=10)
    blocks = residual_blocks(model)
    assert len(blocks) == model.num_blocks == 498
    assert [len(getattr(model, f"layer{s}")) for s in (1, 2, 3)] == [166, 166, 166]
    assert model.out_channels_per_stage == [32, 64, 128]
    assert all(float(b.merge.gain.weight.detach()) == 0.0 for _, b in blocks)


@pytest.mark.parametrize("depth", [15, 17])
def test_wide_resnet_depth_must_be_6n_plus_4(depth):
    with pytest.raises(ValueError, match="6n\\+4"):
        create_model("wide_resnet", depth=depth)


def test_cifar_resnet_depth_must_be_6n_plus_2():
    with pytest.raises(ValueError, match="6n\\+2"):
        create_model("cifar_resnet", depth=21)


@pytest.mark.parametrize("name, scheme", [("rescale50", "rescale"), ("fixup101", "fixup"),
                                          ("skipinit50", "skipinit"), ("rezero50", "rezero"),
                                          ("rescale3d_50", "rescale"), ("vgg19_rescale", "rescale"),
                                          ("vgg11_bn", "bn")])
def test_paper_names_fix_their_scheme(name, scheme):
    kwargs = {"base_width": 8, "num_classes": 3}
    assert create_model(name, **kwargs).scheme.name == scheme
    assert create_model(name, scheme=scheme, **kwargs).scheme.name == scheme
    other = "bn" if scheme != "bn" else "none"
    with pytest.raises(ValueError, match="is defined with scheme"):
        create_model(name, scheme=other, **kwargs)


@pytest.mark.parametrize("name, arch", [("rescale50", "resnet50"), ("vgg11_rescale", "vgg11"),
                                        ("fixup101", "resnet101")])
def test_a_paper_name_takes_its_scheme_as_an_instance_and_names_its_architecture_for_another(name, arch):
    """Before: ``scheme=get_scheme("rescale")`` was refused by rescale50 as another scheme, and
    vgg11_rescale suggested create_model('resnet50', ...)."""
    kwargs = {"base_width": 8, "num_classes": 3}
    scheme = model_entry(name).defaults["scheme"]
    assert create_model(name, scheme=get_scheme(scheme, measure_batches=3), **kwargs).scheme == \
        get_scheme(scheme, measure_batches=3)
    with pytest.raises(ValueError) as refused:
        create_model(name, scheme=get_scheme("none"), **kwargs)
    assert str(refused.value) == (f"model {name!r} is defined with scheme={scheme!r}, got scheme='none'; for another "
                                  f"scheme use its architecture's name: create_model({arch!r}, scheme=...)")


@pytest.mark.parametrize("name, other", [("resnet50", "resnet18"), ("rescale50", "resnet101"),
                                         ("vgg19_bn", "vgg11"), ("transformer_tiny", "transformer_small")])
def test_names_fix_their_architecture(name, other):
    with pytest.raises(ValueError, match=rf"^model '{name}' is defined with arch=.*got arch='{other}'"):
        create_model(name, arch=other)


def test_scheme_options_reach_paper_models():
    model = create_model("rescale50", base_width=8, num_classes=3, scheme_options={"measure_batches": 2})
    assert all(m.measure_batches == 2 for m in rescale_core.mean_shift_layers(model))


def test_transformer_schemes_refused_for_resnets():
    with pytest.raises(ValueError, match="Transformers"):
        create_model("resnet18", scheme="post_ln")


def test_in_channels_and_no_classifier():
    model = create_model("resnet18", scheme="rescale", base_width=8, in_channels=1, num_classes=0)
    assert model.conv1.in_channels == 1
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 64)
