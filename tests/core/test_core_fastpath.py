"""The fast plans (``rescale_core.plans``) compute the same function as the reference paths:
RescaleNet's mean-shift biases (Shao et al. 2020) folded into conv biases / across ReLUs, the
branch multipliers of RescaleNet, SkipInit (De & Smith 2020), Fixup (Zhang et al. 2019) and
ReZero (Bachlechner et al. 2020) folded into the last conv, and the skip multipliers carried
along a ResNet. Outputs, gradients of every parameter and of the input, and the mean-shift
state (during and after measuring) must agree; channels_last too (compiled training:
test_core_plans.py)."""
from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import logging

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core import (MeanShiftBias, ResidualBlock, ResidualSublayer, Scheme, get_scheme,
                          reference_path)
from rescale_core.schemes import SchemeOptionError
from rescale_core import blocks, plans, schemes
from rescale_core.plans import conditions, folded
from rescale_core.plans import folds as fp
from rescale_core.plans.shared import carries_scale
from rescale_core.models.resnet import ResNet
from rescale_core.models import vgg as vgg_module
from rescale_core.models.vgg import VGG
from rescale_core.testing import randomise_

F64 = dict(rtol=1e-9, atol=1e-11)
F32 = dict(rtol=1e-4, atol=1e-5)
# float32 gradients of gains and biases are sums over a whole batch, taken in another order by
# the fast path (over the folded weights instead of the activations): rounding ~1e-4 relative.
F32_SUMS = dict(rtol=1e-3, atol=1e-4)


# --------------------------------------------------------------- helpers
# the execution plans (rescale_core.plans) that compute the reference function another way
FAST_PLANS = ["folded", "lean"]


def _pair(model: nn.Module, plan: str = "folded") -> tuple[nn.Module, nn.Module]:
    """(fast, reference) copies of ``model``, the fast one on ``plan``."""
    ref = copy.deepcopy(model)
    for m in ref.modules():
        if isinstance(getattr(m, "fused", None), bool):
            m.fused = False
    return rescale_core.set_plan(model, plan), ref


def _step(model: nn.Module, x: torch.Tensor, seed: int, backward: bool = True):
    """One forward (dropout seeded) and backward with a fixed random cotangent; returns the
    output, the input's gradient and every parameter's gradient (then cleared)."""
    x = x.clone().requires_grad_(backward)
    torch.manual_seed(seed)
    out = model(x)
    if not backward:
        return out.detach(), None, {}
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 100), dtype=out.dtype)
    (out * g).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


def _assert_same(fused, ref, tol, what=""):
    out_f, gx_f, grads_f = fused
    out_r, gx_r, grads_r = ref
    torch.testing.assert_close(out_f, out_r, **tol, msg=lambda m: f"{what} output: {m}")
    if gx_r is not None:
        torch.testing.assert_close(gx_f, gx_r, **tol, msg=lambda m: f"{what} input grad: {m}")
    assert grads_f.keys() == grads_r.keys(), what
    # a gradient far below the largest (an attention's key bias: 0 but for rounding) is compared
    # at 1e-3 of the largest, the scale of the rounding of the terms that cancel in it
    floor = 1e-3 * max([1.0] + [float(g.abs().max()) for g in grads_r.values()])
    for name in grads_r:
        scale = max(float(grads_r[name].abs().max()), floor)
        t = F32_SUMS if tol is F32 and grads_r[name].dim() != 4 else tol
        torch.testing.assert_close(grads_f[name] / scale, grads_r[name] / scale, **t,
                                   msg=lambda m: f"{what} grad of {name}: {m}")


def _assert_same_state(a: nn.Module, b: nn.Module, tol=F64, what=""):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        if sa[k].is_floating_point():
            torch.testing.assert_close(sa[k], sb[k], **tol, msg=lambda m: f"{what} {k}: {m}")
        else:
            assert torch.equal(sa[k], sb[k]), (what, k)
    ca = [m._count for m in rescale_core.mean_shift_layers(a)]
    assert ca == [m._count for m in rescale_core.mean_shift_layers(b)], what


def _block(scheme: str, kind: str, d: int, dropout: float, stride: int = 2, **options):
    torch.manual_seed(0)
    s = get_scheme(scheme, measure_batches=2, conv_dropout=dropout, **options)
    cin, planes = (16, 8) if kind == "bottleneck" else (16, 16)
    block = ResidualBlock(s, cin, planes, stride=stride, kind=kind, k=2, L=5, spatial_dims=d,
                          conv_dropout=dropout)
    randomise_(block)
    return block


def _block_input(d: int, size: str, dtype=torch.float64) -> torch.Tensor:
    # "wide": the 1x1 convs fold their input offsets into their bias (weight smaller than input);
    # "tiny": 2 samples of 1-2 pixels: the offsets are added to the activations instead.
    shape = {("wide", 2): (4, 16, 9, 9), ("tiny", 2): (2, 16, 2, 1),
             ("wide", 3): (2, 16, 3, 6, 5), ("tiny", 3): (2, 16, 1, 2, 1)}[(size, d)]
    return torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=dtype).add_(0.5)


BLOCK_SCHEMES = ["rescale", "fixup", "skipinit", "rezero", "bn", "none"]


# --------------------------------------------------------------- blocks: every scheme and case
@pytest.mark.parametrize("dropout", [0.0, 0.25], ids=["nodrop", "drop"])
@pytest.mark.parametrize("d", [2, 3], ids=["2d", "3d"])
@pytest.mark.parametrize("kind", ["basic", "bottleneck"])
@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_block_fused_equals_reference(scheme, kind, d, dropout, plan):
    """float64, 4 steps: train while measuring (2 batches), train after, eval, train no_grad;
    both input sizes (offsets folded into 1x1 convs or added); outputs, input and parameter
    gradients, and the state (mu0, counts) after every step."""
    for size in ("wide", "tiny"):
        block = _block(scheme, kind, d, dropout).double()
        fused, ref = _pair(block, plan)
        x = _block_input(d, size)
        x_before = x.clone()
        for step, (train, grad) in enumerate([(True, True), (True, True), (True, True),
                                              (False, True), (True, False)]):
            fused.train(train), ref.train(train)
            with torch.set_grad_enabled(grad):
                got = _step(fused, x + step, seed=step, backward=grad)
                want = _step(ref, x + step, seed=step, backward=grad)
            what = f"{scheme}/{kind}/{d}d/p={dropout}/{size}/step {step}"
            _assert_same(got, want, F64, what)
            _assert_same_state(fused, ref, F64, what)
            assert torch.equal(x, x_before), "the fast path modified its input"
        if scheme == "rescale":
            assert not any(m.measuring for m in rescale_core.mean_shift_layers(fused))


@pytest.mark.parametrize("scheme, options", [
    ("rescale", {"gain": "vector"}), ("rescale", {"fixed_beta": False, "c": 3.0}),
    ("skipinit_reg", {}), ("bn_scaled", {}), ("bn_merge", {}), ("gn", {}),
    ("fixup", {"gain": "vector"}), ("rezero", {"conv_bias": True}),
])
@pytest.mark.parametrize("kind", ["basic", "bottleneck"])
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_block_variants_fused_equals_reference(scheme, options, kind, plan):
    for dropout, size, stride in itertools.product((0.0, 0.25), ("wide", "tiny"), (1, 2)):
        block = _block(scheme, kind, 2, dropout, stride=stride, **options).double()
        fused, ref = _pair(block, plan)
        x = _block_input(2, size)
        for step in range(3):
            got, want = _step(fused, x * (step + 1), step), _step(ref, x * (step + 1), step)
            _assert_same(got, want, F64, f"{scheme}{options}/{kind}/p={dropout}/{size}/s={stride}")
            _assert_same_state(fused, ref)


@pytest.mark.parametrize("scheme", BLOCK_SCHEMES)
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_block_float32(scheme, plan):
    for kind, d, dropout in itertools.product(("basic", "bottleneck"), (2, 3), (0.0, 0.25)):
        block = _block(scheme, kind, d, dropout)
        fused, ref = _pair(block, plan)
        x = _block_input(d, "wide", torch.float32)
        for step in range(3):
            _assert_same(_step(fused, x, step), _step(ref, x, step), F32, f"{scheme}/{kind}/{d}d")
            _assert_same_state(fused, ref, F32)


def test_scaled_units_block_equals_reference():
    """``folded_block(block, x, c_in, c_out)``: on input ``x / c_in`` the block returns its output / ``c_out``."""
    for scheme, kind in itertools.product(("rescale", "fixup", "skipinit"), ("basic", "bottleneck")):
        block = _block(scheme, kind, 2, 0.0).double()
        if scheme == "rescale":
            rescale_core.finish_measuring(block)
        assert carries_scale(block)
        x = _block_input(2, "wide")
        c_in, c_out = 0.7, 0.7 * 0.9
        ref = block._forward_reference(x)
        torch.testing.assert_close(folded.folded_block(block, x / c_in, c_in, c_out) * c_out, ref, **F64)
    assert not carries_scale(_block("bn", "basic", 2, 0.0))
    measuring = _block("rescale", "basic", 2, 0.0).train()
    assert not carries_scale(measuring) and carries_scale(measuring.eval())


# --------------------------------------------------------------- whole models
MODEL_CASES = [("resnet50", s) for s in ("rescale", "fixup", "skipinit", "rezero", "bn", "none")] + [
    ("resnet3d_18", "rescale"), ("resnet3d_50", "fixup"), ("cifar_resnet", "rescale"),
    ("resnext50_32x4d", "rescale"), ("resnet18", "rescale")]


def _model(name: str, scheme: str, dtype=torch.float64, **options):
    torch.manual_seed(0)
    kwargs = {"cifar_resnet": dict(depth=8, base_width=8), "resnext50_32x4d": dict(base_width=16)}
    opts = {"measure_batches": 2, **options}
    model = rescale_core.create_model(name, scheme=scheme, num_classes=5, scheme_options=opts,
                                      **kwargs.get(name, dict(base_width=8)))
    randomise_(model, gain=0.15)
    return model.to(dtype)


def _model_input(name: str, batch: int = 3, dtype=torch.float64) -> torch.Tensor:
    shape = (batch, 3, 4, 32, 32) if "3d" in name else (batch, 3, 32, 32)
    return torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=dtype) + 0.3


@pytest.mark.parametrize("name, scheme", MODEL_CASES, ids=[f"{n}-{s}" for n, s in MODEL_CASES])
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_model_training_trajectory(name, scheme, plan):
    """4 SGD steps (2 measuring), then eval: same outputs, gradients, parameters and state."""
    fused, ref = _pair(_model(name, scheme), plan)
    x = _model_input(name)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (fused, ref)]
    for step in range(4):
        fused.train(), ref.train()
        got, want = _step(fused, x + 0.1 * step, step), _step(ref, x + 0.1 * step, step)
        _assert_same(got, want, F64, f"{name}/{scheme} step {step}")
        for model, opt, grads in ((fused, opts[0], got[2]), (ref, opts[1], want[2])):
            for n, p in model.named_parameters():
                p.grad = grads.get(n)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        _assert_same_state(fused, ref, F64, f"{name}/{scheme} step {step}")
    assert torch.isfinite(got[0]).all()
    fused.eval(), ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ref(x), **F64)
        torch.testing.assert_close(fused.forward_features(x), ref.forward_features(x), **F64)


@pytest.mark.parametrize("scheme", ["rescale", "fixup", "skipinit"])
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_model_float32_and_dropout(scheme, plan):
    model = _model("resnet50", scheme, torch.float32, conv_dropout=0.1, classifier_dropout=0.2)
    fused, ref = _pair(model, plan)
    x = _model_input("resnet50", dtype=torch.float32)
    for step in range(3):
        _assert_same(_step(fused, x, step), _step(ref, x, step), F32, f"{scheme} step {step}")
        _assert_same_state(fused, ref, F32)


def test_scaled_stream_is_used_and_undone():
    """RescaleNet's fast ResNet carries the product of the skip multipliers instead of applying
    them: no block output (but the features returned) is in true units."""
    model = plans.set_frozen(_model("resnet18", "rescale").eval(), False)  # the folded plan, not the frozen one
    rescale_core.finish_measuring(model)
    x = _model_input("resnet18")
    blocks = [b for _, b in rescale_core.analysis.residual_blocks(model)]
    calls = []
    original = folded.folded_block

    def spy(self, x, c_in, c_out):
        calls.append((c_in, c_out))
        return original(self, x, c_in, c_out)

    folded.folded_block = spy
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        folded.folded_block = original
    alphas = [b.merge.skip_scale for b in blocks]
    c = 1.0
    for (c_in, c_out), a in zip(calls, alphas):
        assert c_in == pytest.approx(c) and c_out == pytest.approx(c * a)
        c = c_out
    assert len(calls) == len(blocks) and c < 0.8
    with reference_path(model), torch.no_grad():
        torch.testing.assert_close(out, model(x), **F64)


# --------------------------------------------------------------- paths, hooks, probes
def test_reference_path_context_restores_flags():
    model = _model("resnet18", "rescale")
    model.layer2[0].fused = False
    flags = {n: m.fused for n, m in model.named_modules() if hasattr(m, "fused")}
    assert flags[""] and flags["layer1.0"] and not flags["layer2.0"]
    with reference_path(model):
        assert not any(m.fused for m in model.modules() if hasattr(m, "fused"))
    assert flags == {n: m.fused for n, m in model.named_modules() if hasattr(m, "fused")}
    with pytest.raises(RuntimeError):
        with reference_path(model):
            raise RuntimeError
    assert flags == {n: m.fused for n, m in model.named_modules() if hasattr(m, "fused")}


def test_hooks_on_bypassed_modules_select_the_reference_path():
    """A hook on a module the fast path folds away must still fire (with the reference
    tensors): blocks with hooks inside fall back, the others stay fused."""
    model = _model("resnet18", "rescale").eval()
    rescale_core.finish_measuring(model)
    x = _model_input("resnet18")
    seen = []
    h1 = model.layer1[0].shift2.register_forward_hook(lambda m, a, o: seen.append("shift2"))
    h2 = model.layer3[1].merge.register_forward_pre_hook(lambda m, a: seen.append("merge"))
    h3 = model.pool_shift.register_forward_hook(lambda m, a, o: seen.append("pool"))
    called = []
    spy = lambda name: (lambda m, a: called.append(name))  # noqa: E731
    handles = [b.register_forward_pre_hook(spy(n)) for n, b in rescale_core.analysis.residual_blocks(model)]
    with torch.no_grad():
        out = model(x)
    assert seen == ["shift2", "merge", "pool"]
    assert len(called) == 8  # block-level hooks: those blocks are called as modules
    for h in [h1, h2, h3, *handles]:
        h.remove()
    with torch.no_grad(), reference_path(model):
        torch.testing.assert_close(out, model(x), **F64)
    seen.clear()
    with torch.no_grad():
        model(x)
    assert seen == []


def test_probes_agree_with_the_reference_model():
    model = _model("resnet50", "rescale", torch.float32)
    x = _model_input("resnet50", 4, torch.float32)
    a = rescale_core.analysis.signal_propagation(model, x)
    with reference_path(model):
        b = rescale_core.analysis.signal_propagation(model, x)
    assert a == b and len(a) == 16
    assert all(m.fused for m in model.modules() if hasattr(m, "fused"))


# --------------------------------------------------------------- channels_last
@pytest.mark.parametrize("name, fmt", [("resnet50", torch.channels_last),
                                       ("resnet3d_18", torch.channels_last_3d)])
@pytest.mark.parametrize("scheme", ["rescale", "fixup", "skipinit"])
def test_channels_last(name, fmt, scheme):
    model = _model(name, scheme, torch.float32)
    rescale_core.finish_measuring(model)
    cl = copy.deepcopy(model).to(memory_format=fmt)
    x = _model_input(name, dtype=torch.float32)
    xc = x.contiguous(memory_format=fmt)
    # every block's output keeps the layout (checked without hooks: hooks select the reference)
    for block in (b for _, b in rescale_core.analysis.residual_blocks(cl)):
        assert block.fused
    h = cl.maxpool(folded.folded_stem(cl, xc))
    assert h.is_contiguous(memory_format=fmt)
    for name_, block in rescale_core.analysis.residual_blocks(cl):
        h = block(h)
        assert h.is_contiguous(memory_format=fmt), name_
    _assert_same(_step(cl, xc, 0), _step(model, x, 0), F32, "channels_last")
    assert cl.forward_features(xc).is_contiguous(memory_format=fmt)


# --------------------------------------------------------------- memory: saved activations
def _saved_bytes(model, x) -> int:
    """Bytes of distinct non-parameter storages autograd keeps for backward (the activations)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("scheme", ["rescale", "fixup", "skipinit"])
def test_fast_path_saves_fewer_activations_than_batchnorm(scheme):
    """Measured at full size (ResNet-50, batch 16, 224 px): BN 1375 MB, no norm 663 MB,
    rescale 706 MB (reference path 1609 MB), fixup 684 MB (1676), skipinit 683 MB (1017)."""
    x = _model_input("resnet50", 8, torch.float32)
    model = _model("resnet50", scheme, torch.float32).train()
    rescale_core.finish_measuring(model)
    fused = _saved_bytes(model, x)
    with reference_path(model):
        ref = _saved_bytes(model, x)
    bn = _saved_bytes(_model("resnet50", "bn", torch.float32).train(), x)
    assert fused < ref and fused < 0.8 * bn, (fused, ref, bn)


# --------------------------------------------------------------- mean-shift bookkeeping
def test_mean_shift_flag_follows_the_counter():
    layer = MeanShiftBias(3, measure_batches=2)
    assert layer.measuring and layer._measuring
    layer._count = 2
    assert not layer.measuring and not layer._measuring
    layer.measure_batches = 5
    assert layer.measuring
    layer.finish_measuring()
    assert not layer.measuring and layer._count == 5 and int(layer.count) == 5
    x = torch.randn(4, 3, 2, 2)
    torch.testing.assert_close(layer(x), x + layer.offset(x))
    layer.train()
    assert not layer.updating
    fresh = MeanShiftBias(3, measure_batches=1).train()
    assert fresh.updating
    with torch.no_grad():
        assert not fresh.updating
    fresh.offset()  # without an input: never measures
    assert fresh._count == 0
    fresh.offset(x)
    assert fresh._count == 1 and not fresh.updating


def test_mean_shift_unpickles_old_modules():
    import pickle

    layer = MeanShiftBias(3, measure_batches=4)
    state = layer.__getstate__() if hasattr(layer, "__getstate__") else dict(layer.__dict__)
    old = {k: v for k, v in state.items() if k not in ("_n", "_measuring", "_measure_batches")}
    old.update(_count=2, measure_batches=4)  # the attributes of the earlier layout
    restored = MeanShiftBias.__new__(MeanShiftBias)
    restored.__setstate__(dict(old))
    assert restored._count == 2 and restored.measure_batches == 4 and restored.measuring
    again = pickle.loads(pickle.dumps(restored))
    assert again._count == 2 and again.measuring


def test_fold_helpers():
    torch.manual_seed(0)
    for groups, k in ((1, 1), (2, 1), (1, 3)):
        conv = nn.Conv2d(4, 6, k, padding=0, groups=groups, bias=True)
        x, e = torch.randn(2, 4, 5, 5), torch.randn(1, 4, 1, 1)
        want = conv(x + e)
        got = conv._conv_forward(x, conv.weight, conv.bias + fp.input_offset_bias(conv.weight, e, groups))
        torch.testing.assert_close(got, want, **F32)
        s = torch.randn(1)
        got = conv._conv_forward(x, conv.weight, conv.bias + fp.input_offset_bias(conv.weight, s, groups))
        torch.testing.assert_close(got, conv(x + s), **F32)
    padded = nn.Conv2d(4, 6, 3, padding=1)
    assert not fp.folds_input_offset(padded, 10 ** 9)
    assert fp.folds_input_offset(nn.Conv2d(4, 6, 1), 24) and not fp.folds_input_offset(nn.Conv2d(4, 6, 1), 23)
    assert fp.conv_out_numel(padded, torch.empty(2, 4, 7, 9)) == 2 * 6 * 7 * 9
    assert fp.conv_out_numel(nn.Conv2d(4, 6, 3, stride=2, padding=1), torch.empty(2, 4, 7, 9)) == 2 * 6 * 4 * 5
    # the ReLU with an offset: value and gradients of relu(u) + e, ReLU's tie rule at u = 0
    u = torch.tensor([[-1.0, 0.0, 2.0], [0.5, -0.2, 0.0]]).view(1, 2, 3, 1)
    e = torch.tensor([0.3, -0.7]).view(1, 2, 1, 1)
    for compiling in (False, True):
        uu, ee = u.clone().requires_grad_(), e.clone().requires_grad_()
        z = uu + ee.detach()
        if compiling:
            y = torch.where(z > ee.detach(), z, ee.detach()) + (ee - ee.detach())
        else:
            y = fp.shifted_relu(z, ee)
        g = torch.arange(6.0).view_as(y)
        (y * g).sum().backward()
        uu2, ee2 = u.clone().requires_grad_(), e.clone().requires_grad_()
        ((torch.relu(uu2) + ee2) * g).sum().backward()
        torch.testing.assert_close(y.detach(), torch.relu(u) + e)
        torch.testing.assert_close(uu.grad, uu2.grad)
        torch.testing.assert_close(ee.grad, ee2.grad)


# --------------------------------------------------------------- no host syncs
def test_no_host_sync_in_fused_training_step(count_host_syncs):
    model = _model("resnet50", "rescale", torch.float32, measure_batches=1).train()
    x = _model_input("resnet50", dtype=torch.float32)
    with count_host_syncs() as probe:
        for _ in range(2):  # measuring step, then a measured one
            model(x).sum().backward()
        with torch.no_grad():
            model.eval()(x)
    assert probe.syncs == 0


# --------------------------------------------------------------- bf16 autocast
def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6))


def _train_steps(model: nn.Module, inputs, autocast: bool, steps: int = 3):
    """``steps`` train steps, under CPU bf16 autocast (the dtype the GPU benchmark runs) or in
    float32: the outputs and every parameter's gradient of each step."""
    out = []
    for step in range(steps):
        torch.manual_seed(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = model(*inputs)
        y.float().pow(2).mean().backward()
        out.append([y.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
        model.zero_grad(set_to_none=True)
    return out


BF16_CASES = [("resnet50", "rescale", torch.channels_last), ("resnet50", "fixup", torch.channels_last),
              # contiguous: CPU bf16 conv3d weight gradients in channels_last_3d are inf when the
              # time axis is 2 (a oneDNN bug in torch 2.14, not in this code)
              ("resnet3d_18", "rescale", None), ("resnet18", "skipinit", None),
              ("transformer_tiny", "rescale", None)]


@pytest.mark.parametrize("name, scheme, fmt", BF16_CASES, ids=[f"{n}-{s}" for n, s, _ in BF16_CASES])
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_bf16_autocast_fast_path_matches_reference(name, scheme, fmt, plan):
    """The fast path under bf16 autocast (and channels_last), across the measuring boundary:
    the skip path in the reference's dtype, the same
    measuring state, and outputs and float32 gradients of every parameter about as close to a
    float32 run as the reference path's under the same autocast. Not closer than that: bf16
    rounding alone moves some gradients of these small randomised nets by 10-60%, and the two
    paths round in different places (the fast path folds offsets into float32 conv biases that
    autocast casts once, the reference adds them in bf16); per parameter the fast path's errors
    may be a few times the reference's on a bias whose gradient is a sum with heavy
    cancellation, over all gradients together about the reference's. A wrong fold, scale or
    dtype errs by O(1)."""
    if name.startswith("transformer"):
        torch.manual_seed(0)
        model = rescale_core.create_model(name, scheme=scheme, src_vocab_size=40, dropout=0.0,
                                          scheme_options={"gain": "vector"})
        randomise_(model)
        inputs = (_tokens(3, 7, 1), _tokens(3, 5, 2))
    else:
        model = _model(name, scheme, torch.float32)
        x = _model_input(name, dtype=torch.float32)
        if fmt is not None:
            model, x = model.to(memory_format=fmt), x.contiguous(memory_format=fmt)
        inputs = (x,)
    fused, ref = _pair(model, plan)
    exact = copy.deepcopy(ref)
    features = (lambda m: m.encode(inputs[0])[0]) if name.startswith("transformer") else (
        lambda m: m.forward_features(inputs[0]))
    # the skip path: a ResNet's stays in the autocast dtype, as a BN ResNet's (the scheme's
    # offsets and gains act in the activation's dtype); a Transformer's stays float32 (float32
    # embeddings plus bf16 branches, as in post-/pre-LN models)
    stream = torch.float32 if name.startswith("transformer") else torch.bfloat16
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert features(fused).dtype == features(ref).dtype == stream
    runs = [_train_steps(m, inputs, autocast) for m, autocast in ((fused, True), (ref, True), (exact, False))]
    for step, (got, want, truth) in enumerate(zip(*runs)):
        assert len(got) == len(want) == len(truth)
        assert got[0].dtype == want[0].dtype
        assert _rel_err(got[0], truth[0]) <= 1.5 * _rel_err(want[0], truth[0]) + 0.02, (name, step)
        flat = [torch.cat([g.flatten() for g in run[1:]]) for run in (got, want, truth)]
        assert torch.isfinite(flat[0]).all(), (name, step)
        assert _rel_err(flat[0], flat[2]) <= 2 * _rel_err(flat[1], flat[2]) + 0.02, (name, step)
        biggest = max(float(t.norm()) for t in truth[1:])
        for i, (g, w, t) in enumerate(zip(got[1:], want[1:], truth[1:])):
            assert g.dtype == torch.float32
            if float(t.norm()) < 1e-3 * biggest:
                continue  # a gradient that is ~0 (e.g. a key bias): relative errors mean nothing
            err_fused, err_ref = _rel_err(g, t), _rel_err(w, t)
            assert err_fused <= max(4 * err_ref, 0.5), (name, step, i, err_fused, err_ref)
    for a, b in zip(rescale_core.mean_shift_layers(fused), rescale_core.mean_shift_layers(ref)):
        assert a._count == b._count
        torch.testing.assert_close(a.mu0, b.mu0, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------- Transformer
TF_SCHEMES = rescale_core.list_schemes("transformer")


def _transformer(scheme: str, **kw):
    torch.manual_seed(0)
    model = rescale_core.create_model("transformer_tiny", scheme=scheme, src_vocab_size=40,
                                      dropout=0.2, **kw).double()
    randomise_(model)
    return model


def _tokens(b, t, seed):
    tok = torch.randint(3, 40, (b, t), generator=torch.Generator().manual_seed(seed))
    tok[0, -2:] = 1  # some right padding
    return tok


@pytest.mark.parametrize("scheme", TF_SCHEMES)
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_transformer_fused_equals_reference(scheme, plan):
    options = {"gain": "vector"} if scheme == "rescale" else None
    for opts in (None, options):
        _transformer_same(scheme, opts, plan)


@pytest.mark.parametrize("plan", FAST_PLANS)
@pytest.mark.parametrize("scheme, gain", [("skipinit", "scalar"), ("rescale", "vector"), ("pre_ln", None)])
def test_transformer_scalar_biases_equal_reference(scheme, gain, plan):
    """A Transformer scheme given Fixup's scalar bias after the merge multiplier (a SkipInit with
    a learned bias: ``scalar_biases``) computes the reference on every plan: the bias enters the
    output and gets its gradient, with a gain (scalar or per feature) or without."""
    model = _transformer_same(scheme, {"scalar_biases": True, "gain": gain}, plan)
    assert any(n.endswith("merge.bias.bias") for n, _ in model.named_parameters())


def _transformer_same(scheme: str, options: dict | None, plan: str) -> nn.Module:
    """A tiny Transformer of ``scheme`` under ``options`` on ``plan`` computes the reference's
    outputs and every parameter's gradient, in training and in evaluation; returns it."""
    fused, ref = _pair(_transformer(scheme, scheme_options=options), plan)
    src, tgt = _tokens(3, 7, 1), _tokens(3, 5, 2)
    for train in (True, False):
        fused.train(train), ref.train(train)
        outs = []
        for model in (fused, ref):
            torch.manual_seed(3)
            out = model(src, tgt)
            out.pow(2).mean().backward()
            outs.append((out.detach(), None, {n: p.grad.clone() for n, p in model.named_parameters()
                                              if p.grad is not None}))
            model.zero_grad(set_to_none=True)
        _assert_same(outs[0], outs[1], F64, f"transformer {scheme} {options} train={train}")
    return fused


@pytest.mark.parametrize("rows", [2, 40])  # the scale on the activations / on the weight
@pytest.mark.parametrize("scale", ["float", "scalar", "vector"])
@pytest.mark.parametrize("bias", [True, False])
def test_scaled_linear_gradients(rows, scale, bias):
    """``scaled_linear`` is ``s * layer(x)`` with exact gradients for x, W, b and s (gradcheck
    in float64) on both sides of its weight-or-output choice."""
    torch.manual_seed(0)
    layer = nn.Linear(6, 5, bias=bias).double()
    x = torch.randn(rows, 3, 6, dtype=torch.float64, requires_grad=True)
    s = {"float": 0.7, "scalar": torch.tensor([0.7], dtype=torch.float64, requires_grad=True),
         "vector": torch.randn(5, dtype=torch.float64, requires_grad=True)}[scale]
    params = [x, layer.weight] + ([layer.bias] if bias else []) + ([s] if scale != "float" else [])

    def fn(*args):
        return fp.scaled_linear(layer, x, s)

    assert torch.autograd.gradcheck(fn, params)
    torch.testing.assert_close(fp.scaled_linear(layer, x, s), layer(x) * s, **F64)
    with torch.no_grad():
        torch.testing.assert_close(fp.scaled_linear(layer, x, s), layer(x) * s, **F64)


@pytest.mark.parametrize("rows", [2, 40])
def test_scaled_linear_saves_no_weight_copy(rows):
    """Backward keeps only the input, the parameters and the multiplier (no folded weight):
    the reason a Transformer's gains cost no memory."""
    layer = nn.Linear(6, 5)
    x = torch.randn(rows, 6, requires_grad=True)
    gain = torch.full((1,), 0.5, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fp.scaled_linear(layer, x, gain).sum().backward()
    allowed = {t.data_ptr() for t in (x, layer.weight, layer.bias, gain)}
    assert saved and {t.data_ptr() for t in saved} <= allowed


def test_sublayer_fused_only_with_known_branches():
    sub = ResidualSublayer(get_scheme("rescale"), 8, nn.Linear(8, 8), 2, 6)
    x = torch.randn(2, 3, 8)
    before = x.clone()
    out = sub(x)  # a plain Linear branch takes no out_scale: reference path
    torch.testing.assert_close(out, sub._forward_reference(x))
    assert torch.equal(x, before)


@pytest.mark.parametrize("scheme", ["rescale", "post_ln"])
def test_transformer_sync_free_masks(scheme, count_host_syncs):
    model = _transformer(scheme).eval()
    free = copy.deepcopy(model)
    free.encoder.mask_check = free.decoder.mask_check = False
    for src, tgt in ((_tokens(3, 7, 1), _tokens(3, 5, 2)),  # padded source
                     (torch.randint(3, 40, (2, 6)), torch.randint(3, 40, (2, 4)))):  # none
        left = tgt.clone()
        left[0, 0] = 1  # padding before a real token: explicit causal mask
        for t in (tgt, left):
            with torch.no_grad():
                want = model(src, t)
                with count_host_syncs() as probe:
                    got = free(src, t)
            assert probe.syncs == 0
            torch.testing.assert_close(got, want, **F64)
    built = rescale_core.create_model("transformer_tiny", src_vocab_size=40, mask_check=False)
    assert not built.encoder.mask_check and not built.decoder.mask_check


# --------------------------------------------------------------- torch.compile
# --------------------------------------------------------------- VGG
@pytest.mark.parametrize("scheme", ["rescale", "none", "bn"])
@pytest.mark.parametrize("plan", FAST_PLANS)
def test_vgg_fused_equals_reference(scheme, plan):
    torch.manual_seed(0)
    model = rescale_core.create_model("vgg11", scheme=scheme, base_width=8, hidden_dim=16,
                                      num_classes=5, scheme_options={"measure_batches": 2})
    randomise_(model)
    fused, ref = _pair(model.double(), plan)
    x = _model_input("vgg11")
    for step in range(3):
        _assert_same(_step(fused, x, step), _step(ref, x, step), F64, f"vgg/{scheme} step {step}")
        _assert_same_state(fused, ref)
    fused.eval(), ref.eval()
    _assert_same(_step(fused, x, 9), _step(ref, x, 9), F64, f"vgg/{scheme} eval")


@pytest.mark.parametrize("scheme", ["fixup", "skipinit"])
def test_fx_tracing_records_the_reference_modules(scheme):
    """torch.fx records module calls: under symbolic tracing the models take the reference path.
    (RescaleNet's shortcut pool reads input sizes, which fx cannot trace, with or without it.)"""
    model = _model("resnet18", scheme, torch.float32).eval()
    gm = torch.fx.symbolic_trace(model)
    x = _model_input("resnet18", dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), **F32)
    called = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    assert {"layer1.0.relu", "layer1.0.conv1", "relu"} <= called  # the fast path calls neither ReLU


def test_measuring_step_sees_layers_added_after_a_forward():
    """The cached list of mean-shift layers follows the model's structure: a layer added or
    replaced after the first forward (a wrapper, a new head) is seen at once."""
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3,
                                      scheme_options={"measure_batches": 1}).train()
    x = torch.randn(2, 3, 32, 32)
    model(x)
    assert not plans.measuring_step(model)  # every layer has measured its one batch
    model.fc_bias = MeanShiftBias(model.fc.in_features, spatial_dims=0, measure_batches=1)
    assert plans.measuring_step(model)
    model.fc_bias = nn.Identity()  # and a removed one is forgotten
    assert not plans.measuring_step(model)


# --------------------------------------------------------------- schemes the fast path implements
@dataclasses.dataclass(frozen=True)
class ClippedScheme(Scheme):
    """A scheme with a switch the fast path was not written for (it would clip the branch)."""

    branch_clip: float = 0.0


def _clipped(name: str = "rescale") -> ClippedScheme:
    return ClippedScheme(**vars(get_scheme(name)), branch_clip=0.5)


# the shipped schemes the training plans (lean, folded) were not written for yet, and the fields
# that say so: they train on the reference and evaluate on the frozen plan (tests/core/test_nf_resnet.py)
REFERENCE_ONLY = {"nf": ["scaled_ws", "layout", "init"], "nf_skipinit": ["scaled_ws", "layout", "init"]}


def test_registered_schemes_are_implemented():
    """Every shipped scheme but NF-ResNet's runs the fast path, and every one the frozen plan:
    ``IMPLEMENTED_FIELDS`` lists exactly the fields of ``Scheme`` (a field added without a
    decision on the fast path fails here), ``PLAN_FIELDS`` only some of them."""
    fields = {f.name: f.default for f in dataclasses.fields(Scheme)}
    unlisted = {name: fields[name] for name in sorted(set(fields) - set(plans.IMPLEMENTED_FIELDS))}
    assert not unlisted, (f"Scheme fields missing from rescale_core.plans.IMPLEMENTED_FIELDS: {unlisted}; list each "
                          "with its default value only until the fast plans compute it, e.g. "
                          + ", ".join(f"{name!r}: ({value!r},)" for name, value in unlisted.items())
                          + ' (docs/design.md, "Adding a scheme")')
    assert set(plans.IMPLEMENTED_FIELDS) <= set(fields), "IMPLEMENTED_FIELDS names fields Scheme does not have"
    for fields in plans.PLAN_FIELDS.values():  # a plan's table only adds to the common one
        for name, values in fields.items():
            common = plans.IMPLEMENTED_FIELDS[name]
            assert values is None or (common is not None and set(common) <= set(values)), name
    for name in rescale_core.list_schemes():
        assert plans.unimplemented(get_scheme(name)) == REFERENCE_ONLY.get(name, []), name
        assert plans.implements(get_scheme(name)) == (name not in REFERENCE_ONLY)
        assert plans.unimplemented(get_scheme(name), plans.FROZEN) == [], name


def _count_paths(monkeypatch) -> collections.Counter:
    """Calls of each module type's fast plans (the implementations registered for it) and of
    the blocks' reference."""
    calls = collections.Counter()

    def spy(original, key):
        def counted(*args, **kwargs):
            calls[key] += 1
            return original(*args, **kwargs)
        return counted

    for cls in (ResidualBlock, ResidualSublayer, ResNet, VGG):
        monkeypatch.setattr(cls, "plan_implementations", {
            plan: impl._replace(run=spy(impl.run, f"{cls.__name__}.fused:{plan}"))
            for plan, impl in cls.plan_implementations.items()})
    for cls in (ResidualBlock, ResidualSublayer):
        monkeypatch.setattr(cls, "_forward_reference",
                            spy(cls._forward_reference, f"{cls.__name__}._forward_reference"))
    return calls


def _fused_calls(calls) -> int:
    return sum(n for k, n in calls.items() if "fused" in k)


def _runs_the_reference_only(model: nn.Module, run, calls) -> None:
    """``model`` is built on the reference path (every ``fused`` flag False); ``run(model)`` (a
    seeded training step, then an eval forward) with every flag set to True still calls no fast
    path (nothing re-enables one that would ignore a switch) and equals, bit for bit, a copy run
    under :func:`reference_path`."""
    flags = [m for m in model.modules() if isinstance(getattr(m, "fused", None), bool)]
    assert flags and not any(m.fused for m in flags)
    ref = copy.deepcopy(model)
    for m in flags:
        m.fused = True
    calls.clear()
    got = run(model)
    assert _fused_calls(calls) == 0, dict(calls)
    with reference_path(ref):
        want = run(ref)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _conv_run(model):
    x = _model_input("cifar_resnet", batch=2)
    model.train()
    out, gx, grads = _step(model, x, seed=0)
    model.eval()
    with torch.no_grad():
        return [out, gx, *grads.values(), model(x)]


def _tf_run(model):
    src, tgt = _tokens(2, 5, 1), _tokens(2, 4, 2)
    model.train()
    torch.manual_seed(3)
    out = model(src, tgt)
    out.pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    model.eval()
    with torch.no_grad():
        return [out.detach(), *grads, model(src, tgt)]


def _vgg(scheme):
    torch.manual_seed(0)
    model = rescale_core.create_model("vgg11", scheme=scheme, base_width=4, hidden_dim=8,
                                      num_classes=5, scheme_options={"measure_batches": 1})
    randomise_(model)
    return model.double()


def test_unknown_switch_runs_the_reference_path(monkeypatch, caplog):
    """A ``Scheme`` subclass with a switch the fast path does not know: every block, sublayer,
    ResNet and VGG built from it computes the reference function (logged once per scheme);
    the same scheme without the switch runs the fast path. VGG, which refuses what it does not
    read, builds it once the switch is among the options it reads."""
    monkeypatch.setitem(schemes.FIELD_READERS, "branch_clip", frozenset({"conv", "transformer"}))
    with pytest.raises(SchemeOptionError, match="branch_clip: 0.5 is not an option VGG builds"):
        _vgg(_clipped())
    monkeypatch.setattr(vgg_module, "VGG_OPTIONS", (*vgg_module.VGG_OPTIONS, "branch_clip"))
    monkeypatch.setattr(conditions, "_logged", set())
    caplog.set_level(logging.INFO, logger="rescale_core.plans.conditions")
    calls = _count_paths(monkeypatch)
    assert plans.unimplemented(_clipped()) == ["branch_clip"] and not plans.implements(_clipped())
    for build, run in ((lambda s: _model("cifar_resnet", s), _conv_run),
                       (_transformer, _tf_run), (_vgg, _conv_run)):
        model = build(get_scheme("rescale"))
        calls.clear()
        run(model)
        assert _fused_calls(calls) > 0, dict(calls)
        _runs_the_reference_only(build(_clipped()), run, calls)
    logged = [r for r in caplog.records if r.name == "rescale_core.plans.conditions"]
    assert len(logged) == 1 and "branch_clip" in logged[0].getMessage()


@dataclasses.dataclass(frozen=True)
class ShortcutScheme(Scheme):
    """A switch under study, added as docs/design.md ("Adding a scheme") says: a shortcut multiplier."""

    shortcut_mult: float = 1.0


def test_a_new_field_listed_with_its_default_keeps_the_plans_where_it_is_unset(monkeypatch):
    """The recipe of docs/design.md for a new field: listed in ``IMPLEMENTED_FIELDS`` with its
    default only, a scheme that leaves it there runs its fast plan, one that sets it the
    reference; as a conv-only option a Transformer refuses it, and VGG refuses it unread."""
    monkeypatch.setitem(plans.IMPLEMENTED_FIELDS, "shortcut_mult", (1.0,))
    monkeypatch.setitem(schemes.FIELD_READERS, "shortcut_mult", frozenset({"conv"}))
    x = _model_input("cifar_resnet")
    for value, plan in ((1.0, "folded"), (0.5, "reference")):
        scheme = ShortcutScheme(**vars(get_scheme("rescale")), shortcut_mult=value)
        assert plans.running_plan(_model("cifar_resnet", scheme).layer1[0], x) == plan
    unread = ShortcutScheme(**vars(get_scheme("rescale")), shortcut_mult=0.5)
    with pytest.raises(SchemeOptionError, match="shortcut_mult: 0.5 is not an option of a Transformer"):
        _transformer(unread)
    with pytest.raises(SchemeOptionError, match="shortcut_mult: 0.5 is not an option VGG builds"):
        _vgg(unread)


def test_unlisted_value_runs_the_reference_path(monkeypatch):
    """A categorical field's value outside those the fast path lists (here: ``merge="rescale"``
    taken off the table) also selects the reference path; other values of it stay fast."""
    monkeypatch.setitem(plans.IMPLEMENTED_FIELDS, "merge", ("add",))
    assert plans.unimplemented(get_scheme("rescale")) == ["merge"]
    assert plans.implements(get_scheme("fixup"))
    calls = _count_paths(monkeypatch)
    _runs_the_reference_only(_model("cifar_resnet", "rescale"), _conv_run, calls)
    _conv_run(_model("cifar_resnet", "fixup"))
    assert _fused_calls(calls) > 0
