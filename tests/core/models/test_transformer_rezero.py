"""ReZero's Transformer layer (Bachlechner et al. 2020): one ``resweight`` per layer, shared by its
sublayers, as majumderb/rezero ``rztx.py`` (``RZTXEncoderLayer``, ``RZTXDecoderLayer``) computes it."""
from __future__ import annotations

import pytest
import torch

from rescale_core import create_model, get_scheme
from rescale_core.analysis import learned_scalars
from rescale_core.models.transformer import TransformerConfig, TransformerDecoderLayer, TransformerEncoderLayer
from rescale_core.schemes import SchemeOptionError

CFG = TransformerConfig(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                        dropout=0.0)


def _rztx_encoder(layer: TransformerEncoderLayer, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """ReZero's encoder layer on the suite's attention and feed-forward: one ``a`` for both."""
    x = x + a * layer.self_attn.fn(x)
    return x + a * layer.ffn.fn(x)


def test_rezero_encoder_layer_shares_one_gain_as_the_rezero_code():
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(CFG, get_scheme("rezero"), 1, 2)
    gains = [p for n, p in layer.named_parameters() if n.endswith("gain.weight")]
    assert len(gains) == 1 and layer.self_attn.merge.gain is layer.ffn.merge.gain
    with torch.no_grad():
        gains[0].fill_(0.3)
    x = torch.randn(2, 5, 16)
    a = torch.tensor(0.3, requires_grad=True)
    expected = _rztx_encoder(layer, a, x)
    out = layer(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(gains[0].grad, a.grad.reshape(1))  # the sum of both sublayers' terms


def test_rezero_decoder_layer_shares_one_gain_skipinit_keeps_one_per_sublayer():
    rezero = TransformerDecoderLayer(CFG, get_scheme("rezero"), 1, 3)
    assert rezero.self_attn.merge.gain is rezero.cross_attn.merge.gain is rezero.ffn.merge.gain
    skipinit = TransformerDecoderLayer(CFG, get_scheme("skipinit"), 1, 3)
    assert len({id(s.merge.gain) for s in (skipinit.self_attn, skipinit.cross_attn, skipinit.ffn)}) == 3
    unshared = TransformerDecoderLayer(CFG, get_scheme("rezero", layer_gain=False), 1, 3)
    assert len({id(s.merge.gain) for s in (unshared.self_attn, unshared.cross_attn, unshared.ffn)}) == 3


def test_rezero_model_round_trips_and_refuses_a_checkpoint_of_unshared_gains():
    torch.manual_seed(0)
    model = create_model("transformer_tiny", scheme="rezero", src_vocab_size=40)
    old = create_model("transformer_tiny", scheme="rezero", scheme_options={"layer_gain": False}, src_vocab_size=40)
    skipinit = create_model("transformer_tiny", scheme="skipinit", src_vocab_size=40)
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n_params(old) - n_params(model) == 2 * 1 + 2 * 2  # 2 encoder, 2 decoder layers
    assert n_params(old) == n_params(skipinit)
    with torch.no_grad():
        for i, layer in enumerate(model.decoder.layers):
            layer.ffn.merge.gain.weight.fill_(0.1 * (i + 1))
    state = model.state_dict()
    fresh = create_model("transformer_tiny", scheme="rezero", src_vocab_size=40)
    fresh.load_state_dict(state)
    assert fresh.decoder.layers[1].self_attn.merge.gain.weight.item() == pytest.approx(0.2)
    with torch.no_grad():
        old.decoder.layers[1].cross_attn.merge.gain.weight.fill_(0.5)
    with pytest.raises(ValueError, match=r"^decoder\.layers\.1: the checkpoint holds one gain per sublayer "
                                         r"\(self_attn 0, cross_attn 0\.5, ffn 0\).*layer_gain: false"):
        fresh.load_state_dict(old.state_dict())
    with torch.no_grad():  # a diverged run's shared gain: NaN in every entry is one value, not one per sublayer
        model.decoder.layers[1].ffn.merge.gain.weight.fill_(float("nan"))
    fresh.load_state_dict(model.state_dict())
    assert fresh.decoder.layers[1].cross_attn.merge.gain.weight.isnan().all()


def test_layer_gain_is_refused_where_nothing_reads_it():
    with pytest.raises(SchemeOptionError, match="layer_gain: true is not an option without a gain"):
        get_scheme("pre_ln", layer_gain=True)
    with pytest.raises(SchemeOptionError, match="layer_gain: true is not an option of a conv network"):
        create_model("cifar_resnet", depth=8, scheme="skipinit", scheme_options={"layer_gain": True})
    create_model("cifar_resnet", depth=8, scheme="rezero")  # its definition: one gain per block there


def test_a_shared_gain_is_one_learned_scalar_named_by_its_layer():
    """``learned_scalars`` (the logged and plotted multipliers) lists a layer's shared gain once, under
    the layer's name; it had listed it under each sublayer (2-3 copies of one value)."""
    rezero = learned_scalars(create_model("transformer_tiny", scheme="rezero", src_vocab_size=40))
    assert sorted(rezero) == ["decoder.layers.0", "decoder.layers.1", "encoder.layers.0", "encoder.layers.1"]
    skipinit = learned_scalars(create_model("transformer_tiny", scheme="skipinit", src_vocab_size=40))
    assert len(skipinit) == 2 * 2 + 2 * 3 and "decoder.layers.1.cross_attn" in skipinit
