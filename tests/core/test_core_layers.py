"""RescaleNet's mean-shift bias (Shao et al. 2020, Sec. 4.4) and the small layers of the schemes:
statistics measured on training batches only, restored from checkpoints, no host sync once set."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core.layers import (Gain, MeanShiftBias, ScalarBias, StridedAvgPool, channel_shape,
                                 conv_nd, dropout_nd, make_norm, pool_nd)

C = 4


def batches(n: int, seed: int = 0, batch: int = 6) -> list[torch.Tensor]:
    """Batches whose channel means are far from 0 and differ from batch to batch."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([3.0, -2.0, 0.5, 10.0]).view(1, C, 1, 1)
    return [torch.randn(batch, C, 5, 5, generator=g) * 2 + offsets + torch.randn(1, C, 1, 1, generator=g)
            for _ in range(n)]


def train_on(layer: nn.Module, xs) -> None:
    layer.train()
    with torch.enable_grad():
        for x in xs:
            layer(x)


def channel_means(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).reshape(t.shape[1], -1).mean(dim=1)


# --------------------------------------------------------------- MeanShiftBias
def test_measures_the_channel_means_of_the_first_batches():
    layer = MeanShiftBias(C, measure_batches=3)
    xs = batches(3)
    assert layer.measuring
    train_on(layer, xs)
    assert not layer.measuring and int(layer.count) == 3 and layer._count == 3
    measured = torch.cat(xs)
    torch.testing.assert_close(layer.mu0.flatten(), channel_means(measured), rtol=0, atol=1e-5)
    layer.eval()
    with torch.no_grad():
        out = layer(measured)
    assert channel_means(out).abs().max() < 1e-5
    # frozen afterwards: more training batches from another distribution change nothing
    mu0 = layer.mu0.clone()
    train_on(layer, [x * 5 + 7 for x in batches(4, seed=1)])
    assert torch.equal(layer.mu0, mu0) and int(layer.count) == 3 and layer._count == 3


def test_bias_is_scaled_while_measuring_and_learnable():
    layer = MeanShiftBias(C, measure_batches=2)
    with torch.no_grad():
        layer.bias.fill_(1.0)
    x = batches(1)[0]
    layer.eval()
    with torch.no_grad():  # not measuring in eval: x + 1e-2 * bias - 0
        torch.testing.assert_close(layer(x), x + 0.01)
    train_on(layer, batches(2))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), x + 1.0 - layer.mu0)
    out = layer.train()(x)
    out.sum().backward()
    assert torch.all(layer.bias.grad == x[:, :1].numel())


@pytest.mark.parametrize("mode", ["eval", "eval_no_grad", "train_no_grad"])
def test_does_not_measure_outside_training_steps(mode):
    """Validation passes (Lightning's sanity check runs in eval mode under no_grad) and
    ``torch.no_grad()`` forwards in train mode must not consume the measuring batches."""
    layer = MeanShiftBias(C, measure_batches=2)
    layer.train(mode == "train_no_grad")
    with torch.set_grad_enabled(mode == "eval"):
        for x in batches(3):
            layer(x)
    assert layer.measuring and layer._count == 0 and int(layer.count) == 0
    assert torch.count_nonzero(layer.mu0) == 0


def test_state_dict_after_measuring_is_final():
    layer = MeanShiftBias(C, measure_batches=2)
    train_on(layer, batches(2))
    state = copy.deepcopy(layer.state_dict())
    assert set(state) == {"bias", "mu0", "count"}
    restored = MeanShiftBias(C, measure_batches=2)
    restored.load_state_dict(state)
    assert not restored.measuring and restored._count == 2
    train_on(restored, batches(3, seed=5))  # measures nothing more
    assert torch.equal(restored.mu0, layer.mu0)


def test_state_dict_mid_measuring_continues_from_the_saved_count():
    xs = batches(5)
    reference = MeanShiftBias(C, measure_batches=5)
    train_on(reference, xs)
    first = MeanShiftBias(C, measure_batches=5)
    train_on(first, xs[:2])
    resumed = MeanShiftBias(C, measure_batches=5)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert resumed.measuring and resumed._count == 2
    train_on(resumed, xs[2:4])
    assert resumed.measuring and resumed._count == 4
    train_on(resumed, xs[4:] + batches(2, seed=9))
    assert resumed._count == 5
    torch.testing.assert_close(resumed.mu0, reference.mu0, rtol=0, atol=1e-6)


def test_finish_measuring_freezes_now():
    layer = MeanShiftBias(C, measure_batches=8)
    xs = batches(1)
    train_on(layer, xs)
    layer.finish_measuring()
    assert not layer.measuring and int(layer.count) == 8
    torch.testing.assert_close(layer.mu0.flatten(), channel_means(xs[0]), rtol=0, atol=1e-5)
    mu0 = layer.mu0.clone()
    train_on(layer, batches(2, seed=3))
    assert torch.equal(layer.mu0, mu0)
    # a second call never lowers the count
    layer.finish_measuring()
    assert layer._count == 8


@pytest.mark.parametrize("spatial_dims, shape", [(0, (5, C)), (1, (5, C, 7)), (3, (5, C, 2, 3, 3))])
def test_other_input_ranks(spatial_dims, shape):
    layer = MeanShiftBias(C, spatial_dims, measure_batches=1)
    assert layer.bias.shape == layer.mu0.shape == channel_shape(C, spatial_dims)
    x = torch.randn(shape) + torch.arange(C).view(channel_shape(C, spatial_dims)) * 3
    train_on(layer, [x])
    torch.testing.assert_close(layer.mu0.flatten(), channel_means(x), rtol=0, atol=1e-5)


def _forbid_host_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("host read of a tensor in forward")
    for attr in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, attr, refuse)


def test_the_sync_probes_catch_a_count_check_on_a_tensor(monkeypatch, count_host_syncs):
    """Control: the probes below do see the official code's ``if count < threshold`` and the one
    sync this layer does on purpose (reading ``count`` at load time)."""
    count = torch.zeros((), dtype=torch.long)
    with count_host_syncs() as probe:
        if count < 8:
            pass
    assert probe.syncs == 1
    layer = MeanShiftBias(C, measure_batches=1)
    state = layer.state_dict()
    with count_host_syncs() as probe:
        layer.load_state_dict(state)
    assert probe.syncs == 1
    with monkeypatch.context() as m:
        _forbid_host_reads(m)
        with pytest.raises(AssertionError, match="host read"):
            layer.load_state_dict(state)
        with pytest.raises(AssertionError, match="host read"):
            bool(count < 8)


def test_no_host_sync_in_forward_once_measured(monkeypatch, count_host_syncs):
    torch.manual_seed(0)
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3,
                                      scheme_options={"measure_batches": 2}).train()
    x = torch.randn(2, 3, 32, 32)
    for _ in range(2):
        model(x)
    assert not any(m.measuring for m in rescale_core.mean_shift_layers(model))
    with count_host_syncs() as probe:
        model(x).sum().backward()
        model.eval()
        with torch.no_grad():
            model(x)
    assert probe.syncs == 0
    model.train()
    with monkeypatch.context() as m:
        _forbid_host_reads(m)
        out = model(x)
    assert torch.isfinite(out).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_device_sync_in_forward_once_measured_cuda():
    torch.manual_seed(0)
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3,
                                      scheme_options={"measure_batches": 1}).cuda().train()
    x = torch.randn(2, 3, 32, 32, device="cuda")
    model(x)  # the measuring forward runs the reference path
    model(x)  # the first planned forward builds the plan's cached constants (a copy to the device, once)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --------------------------------------------------------------- mean shift through a model
def _rescale18(**options):
    torch.manual_seed(0)
    return rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3,
                                     scheme_options=options or None)


def test_measure_batches_option_and_model_outputs_centred():
    model = _rescale18(measure_batches=1)
    layers = rescale_core.mean_shift_layers(model)
    assert len(layers) == 2 + 2 * 8 + 3  # stem, pool, 2 per basic block, 3 downsample shortcuts
    assert all(m.measure_batches == 1 for m in layers)
    x = torch.randn(8, 3, 32, 32) * 2 + 1
    model.train()(x)
    outputs = {}
    hooks = [m.register_forward_hook(lambda mod, args, out: outputs.__setitem__(mod, out.clone()))
             for m in layers]
    model.eval()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for m in layers:  # every layer measured its input as it is once the layers before it shift
        scale = max(float(outputs[m].std()), 1.0)
        assert channel_means(outputs[m]).abs().max() < 1e-4 * scale, m


def test_model_measures_running_means_of_its_inputs():
    model = _rescale18(measure_batches=3)
    layers = rescale_core.mean_shift_layers(model)
    assert all(m.measure_batches == 3 for m in layers)
    seen = {m: [] for m in layers}
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen[mod].append(channel_means(args[0])))
             for m in layers]
    model.train()
    for seed in range(5):
        torch.manual_seed(seed)
        model(torch.randn(4, 3, 32, 32) + seed)
    for h in hooks:
        h.remove()
    for m in layers:
        assert int(m.count) == 3 and not m.measuring
        expected = torch.stack(seen[m][:3]).mean(0)  # the last 2 batches are not measured
        torch.testing.assert_close(m.mu0.flatten(), expected, rtol=1e-5, atol=1e-5)


def test_model_does_not_measure_in_validation_or_no_grad():
    model = _rescale18(measure_batches=2)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()
    with torch.no_grad():
        model(x)
    assert all(m._count == 0 and torch.count_nonzero(m.mu0) == 0 for m in rescale_core.mean_shift_layers(model))
    model(x)
    assert all(m._count == 1 for m in rescale_core.mean_shift_layers(model))


def test_model_checkpoints_keep_the_measuring_state():
    x = torch.randn(2, 3, 32, 32)
    model = _rescale18(measure_batches=2).train()
    model(x)
    mid = copy.deepcopy(model.state_dict())
    model(x * 2)
    done = copy.deepcopy(model.state_dict())
    # loaded after measuring: does not measure again
    fresh = _rescale18(measure_batches=2)
    fresh.load_state_dict(done)
    assert not any(m.measuring for m in rescale_core.mean_shift_layers(fresh))
    fresh.train()(x * 100)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, done[name]), name
    # loaded mid-measuring: measures exactly the remaining batch, like the uninterrupted run
    resumed = _rescale18(measure_batches=2)
    resumed.load_state_dict(mid)
    assert all(m._count == 1 for m in rescale_core.mean_shift_layers(resumed))
    resumed.train()(x * 2)
    for name, tensor in resumed.state_dict().items():
        torch.testing.assert_close(tensor, done[name], rtol=1e-6, atol=1e-6, msg=name)


def test_finish_measuring_on_a_model():
    model = _rescale18()
    assert all(m.measuring for m in rescale_core.mean_shift_layers(model))
    rescale_core.finish_measuring(model)
    layers = rescale_core.mean_shift_layers(model)
    assert all(not m.measuring and int(m.count) == 8 for m in layers)
    model.train()(torch.randn(2, 3, 32, 32) + 5)
    assert all(torch.count_nonzero(m.mu0) == 0 for m in layers)


# --------------------------------------------------------------- the other small layers
def test_scalar_bias_and_gain():
    sb = ScalarBias()
    assert sb.bias.shape == (1,) and float(sb.bias.detach()) == 0.0
    x = torch.randn(2, 3)
    with torch.no_grad():
        sb.bias.fill_(0.5)
    torch.testing.assert_close(sb(x), x + 0.5)
    g = Gain(0.0)
    assert torch.count_nonzero(g(x)) == 0
    v = Gain(2.0, channel_shape(3, 2))
    assert v.weight.shape == (1, 3, 1, 1)
    y = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(v(y), 2 * y)


def test_make_norm():
    assert isinstance(make_norm(None, 8), nn.Identity) and isinstance(make_norm("none", 8), nn.Identity)
    assert isinstance(make_norm("bn", 8, 3), nn.BatchNorm3d)
    assert isinstance(make_norm("bn", 8, 0), nn.BatchNorm1d)
    gn = make_norm("gn", 48)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 16  # 32 does not divide 48
    assert make_norm("gn", 8).num_groups == 8
    assert isinstance(make_norm("ln", 8), nn.LayerNorm)
    with pytest.raises(ValueError, match="unknown norm"):
        make_norm("instance", 8)


def test_factories():
    assert isinstance(conv_nd(3, 2, 4, 3), nn.Conv3d)
    assert isinstance(pool_nd("max", 1, 2), nn.MaxPool1d)
    assert isinstance(dropout_nd(0.0, 2), nn.Identity)
    assert isinstance(dropout_nd(0.1, 3), nn.Dropout3d) and isinstance(dropout_nd(0.1, 0), nn.Dropout)


def test_strided_avg_pool_matches_the_strided_conv_size():
    x = torch.randn(2, 3, 8, 6)
    torch.testing.assert_close(StridedAvgPool(2, 2)(x), nn.AvgPool2d(2)(x))  # the official pool
    for n in (1, 2, 5, 7, 14):
        y = torch.randn(1, 2, n, n + 1)
        conv = nn.Conv2d(2, 2, 3, stride=2, padding=1)
        assert StridedAvgPool(2, 2)(y).shape == conv(y).shape
    odd = torch.arange(7.0).view(1, 1, 7)
    torch.testing.assert_close(StridedAvgPool(2, 1)(odd), torch.tensor([[[0.5, 2.5, 4.5, 6.0]]]))
    clip = torch.randn(1, 2, 1, 4, 4)
    torch.testing.assert_close(StridedAvgPool(2, 3)(clip), clip.view(1, 2, 1, 2, 2, 2, 2).mean((4, 6)))
