"""Transformer encoder-decoder under every Transformer scheme (tiny models, CPU)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core import ResidualSublayer, create_model, get_scheme, list_schemes
from rescale_core.analysis import signal_propagation
from rescale_core.models.transformer import TRANSFORMERS, Transformer, transformer

SCHEMES = list_schemes("transformer")
V, PAD, BOS, EOS = 40, 1, 0, 2


def tiny(scheme: str = "post_ln", seed: int = 0, **kwargs) -> Transformer:
    torch.manual_seed(seed)
    kwargs.setdefault("src_vocab_size", V)
    return create_model("transformer_tiny", scheme=scheme, **kwargs)


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (batch, length), generator=g)  # never pad/bos/eos


def sublayers(stack: nn.Module) -> list[ResidualSublayer]:
    return [m for m in stack.modules() if isinstance(m, ResidualSublayer)]


def test_schemes_and_registry():
    assert SCHEMES == ["deepnorm", "derf", "dyt", "post_ln", "pre_ln", "rescale", "rezero", "skipinit", "tfixup"]
    assert set(rescale_core.list_models(family="transformer")) == set(TRANSFORMERS)
    assert TRANSFORMERS["transformer_tiny"].d_model == 32
    base, big, deep = (TRANSFORMERS[f"transformer_{n}"] for n in ("base", "big", "deep"))
    assert (base.d_model, base.nhead, base.num_encoder_layers, base.num_decoder_layers,
            base.dim_feedforward) == (512, 8, 6, 6, 2048)
    assert (big.d_model, big.nhead, big.num_encoder_layers, big.dim_feedforward) == (1024, 16, 6, 4096)
    assert (deep.d_model, deep.num_encoder_layers, deep.num_decoder_layers,
            deep.dim_feedforward) == (512, 18, 18, 2048)


def test_create_model_and_builder_arguments():
    model = create_model("transformer_tiny", scheme="rezero", src_vocab_size=50)
    assert isinstance(model, Transformer) and model.scheme.name == "rezero"
    assert model.config.num_encoder_layers == 2 and model.config.dim_feedforward == 64
    # tied output by default, separate source/target embeddings
    assert model.output_projection.weight is model.decoder.embed.embed_tokens.weight
    assert model.encoder.embed.embed_tokens is not model.decoder.embed.embed_tokens
    shared = tiny(share_embeddings=True)
    assert shared.encoder.embed.embed_tokens is shared.decoder.embed.embed_tokens
    untied = tiny(tgt_vocab_size=23, tie_output=False, dropout=0.0, num_decoder_layers=1)
    assert untied.output_projection.weight is not untied.decoder.embed.embed_tokens.weight
    assert untied.config.dropout == 0.0 and len(untied.decoder.layers) == 1
    assert untied(tokens(2, 5), tokens(2, 4) % 23).shape == (2, 4, 23)
    with pytest.raises(ValueError, match="share_embeddings"):
        tiny(tgt_vocab_size=23, share_embeddings=True)
    with pytest.raises(ValueError, match="src_vocab_size"):
        create_model("transformer_tiny")
    with pytest.raises(ValueError, match="num_classes"):
        create_model("transformer_tiny", src_vocab_size=V, num_classes=10)
    with pytest.raises(TypeError, match=r"^unknown Transformer argument\(s\) 'd_modle' \(did you mean d_model\?\)"):
        create_model("transformer_tiny", src_vocab_size=V, d_modle=64)
    with pytest.raises(TypeError, match=r"'vocab_size' \(did you mean (src_vocab_size|tgt_vocab_size)"):
        create_model("transformer_tiny", vocab_size=V)
    with pytest.raises(TypeError, match=r"'depht' \(did you mean depth\?\); the arguments are src_vocab_size, tgt_vocab_size, depth, "):
        create_model("transformer_tiny", src_vocab_size=V, depht=3)
    with pytest.raises(ValueError, match="divisible"):
        create_model("transformer_tiny", src_vocab_size=V, nhead=3)
    # depth: the layers of each side, the key `rescale study depth` sets (network_options.depth)
    deep = create_model("transformer_tiny", scheme="tfixup", src_vocab_size=V, depth=3)
    assert (len(deep.encoder.layers), len(deep.decoder.layers)) == (3, 3)
    assert deep.config.num_encoder_layers == deep.config.num_decoder_layers == 3
    with pytest.raises(TypeError, match=r"give depth \(the layers of each side\) or num_decoder_layers, not both"):
        create_model("transformer_tiny", src_vocab_size=V, depth=3, num_decoder_layers=2)
    # scheme options reach the scheme
    model = tiny("rescale", scheme_options={"c": 10.0, "gain": "vector"})
    assert model.scheme.c == 10.0 and model.scheme.gain == "vector"
    assert model.encoder.layers[0].self_attn.merge.gain.weight.shape == (32,)


@pytest.mark.parametrize("scheme", ["bn", "gn", "none", "fixup", "skipinit_reg"])
def test_conv_only_schemes_raise(scheme):
    with pytest.raises(ValueError, match="Transformer"):
        create_model("transformer_tiny", scheme=scheme, src_vocab_size=V)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_forward_backward_and_training_moves_every_parameter(scheme):
    model = tiny(scheme)
    src, tgt = tokens(3, 7, 1), tokens(3, 6, 2)
    src[0, 5:] = PAD
    tgt[1, 4:] = PAD
    target = torch.roll(tgt, -1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    # rezero/skipinit gains start at 0: the first step moves only the gains (and embeddings);
    # the encoder sees gradient once the decoder's cross-attention gains are non-zero, so it
    # takes three steps before every parameter has moved.
    for step in range(4):
        logits = model(src, tgt)
        assert logits.shape == (3, 6, V)
        loss = nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        assert torch.isfinite(loss)
        for name, p in model.named_parameters():
            assert p.grad is not None, name
            assert torch.isfinite(p.grad).all(), name
        if step == 0 and scheme in ("rezero", "skipinit"):
            gains = [n for n, p in model.named_parameters()
                     if n.endswith("gain.weight") and p.grad.abs().sum() > 0]
            # every decoder gain (6 sublayers' under skipinit, 2 layers' under rezero); encoder gains
            # wait for the cross gains
            assert gains == [n for n, _ in model.named_parameters()
                             if n.startswith("decoder.") and n.endswith("gain.weight")]
            assert len(gains) == {"rezero": 2, "skipinit": 6}[scheme]
        opt.step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_state_dict_round_trip(scheme):
    a, b = tiny(scheme, seed=0).eval(), tiny(scheme, seed=1).eval()
    src, tgt = tokens(2, 6), tokens(2, 5, 3)
    assert not torch.equal(a(src, tgt), b(src, tgt))
    state = a.state_dict()
    assert not any("positions" in k for k in state)  # the sinusoid table is not saved
    b.load_state_dict(state)
    assert torch.equal(a(src, tgt), b(src, tgt))
    torch.testing.assert_close(a.greedy_decode(src, BOS, EOS, 6), b.greedy_decode(src, BOS, EOS, 6))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_signal_propagation_records_every_sublayer(scheme):
    model = tiny(scheme)
    src, tgt = tokens(4, 9), tokens(4, 7, 2)
    records = signal_propagation(model, (src, tgt))
    assert [r["stage"] for r in records] == ["encoder.layers"] * 4 + ["decoder.layers"] * 6
    expected = [(k, 4) for k in range(1, 5)] + [(k, 6) for k in range(1, 7)]
    assert [(r["k"], r["L"]) for r in records] == expected
    assert all(math.isfinite(r["var_out"]) and r["var_out"] > 0 for r in records)
    if scheme == "post_ln":
        assert all(abs(r["var_out"] - 1) < 1e-2 for r in records)


@pytest.mark.parametrize("scheme", ["rezero", "skipinit"])
def test_zero_gain_schemes_are_identity_at_init(scheme):
    model = tiny(scheme)
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    records = signal_propagation(model, (tokens(3, 8), tokens(3, 6, 2)))
    assert all(r["var_branch"] == 0.0 and r["gain"] == 0.0 for r in records)
    assert all(r["var_out"] == pytest.approx(r["var_skip"], rel=1e-12) for r in records)
    pairs = []
    hooks = [m.register_forward_hook(lambda mod, args, out: pairs.append((args[0], out)))
             for m in sublayers(model)]
    model.train()
    model(tokens(3, 8), tokens(3, 6, 2))
    for h in hooks:
        h.remove()
    assert len(pairs) == 10
    assert all(torch.equal(x, y) for x, y in pairs)


def test_rescale_merge_scales_and_init_multiplier():
    model = tiny("rescale")
    reference = tiny("rescale", scheme_options={"init": "he_fan_in"})  # same merge, no multiplier
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    stacks = ((model.encoder, reference.encoder, 4), (model.decoder, reference.decoder, 6))
    for stack, ref_stack, L in stacks:
        subs, refs = sublayers(stack), sublayers(ref_stack)
        assert len(subs) == L
        for k, (sub, ref) in enumerate(zip(subs, refs), start=1):
            assert (sub.merge.k, sub.merge.L) == (k, L)
            assert sub.merge.skip_scale == pytest.approx(math.sqrt((k - 1 + L) / (k + L)), rel=1e-12)
            assert sub.merge.branch_scale == pytest.approx(L ** -0.5, rel=1e-12)
            assert sub.merge.gain.weight.item() == 1.0
            mult = (L / (k + L)) ** 0.25
            names = ("v_proj", "out_proj") if hasattr(sub.fn, "v_proj") else ("fc1", "fc2")
            for name in names:
                torch.testing.assert_close(getattr(sub.fn, name).weight,
                                           getattr(ref.fn, name).weight * mult, rtol=1e-6, atol=0)
            for name in ("q_proj", "k_proj"):
                if hasattr(sub.fn, name):
                    assert torch.equal(getattr(sub.fn, name).weight, getattr(ref.fn, name).weight)
            # the branch is scaled by exactly sqrt(L / (k + L)) at init: effective beta_k^2 = 1/(k+L)
            x = torch.randn(2, 5, 32)
            is_cross = any(sub is getattr(layer, "cross_attn", None) for layer in stack.layers)
            kw = {"memory": torch.randn(2, 4, 32)} if is_cross else {}
            torch.testing.assert_close(sub.fn(x, **kw), ref.fn(x, **kw) * mult ** 2,
                                       rtol=1e-4, atol=1e-6)


def test_rescale_init_std_matches_scaled_xavier():
    torch.manual_seed(0)
    d, ff = 128, 512
    model = create_model("transformer_tiny", scheme="rescale", src_vocab_size=V, d_model=d,
                         dim_feedforward=ff, nhead=4)
    L = model.encoder.num_blocks
    for k, sub in enumerate(sublayers(model.encoder), start=1):
        mult = (L / (k + L)) ** 0.25
        if hasattr(sub.fn, "v_proj"):
            expected = {"v_proj": mult * math.sqrt(2 / (2 * d)) / math.sqrt(2),
                        "out_proj": mult * math.sqrt(2 / (2 * d)),
                        "q_proj": math.sqrt(2 / (2 * d)) / math.sqrt(2)}
        else:
            expected = {"fc1": mult * math.sqrt(2 / (d + ff)), "fc2": mult * math.sqrt(2 / (d + ff))}
        for name, std in expected.items():
            assert getattr(sub.fn, name).weight.std().item() == pytest.approx(std, rel=0.02), (k, name)
            assert getattr(sub.fn, name).bias.abs().max().item() == 0.0
    emb = model.encoder.embed.embed_tokens.weight
    assert emb[PAD].abs().max().item() == 0.0
    assert emb.std().item() == pytest.approx(d ** -0.5, rel=0.05)


def _sublayer_io(model, src, tgt):
    """(fn input, sublayer output) of every sublayer."""
    fn_in, outs = [], []
    hooks = []
    for sub in sublayers(model):
        hooks.append(sub.fn.register_forward_pre_hook(lambda m, args: fn_in.append(args[0])))
        hooks.append(sub.register_forward_hook(lambda m, args, out: outs.append(out)))
    model(src, tgt)
    for h in hooks:
        h.remove()
    return fn_in, outs


def _token_stats(x):
    return x.mean(-1), x.var(-1, unbiased=False)


def test_post_ln_and_pre_ln_placement():
    src, tgt = tokens(3, 8), tokens(3, 6, 2)
    post = tiny("post_ln").eval()
    assert post.encoder.layer_norm is None and post.decoder.layer_norm is None
    for sub in sublayers(post):
        assert isinstance(sub.post_norm, nn.LayerNorm) and isinstance(sub.pre_norm, nn.Identity)
    _, outs = _sublayer_io(post, src, tgt)
    for out in outs:  # LN(x + F(x)): every token of every sublayer output is normalised
        mean, var = _token_stats(out)
        torch.testing.assert_close(mean, torch.zeros_like(mean), atol=1e-5, rtol=0)
        torch.testing.assert_close(var, torch.ones_like(var), atol=1e-3, rtol=0)

    pre = tiny("pre_ln").eval()
    assert isinstance(pre.encoder.layer_norm, nn.LayerNorm)
    assert isinstance(pre.decoder.layer_norm, nn.LayerNorm)
    for sub in sublayers(pre):
        assert isinstance(sub.pre_norm, nn.LayerNorm) and isinstance(sub.post_norm, nn.Identity)
    fn_in, outs = _sublayer_io(pre, src, tgt)
    for x in fn_in:  # x + F(LN(x)): the branch sees normalised tokens ...
        mean, var = _token_stats(x)
        torch.testing.assert_close(var, torch.ones_like(var), atol=1e-3, rtol=0)
    # ... the residual stream itself is not normalised
    assert max((_token_stats(out)[1] - 1).abs().max().item() for out in outs) > 0.05
    # final LayerNorm on the decoder output
    feats = pre.decoder(tgt, *pre.encode(src))
    torch.testing.assert_close(_token_stats(feats)[1], torch.ones(3, 6), atol=1e-3, rtol=0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_source_padding_is_invisible(scheme):
    model = tiny(scheme).eval()
    src, tgt = tokens(2, 8), tokens(2, 6, 2)
    alone = model(src[:1, :5], tgt[:1])
    right = src.clone()
    right[0, 5:] = PAD
    left = torch.stack([torch.cat([torch.full((6,), PAD), src[0, :5]]),
                        torch.cat([torch.full((3,), PAD), src[1]])])
    torch.testing.assert_close(model(right, tgt)[:1], alone, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(model(left, tgt)[:1], alone, atol=2e-5, rtol=1e-5)
    # whatever the encoder leaves at padded positions does not reach the decoder
    memory, mask = model.encode(right)
    assert mask.dtype == torch.bool and mask[0, 5:].all() and not mask[1].any()
    garbage = memory.clone()
    garbage[mask] = 1e3 * torch.randn(int(mask.sum()), memory.size(-1))
    torch.testing.assert_close(model.decode(tgt, garbage, mask), model.decode(tgt, memory, mask),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("scheme", ["post_ln", "rescale"])
def test_target_padding_and_causality(scheme):
    model = tiny(scheme).eval()
    src, tgt = tokens(2, 7), tokens(2, 8, 2)
    ref = model(src, tgt)
    for j in (0, 3, 7):  # changing target token j changes no logit before j
        changed = tgt.clone()
        changed[:, j] = (changed[:, j] + 1 - 3) % (V - 3) + 3
        out = model(src, changed)
        torch.testing.assert_close(out[:, :j], ref[:, :j], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(out[:, j:], ref[:, j:])
    # trailing (right) and leading (left) target padding leave the real positions unchanged
    right = tgt.clone()
    right[0, 5:] = PAD
    torch.testing.assert_close(model(src, right)[0, :5], ref[0, :5], atol=2e-5, rtol=1e-5)
    left = torch.cat([torch.full((2, 2), PAD), tgt], 1)
    torch.testing.assert_close(model(src, left)[:, 2:], ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["pre_ln", "rescale"])
def test_incremental_decoding_matches_full_decoding(scheme):
    model = tiny(scheme, num_decoder_layers=3).eval()
    src, tgt = tokens(2, 6), tokens(2, 5, 2)
    src[1, 4:] = PAD
    memory, mask = model.encode(src)
    full = model.decode(tgt, memory, mask)
    cache = model.new_cache(memory, mask)
    steps = [model.decode_step(tgt[:, t : t + 1], cache) for t in range(5)]
    assert all(s.shape == (2, 1, V) for s in steps)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-5)


def _reference_greedy(model, src, max_len):
    """Greedy search recomputing the whole prefix at every step (no cache)."""
    memory, mask = model.encode(src)
    prefix = torch.full((src.size(0), 1), BOS)
    for _ in range(max_len):
        logits = model.decode(prefix, memory, mask)[:, -1]
        logits[:, PAD] = -math.inf
        prefix = torch.cat([prefix, logits.argmax(-1, keepdim=True)], 1)
    return prefix[:, 1:]


@pytest.mark.parametrize("scheme", ["post_ln", "rezero"])
def test_greedy_decode(scheme):
    # An untrained tied model copies its input token (bos) forever. Untied output rows that are
    # permuted embedding rows make it emit perm^-1(input): a non-trivial chain of tokens.
    model = tiny(scheme, tie_output=False).eval()
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.output_projection.weight.copy_(model.decoder.embed.embed_tokens.weight[perm])
        if scheme == "rezero":  # give the branches something to do
            for p in model.parameters():
                if p.numel() == 1:
                    p.fill_(0.3)
    src = tokens(3, 7)
    src[2, 3:] = PAD
    out = model.greedy_decode(src, BOS, EOS, max_len=9)
    assert out.dtype == torch.long and out.shape[0] == 3 and 1 <= out.shape[1] <= 9
    assert out.unique().numel() > 1
    expected = _reference_greedy(model, src, out.shape[1])
    # the first column is the first generated token (bos is not returned)
    for row, ref in zip(out, expected):
        eos = (ref == EOS).nonzero()
        n = int(eos[0]) + 1 if len(eos) else len(ref)
        assert torch.equal(row[:n], ref[:n])
        assert row[n:].eq(PAD).all()  # padding after eos
    # stops as soon as every sequence produced eos
    forced = tiny(scheme, tie_output=False).eval()
    with torch.no_grad():
        forced.output_projection.weight.zero_()  # all logits equal -> argmax = token 0
    out = forced.greedy_decode(src, bos_index=3, eos_index=0, max_len=9)
    assert out.shape == (3, 1) and out.eq(0).all()
    with pytest.raises(ValueError, match="max_len"):
        model.greedy_decode(src, BOS, EOS, max_len=model.config.max_positions + 1)


def test_param_groups_put_gains_in_scalars():
    model = tiny("rescale")
    groups = {g["name"]: g for g in rescale_core.param_groups(model, weight_decay=1e-4, lr=1.0)}
    assert len(groups["scalars"]["params"]) == 10 and groups["scalars"]["weight_decay"] == 0.0
    n_params = sum(len(g["params"]) for g in groups.values())
    assert n_params == len(list(model.parameters()))
    assert get_scheme("rescale").supports("transformer")


def test_transformer_builder_direct():
    model = transformer("transformer_tiny", scheme="pre_ln", src_vocab_size=V, max_positions=16)
    with pytest.raises(ValueError, match="max_positions"):
        model(tokens(1, 17), tokens(1, 3))
    with pytest.raises(KeyError, match="transformer_tiny"):
        transformer("transformer_huge", src_vocab_size=V)


@pytest.mark.parametrize("plan", ["reference", "lean"])
def test_vmap_over_sentences_gives_each_sentences_outputs_and_gradients(plan):
    """``torch.func.vmap`` over padded sentences (a source padded at its end, a target padded
    before a real token) gives each sentence's outputs and per-sample gradients as a loop does:
    the padding checks, host reads outside vmap, keep their masks under it."""
    model = tiny("rescale", dropout=0.0, plan=plan).train()
    src, tgt = tokens(3, 5)[:, None], tokens(3, 4, seed=2)[:, None]
    src[1, 0, -2:] = PAD
    tgt[2, 0, 1] = PAD
    outputs = torch.func.vmap(model)(src, tgt)
    torch.testing.assert_close(outputs, torch.stack([model(s, t) for s, t in zip(src, tgt)]))
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(params, s, t):
        return torch.func.functional_call(model, params, (s, t)).square().mean()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, src, tgt)
    for i in range(len(src)):
        model.zero_grad()
        model(src[i], tgt[i]).square().mean().backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(per_sample[n][i], p.grad, msg=f"{n} sentence {i}")
