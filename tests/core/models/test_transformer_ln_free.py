"""The LayerNorm-free and LayerNorm-taming Transformer schemes: ``tfixup`` (Huang et al. 2020),
``deepnorm`` (Wang et al. 2022), ``dyt`` (Zhu et al. 2025) and ``derf`` (Chen et al. 2025).

Each constant and each placement is checked against the rule its public code implements
(docs/transformers.md names the file and line of each): the init statistics of every weight
group (std within sampling error), the merge and the norms' placement, the pointwise layers'
formula and parameter names. The forward, incremental decoding, plans and export of every
Transformer scheme are tested with the others (test_transformer.py, test_transformer_decoding.py,
tests/core/test_core_fastpath.py, tests/core/test_core_frozen.py)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core import ResidualSublayer, blocks, create_model, get_scheme
from rescale_core.init import TransformerStack, deepnorm_constants, tfixup_multiplier
from rescale_core.layers import PointwiseNorm
from rescale_core.schemes import SchemeOptionError

V, PAD = 40, 1
D, FF, N, M = 128, 512, 3, 4  # a width where a weight's sample std is within ~1% of its init's


def model(scheme: str, seed: int = 0, **kwargs) -> nn.Module:
    torch.manual_seed(seed)
    kwargs.setdefault("src_vocab_size", V)
    return create_model("transformer_tiny", scheme=scheme, d_model=D, dim_feedforward=FF, nhead=4,
                        num_encoder_layers=N, num_decoder_layers=M, **kwargs)


def sublayers(stack: nn.Module) -> list[ResidualSublayer]:
    return [m for m in stack.modules() if isinstance(m, ResidualSublayer)]


def xavier_std(layer: nn.Linear, gain: float = 1.0) -> float:
    fan_out, fan_in = layer.weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------- DyT and Derf
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_pointwise_norm_is_the_public_formula_with_its_parameter_names(kind):
    torch.manual_seed(0)
    layer = PointwiseNorm(kind, 6, alpha_init=0.7, shift_init=0.1)
    assert layer.alpha.shape == (1,) and layer.alpha.item() == pytest.approx(0.7)
    assert torch.equal(layer.weight, torch.ones(6)) and torch.equal(layer.bias, torch.zeros(6))
    names = {"alpha", "weight", "bias"} | ({"shift"} if kind == "derf" else set())
    assert set(layer.state_dict()) == names  # DynamicTanh's / Dynamic_erf's names: their weights load
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = torch.randn(2, 5, 6)
    if kind == "dyt":  # jiachenzhu/DyT dynamic_tanh.py: tanh(alpha x) * weight + bias
        want = torch.tanh(layer.alpha * x) * layer.weight + layer.bias
    else:  # zlab-princeton/Derf dynamic_erf.py: erf(alpha x + shift) * weight + bias
        want = torch.erf(layer.alpha * x + layer.shift) * layer.weight + layer.bias
    torch.testing.assert_close(layer(x), want)
    # channels at dim 1 (a conv net's BatchNorm replaced; DyT's channels_last=False)
    conv_layer = PointwiseNorm(kind, 6, spatial_dims=2)
    conv_layer.load_state_dict(layer.state_dict())
    image = torch.randn(2, 6, 3, 3)
    torch.testing.assert_close(conv_layer(image), layer(image.movedim(1, -1)).movedim(-1, 1))


@pytest.mark.parametrize("scheme", ["dyt", "derf"])
def test_every_layer_norm_is_replaced_and_alpha_is_set_per_site(scheme):
    net = model(scheme, scheme_options={"norm_alpha_attention": 0.8, "norm_alpha_ffn": 0.2,
                                        "norm_alpha_final": 0.3})
    assert not any(isinstance(m, nn.LayerNorm) for m in net.modules())
    for sub in sublayers(net):  # pre-norm: the pointwise layer on the branch's input only
        assert isinstance(sub.pre_norm, PointwiseNorm) and isinstance(sub.post_norm, nn.Identity)
        assert sub.pre_norm.kind == scheme
        want = 0.8 if hasattr(sub.fn, "q_proj") else 0.2
        assert sub.pre_norm.alpha.item() == pytest.approx(want)
    for stack in (net.encoder, net.decoder):  # and in place of each stack's final LayerNorm
        assert isinstance(stack.layer_norm, PointwiseNorm) and stack.layer_norm.alpha.item() == pytest.approx(0.3)
    default = model(scheme)
    assert {m.alpha.item() for m in default.modules() if isinstance(m, PointwiseNorm)} == {0.5}
    # the rest of the network is pre_ln's, weight for weight
    pre = model("pre_ln").state_dict()
    ours = default.state_dict()
    for key, value in pre.items():
        if "norm" not in key:
            assert torch.equal(ours[key], value), key


@pytest.mark.parametrize("scheme", ["dyt", "derf"])
def test_the_frozen_plan_folds_the_pointwise_affine_into_the_layers_reading_it(scheme, monkeypatch):
    """Evaluation runs ``f(alpha x + s)`` alone, its ``weight``/``bias`` folded into q/k/v (of x,
    not of the memory) and fc1; the outputs and a decoding step are the reference's (float64)."""
    net = model(scheme, seed=4).double().eval()
    with torch.no_grad():  # weights off their init, so that the folding has something to fold
        for layer in net.modules():
            if isinstance(layer, PointwiseNorm):
                layer.weight.normal_(1.0, 0.3)
                layer.bias.normal_(0.0, 0.3)
    src, tgt = tokens(2, 7, 6), tokens(2, 5, 7)
    with torch.no_grad():
        rescale_core.set_plan(net, "reference")
        want = net(src, tgt)
        rescale_core.set_plan(net, "auto")
        calls = []
        whole = PointwiseNorm.forward

        def spied(self, x):
            calls.append(self)
            return whole(self, x)

        monkeypatch.setattr(PointwiseNorm, "forward", spied)
        got = net(src, tgt)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    finals = {net.encoder.layer_norm, net.decoder.layer_norm}
    assert calls and set(calls) <= finals  # the sublayers' pointwise layers never ran whole


def test_pointwise_options_are_refused_where_they_mean_nothing():
    with pytest.raises(SchemeOptionError, match="norm_alpha: 0.5 is not null unless norm is dyt or derf"):
        get_scheme("pre_ln", norm_alpha=0.5)
    with pytest.raises(SchemeOptionError, match="norm_alpha_final: -1"):
        get_scheme("dyt", norm_alpha_final=-1.0)


# a value off the default for each conv-only option (zero_gamma with a conv gain to zero)
CONV_ONLY_VALUES = {"zero_gamma": {"zero_gamma": True, "scaled_ws": True}, "mean_shift": {"mean_shift": True},
                    "measure_batches": {"measure_batches": 3}, "conv_bias": {"conv_bias": True},
                    "conv_dropout": {"conv_dropout": 0.5}, "conv_dropout_stages": {"conv_dropout": 0.5, "conv_dropout_stages": [1]},
                    "scaled_ws": {"scaled_ws": True}, "merge_norm": {"merge_norm": True},
                    "head_norm": {"head_norm": True}, "classifier_dropout": {"classifier_dropout": 0.3},
                    "stochdepth_rate": {"stochdepth_rate": 0.1}, "stochdepth_scale": {"stochdepth_scale": False},
                    "zero_classifier": {"zero_classifier": True}, "shortcut_gain": {"shortcut_gain": 2.0},
                    "classifier_gain": {"classifier_gain": 2.0}}


def test_options_only_conv_networks_read_change_no_transformer_and_are_refused(monkeypatch):
    """Each of CONV_ONLY_OPTIONS leaves every Transformer scheme's weights and outputs as they were
    (so the list is right: built with the refusal lifted), and given as a scheme option or set on a
    Scheme instance it is refused in one line naming it, rather than accepted and ignored."""
    from rescale_core import schemes
    from rescale_core.schemes import CONV_ONLY_OPTIONS

    assert set(CONV_ONLY_VALUES) == CONV_ONLY_OPTIONS
    src, tgt = torch.randint(3, 50, (2, 5)), torch.randint(3, 50, (2, 4))

    def built(scheme):
        torch.manual_seed(0)
        return create_model("transformer_tiny", scheme=scheme, src_vocab_size=50, dropout=0.0).eval()

    for name in rescale_core.list_schemes("transformer"):
        for values in CONV_ONLY_VALUES.values():
            scheme = get_scheme(name, **values)
            if not set(values) & set(scheme.overrides()):
                continue  # the scheme's own definition (rescale's mean_shift)
            with pytest.raises(SchemeOptionError, match="is not an option of a Transformer") as refused:
                built(scheme)
            assert refused.value.option in values
    with monkeypatch.context() as lifted:
        for option in CONV_ONLY_OPTIONS:
            lifted.setitem(schemes.FIELD_READERS, option, frozenset({"conv", "transformer"}))
        for name in rescale_core.list_schemes("transformer"):
            plain = built(name)
            for option, values in CONV_ONLY_VALUES.items():
                other = built(get_scheme(name, **values))
                assert plain.state_dict().keys() == other.state_dict().keys(), (name, option)
                assert all(torch.equal(v, other.state_dict()[k]) for k, v in plain.state_dict().items()), (name, option)
                assert torch.equal(plain(src, tgt), other(src, tgt)), (name, option)
    with pytest.raises(SchemeOptionError, match="^scheme_options.mean_shift: true is not an option of a Transformer"):
        create_model("transformer_tiny", scheme="deepnorm", scheme_options={"mean_shift": True}, src_vocab_size=50)


@pytest.mark.parametrize("scheme,init", [("post_ln", "he_fan_in"), ("rezero", "he_fan_out"),
                                         ("skipinit", "he_fan_out")])
def test_a_he_init_that_changes_no_transformer_is_refused(scheme, init):
    """A Transformer keeps fairseq's Xavier init under either He init: before, switching one for
    the other was accepted and built the very same weights."""
    own = get_scheme(scheme).init
    with pytest.raises(SchemeOptionError) as refused:
        create_model("transformer_tiny", scheme=scheme, scheme_options={"init": init}, src_vocab_size=50)
    assert str(refused.value) == (f'scheme_options.init: "{init}" is not an init that changes a Transformer of scheme '
                                  f'{scheme} (its own "{own}" and "{init}" both keep fairseq\'s Xavier init: remove '
                                  f"it) for scheme {scheme}")
    torch.manual_seed(0)
    plain = create_model("transformer_tiny", scheme=scheme, src_vocab_size=50)
    with pytest.MonkeyPatch.context() as lifted:  # the refusal lifted: the same weights, so it is right
        lifted.setattr(blocks, "_HE_INITS", ())
        torch.manual_seed(0)
        other = create_model("transformer_tiny", scheme=scheme, scheme_options={"init": init}, src_vocab_size=50)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in plain.state_dict().items())
    # an init that changes the network, and the scheme's own, are accepted
    assert create_model("transformer_tiny", scheme="rescale", scheme_options={"init": init}, src_vocab_size=50)
    assert create_model("transformer_tiny", scheme=scheme, scheme_options={"init": own}, src_vocab_size=50)


# --------------------------------------------------------------- DeepNorm
def test_deepnorm_constants_are_the_papers_encoder_decoder_column():
    enc, dec = TransformerStack("encoder", 6, 6), TransformerStack("decoder", 6, 6)
    assert deepnorm_constants(enc) == pytest.approx((0.81 * (6 ** 5) ** (1 / 16), 0.87 * (6 ** 5) ** (-1 / 16)))
    assert deepnorm_constants(dec) == pytest.approx(((3 * 6) ** 0.25, (12 * 6) ** -0.25))
    # torchscale prints these for N = M = 6 (alpha) ...
    assert deepnorm_constants(enc)[0] == pytest.approx(1.4179, abs=1e-4)
    assert deepnorm_constants(dec) == pytest.approx((2.0598, 0.3433), abs=1e-4)
    # ... and its encoder beta is 1.15 (N^4 M)^(-1/16), the paper's 0.87 inverted (docs/transformers.md)
    assert 1.15 * (6 ** 5) ** (-1 / 16) / deepnorm_constants(enc)[1] == pytest.approx(1.15 / 0.87)


def test_deepnorm_merges_alpha_x_plus_f_then_layer_norm_and_inits_with_beta():
    net = model("deepnorm", seed=1)
    assert net.encoder.layer_norm is None and net.decoder.layer_norm is None  # no final LayerNorm
    for side, stack in (("encoder", net.encoder), ("decoder", net.decoder)):
        alpha, beta = deepnorm_constants(TransformerStack(side, N, M))
        for sub in sublayers(stack):
            assert isinstance(sub.post_norm, nn.LayerNorm) and isinstance(sub.pre_norm, nn.Identity)
            assert sub.merge.skip_scale == pytest.approx(alpha) and sub.merge.branch_scale == 1.0
            gains = ({"q_proj": 1.0, "k_proj": 1.0, "v_proj": beta, "out_proj": beta}
                     if hasattr(sub.fn, "q_proj") else {"fc1": beta, "fc2": beta})
            for name, gain in gains.items():  # Xavier-normal with gain beta (q, k: gain 1)
                layer = getattr(sub.fn, name)
                assert layer.weight.std().item() == pytest.approx(xavier_std(layer, gain), rel=0.03), (side, name)
                assert layer.weight.mean().abs().item() < 0.1 * xavier_std(layer, gain)
                assert layer.bias.abs().max().item() == 0.0
    sub = net.encoder.layers[0].ffn.eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad():  # LN(alpha x + F(x))
        want = sub.post_norm(sub.merge.skip_scale * x + sub.fn(x))
        torch.testing.assert_close(sub(x), want)


def test_a_skip_alpha_given_is_kept_and_one_clashing_with_rescale_is_refused():
    net = model("deepnorm", scheme_options={"skip_alpha": 3.0})
    assert {sub.merge.skip_scale for sub in sublayers(net)} == {3.0}
    with pytest.raises(ValueError, match="skip_alpha replaces the shortcut multiplier"):
        get_scheme("rescale", skip_alpha=2.0)


# --------------------------------------------------------------- T-Fixup
def test_tfixup_has_no_layer_norm_and_scales_as_its_code_does():
    net, plain = model("tfixup", seed=2), model("skipinit", seed=2)  # the same draws before T-Fixup's scaling
    assert not any(isinstance(m, (nn.LayerNorm, PointwiseNorm)) for m in net.modules())
    assert net.encoder.layer_norm is None and net.decoder.layer_norm is None
    for side, stack, ref in (("encoder", net.encoder, plain.encoder), ("decoder", net.decoder, plain.decoder)):
        mult = tfixup_multiplier(TransformerStack(side, N, M))
        assert mult == pytest.approx(0.67 * N ** -0.25 if side == "encoder" else (9 * M) ** -0.25)
        for sub, base in zip(sublayers(stack), sublayers(ref)):
            assert sub.merge.skip_scale == 1.0 and sub.merge.gain is None  # x + F(x)
            factors = ({"q_proj": 1.0, "k_proj": 1.0, "v_proj": mult * math.sqrt(2), "out_proj": mult}
                       if hasattr(sub.fn, "q_proj") else {"fc1": mult, "fc2": mult})
            for name, factor in factors.items():
                torch.testing.assert_close(getattr(sub.fn, name).weight,
                                           getattr(base.fn, name).weight * factor, rtol=1e-6, atol=0)
        # v_proj: fairseq's Xavier gain 1/sqrt(2) times sqrt(2): Xavier gain 1 times the multiplier
        v = stack.layers[0].self_attn.fn.v_proj
        assert v.weight.std().item() == pytest.approx(mult * xavier_std(v), rel=0.03)
    # token embeddings: N(0, d^-1/2) times (9N)^(-1/4) (source) and (9M)^(-1/4) (target), pad row 0
    src, tgt = net.encoder.embed.embed_tokens.weight, net.decoder.embed.embed_tokens.weight
    assert src.std().item() == pytest.approx(D ** -0.5 * (9 * N) ** -0.25, rel=0.03)
    assert tgt.std().item() == pytest.approx(D ** -0.5 * (9 * M) ** -0.25, rel=0.03)
    assert src[PAD].abs().max().item() == tgt[PAD].abs().max().item() == 0.0
    shared = model("tfixup", seed=2, share_embeddings=True)  # one matrix, scaled once (the encoder's)
    assert shared.encoder.embed.embed_tokens.weight.std().item() == pytest.approx(
        D ** -0.5 * (9 * N) ** -0.25, rel=0.03)


@pytest.mark.parametrize("scheme", ["tfixup", "deepnorm", "dyt", "derf"])
def test_a_few_adam_steps_without_warmup_lower_the_loss(scheme):
    """Each trains from its init at a constant learning rate (T-Fixup's point: no warm-up)."""
    net = model(scheme, seed=3)
    src, tgt = tokens(8, 7, 4), tokens(8, 6, 5)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.98))
    losses = []
    for _ in range(12):
        opt.zero_grad()
        logits = net(src, tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("scheme", ["tfixup", "deepnorm", "derf"])
def test_conv_networks_refuse_them_in_one_line(scheme):
    """``dyt`` alone has a conv form, the BatchNorms replaced (``tests/core/models/test_resnet.py``)."""
    with pytest.raises(ValueError, match=f"^scheme '{scheme}' is for Transformers, not ResNets"):
        create_model("resnet18", scheme=scheme, num_classes=3)
