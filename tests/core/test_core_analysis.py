"""Probes: signal propagation per residual block (RescaleNet rebuttal, Shao et al. 2020, Eq. 1),
learned branch multipliers and dead ReLUs. They must leave the model exactly as they found it."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core.analysis import (dead_relu_fraction, learned_scalars, residual_blocks,
                                   signal_propagation)
from rescale_core.models.transformer import FeedForward


def _model(name, scheme, **kw):
    torch.manual_seed(0)
    return rescale_core.create_model(name, scheme=scheme, base_width=8, num_classes=5, **kw)


def _snapshot(model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = {name: m.training for name, m in model.named_modules()}
    counts = [m._count for m in rescale_core.mean_shift_layers(model)]
    return state, modes, counts


def _assert_same(model, snapshot):
    state, modes, counts = snapshot
    now = model.state_dict()
    assert now.keys() == state.keys()
    for k in state:
        assert torch.equal(now[k], state[k]), k
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert [m._count for m in rescale_core.mean_shift_layers(model)] == counts


@pytest.mark.parametrize("scheme, train", [("rescale", True), ("rescale", False), ("rescale", None),
                                           ("bn", True), ("bn", False), ("bn_merge", True),
                                           ("fixup", True)])
def test_signal_propagation_restores_the_model(scheme, train):
    model = _model("resnet18", scheme)
    model.train()
    model(torch.randn(4, 3, 32, 32))  # some statistics already measured: count 1 of 8
    model.eval()
    model.layer2.train()  # mixed modes must survive too
    snap = _snapshot(model)
    records = signal_propagation(model, torch.randn(4, 3, 32, 32), train=train)
    assert len(records) == 8
    assert all(r["var_out"] > 0 for r in records)
    _assert_same(model, snap)


def test_signal_propagation_in_the_models_own_mode_is_that_modes_forward():
    """``train=None`` keeps the model's mode: a model in training mode is probed as ``train=True``
    (its mean-shift layers still measuring subtract this batch's means, as on a first training
    step; they were left out, the probe running without gradients), one in eval mode as ``False``."""
    model = _model("cifar_resnet", "rescale", depth=8)
    x = torch.randn(8, 3, 8, 8) + 1.0  # inputs whose mean the measuring layers remove
    keys = ("var_skip", "var_branch", "var_sum", "var_out")

    def values(records):
        return [[r[k] for k in keys] for r in records]

    snap = _snapshot(model.train())
    mine = signal_propagation(model, x, train=None)
    assert values(mine) == values(signal_propagation(model, x, train=True))
    assert values(mine) != values(signal_propagation(model, x, train=False))
    _assert_same(model, snap)
    model.eval()
    assert values(signal_propagation(model, x, train=None)) == values(signal_propagation(model, x, train=False))


def test_signal_propagation_measures_like_a_training_batch_but_keeps_nothing():
    model = _model("resnet18", "rescale").eval()
    x = torch.randn(4, 3, 32, 32)
    layers = rescale_core.mean_shift_layers(model)
    seen = []
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append(mod._count)) for m in layers]
    signal_propagation(model, x, train=True)
    assert seen == [1] * len(layers)  # during the probe: measured, as on a first training batch
    seen.clear()
    signal_propagation(model, x, train=False)
    assert seen == [0] * len(layers)
    for h in hooks:
        h.remove()
    assert all(m._count == 0 and torch.count_nonzero(m.mu0) == 0 for m in layers)


def test_eval_mode_uses_running_statistics():
    model = _model("resnet18", "bn")
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_var.fill_(100.0)
    x = torch.randn(4, 3, 32, 32)
    eval_records = signal_propagation(model, x, train=False)
    train_records = signal_propagation(model, x, train=True)
    assert eval_records[0]["var_out"] < 0.1 * train_records[0]["var_out"]
    assert all(torch.all(m.running_var == 100.0) for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def test_records_come_in_forward_order():
    model = _model("resnet50", "rescale")
    records = signal_propagation(model, torch.randn(2, 3, 32, 32))
    names = [name for name, _ in residual_blocks(model)]
    assert [r["name"] for r in records] == names
    assert [r["stage"] for r in records] == ["layer1"] * 3 + ["layer2"] * 4 + ["layer3"] * 6 + ["layer4"] * 3
    assert [r["block"] for r in records] == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert [r["k"] for r in records] == list(range(1, 17)) and {r["L"] for r in records} == {16}
    expected_keys = {"name", "stage", "block", "k", "L", "skip_scale", "branch_scale", "gain",
                     "var_skip", "var_branch", "var_sum", "var_out", "eta", "chan_mean_sq_out", "chan_var_out"}
    for r, (_, block) in zip(records, residual_blocks(model)):
        assert set(r) == expected_keys
        assert r["skip_scale"] == block.merge.skip_scale and r["gain"] == 1.0
        # eta is the relative error of Var[a x] + Var[b F] against Var[x_k] before the ReLU
        assert r["eta"] == pytest.approx(abs(r["var_skip"] + r["var_branch"] - r["var_sum"]) / r["var_sum"])
        assert r["var_out"] <= r["var_sum"] * 1.01 + 1e-12  # ReLU after the merge cannot add variance much


def test_var_out_is_what_the_next_block_receives():
    model = _model("resnet18", "bn")
    x = torch.randn(4, 3, 32, 32)
    inputs = {}
    hooks = [b.register_forward_pre_hook(lambda mod, args, n=n: inputs.__setitem__(n, args[0].var(unbiased=False).item()))
             for n, b in residual_blocks(model)]
    records = signal_propagation(model, x)
    for h in hooks:
        h.remove()
    for prev, nxt in zip(records, records[1:]):
        assert nxt["name"] in inputs
        assert inputs[nxt["name"]] == pytest.approx(prev["var_out"], rel=1e-5)


def test_vgg_gives_no_records():
    torch.manual_seed(0)
    model = rescale_core.create_model("vgg11", scheme="bn", base_width=8, hidden_dim=32, num_classes=5)
    snap = _snapshot(model)
    assert signal_propagation(model, torch.randn(2, 3, 32, 32)) == []
    _assert_same(model, snap)


def test_tuple_inputs():
    model = _model("cifar_resnet", "rezero", depth=8)
    records = signal_propagation(model, (torch.randn(2, 3, 16, 16),))
    assert [r["stage"] for r in records] == ["layer1", "layer2", "layer3"]
    assert all(r["var_branch"] == 0.0 and r["gain"] == 0.0 for r in records)


def test_learned_scalars():
    model = _model("resnet18", "rescale")
    with torch.no_grad():
        model.layer3[1].merge.gain.weight.fill_(11.1)
    scalars = learned_scalars(model)
    assert list(scalars) == [n for n, _ in residual_blocks(model)]
    assert scalars["layer3.1"] == pytest.approx(11.1) and scalars["layer1.0"] == 1.0
    assert learned_scalars(_model("resnet18", "bn")) == {}
    vec = _model("resnet18", "rescale", scheme_options={"gain": "vector"})
    with torch.no_grad():
        vec.layer1[0].merge.gain.weight.copy_(torch.arange(8.0).view(1, 8, 1, 1))
    assert learned_scalars(vec)["layer1.0"] == pytest.approx(3.5)


def test_dead_relu_fraction():
    model = _model("resnet18", "rescale").train()
    x = torch.randn(4, 3, 32, 32)
    before = copy.deepcopy(model.state_dict())
    frac = dead_relu_fraction(model, x)
    assert 0.0 <= frac < 1.0 and model.training
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # a stem that only outputs negatives kills every unit of the first ReLU: each of its channels
    # is zero at every sample and position, and the network's fraction counts them
    with torch.no_grad():
        model.conv1.weight.zero_()
        model.bn1.bias.fill_(-1.0)
    stem_outputs = []
    handle = model.relu.register_forward_hook(lambda module, args, out: stem_outputs.append(out.detach().clone()))
    try:
        after = dead_relu_fraction(model.eval(), x)
    finally:
        handle.remove()
    assert stem_outputs and not stem_outputs[0].any() and after > frac
    assert not model.training
    stem = nn.Sequential(model.conv1, model.bn1, model.relu)
    assert dead_relu_fraction(stem, x) == 1.0 == dead_relu_fraction(stem, x, per_sample=True)
    with torch.no_grad():
        model.bn1.bias[0, 0] = 1.0  # one channel back to life: exactly one of the stem's channels counts
    channels = model.conv1.out_channels
    assert dead_relu_fraction(stem, x) == 1 - 1 / channels == dead_relu_fraction(stem, x, per_sample=True)


def test_dead_relu_fraction_is_one_when_every_relu_only_sees_negatives():
    """A BN network whose every BN outputs -1: every unit of every ReLU call is dead (the block
    ReLUs see -1 plus a skip path that is zero or -1 itself), in both counting modes."""
    model = _model("resnet18", "bn").eval()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.weight.zero_()
            bn.bias.fill_(-1.0)
    x = torch.randn(4, 3, 32, 32)
    assert dead_relu_fraction(model, x) == 1.0 == dead_relu_fraction(model, x, per_sample=True)


def test_dead_relu_fraction_counts_a_transformers_feed_forward_features():
    """A Transformer's feed-forward ReLUs act on ``[batch, positions, features]``: its units are the
    features (not the positions), each dead when zero at every sample and position. One feature
    of one layer silenced (its fc1 bias far below zero) is exactly one dead unit of that call; a
    part of the model kept in eval mode stays so."""
    model = rescale_core.create_model("transformer_tiny", scheme="pre_ln", src_vocab_size=50)
    tokens = (torch.randint(3, 50, (3, 7)), torch.randint(3, 50, (3, 5)))
    ffn = [m for m in model.modules() if isinstance(m, FeedForward)]
    units = sum(f.fc1.out_features for f in ffn)
    with torch.no_grad():
        for f in ffn:
            f.fc1.bias.fill_(100.0)  # every feature alive
        ffn[0].fc1.bias[3] = -1e4
    model.train()
    ffn[1].eval()
    assert dead_relu_fraction(model, tokens) == 1 / units == dead_relu_fraction(model, tokens, per_sample=True)
    assert model.training and not ffn[1].training and ffn[0].training


def test_dead_relu_fraction_counts_a_transformers_real_tokens_only():
    """Padding is no position of a unit: a padded batch gives the fractions of its sentences run
    unpadded (the model masks padding, so real tokens see the same values). Before, a unit firing
    only at padding positions counted as alive."""
    torch.manual_seed(0)
    model = rescale_core.create_model("transformer_tiny", scheme="pre_ln", src_vocab_size=50).eval()
    pad = model.pad_index
    gen = torch.Generator().manual_seed(1)
    long = (torch.randint(3, 50, (1, 9), generator=gen), torch.randint(3, 50, (1, 8), generator=gen))
    short = (torch.randint(3, 50, (1, 3), generator=gen), torch.randint(3, 50, (1, 2), generator=gen))

    def padded(pair, src_len, tgt_len):
        src, tgt = pair
        return (nn.functional.pad(src, (0, src_len - src.shape[1]), value=pad),
                nn.functional.pad(tgt, (0, tgt_len - tgt.shape[1]), value=pad))

    assert dead_relu_fraction(model, padded(short, 30, 30)) == dead_relu_fraction(model, short) > 0
    batch = tuple(torch.cat(parts) for parts in zip(long, padded(short, 9, 8)))
    alone = [dead_relu_fraction(model, pair, per_sample=True) for pair in (long, short)]
    assert dead_relu_fraction(model, batch, per_sample=True) == pytest.approx(sum(alone) / 2)


def test_dead_relu_fraction_counts_a_resnets_stem_channels():
    """A ResNet's stem ReLU sits beside its classifier (both children of the network), yet acts on
    the stem convolution's ``[batch, channels, H, W]``: its units are channels. Every BN output
    made positive and one stem channel silenced is exactly one dead unit of the network's
    (stem 4 channels, then two ReLU calls of each block's channels)."""
    model = rescale_core.create_model("cifar_resnet", scheme="bn", depth=8, base_width=4, num_classes=3).eval()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.weight.zero_()
            bn.bias.fill_(1.0)
        model.bn1.bias[0] = -1.0
    units = 4 + 2 * (4 + 8 + 16)
    x = torch.randn(2, 3, 8, 8)
    assert dead_relu_fraction(model, x) == 1 / units == dead_relu_fraction(model, x, per_sample=True)


def test_signal_propagation_leaves_the_random_streams_as_they_were():
    """A Transformer probed in training mode ran its dropout, drawing from the caller's random
    stream: a training step after a probe saw other dropout masks than without it. The probe
    leaves the stream as it was, and runs without dropout (as the NF paper's plots)."""
    model = rescale_core.create_model("transformer_tiny", scheme="pre_ln", src_vocab_size=30)
    assert any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())
    tokens = (torch.randint(3, 30, (2, 5)), torch.randint(3, 30, (2, 4)))
    torch.manual_seed(2)
    first = signal_propagation(model, tokens, train=True)
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    second = signal_propagation(model, tokens, train=True)
    assert torch.equal(torch.rand(3), expected)
    assert [r["var_out"] for r in first] == [r["var_out"] for r in second]  # no dropout: no draw
    assert any(m.training for m in model.modules() if isinstance(m, nn.Dropout))  # put back


@pytest.mark.parametrize("train", [True, None])
def test_signal_propagation_is_of_the_network_without_its_drops(train):
    """Stochastic depth and dropout act in training only: in training mode the probe measures the
    network without them (the NF paper's plots), a network with a rate as the same one without."""
    options = {"stochdepth_rate": 0.5, "classifier_dropout": 0.3, "conv_dropout": 0.3,
               "conv_dropout_stages": [1, 2, 3]}
    on = {"zero_gamma": False}  # branches on at init (nf's default init cuts them off: nothing to drop)
    dropped = _model("cifar_resnet", "nf", depth=8, scheme_options={**options, **on}).train()
    plain = _model("cifar_resnet", "nf", depth=8, scheme_options=on).train()
    plain.load_state_dict(dropped.state_dict())
    rates = [b.drop_rate for _, b in residual_blocks(dropped)]
    assert max(rates) > 0 and any(isinstance(m, nn.Dropout2d) for m in dropped.modules())
    x = torch.randn(8, 3, 8, 8)
    keys = ("var_skip", "var_branch", "var_sum", "var_out", "chan_mean_sq_out", "chan_var_out")
    assert ([[r[k] for k in keys] for r in signal_propagation(dropped, x, train=train)]
            == [[r[k] for k in keys] for r in signal_propagation(plain, x, train=train)])
    assert [b.drop_rate for _, b in residual_blocks(dropped)] == rates and dropped.training
    assert all(m.training for m in dropped.modules() if isinstance(m, nn.Dropout2d))


def test_probes_of_a_compiled_model_hook_every_block():
    """A model compiled in place (a run's ``compile: true``) runs cached compiled code that skips
    hooks added after it compiled: the signal probe crashed (a block's hook fired, its merge's
    did not) once the dead-ReLU probe had compiled the model. The probes run it eagerly."""
    torch.manual_seed(0)
    model = _model("cifar_resnet", "rescale", depth=8, scheme_options={"mean_shift": True})
    rescale_core.finish_measuring(model)
    plain = copy.deepcopy(model)
    model.compile(backend="eager")  # dynamo's tracing, without a compiler's wait
    x = torch.randn(8, 3, 8, 8)
    for per_sample in (True, False):
        assert dead_relu_fraction(model, x, per_sample) == dead_relu_fraction(plain, x, per_sample)
    expected = signal_propagation(plain, x)
    assert signal_propagation(model, x) == expected and len(expected) == 3


@pytest.mark.parametrize("name, dim", [("cifar_resnet", 1), ("transformer_tiny", -1)])
def test_channel_statistics_are_those_of_the_signal_propagation_plots(name, dim):
    """Brock et al.'s plots show the average channel squared mean and the average channel variance
    of each block's output; the probe only gave the variance over all elements, which pools the
    channels (a ReLU network's large channel means showed nowhere). By hand, one channel at a time."""
    torch.manual_seed(0)
    if name == "cifar_resnet":
        model, inputs = _model(name, "rescale", depth=8), torch.randn(6, 3, 8, 8) + 0.5
    else:
        model = rescale_core.create_model(name, scheme="pre_ln", src_vocab_size=30)
        inputs = (torch.randint(3, 30, (2, 5)), torch.randint(3, 30, (2, 4)))
    outputs = {}
    for block_name, block in residual_blocks(model):
        block.register_forward_hook(lambda m, a, out, n=block_name: outputs.__setitem__(n, out.detach().clone()))
    records = signal_propagation(model, inputs, train=False)
    assert len(records) == len(outputs) > 0
    for record in records:
        out = outputs[record["name"]].double().movedim(dim, 0)
        channels = [out[c].flatten() for c in range(out.shape[0])]
        means = [float(v.sum() / v.numel()) for v in channels]
        variances = [float(((v - m) ** 2).sum() / v.numel()) for v, m in zip(channels, means)]
        assert record["chan_mean_sq_out"] == pytest.approx(sum(m * m for m in means) / len(means), rel=1e-9)
        assert record["chan_var_out"] == pytest.approx(sum(variances) / len(variances), rel=1e-9)
    if name == "cifar_resnet":  # post-ReLU outputs: channel means far from 0
        assert all(r["chan_mean_sq_out"] > 0.2 * r["chan_var_out"] for r in records)


@pytest.mark.ddp
def test_learned_scalars_under_fsdp_are_the_whole_gains_once_each(tmp_path):
    """Under FSDP (one unit per residual block, as experiments/cluster/fsdp.yaml) rank 0 read NaN
    for every block's gain (the gain lay in the other rank's shard: empty here), and every block
    twice, under names with FSDP's wrapper in them. Per-channel gains, each block's of its own mean."""
    import torch.multiprocessing as mp
    from fsdp_scalars_rank import scalars_rank

    model = _model("cifar_resnet", "rescale", depth=8, scheme_options={"gain": "vector"})
    with torch.no_grad():
        for i, (_, block) in enumerate(residual_blocks(model)):
            weight = block.merge.gain.weight
            weight.copy_(torch.linspace(0, 2 * (i + 1), weight.numel()).view_as(weight))
    expected = learned_scalars(model)
    assert expected == pytest.approx({"layer1.0": 1.0, "layer2.0": 2.0, "layer3.0": 3.0})
    out = tmp_path / "scalars.pt"
    mp.spawn(scalars_rank, args=(2, str(tmp_path / "rendezvous"), model, str(out)), nprocs=2)
    assert torch.load(out) == pytest.approx(expected)


def test_dead_relu_fraction_of_a_network_without_relus_is_an_error():
    """No ReLU unit ran: the probe returned 0.0, the reading of a network whose ReLUs all live."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh())
    with pytest.raises(ValueError, match="no nn.ReLU module ran"):
        dead_relu_fraction(model, torch.randn(2, 3, 8, 8))
