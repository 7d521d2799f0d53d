"""Execution plans (``rescale_core.plans``): choosing one, the lean plan's special cases (a block
called on its own, evaluation before any measuring, channels_last) and compiled training: one
graph for training and one for evaluation with no graph break (``fullgraph=True``) for every
family and scheme, one recompile when RescaleNet's measuring ends, the same numbers as eager.
The plans' equivalence with the reference path over every block variant is in
``test_core_fastpath.py`` (its tests run once per fast plan)."""
from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import rescale_core
from rescale_core import plans
from rescale_core.layers import StridedAvgPool
from rescale_core.models.resnet import ResNet, ResNetConfig
from rescale_core.plans.folds import scaled_linear, shifted_relu
from rescale_core.plans.lean import gain_merge
from rescale_core.testing import randomise_

F64 = dict(rtol=1e-9, atol=1e-11)


def _planned(model):
    return [m for m in model.modules() if isinstance(getattr(m, "fused", None), bool)]


def test_create_model_takes_a_plan_and_set_plan_changes_it():
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3, plan="lean")
    assert {m.plan for m in _planned(model)} == {"lean"} and rescale_core.plan_of(model) == "lean"
    rescale_core.set_plan(model, "reference")
    assert not any(m.fused for m in _planned(model)) and rescale_core.plan_of(model) == "reference"
    rescale_core.set_plan(model, "folded")
    assert all(m.fused for m in _planned(model)) and rescale_core.plan_of(model) == "folded"
    assert rescale_core.plan_of(rescale_core.create_model("resnet18", base_width=8)) == "auto"
    with pytest.raises(ValueError, match="unknown execution plan 'fast'; expected one of auto, lean"):
        rescale_core.create_model("resnet18", plan="fast")


def test_auto_is_lean_on_accelerators_and_folded_on_the_cpu():
    block = rescale_core.create_model("resnet18", scheme="rescale", base_width=8).layer1[0]
    on = types.SimpleNamespace  # wants_lean reads only the input's device
    assert plans.wants_lean(block, on(device=torch.device("cuda", 0)))
    assert not plans.wants_lean(block, on(device=torch.device("cpu")))
    block.plan = "lean"
    assert plans.wants_lean(block, on(device=torch.device("cpu")))
    block.plan = "folded"
    assert not plans.wants_lean(block, on(device=torch.device("cuda", 0)))


def _lean_and_reference(name: str, scheme: str, **kwargs):
    torch.manual_seed(0)
    model = rescale_core.create_model(name, scheme=scheme, num_classes=4, **kwargs).double()
    randomise_(model)
    ref = rescale_core.set_plan(copy.deepcopy(model), "reference")
    return rescale_core.set_plan(model, "lean"), ref


def test_lean_evaluation_before_measuring_matches_the_reference():
    """A RescaleNet evaluated before it trained (its mean-shift layers still measuring) uses
    ``bias * measure_bias_scale - mu0``: the lean plan's one-pass terms do too."""
    lean, ref = _lean_and_reference("resnet18", "rescale", base_width=8)
    lean.eval(), ref.eval()
    assert all(m.measuring for m in rescale_core.mean_shift_layers(lean))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64) + 0.5
    with torch.no_grad():
        torch.testing.assert_close(lean(x), ref(x), **F64)


@pytest.mark.parametrize("scheme", ["rescale", "fixup", "skipinit"])
def test_blocks_called_one_by_one_match_the_reference(scheme):
    """A detection backbone's layer getter calls the stem and the blocks itself: each block then
    computes its own lean terms; outputs and gradients are the network's."""
    lean, ref = _lean_and_reference("resnet50", scheme, base_width=8)
    rescale_core.finish_measuring(lean), rescale_core.finish_measuring(ref)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64) + 0.5
    outs = []
    for model in (lean, ref):
        h = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        for _, block in rescale_core.analysis.residual_blocks(model):
            h = block(h)
        h.square().sum().backward()
        outs.append((h.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(outs[0][0], outs[1][0], **F64)
    assert outs[0][1].keys() == outs[1][1].keys()
    for name, grad in outs[1][1].items():
        torch.testing.assert_close(outs[0][1][name], grad, **F64, msg=name)


@pytest.mark.parametrize("name, fmt", [("resnet50", torch.channels_last), ("r3d_18", torch.channels_last_3d)])
def test_lean_plan_keeps_channels_last(name, fmt):
    lean, ref = _lean_and_reference(name, "rescale", base_width=8)
    rescale_core.finish_measuring(lean), rescale_core.finish_measuring(ref)
    lean = lean.float().to(memory_format=fmt)
    shape = (2, 3, 4, 32, 32) if fmt is torch.channels_last_3d else (2, 3, 32, 32)
    x = torch.randn(shape) + 0.5
    stages = lean.stage_outputs(x.contiguous(memory_format=fmt))
    # (a map with a size-1 dim has ambiguous strides: checked where every dim is larger)
    assert all(s.is_contiguous(memory_format=fmt) for s in stages if min(s.shape[2:]) > 1)
    torch.testing.assert_close(lean(x.contiguous(memory_format=fmt)), ref.float()(x), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------- compiled
# the compiled cases' networks: every block kind of a family once (one block per stage: the
# identity-shortcut block, then the transitions), as dynamo traces each block it meets, so that the
# tracing stays short; ResNeXt with grouped bottlenecks
TINY = {"resnet_tiny": ResNetConfig("basic", (1, 1, 1, 1), widths=(8, 16, 32, 64), stem_width=8),
        "r3d_tiny": ResNetConfig("basic", (1, 1, 1, 1), widths=(8, 16, 32, 64), stem_width=8, spatial_dims=3,
                                 stem_pool="none"),
        "resnext_tiny": ResNetConfig("bottleneck", (1, 1, 1, 1), widths=(8, 16, 32, 64), stem_width=8, groups=2,
                                     width_per_group=8)}


def _case(name: str, scheme: str):
    torch.manual_seed(0)
    if name == "transformer_tiny":  # one encoder and one decoder layer
        model = rescale_core.create_model(name, scheme=scheme, src_vocab_size=50, num_encoder_layers=1,
                                          num_decoder_layers=1)
        src, tgt = torch.randint(4, 50, (2, 6)), torch.randint(4, 50, (2, 5))
        return model, (src, tgt), lambda out: out.float().square().mean()
    kwargs = {"wide_resnet": dict(depth=10, width=2, base_width=4), "vgg11": dict(base_width=8, hidden_dim=16)
              }.get(name, dict(base_width=8))
    options = {"measure_batches": 1} if scheme == "rescale" else None
    if name in TINY:
        model = ResNet(TINY[name], scheme, options, num_classes=3)
    else:
        model = rescale_core.create_model(name, scheme=scheme, num_classes=3, scheme_options=options, **kwargs)
    x = torch.randn((2, 3, 4, 16, 16) if name == "r3d_tiny" else (2, 3, 32, 32))
    return model, (x,), lambda out: F.cross_entropy(out, torch.arange(2))


# every scheme of the conv families (rezero's blocks are skipinit's), each family, both plans
COMPILE_CASES = [("resnet_tiny", s, "lean") for s in ("rescale", "skipinit", "bn")] + [
    ("resnext_tiny", "fixup", "lean"), ("r3d_tiny", "rescale", "lean"), ("wide_resnet", "rezero", "lean"),
    ("vgg11", "rescale", "lean"), ("transformer_tiny", "rescale", "lean"),
    ("resnet_tiny", "fixup", "folded"), ("transformer_tiny", "rezero", "folded")]


@pytest.mark.parametrize("name, scheme, plan", COMPILE_CASES, ids=["-".join(c) for c in COMPILE_CASES])
def test_whole_network_compiles_without_graph_break(name, scheme, plan):
    """``torch.compile(fullgraph=True)`` (dynamo; the eager backend keeps the test quick): after
    the measuring steps (eager), one graph for training and two for evaluation without autograd
    (the frozen plan: the first folds the weights and keeps them, the second reads them; one for
    BN, which has no frozen plan), never another; evaluation computes the reference's function."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model, inputs, loss = _case(name, scheme)
    rescale_core.set_plan(model, plan)
    model.train()
    loss(model(*inputs)).backward()  # RescaleNet measures (measure_batches=1), eagerly
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    graphs = []
    for _ in range(3):
        before = counter.frame_count
        loss(compiled(*inputs)).backward()
        graphs.append(counter.frame_count - before)
    model.eval()
    with torch.no_grad():
        compiled(*inputs)
        got = compiled(*inputs)
        with rescale_core.reference_path(model):
            want = model(*inputs)  # eager, and the compiled graphs stay as they were
    scale = want.abs().max().clamp_min(1e-6)  # (Fixup's zero classifier: all zeros)
    torch.testing.assert_close(got / scale, want / scale, rtol=1e-4, atol=1e-5)
    evaluation = 1 if scheme == "bn" else 2  # BN's norm layers: no frozen plan, one graph
    assert graphs == [1, 0, 0] and counter.frame_count == 1 + evaluation, (graphs, counter.frame_count)
    torch._dynamo.reset()


@pytest.mark.compile_check
@pytest.mark.parametrize("backend, plan", [("aot_eager", "lean"), ("aot_eager", "folded")])
def test_compiled_training_matches_eager_and_recompiles_once(backend, plan):
    """A tiny RescaleNet trained compiled (AOT autograd: forward and backward traced as inductor
    gets them; inductor itself trains through the CLI in test_classification_acceleration.py)
    and eager over the end of measuring (measure_batches=2): same losses, parameters and
    mean-shift state. The measuring steps run eagerly (their counters never reach compiled
    code); when measuring ends the whole forward is compiled once, as one graph, never again."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = rescale_core.set_plan(ResNet(TINY["resnet_tiny"], "rescale", {"measure_batches": 2}, num_classes=5), plan)
    randomise_(eager, gain=0.15)
    model = copy.deepcopy(eager)
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, eager)]
    new_graphs = []
    for step in range(5):
        x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(step)) + 0.3
        y = torch.arange(4) % 5
        before = counter.frame_count
        losses = []
        for net, opt in ((compiled, opts[0]), (eager, opts[1])):
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        new_graphs.append(counter.frame_count - before)
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
        for (n, a), b in zip(model.state_dict().items(), eager.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=f"step {step} {n}")
        assert [m._count for m in rescale_core.mean_shift_layers(model)] == \
            [m._count for m in rescale_core.mean_shift_layers(eager)]
    assert new_graphs == [0, 0, 1, 0, 0], new_graphs
    torch._dynamo.reset()


GRADIENT_CASES = [("transformer_tiny", "rescale", "lean"), ("transformer_tiny", "rezero", "folded"),
                  ("vgg11", "rescale", "lean"), ("r3d_tiny", "rescale", "lean"), ("resnext_tiny", "fixup", "lean")]


@pytest.mark.compile_check
@pytest.mark.parametrize("name, scheme, plan", GRADIENT_CASES, ids=["-".join(c) for c in GRADIENT_CASES])
def test_a_compiled_step_has_the_eager_gradients(name, scheme, plan):
    """The families the test above leaves out: after the measuring step, one training step compiled
    (AOT autograd) has the eager step's loss and every gradient (dropout off: its random draws
    differ when compiled). Torch 2.11's dynamo gave the parameters below the classifier a zero
    gradient here (``rescale_core.layers.writes_into_buffers``)."""
    torch._dynamo.reset()
    model, inputs, loss = _case(name, scheme)
    for m in model.modules():
        if isinstance(getattr(m, "dropout", None), float):
            m.dropout = 0.0
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    rescale_core.set_plan(model, plan)
    model.train()
    loss(model(*inputs)).backward()  # RescaleNet measures, eagerly
    eager = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    compiled_loss = loss(torch.compile(model, backend="aot_eager")(*inputs))
    compiled_loss.backward()
    eager_loss = loss(eager(*inputs))
    eager_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for (n, a), b in zip(model.named_parameters(), eager.parameters()):
        assert (a.grad is None) == (b.grad is None), n
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=n)
    assert any(b.grad is not None and b.grad.abs().sum() > 0 for b in eager.parameters())
    torch._dynamo.reset()


class _WritingOps(TorchDispatchMode):
    """The ops that write into a tensor they are given (``out=``, ``grad_input=``, in place) while
    it is active."""

    def __init__(self):
        super().__init__()
        self.writing = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
            self.writing.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_fast_plans_autograd_functions_return_fresh_results_when_compiling(monkeypatch):
    """Under ``torch.compile`` the forwards of the lean merge and the scaled linear layer call
    out-of-place ops only, no ``out=`` or in-place one (``layers.writes_into_buffers``): the
    torch where dynamo loses such a gradient (2.11) is not the one this suite pins."""
    skip, f = (torch.randn(2, 4, 3, 3, requires_grad=True) for _ in range(2))
    s = torch.randn(1, 4, 1, 1, requires_grad=True)
    layer, x = torch.nn.Linear(6, 5), torch.randn(3, 6, requires_grad=True)
    for compiling in (False, True):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
        with _WritingOps() as ops:
            gain_merge(skip, f, s)
            scaled_linear(layer, x, torch.rand(5) + 0.5)
            scaled_linear(layer, torch.randn(40, 6, requires_grad=True), 0.5)  # the scale on the output
        assert bool(ops.writing) != compiling, (compiling, ops.writing)  # eager does write into buffers


def _tiny_cifar(scheme: str, plan: str, dtype=torch.float64, measured: bool = True):
    """A CIFAR ResNet of depth 8 and width 4 (each custom autograd function of ``plan`` at 8x8
    inputs: the shortcut's strided mean, the shifted ReLU, the lean merge), parameters randomised."""
    torch.manual_seed(0)
    model = rescale_core.create_model("cifar_resnet", depth=8, base_width=4, num_classes=5, scheme=scheme,
                                      plan=plan).to(dtype)
    randomise_(model)
    if measured:
        rescale_core.finish_measuring(model)
    return model


@pytest.mark.compile_check
def test_fullgraph_from_the_first_step_names_the_measuring_steps():
    """A RescaleNet's measuring steps run eagerly (a graph break): ``fullgraph=True`` from step 0
    is refused at the first step with dynamo's error giving that reason; once measuring is over the
    same compiled module is one graph."""
    torch._dynamo.reset()
    model = _tiny_cifar("rescale", "folded", dtype=torch.float32, measured=False)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(4, 3, 8, 8)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="(?s)reason: RescaleNet's mean-shift measuring steps.*"
                                                            "fullgraph=True once they are over"):
        compiled(x)
    assert all(m.measuring and m.count == 0 for m in rescale_core.mean_shift_layers(model))
    rescale_core.finish_measuring(model)
    compiled(x).sum().backward()
    torch._dynamo.reset()


# --------------------------------------------------------------- torch.func and double backward
FUNC_CASES = [(scheme, plan) for scheme in ("rescale", "fixup", "skipinit") for plan in ("reference", "folded", "lean")]


@pytest.mark.parametrize("scheme, plan", FUNC_CASES, ids=["-".join(c) for c in FUNC_CASES])
def test_torch_func_gives_the_reference_gradients_on_every_plan(scheme, plan):
    """``torch.func``: per-sample gradients (``vmap`` of ``grad`` over ``functional_call``) and the
    input Jacobian (``jacrev``; autograd's own vectorized one, whose backward runs batched) equal
    autograd's on the reference path, sample by sample."""
    model, ref = _tiny_cifar(scheme, plan), _tiny_cifar(scheme, "reference")
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def loss(params, xi):
        return torch.func.functional_call(model, params, (xi[None],)).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(dict(model.named_parameters()), x)
    for i in range(len(x)):
        ref.zero_grad()
        ref(x[i:i + 1]).square().sum().backward()
        for n, p in ref.named_parameters():
            torch.testing.assert_close(per_sample[n][i], p.grad, **F64, msg=f"{n} sample {i}")
    jacobian = torch.func.jacrev(model)(x[:2])
    torch.testing.assert_close(jacobian, torch.autograd.functional.jacobian(ref, x[:2]), **F64)
    torch.testing.assert_close(torch.autograd.functional.jacobian(model, x[:2], vectorize=True), jacobian, **F64)
    if plan == "reference":  # forward mode: the reference path's functions have a jvp
        torch.testing.assert_close(torch.func.jacfwd(model)(x[:2]), jacobian, **F64)


@pytest.mark.parametrize("scheme, plan", FUNC_CASES, ids=["-".join(c) for c in FUNC_CASES])
def test_double_backward_equals_the_reference(scheme, plan):
    """``create_graph=True``: the gradient of the input gradient's norm, with respect to the input
    and every parameter, equals the reference path's (which equals finite differences:
    ``test_the_plans_autograd_functions_have_exact_second_derivatives``)."""
    model, ref = _tiny_cifar(scheme, plan), _tiny_cifar(scheme, "reference")
    x0 = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def second(net):
        x = x0.clone().requires_grad_()
        gx, = torch.autograd.grad(net(x).square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), [x, *net.parameters()])

    for n, a, b in zip(["input"] + [n for n, _ in model.named_parameters()], second(model), second(ref)):
        torch.testing.assert_close(a, b, **F64, msg=n)


def _functions_under_test():
    """Each custom autograd function of the plans as ``(name, fn, inputs)``, float64."""
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()

    pool, linear = StridedAvgPool(2, 2), torch.nn.Linear(6, 5).double()
    return [("strided mean", lambda x: pool(x), (t(2, 3, 4, 6),)),
            ("shifted relu", lambda u, e: shifted_relu(u + e.detach(), e), (t(2, 3, 4, 4), t(1, 3, 1, 1))),
            ("gain merge", gain_merge, (t(2, 3, 4, 4), t(2, 3, 4, 4), t(1, 3, 1, 1))),
            ("scaled linear", lambda x, s: scaled_linear(linear, x, s), (t(4, 6), t(5)))]


@pytest.mark.parametrize("case", range(4), ids=["strided-mean", "shifted-relu", "gain-merge", "scaled-linear"])
def test_the_plans_autograd_functions_have_exact_second_derivatives(case):
    """Each custom autograd function passes ``gradcheck`` and ``gradgradcheck`` (float64), gives
    autograd's gradients per sample under ``torch.func.vmap(torch.func.grad(...))``, and, eager,
    runs in its combined form (no signature bound per call) with a plain backward (no
    ``create_graph``) that still writes into buffers where its forward does."""
    name, fn, inputs = _functions_under_test()[case]
    assert torch.autograd.gradcheck(fn, inputs), name
    assert torch.autograd.gradgradcheck(fn, inputs), name

    def loss(*args):
        return fn(*args).square().sum()

    samples = [[a.detach() * k for a in inputs] for k in (1.0, -0.5)]
    per_sample = torch.func.vmap(torch.func.grad(loss, argnums=tuple(range(len(inputs)))))(
        *[torch.stack(column) for column in zip(*samples)])
    for i, sample in enumerate(samples):
        sample = [a.requires_grad_() for a in sample]
        for got, want in zip(per_sample, torch.autograd.grad(loss(*sample), sample)):
            torch.testing.assert_close(got[i], want, **F64, msg=f"{name} sample {i}")
    out = fn(*inputs)
    assert type(out.grad_fn).__name__.endswith("CombinedBackward"), (name, out.grad_fn)
    with _WritingOps() as ops:
        torch.autograd.grad(out, inputs, torch.ones_like(out))
    assert bool(ops.writing) == (name in ("strided mean", "shifted relu")), (name, ops.writing)


# --------------------------------------------------------------- on a GPU (make bench-gpu)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_auto_runs_lean_and_reduce_overhead_compiles():
    """On CUDA the default plan is lean: bf16 channels_last training equals the reference path;
    after the measuring steps ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) trains
    with the eager model's losses."""
    torch.manual_seed(0)
    fmt = torch.channels_last
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=16, num_classes=5,
                                      scheme_options={"measure_batches": 2}).cuda().to(memory_format=fmt)
    ref = rescale_core.set_plan(copy.deepcopy(model), "reference")
    x = (torch.randn(8, 3, 64, 64, device="cuda") + 0.3).contiguous(memory_format=fmt)
    y = torch.arange(8, device="cuda") % 5

    def loss_of(net):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.cross_entropy(net(x), y)

    for _ in range(3):
        losses = [loss_of(net) for net in (model, ref)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[0].float(), losses[1].float(), rtol=2e-2, atol=2e-2)
    assert plans.running_plan(model, x) == "lean"  # auto chose lean for CUDA tensors
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (model, eager)]
    for _ in range(6):
        losses = []
        for net, opt in ((compiled, opts[0]), (eager, opts[1])):
            opt.zero_grad(set_to_none=True)
            loss = loss_of(net)
            loss.backward()
            opt.step()
            losses.append(loss.detach().float())
        assert torch.isfinite(losses[0])
        torch.testing.assert_close(losses[0], losses[1], rtol=5e-2, atol=5e-2)
    torch._dynamo.reset()
