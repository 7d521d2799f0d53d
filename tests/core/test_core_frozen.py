"""The frozen plan (``rescale_core.plans.frozen``): in eval mode without autograd a
normalization-free network computes from weights folded once, as a plain conv/ReLU network, and
equals the reference path for every scheme and family (float64 exactly, float32 and bf16
autocast to their rounding), before and after RescaleNet's measuring; the folds' identities;
the cache (folded once, rebuilt after an optimizer step, ``load_state_dict``, an in-place edit,
a new parameter, a move, a change of autocast's dtype; dropped by ``train()``); under autocast
the folded weights are kept in its dtype (no cast at a call); it never runs with autograd on,
declines under hooks, compiles, and keeps channels_last."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter

import rescale_core
from rescale_core import plans
from rescale_core.plans import FROZEN, drop_kept, frozen, reference_path, running_plan
from rescale_core.testing import randomise_

F64 = dict(rtol=1e-9, atol=1e-10)
F32 = dict(rtol=1e-4, atol=1e-4)

TINY = {"cifar_resnet": dict(depth=8, base_width=8), "wide_resnet": dict(depth=10, width=2, base_width=4),
        "resnext50_32x4d": dict(base_width=16), "vgg11": dict(base_width=8, hidden_dim=16)}
PLAIN = ("rescale", "fixup", "skipinit", "rezero", "skipinit_reg", "none", "bn_head", "nf", "nf_skipinit")
# every conv scheme on a basic and a bottleneck ResNet; the normalization-free ones on every family
CASES = ([("resnet18", s) for s in rescale_core.list_schemes("conv")]
         + [("resnet50", s) for s in ("rescale", "fixup", "skipinit", "rezero", "skipinit_reg", "none", "bn_merge")]
         + [(n, s) for n in ("resnext50_32x4d", "wide_resnet", "cifar_resnet", "r3d_18", "slow_r50", "i3d_r50",
                             "resnet3d_18") for s in ("rescale", "fixup", "skipinit", "nf")]
         + [("vgg11", s) for s in ("rescale", "none", "bn")])


def _model(name: str, scheme: str, dtype=torch.float64, **options):
    torch.manual_seed(0)
    model = rescale_core.create_model(name, scheme=scheme, num_classes=5, **TINY.get(name, dict(base_width=8)),
                                      scheme_options={"measure_batches": 1, **options})
    return randomise_(model, gain=0.15).to(dtype)


def _input(name: str, dtype=torch.float64, batch: int = 2) -> torch.Tensor:
    shape = (batch, 3, 4, 16, 16) if ("3d" in name or name.endswith("r50")) else (batch, 3, 32, 32)
    return torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=dtype) + 0.3


def _reference(model: nn.Module) -> nn.Module:
    return rescale_core.set_plan(copy.deepcopy(model), "reference")


def _close(got: torch.Tensor, want: torch.Tensor, tol: dict, what: str = "") -> None:
    scale = float(want.abs().max().clamp_min(1e-6))
    torch.testing.assert_close(got / scale, want / scale, **tol, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------- every scheme and family
@pytest.mark.parametrize("name, scheme", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_frozen_equals_reference(name, scheme):
    """float64, before RescaleNet's measuring (``bias * measure_bias_scale - mu0``) and after:
    logits, features and every stage's output (no offset rides across a stage boundary there)
    under ``no_grad`` and ``inference_mode``; the frozen plan runs wherever the network is plain."""
    model, x = _model(name, scheme), _input(name)
    ref = _reference(model)
    for phase in ("before measuring", "after measuring"):
        if phase == "after measuring":
            for net in (model.train(), ref.train()):  # both measure the same batch (same dropout)
                torch.manual_seed(1)
                net(x)
        model.eval(), ref.eval()
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                assert (running_plan(model, x) == FROZEN) == (scheme in PLAIN), (name, scheme)
                _close(model(x), ref(x), F64, f"{name}/{scheme} {phase} logits")
                if name.startswith("vgg"):
                    continue
                _close(model.forward_features(x), ref.forward_features(x), F64, f"{name}/{scheme} features")
                for k, (a, b) in enumerate(zip(model.stage_outputs(x), ref.stage_outputs(x))):
                    _close(a, b, F64, f"{name}/{scheme} stage {k + 1}")
    if scheme == "rescale":
        assert not any(m.measuring for m in rescale_core.mean_shift_layers(model))


# schemes that are only data: Scaled WS (NF-ResNet's convolutions) in the v1 layout beside offsets
# folded into a convolution's bias (RescaleNet's mean-shift biases, Fixup's scalar biases)
SCALED_WS_CASES = [("resnet50", "rescale", {"scaled_ws": True}), ("resnet50", "fixup", {"scaled_ws": True}),
                   ("cifar_resnet", "fixup", {"scaled_ws": True}), ("r3d_18", "fixup", {"scaled_ws": True})]


@pytest.mark.parametrize("name, scheme, options", SCALED_WS_CASES, ids=[f"{n}-{s}" for n, s, _ in SCALED_WS_CASES])
def test_frozen_folds_offsets_on_the_standardized_weight(name, scheme, options):
    """An offset folded into a Scaled WS convolution's bias is computed with the weight it
    convolves with (the standardized one), so that evaluation equals the reference."""
    model, x = _model(name, scheme, **options), _input(name)
    model.train()
    model(x)  # measured (RescaleNet)
    model.eval()
    ref = _reference(model)
    with torch.no_grad():
        assert running_plan(model, x) == FROZEN
        _close(model(x), ref(x), F64, f"{name}/{scheme} {options} logits")


@pytest.mark.parametrize("scheme", ["rescale", "fixup", "skipinit", "nf"])
def test_backbone_through_torchvision_layer_getter(scheme):
    """A detection backbone: torchvision's ``IntermediateLayerGetter`` calls the stem's modules
    and each block on its own (never ``ResNet.forward``): each block runs its own frozen plan,
    in true units, and the FPN sees the reference's stage outputs."""
    model = _model("resnet18", scheme)
    model.train()
    model(_input("resnet18"))  # measured
    model.eval()
    ref = _reference(model)
    layers = {f"layer{i}": str(i) for i in range(1, 5)}
    getter, ref_getter = IntermediateLayerGetter(model, layers), IntermediateLayerGetter(ref, layers)
    x = _input("resnet18")
    with torch.no_grad():
        assert running_plan(model.layer1[0], torch.zeros(1, 8, 8, 8, dtype=torch.float64)) == FROZEN
        got, want = getter(x), ref_getter(x)
    for k in want:
        _close(got[k], want[k], F64, f"stage {k}")


@pytest.mark.parametrize("name, scheme, fmt", [
    ("resnet50", "rescale", torch.channels_last), ("resnet18", "fixup", None),
    ("r3d_18", "rescale", None), ("vgg11", "rescale", None), ("resnet50", "nf", torch.channels_last)])
def test_float32_and_bf16_autocast(name, scheme, fmt):
    """float32 to its rounding; under bf16 autocast (the folds made in float32, cast by autocast
    as a convolution's weights are) as close to a float32 run as the reference under the same
    autocast is, in the same dtype; before and after RescaleNet's measuring."""
    model, x = _model(name, scheme, torch.float32), _input(name, torch.float32)
    if fmt is not None:
        model, x = model.to(memory_format=fmt), x.contiguous(memory_format=fmt)
    ref = _reference(model)
    for phase in ("before measuring", "after measuring"):
        if phase == "after measuring":
            for net in (model.train(), ref.train()):
                torch.manual_seed(1)
                net(x)
        model.eval(), ref.eval()
        with torch.no_grad():
            exact = ref(x)
            _close(model(x), exact, F32, f"{name}/{scheme} {phase} float32")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got, want = model(x), ref(x)
                assert running_plan(model, x) == FROZEN
        assert got.dtype == want.dtype
        err = float((got.float() - exact).norm() / exact.norm())
        ref_err = float((want.float() - exact).norm() / exact.norm())
        assert err <= 3 * ref_err + 2e-3, (phase, err, ref_err)


@pytest.mark.parametrize("name, scheme", [("resnet50", "rescale"), ("resnet18", "fixup"), ("vgg11", "rescale"),
                                          ("resnet18", "none")])
def test_autocast_evaluation_casts_nothing(name, scheme, count_casts):
    """Under bf16 autocast the frozen program keeps its folded weights and biases in bf16 (folded
    in float32 and rounded once, as autocast rounds them at every call): an eval forward on a
    bf16 input launches no cast under ``torch.no_grad`` or ``torch.inference_mode`` (a float32
    input: one, its own), and computes the same as before the weights were kept in bf16 (the
    frozen plan's float32 folds cast by autocast). An evaluation without autocast afterwards
    folds again, in float32."""
    model, x = _model(name, scheme, torch.float32), _input(name, torch.float32)
    model.train()
    model(x)  # measured
    model.eval()
    ref, x16 = _reference(model), x.bfloat16()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref(x)
        model(x), model(x16)  # folds (VGG's program also knows the input's dtype)
        state = model._frozen_state
        for mode in (torch.no_grad, torch.inference_mode):
            with mode(), count_casts() as probe:
                got = model(x16)
            assert probe.casts == [], (mode.__name__, probe.casts)
            with mode(), count_casts() as probe:
                model(x)
            assert probe.casts == [(torch.float32, torch.bfloat16)], mode.__name__
        assert got.dtype == want.dtype == torch.bfloat16
    layers = (frozen.FrozenConv, frozen.FrozenLinear)
    weights = [t for layer in torch.utils._pytree.tree_leaves(state.programs, is_leaf=lambda v: isinstance(v, layers))
               if isinstance(layer, layers) for t in (layer.weight, layer.bias) if t is not None]
    assert weights and all(t.dtype == torch.bfloat16 for t in weights)
    exact = _eval(ref, x)
    err = float((got.float() - exact).norm() / exact.norm())
    ref_err = float((want.float() - exact).norm() / exact.norm())
    assert err <= 3 * ref_err + 2e-3, (err, ref_err)
    _close(_eval(model, x), exact, F32, "float32 after bf16")  # autocast's dtype changed: folded again
    assert model._frozen_state is not state
    assert all(t.dtype == torch.float32 for t in torch.utils._pytree.tree_leaves(model._frozen_state.programs)
               if isinstance(t, torch.Tensor))


def test_a_block_called_alone_under_autocast_casts_nothing(count_casts):
    """A detection backbone's blocks (each its own frozen program) keep their weights in bf16 too."""
    model = _model("resnet50", "rescale", torch.float32)
    model.train()
    model(_input("resnet50", torch.float32))
    model.eval()
    h = torch.randn(2, model.layer1[0].conv1.in_channels, 8, 8, dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for block in (model.layer1[0], model.layer1[1]):
            assert running_plan(block, h) == FROZEN
            block(h)
            with count_casts() as probe:
                h = block(h)
            assert probe.casts == []


def _transformer(scheme: str, **options) -> nn.Module:
    torch.manual_seed(0)
    model = rescale_core.create_model("transformer_tiny", scheme=scheme, src_vocab_size=40, dropout=0.1,
                                      scheme_options=options or None)
    return randomise_(model).double().eval()


@pytest.mark.parametrize("scheme, options", [("rescale", {"gain": "vector"}), ("rescale", {}), ("rezero", {}),
                                             ("skipinit", {}), ("post_ln", {}), ("pre_ln", {}), ("deepnorm", {}),
                                             ("tfixup", {}), ("dyt", {}), ("derf", {"norm_alpha": 0.8})])
def test_transformer_sublayers(scheme, options):
    """Every sublayer with its branch's last linear layer folded once: the forward and
    incremental decoding (``decode_step``) equal the reference's."""
    model = _transformer(scheme, **options)
    ref = _reference(model)
    src = torch.randint(3, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(3, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    src[0, -2:] = 1
    sub = model.encoder.layers[0].ffn
    with torch.no_grad():
        assert running_plan(sub, torch.zeros(2, 3, 32, dtype=torch.float64)) == FROZEN
        _close(model(src, tgt), ref(src, tgt), F64, f"{scheme} forward")
        steps = []
        for net in (model, ref):
            memory, mask = net.encode(src)
            cache = net.new_cache(memory, mask)
            steps.append(torch.cat([net.decode_step(tgt[:, i:i + 1], cache) for i in range(tgt.size(1))], 1))
    _close(steps[0], steps[1], F64, f"{scheme} decode_step")
    if scheme == "rescale":
        assert isinstance(sub._frozen_state.programs["sublayer"], frozen.FrozenLinear)


# --------------------------------------------------------------- the identities
def test_fold_identities():
    """The identities the frozen plan rests on, and why an offset in front of a zero-padded
    convolution is carried in the stream instead of folded into a bias."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64)
    e = torch.randn(1, 4, 1, 1, generator=g, dtype=torch.float64)
    conv = nn.Conv2d(4, 4, 3, padding=1).double()
    # an offset before a padded conv is not a bias: the border sees the padding's zeros
    as_bias = conv._conv_forward(x, conv.weight, conv.bias + plans.folds.input_offset_bias(conv.weight, e))
    wrong = (as_bias - conv(x + e)).abs()
    assert wrong[..., 1:-1, 1:-1].max() < 1e-12 and wrong.max() > 1e-3
    # (2) across a ReLU and a max-pool (padded with -inf)
    z = torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.relu(z) + e, torch.maximum(z + e, e), **F64)
    pool = nn.MaxPool2d(3, 2, 1)
    torch.testing.assert_close(pool(torch.relu(z) + e), pool(torch.maximum(z + e, e)), **F64)
    torch.testing.assert_close(pool(z + e), pool(z) + e, **F64)
    # the stream carries the block's offset: its padded conv reads it as is; the skip path pays
    # -alpha e in the last conv's bias, or in the projection's bias after an average pool
    alpha, last = 0.8, nn.Conv2d(4, 4, 1).double()
    s = torch.relu(z) + e  # what the previous block returns: max(z + e, e)
    want = last(torch.relu(conv(torch.relu(z) + e))) + alpha * torch.relu(z)
    got = last._conv_forward(torch.relu(conv(s)), last.weight, last.bias - alpha * e.reshape(-1)) + alpha * s
    torch.testing.assert_close(got, want, **F64)
    avg, proj, e_d = nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), nn.Conv2d(4, 8, 1).double(), e.flip(1)
    want = proj(avg(torch.relu(z)) + e_d)
    got = proj._conv_forward(avg(s), proj.weight, proj.bias + plans.folds.input_offset_bias(proj.weight, e_d - e))
    torch.testing.assert_close(got, want, **F64)
    # the head: fc(avgpool(y) + e) = fc(avgpool(y)) + W e
    fc = nn.Linear(4, 3).double()
    pooled = z.mean((2, 3))
    torch.testing.assert_close(fc(pooled + e.reshape(1, -1)),
                               F.linear(pooled, fc.weight, fc.bias + fc.weight @ e.reshape(-1)), **F64)


# --------------------------------------------------------------- the cache
def _eval(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def test_folded_once_and_rebuilt_when_the_weights_change():
    model, x = _model("resnet18", "rescale"), _input("resnet18")
    model.eval()
    _eval(model, x)
    state = model._frozen_state
    program = state.programs[next(iter(state.programs))]
    model.eval()  # (an exporter's capture puts the model in eval mode again: the folds stay)
    _eval(model, x)
    assert model._frozen_state is state and state.programs[next(iter(state.programs))] is program  # folded once

    def check(what: str) -> None:
        ref = _reference(model).eval()
        _close(_eval(model, x), _eval(ref, x), F64, what)

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    F.cross_entropy(model(x), torch.arange(2)).backward()
    opt.step()
    assert model._frozen_state is None  # train() dropped it: training holds no folded copy
    model.eval()
    check("after a training step")
    F.cross_entropy(model(x), torch.arange(2)).backward()  # eval mode, autograd on: not frozen
    opt.step()
    check("after an optimizer step in eval mode")
    with torch.no_grad():
        model.layer2[0].merge.gain.weight.mul_(1.5)
        model.layer3[1].shift2.mu0.add_(0.2)
    check("after an in-place edit")
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.9)
    model.load_state_dict(other.state_dict())
    check("after load_state_dict")
    model.layer1[1].conv2.weight = nn.Parameter(model.layer1[1].conv2.weight.detach() * 1.1)
    check("after a new parameter")
    halved = {k: v * 0.5 for k, v in model.named_parameters()}  # swapped in, no registration
    with torch.no_grad():
        swapped = torch.func.functional_call(model, halved, (x,))
        with reference_path(model):
            expected = torch.func.functional_call(model, halved, (x,))
    _close(swapped, expected, F64, "under functional_call")
    check("after functional_call")
    model.layer2[1].conv1.weight.data.mul_(3.0)  # a version counter of its own: drop_kept says so
    drop_kept(model)
    check("after an edit through .data and drop_kept")
    model.float()
    x = x.float()
    ref = _reference(model).eval()
    _close(_eval(model, x), _eval(ref, x), F32, "after a cast")


def test_runs_only_in_evaluation_without_autograd(monkeypatch):
    """Training and evaluation with autograd on run the plans training runs (gradients flow);
    ``set_frozen(model, False)`` evaluates as before the frozen plan; a hook below a network
    makes the network decline (the hook fires), and a block called as a module beside the
    hooked one stays frozen."""
    calls = []
    for cls in (rescale_core.ResidualBlock, frozen.ResNet):
        impl = cls.plan_implementations[FROZEN]
        monkeypatch.setitem(cls.plan_implementations, FROZEN, impl._replace(
            run=lambda *a, _run=impl.run, **k: calls.append(torch.is_grad_enabled()) or _run(*a, **k)))
    model, x = _model("resnet18", "rescale"), _input("resnet18")
    model(x).sum().backward()
    model.eval()
    out = model(x)
    assert out.requires_grad and running_plan(model, x) == "folded" and not calls
    _eval(model, x)
    assert calls == [False]
    plans.set_frozen(model, False)
    with torch.no_grad():
        assert running_plan(model, x) == "folded"
    plans.set_frozen(model, True)
    ref, seen = _reference(model), []
    handle = model.layer2[0].conv1.register_forward_hook(lambda *a: seen.append(1))
    calls.clear()
    with torch.no_grad():
        assert running_plan(model, x) == "folded"
        _close(model(x), ref(x), F64, "with a hook")
    handle.remove()
    assert seen == [1] and calls == [False]  # layer2[1], called as a module beside its hooked sibling


def test_compiled_evaluation_follows_training():
    """Compiled (dynamo, eager backend): evaluation after training steps, and after an optimizer
    step taken in eval mode, computes the new weights' function."""
    torch._dynamo.reset()
    model, x = _model("cifar_resnet", "fixup", torch.float32), _input("cifar_resnet", torch.float32)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(2):
        model.train()
        F.cross_entropy(compiled(x), torch.arange(2)).backward()
        opt.step()
        model.eval()
        if step:
            F.cross_entropy(model(x), torch.arange(2)).backward()
            opt.step()
        with torch.no_grad():
            got = compiled(x)
            _close(got, _reference(model)(x), F32, f"compiled evaluation {step}")
    torch._dynamo.reset()


def test_channels_last_and_no_host_sync(count_host_syncs):
    model, x = _model("resnet50", "rescale", torch.float32), _input("resnet50", torch.float32)
    model = model.to(memory_format=torch.channels_last).eval()
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        model(x)
        with count_host_syncs() as probe:
            feats = model.forward_features(x)
            model(x)
    assert probe.syncs == 0 and feats.is_contiguous(memory_format=torch.channels_last)


def test_export_captures_the_folded_weights_as_constants():
    """``torch.export`` of an evaluated network: the kept program's tensors are the graph's
    constants, so the graph holds a plain network's operators (convolutions, ReLUs or their
    ``maximum`` form, adds, pools, the classifier), none of the folds."""
    model, x = _model("resnet18", "rescale", torch.float32), _input("resnet18", torch.float32)
    model.eval()
    with torch.no_grad():
        want = model(x)
        program = torch.export.export(model, (x,))
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert ops <= {"aten.conv2d.default", "aten.relu_.default", "aten.relu.default", "aten.maximum.default",
                   "aten.add_.Tensor", "aten.add.Tensor", "aten.avg_pool2d.default", "aten.max_pool2d.default",
                   "aten.adaptive_avg_pool2d.default", "aten.flatten.using_ints", "aten.view.default",
                   "aten.linear.default", "aten.mean.dim"}, ops
    torch.testing.assert_close(program.module()(x), want)
