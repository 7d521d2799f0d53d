"""Scheme options are typed: a value that does not fit its field (a typo for a boolean, a word for
a number, a list for a number) is refused in one message naming the option, the value, the
expected type and the scheme, by ``get_scheme`` and ``create_model`` alike; the coercions a
config reader needs (an integer for a float, ``"2"``, ``"false"``, a list for a tuple) are made."""
from __future__ import annotations

import pytest
from torch import nn

from rescale_core import ResidualBlock, ResidualSublayer, create_model, get_scheme, param_groups
from rescale_core.schemes import SchemeOptionError


@pytest.mark.parametrize("scheme,option,value", [("bn", "c", 2.0), ("skipinit", "fixed_beta", False),
                                                  ("fixup", "c", 1.0)])
def test_the_rescale_merge_options_are_refused_under_another_merge(scheme, option, value):
    """``c`` and ``fixed_beta`` shape merge "rescale" only: set under another they changed nothing."""
    merge = get_scheme(scheme).merge
    with pytest.raises(SchemeOptionError) as refused:
        get_scheme(scheme, **{option: value})
    assert str(refused.value) == (f"scheme_options.{option}: {str(value).lower()} is not an option of merge "
                                  f"'{merge}' (it shapes merge \"rescale\" only: remove it) for scheme {scheme}")


@pytest.mark.parametrize("scheme,options", [("fixup", {"block_scale": 0.5}), ("none", {"block_scale": 2.0,
                                                                                     "scalar_biases": True})])
def test_a_block_scale_beside_fixups_bias_is_refused(scheme, options):
    """Before: accepted, and the merge computed ``block_scale * (s + g f) + b`` where the merge rule
    says ``block_scale * (s + g f + b)`` (another function than the documented one)."""
    with pytest.raises(SchemeOptionError, match=r"block_scale: .* is not 1 under scalar_biases"):
        create_model("cifar_resnet", depth=8, base_width=4, scheme=scheme, scheme_options=options)
    assert get_scheme("bn_scaled").block_scale != 1.0 and get_scheme("fixup").scalar_biases


@pytest.mark.parametrize("option,value", [("name", "bn"), ("families", ["transformer"])])
def test_the_fields_that_name_the_scheme_are_not_options(option, value):
    """Before: ``scheme_options: {name: bn}`` built a RescaleNet called ``bn``, and its run summary
    filed it as the BN baseline (``rescale compare`` compared RescaleNet with itself)."""
    with pytest.raises(SchemeOptionError) as refused:
        create_model("cifar_resnet", **TINY["cifar_resnet"], scheme="rescale", scheme_options={option: value})
    assert str(refused.value).startswith(f"scheme_options.{option}: ") and "model.init_args.scheme" in str(refused.value)
    derived = get_scheme("rezero").replace(name="rezero_half", gain_init=0.5)  # a new scheme to register
    assert (derived.name, derived.gain, derived.gain_init) == ("rezero_half", "scalar", 0.5)


def test_conv_dropout_stages_without_conv_dropout_is_refused():
    """Before: accepted, and the ResNet built no dropout anywhere (conv_dropout 0)."""
    expected = ("scheme_options.conv_dropout_stages: [1, 2] is not an option without conv_dropout (it picks the "
                "stages conv_dropout drops in: remove it, or set conv_dropout) for scheme rescale")
    with pytest.raises(SchemeOptionError) as refused:
        get_scheme("rescale", conv_dropout_stages=[1, 2])
    assert str(refused.value) == expected
    with pytest.raises(SchemeOptionError) as refused:
        create_model("cifar_resnet", **TINY["cifar_resnet"], scheme="rescale",
                     scheme_options={"conv_dropout_stages": [1, 2]})
    assert str(refused.value) == expected
    net = create_model("cifar_resnet", **TINY["cifar_resnet"], scheme="rescale",
                       scheme_options={"conv_dropout_stages": [1, 2], "conv_dropout": 0.1})
    assert isinstance(net.layer1[0].drop, nn.Dropout2d) and not isinstance(net.layer3[0].drop, nn.Dropout2d)
    assert get_scheme("rescale", conv_dropout_stages=(3, 4)).conv_dropout == 0.0  # the default stages


@pytest.mark.parametrize("scheme,options", [("none", {}), ("bn", {}), ("nf", {}),
                                            ("fixup", {"gain": None, "scalar_biases": False})])
def test_scalar_lr_factor_without_scalars_is_refused(scheme, options):
    """Before: accepted, and param_groups made no scalars group for it to scale (the network has
    no gain and no scalar bias): every parameter trained at the full learning rate."""
    expected = ("scheme_options.scalar_lr_factor: 0.1 is not an option without a gain or scalar_biases (it sets "
                f"their learning rate, and the network has neither: remove it) for scheme {scheme}")
    with pytest.raises(SchemeOptionError) as refused:
        create_model("cifar_resnet", **TINY["cifar_resnet"], scheme=scheme,
                     scheme_options={**options, "scalar_lr_factor": 0.1})
    assert str(refused.value) == expected
    for readers in ({"gain": "scalar"}, {"scalar_biases": True}):
        net = create_model("cifar_resnet", **TINY["cifar_resnet"], scheme="none",
                           scheme_options={**readers, "scalar_lr_factor": 0.1})
        groups = {g["name"]: g["lr_factor"] for g in param_groups(net, lr=1.0)}
        assert groups["scalars"] == 0.1


def test_a_gain_init_without_a_gain_is_refused():
    """It initialised no parameter: bn and nf have no gain. A scheme whose gain is removed keeps
    its own gain_init (skipinit's 0: the floor of the benchmarks)."""
    for scheme in ("bn", "nf"):
        for given in ({"scheme": scheme, "scheme_options": {"gain_init": 3.0}},
                      {"scheme": get_scheme(scheme, gain_init=3.0)}):
            with pytest.raises(SchemeOptionError) as refused:
                create_model("cifar_resnet", **TINY["cifar_resnet"], **given)
            assert str(refused.value) == ("scheme_options.gain_init: 3.0 is not an option without a gain (gain: scalar "
                                          f"or vector; it changes nothing here: remove it) for scheme {scheme}")
    for network in ("cifar_resnet", "transformer_tiny"):
        assert create_model(network, **TINY[network], scheme="skipinit", scheme_options={"gain": None}).scheme.gain is None
    assert create_model("cifar_resnet", **TINY["cifar_resnet"], scheme="bn",
                        scheme_options={"gain": "scalar", "gain_init": 3.0}).scheme.gain_init == 3.0


@pytest.mark.parametrize("option,value,expected", [
    ("mean_shift", "flase", '"flase" is not a boolean (true or false)'),
    ("mean_shift", 0, "0 is not a boolean (true or false)"),
    ("mean_shift", None, "null is not a boolean (true or false)"),
    ("shortcut_gain", "two", '"two" is not a number or null'),
    ("conv_dropout", "high", '"high" is not a number'),
    ("c", [1], "[1] is not a number or null"),
    ("gain_init", True, "true is not a number"),
    ("measure_batches", 8.5, "8.5 is not an integer"),
    ("conv_dropout_stages", 3, "3 is not a list of integers"),
    ("conv_dropout_stages", ["x"], '["x"] is not a list of integers'),
    ("gain", "vectr", '"vectr" is not one of "scalar", "vector" or null'),
    ("conv_dropout", 1.5, "1.5 is not a rate in [0, 1)"),
    ("measure_batches", 0, "0 is not an integer >= 1"),
    ("c", -5, "-5.0 is not a positive number or null"),
    ("c", -0.5, "-0.5 is not a positive number or null"),
    ("c", 0, "0.0 is not a positive number or null"),
    ("c", float("nan"), "NaN is not a positive number or null"),
    ("c", float("inf"), "Infinity is not a positive number or null"),
    ("gain_init", float("nan"), "NaN is not a finite number"),
    ("gain_init", float("-inf"), "-Infinity is not a finite number"),
    ("block_scale", 0, "0.0 is not a positive number"),
    ("block_scale", -1, "-1.0 is not a positive number"),
    ("scalar_lr_factor", -0.1, "-0.1 is not a number >= 0"),
    ("scalar_lr_factor", float("nan"), "NaN is not a number >= 0"),
    ("conv_dropout_stages", [0, 3], "[0, 3] is not a list of stages, each >= 1"),
    ("zero_gamma", True, "true is not possible without a norm or scaled_ws (it zeroes the last norm weight "
                         "or conv gain of each branch)"),
])
def test_a_value_that_does_not_fit_its_field_is_refused(option, value, expected):
    with pytest.raises(SchemeOptionError) as refused:
        get_scheme("rescale", **{option: value})
    assert str(refused.value) == f"scheme_options.{option}: {expected} for scheme rescale"
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, ValueError)


@pytest.mark.parametrize("options", [{"mean_shift": "flase"}, {"shortcut_gain": "two"}, {"conv_dropout": "high"},
                                     {"c": [1]}])
def test_create_model_refuses_them_with_the_same_message(options):
    (option, value), = options.items()
    with pytest.raises(TypeError) as refused:
        create_model("cifar_resnet", depth=8, base_width=4, scheme="rescale", scheme_options=options)
    assert str(refused.value).startswith(f"scheme_options.{option}: ")
    assert str(refused.value).endswith(" for scheme rescale")


@pytest.mark.parametrize("option,value,typed", [
    ("mean_shift", False, False),
    ("mean_shift", True, True),
    ("mean_shift", "false", False),
    ("mean_shift", "True", True),
    ("mean_shift", "no", False),
    ("c", 2, 2.0),
    ("c", 2.0, 2.0),
    ("c", "2", 2.0),
    ("c", None, None),
    ("shortcut_gain", "2.5", 2.5),
    ("measure_batches", 3, 3),
    ("measure_batches", "3", 3),
    ("conv_dropout_stages", [2, 3], (2, 3)),
    ("c", 0.5, 0.5),
    ("gain_init", -1, -1.0),
    ("scalar_lr_factor", 0, 0.0),
])
def test_values_of_the_right_type_or_read_as_it_are_accepted(option, value, typed):
    reader = {"conv_dropout": 0.1} if option == "conv_dropout_stages" else {}  # the switch reading the option
    scheme = get_scheme("rescale", **reader, **{option: value})
    assert getattr(scheme, option) == typed and type(getattr(scheme, option)) is type(typed)


def test_the_model_is_built_with_the_typed_values():
    net = create_model("cifar_resnet", depth=8, base_width=4, scheme="rescale",
                       scheme_options={"mean_shift": "false", "shortcut_gain": 2, "c": "3"})
    assert (net.scheme.mean_shift, net.scheme.shortcut_gain, net.scheme.c) == (False, 2.0, 3.0)


# --- an option the network cannot honour is refused when it is created -----------------------------

TINY = {"cifar_resnet": dict(depth=8, base_width=4, num_classes=3),
        "vgg11": dict(base_width=8, hidden_dim=32, num_classes=3),
        "transformer_tiny": dict(src_vocab_size=50)}


@pytest.mark.parametrize("network,scheme,options,expected", [
    ("cifar_resnet", "bn", {"norm": "ln"},
     '"ln" is not a norm a conv network builds (one of "bn", "gn", "dyt", "derf" or null)'),
    ("cifar_resnet", "bn", {"init": "tfixup"}, '"tfixup" is not an init a conv network applies (one of "he_fan_out", '
                                               '"he_fan_in", "rescale", "fixup", "nf")'),
    ("cifar_resnet", "rescale", {"conv_dropout": 0.1, "conv_dropout_stages": [3, 5]},
     "[3, 5] is not a list of this network's stages (1, 2, 3)"),
    ("transformer_tiny", "post_ln", {"norm": "bn"},
     '"bn" is not a norm a Transformer builds (one of "ln", "dyt", "derf" or null)'),
    ("transformer_tiny", "pre_ln", {"norm": "gn"},
     '"gn" is not a norm a Transformer builds (one of "ln", "dyt", "derf" or null)'),
    ("transformer_tiny", "rezero", {"init": "fixup"}, '"fixup" is not an init a Transformer applies (one of '
                                                      '"he_fan_out", "he_fan_in", "rescale", "deepnorm", "tfixup")'),
    ("cifar_resnet", "bn", {"norm_position": "pre"},
     '"pre" is not an option of a conv network (it shapes Transformers only: remove it)'),
    ("cifar_resnet", "dyt", {"norm_alpha_ffn": 0.3},
     "0.3 is not an option of a conv network (it shapes Transformers only: remove it)"),
    ("transformer_tiny", "pre_ln", {"nf_alpha": 0.2, "layout": "preact"},
     '"preact" is not a layout a Transformer builds ("v1": norm_position places its norms)'),
    ("vgg11", "bn", {"norm": "gn"}, '"gn" is not a norm VGG builds ("bn" or null)'),
    *[("vgg11", scheme, options, f"{shown} is not an option VGG builds (it reads only norm: "
                                 '"bn" or null, mean_shift and measure_batches)')
      for scheme, options, shown in [("bn", {"zero_gamma": True}, "true"), ("rescale", {"gain": "vector"}, '"vector"'),
                                     ("rescale", {"conv_dropout": 0.1}, "0.1"),
                                     ("none", {"classifier_dropout": 0.5}, "0.5"), ("rescale", {"c": 2}, "2.0")]],
])
def test_an_option_the_network_cannot_honour_is_refused(network, scheme, options, expected):
    """Before: a conv network took norm ln and built no norm at all, a Transformer crashed on bn
    (KeyError) and normalised the sequence under gn, VGG ignored every option but its norm's name,
    and conv_dropout_stages named stages the network has not, all without a word."""
    option = list(options)[-1]
    for given in ({"scheme": scheme, "scheme_options": options}, {"scheme": get_scheme(scheme, **options)}):
        with pytest.raises(SchemeOptionError) as refused:
            create_model(network, **TINY[network], **given)
        assert str(refused.value) == f"scheme_options.{option}: {expected} for scheme {scheme}"


@pytest.mark.parametrize("network,scheme,options", [
    ("cifar_resnet", "rescale", {"conv_dropout": 0.1}),  # the default stages 3, 4: those the network has
    ("cifar_resnet", "rescale", {"conv_dropout": 0.1, "conv_dropout_stages": [1, 3]}),
    ("cifar_resnet", "bn", {"norm": "gn", "init": "he_fan_in"}),
    ("cifar_resnet", "bn", {"zero_gamma": True}),
    ("transformer_tiny", "rezero", {"norm": "ln", "norm_position": "pre", "init": "deepnorm"}),
    ("vgg11", "bn", {"norm": None}),
    ("vgg11", "rescale", {"measure_batches": 2, "mean_shift": False}),
    ("vgg11", "rescale", {"gain": "scalar"}),  # the scheme's own value
])
def test_the_options_a_network_honours_are_accepted(network, scheme, options):
    assert create_model(network, **TINY[network], scheme=scheme, scheme_options=options).scheme == \
        get_scheme(scheme, **options)


def test_the_blocks_refuse_them_too():
    with pytest.raises(SchemeOptionError, match='^scheme_options.norm: "ln" is not a norm a conv network builds'):
        ResidualBlock(get_scheme("bn", norm="ln"), 4, 4)
    with pytest.raises(SchemeOptionError, match='^scheme_options.norm: "bn" is not a norm a Transformer builds'):
        ResidualSublayer(get_scheme("post_ln", norm="bn"), 8, nn.Linear(8, 8), 1, 2)
