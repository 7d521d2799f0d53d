"""Residual schemes as data: the merge rule of RescaleNet (Shao et al. 2020, Eq. 4-6), SkipInit
(De & Smith 2020), Fixup (Zhang et al. 2019), ReZero (Bachlechner et al. 2020) and BN baselines."""
from __future__ import annotations

import dataclasses
import math

import pytest

from rescale_core import get_scheme, list_schemes, register_scheme
from rescale_core.init import rescale_conv_multiplier
from rescale_core.schemes import Scheme, SchemeOptionError


@pytest.mark.parametrize("L", [1, 16, 33, 498])
def test_rescale_merge_preserves_variance(L):
    s = get_scheme("rescale")
    for k in range(1, L + 1):
        alpha = s.skip_scale(k, L)
        assert alpha == pytest.approx(math.sqrt((k - 1 + L) / (k + L)), rel=1e-12)
        assert s.branch_scale(k, L) == pytest.approx(L ** -0.5, rel=1e-12)
        # effective beta_k: the fixed L^-1/2 times the init multiplier of m convs, squared
        for m in (2, 3):
            beta = s.branch_scale(k, L) * rescale_conv_multiplier(k, L, m) ** m
            assert alpha ** 2 + beta ** 2 == pytest.approx(1.0, rel=1e-12)
            assert beta ** 2 == pytest.approx(1 / (k + L), rel=1e-12)


def test_rescale_non_reparameterised_and_c():
    s = get_scheme("rescale", fixed_beta=False, c=3.0)
    L = 10
    for k in range(1, L + 1):
        assert s.branch_scale(k, L) == pytest.approx((k + 3.0) ** -0.5)
        assert s.skip_scale(k, L) ** 2 + s.branch_scale(k, L) ** 2 == pytest.approx(1.0)
    assert s.c_for(L) == 3.0 and get_scheme("rescale").c_for(L) == 10.0
    assert get_scheme("rescale").skip_scale(1, 1) == pytest.approx(math.sqrt(0.5))


@pytest.mark.parametrize("name", ["bn", "gn", "none", "skipinit", "fixup", "rezero", "bn_head"])
def test_additive_schemes_have_unit_scales(name):
    s = get_scheme(name)
    assert s.skip_scale(3, 10) == 1.0 and s.branch_scale(3, 10) == 1.0


def test_registered_scheme_definitions():
    assert get_scheme("bn").norm == "bn" and get_scheme("gn").norm == "gn"
    assert get_scheme("none").norm is None and get_scheme("none").gain is None
    r = get_scheme("rescale")
    assert (r.merge, r.gain, r.gain_init, r.mean_shift, r.init, r.measure_batches) == (
        "rescale", "scalar", 1.0, True, "rescale", 8)
    for name in ("skipinit", "rezero", "skipinit_reg"):
        s = get_scheme(name)
        assert s.gain == "scalar" and s.gain_init == 0.0 and s.norm is None
    assert get_scheme("skipinit_reg").conv_bias and get_scheme("skipinit_reg").classifier_dropout > 0
    f = get_scheme("fixup")
    assert (f.scalar_biases, f.zero_classifier, f.init, f.scalar_lr_factor) == (True, True, "fixup", 0.1)
    assert get_scheme("bn_scaled").block_scale == pytest.approx(math.sqrt(0.5))
    assert get_scheme("bn_head").head_norm and get_scheme("bn_head").norm is None
    assert get_scheme("bn_merge").merge_norm and get_scheme("bn_merge").norm == "bn"


def test_families():
    conv = list_schemes("conv")
    tf = list_schemes("transformer")
    assert {"bn", "gn", "none", "rescale", "skipinit", "skipinit_reg", "fixup", "rezero",
            "bn_scaled", "bn_head", "bn_merge", "nf", "nf_skipinit", "dyt"} == set(conv)
    assert {"post_ln", "pre_ln", "rescale", "rezero", "skipinit", "deepnorm", "tfixup", "dyt", "derf"} == set(tf)
    assert set(list_schemes()) == set(conv) | set(tf)
    assert get_scheme("pre_ln").supports("transformer") and not get_scheme("pre_ln").supports("conv")


def test_overrides_return_new_frozen_schemes():
    base = get_scheme("rescale")
    s = get_scheme("rescale", gain="vector", measure_batches=2)
    assert (s.gain, s.measure_batches) == ("vector", 2) and base.gain == "scalar"
    assert get_scheme(s) is s and get_scheme(s, c=1.0).c == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.c = 2.0


def test_overrides_are_the_fields_set_off_the_schemes_definition():
    assert get_scheme("rescale").overrides() == {}
    assert get_scheme("rescale", c=2, mean_shift=True, conv_dropout_stages=[3, 4]).overrides() == {"c": 2.0}
    assert Scheme("unregistered", families=("transformer",), conv_bias=True).overrides() == {"conv_bias": True}


@dataclasses.dataclass(frozen=True)
class _ShortcutScheme(Scheme):
    """A scheme with one more switch, as a method under study adds one."""

    shortcut_mult: float = 1.0


def test_overrides_name_a_subclass_field_set_off_its_default():
    """A field of a ``Scheme`` subclass counts as set off the definition where it leaves its
    default, so that a network that does not read it refuses it instead of ignoring it."""
    rescale = vars(get_scheme("rescale"))
    assert _ShortcutScheme(**rescale).overrides() == {}
    assert _ShortcutScheme(**rescale, shortcut_mult=0.5).overrides() == {"shortcut_mult": 0.5}
    assert _ShortcutScheme(**{**rescale, "c": 3.0}, shortcut_mult=0.5).overrides() == {"c": 3.0, "shortcut_mult": 0.5}


def test_unknown_option_lists_the_options():
    with pytest.raises(ValueError) as exc:
        get_scheme("rescale", measure_batch=2)
    message = str(exc.value)
    assert "measure_batch" in message and "measure_batches" in message and "fixed_beta" in message


def test_unknown_scheme_suggests_close_matches():
    with pytest.raises(KeyError) as exc:
        get_scheme("rescal")
    assert "Did you mean rescale" in str(exc.value) and "skipinit" in str(exc.value)


@pytest.mark.parametrize("bad", [{"norm": "batch"}, {"merge": "mul"}, {"gain": "matrix"},
                                 {"init": "xavier"}, {"norm_position": "middle"},
                                 {"conv_dropout": 1.0}, {"classifier_dropout": -0.1},
                                 {"measure_batches": 0}])
def test_invalid_values_are_refused(bad):
    with pytest.raises(ValueError):
        get_scheme("rescale", **bad)


@pytest.mark.parametrize("families", [("convs",), ("Transformer",), ()])
def test_a_family_no_network_builds_is_refused(families):
    """A new scheme's ``families`` name the networks it builds: a typo is refused where the
    scheme is defined, not met later as "is for Transformers, not ResNets"."""
    with pytest.raises(SchemeOptionError, match=r'scheme_options.families: .* each one of "conv", "transformer" '
                                                r"for scheme mine"):
        Scheme("mine", families=families, gain="scalar", gain_init=0.0)
    assert Scheme("mine", families=["transformer", "conv"]).families == ("transformer", "conv")


def test_duplicate_scheme_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_scheme(Scheme("bn"))
    assert get_scheme("bn").norm == "bn"


def test_a_registered_gain_init_without_a_gain_is_refused(monkeypatch):
    """A ReZero variant registered with another ``gain_init`` but no ``gain`` would train as a
    plain ``x + F(x)`` network (no network reads it): refused where it is registered; with its
    gain it registers and every family builds the gain at that value."""
    import rescale_core
    from rescale_core import schemes

    monkeypatch.setattr(schemes, "_SCHEMES", dict(schemes._SCHEMES))  # the registry as it was, after
    with pytest.raises(SchemeOptionError, match=r"gain_init: 0.5 is not an option without a gain .* "
                                                r"for scheme rezero_half"):
        register_scheme(Scheme("rezero_half", families=("conv", "transformer"), gain_init=0.5))
    assert "rezero_half" not in list_schemes()
    register_scheme(Scheme("rezero_half", families=("conv", "transformer"), gain="scalar", gain_init=0.5))
    for network, options in (("cifar_resnet", {"depth": 8, "base_width": 4}),
                             ("transformer_tiny", {"src_vocab_size": 20})):
        net = rescale_core.create_model(network, scheme="rezero_half", **options)
        gains = [p for n, p in net.named_parameters() if n.endswith("merge.gain.weight")]
        assert gains and all(float(g.detach()) == 0.5 for g in gains), network


def test_every_scheme_field_says_which_networks_read_it():
    """``FIELD_READERS`` classifies every ``Scheme`` field (conv networks, Transformers or both),
    so that a network that does not read a field refuses it rather than ignore it; a field added
    without a decision fails here, naming the table to edit."""
    from rescale_core.schemes import FIELD_READERS

    unclassified = [f.name for f in dataclasses.fields(Scheme) if f.name not in FIELD_READERS]
    assert not unclassified, (f"Scheme fields missing from rescale_core.schemes.FIELD_READERS: {unclassified}; "
                              'list each with the networks that read it ("conv", "transformer" or both)')
    assert set(FIELD_READERS) <= {f.name for f in dataclasses.fields(Scheme)}
    assert all(readers and readers <= {"conv", "transformer"} for readers in FIELD_READERS.values())


@dataclasses.dataclass(frozen=True)
class _ShortcutScheme(Scheme):
    """A switch under study in a ``Scheme`` subclass (docs/design.md, "Adding a scheme")."""

    shortcut_mult: float = 1.0


def test_a_subclass_field_is_refused_until_classified_then_by_the_networks_not_reading_it(monkeypatch):
    """Before, a Transformer took a new conv-only field and ignored it unless someone listed it in
    a blacklist; now a field no table classifies is refused by every network, and once classified
    as conv-only, by the Transformer only."""
    from rescale_core import create_model, schemes

    def build(family, scheme):
        if family == "conv":
            return create_model("cifar_resnet", depth=8, scheme=scheme, num_classes=3)
        return create_model("transformer_tiny", scheme=scheme, src_vocab_size=50)

    scheme = _ShortcutScheme(**vars(get_scheme("rescale")), shortcut_mult=0.5)
    for family in ("conv", "transformer"):
        with pytest.raises(SchemeOptionError, match="^scheme_options.shortcut_mult: 0.5 is not a field "
                                                    "rescale_core.schemes.FIELD_READERS classifies"):
            build(family, scheme)
    build("transformer", _ShortcutScheme(**vars(get_scheme("rescale"))))  # left at its default: nothing set
    monkeypatch.setitem(schemes.FIELD_READERS, "shortcut_mult", frozenset({"conv"}))
    with pytest.raises(SchemeOptionError, match="^scheme_options.shortcut_mult: 0.5 is not an option of a Transformer "
                                                r"\(it shapes conv networks only: remove it\)"):
        build("transformer", scheme)
    assert build("conv", scheme).scheme.shortcut_mult == 0.5
    monkeypatch.setitem(schemes.FIELD_READERS, "shortcut_mult", frozenset({"transformer"}))
    with pytest.raises(SchemeOptionError, match="is not an option of a conv network"):
        build("conv", scheme)


def test_the_names_other_modules_import_from_schemes_are_public():
    from rescale_core import schemes

    assert {"shown", "GAIN_INIT_WITHOUT_GAIN"} <= set(schemes.__all__)
    assert all(hasattr(schemes, name) for name in schemes.__all__)
