"""``python -m benchmarks.opcount``: ops launched per eager train step, per family, scheme and plan,
and per eval forward (the frozen inference plan against the training plans evaluating).

An eager GPU step is host-bound: every op it launches costs ~9 us of host time on an H100 node
whatever its size (``docs/design.md``, "Host cost per launched op"), so what an eager step costs
there is about ``max(kernel time, ops x 9 us)``. The ops a step launches do not depend on the
device, so they are counted here on the CPU, exactly and repeatably, the way a GPU step would
launch them:

- one train step (forward, backward, optimizer) under bf16 autocast, channels_last for the
  conv families, batch 2, after the mean-shift measuring steps (and one measuring step for
  RescaleNet, counted apart); SGD with momentum and weight decay in its multi-tensor
  (``foreach``) form, which is what ``torch.optim.SGD`` picks on CUDA (on the CPU it picks the
  per-parameter loop, which would charge every added gain and bias four more ops);
- counted by a :class:`~torch.utils._python_dispatch.TorchDispatchMode` around the step:
  **launches** (the train tables) are the aten ops that are not views (a view launches no
  kernel), not bare allocations (``empty``: the caching allocator launches nothing) and that
  return a tensor (``promote_types`` and profiler markers launch nothing); **dispatches** are
  every call, views included (each still costs host time, much less);
- an eval forward is counted in **kernels** (:meth:`OpCounter.ran_kernel`), judged by what an op
  did: it wrote an argument or returned a tensor in storage of its own. Under
  ``torch.inference_mode`` the dispatcher shows composite ops whole: autocast's casts as
  ``aten.to`` (marked a view, so the launch count leaves them out) and an eval-mode ``dropout``
  that hands its input back (which the launch count charges); judged by what they did, the
  kernels are the same under ``torch.no_grad`` and ``torch.inference_mode``, casts included
  (**casts**: the dtype conversions among them). In a train step the two counts differ only by
  metadata ops (``as_strided_``, ``_unsafe_view``: one or two per step);
- the counts depend on the network's structure, not on its widths or the input size, so the
  models are narrow and the inputs small (a second per contender);
- an eval forward (eval mode, under ``torch.no_grad`` and under ``torch.inference_mode``) is
  counted in the steady state, after a first forward that folds the frozen plan's weights
  (:mod:`rescale_core.plans.frozen`: once per evaluation), and again with the frozen plan off
  (``set_frozen(model, False)``: the plan set on the model evaluates, as before the frozen plan
  existed), both under bf16 autocast and channels_last and in float32 on contiguous tensors (the
  CPU default);
- one adaptive gradient clipping call (:mod:`rescale_core.agc`, the ``agc_clip`` training option)
  on the parameters it clips in training (all but the output layer), next to the lean train step
  and to timm's per-parameter ``adaptive_clip_grad``: its launches include its one in-place
  ``_foreach_copy_``, which returns nothing (:class:`WriteCounter`; the train-step counts leave
  such ops out: SGD's three in-place foreach updates).

Families: ResNet-50 (bottleneck), ResNeXt-50 32x4d (grouped bottleneck), ResNet-18 (basic),
Wide-ResNet 16-4, the R3D-18 video ResNet, VGG-11 and the Transformer (``transformer_tiny``),
each with its normalized baseline (BN; post-LN) and its no-normalization floor (scheme ``none``,
or the Transformer without LayerNorm and without gains), all built by
:func:`rescale_core.create_model`; every normalization-free scheme under the ``folded`` and
``lean`` plans (:mod:`rescale_core.plans`).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import rescale_core
from rescale_core.agc import adaptive_clip_grad_, unit_size
from rescale_tasks.common.training import output_layers

from .toolkit import SectionResult, Settings, Table

__all__ = ["OpCounter", "Family", "FAMILIES", "StepCount", "count_step", "count_contender",
           "op_counts", "op_table", "EvalCount", "count_eval", "eval_counts", "eval_table", "WriteCounter",
           "AgcCount", "count_agc", "agc_table", "section_ops", "main"]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it: ``launches`` (not views or allocations,
    returning a tensor: what the train-step tables count), ``kernels`` (what a device launches:
    an op that writes an argument or returns a tensor in storage of its own, casts included, the
    same under ``torch.no_grad`` and ``torch.inference_mode``), ``casts`` (the dtype conversions
    among the kernels) and ``dispatches`` (every call); ``by_op`` the launches per op name and
    ``by_kernel`` the kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.launches = 0
        self.kernels = 0
        self.casts = 0
        self.dispatches = 0
        self.by_op: Counter = Counter()
        self.by_kernel: Counter = Counter()

    # allocations: the caching allocator hands out memory without a kernel
    ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")

    @staticmethod
    def launches_kernel(func) -> bool:
        if func.namespace != "aten" or func.is_view or func._schema.name.split("::")[-1] in OpCounter.ALLOCATIONS:
            return False
        return any(isinstance(r.type, torch.TensorType) or "Tensor" in str(r.type)
                   for r in func._schema.returns)

    @staticmethod
    def ran_kernel(func, args: tuple, kwargs: dict, out) -> bool:
        """Whether the call launched a kernel, judged by what it did rather than by its schema:
        it wrote one of its arguments (an in-place or ``out=`` op; a metadata-only
        ``as_strided_`` writes nothing), or returned a tensor whose storage none of its arguments
        has. So ``aten.to``, which the dispatcher marks a view because it aliases where nothing
        changes, counts where it casts (autocast's casts under ``torch.inference_mode``), and an
        op that hands its input back (``dropout`` in eval mode, seen whole under
        ``torch.inference_mode``) does not."""
        if (func.namespace != "aten" or func._schema.name.split("::")[-1] in OpCounter.ALLOCATIONS
                or torch.Tag.inplace_view in func.tags):
            return False
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outs:
            return False
        if func._schema.is_mutable:
            return True
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        return any(t.untyped_storage().data_ptr() not in inputs for t in outs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.dispatches += 1
        out = func(*args, **kwargs)
        if self.launches_kernel(func):
            self.launches += 1
            self.by_op[str(func)] += 1
        if self.ran_kernel(func, args, kwargs, out):
            self.kernels += 1
            self.by_kernel[str(func)] += 1
            if (func._schema.name in ("aten::_to_copy", "aten::to") and isinstance(out, torch.Tensor)
                    and out.dtype != args[0].dtype):
                self.casts += 1
        return out


@dataclass(frozen=True)
class Family:
    """A model family: how to build it under a scheme, a batch for it and its loss."""

    name: str
    build: Callable[..., nn.Module]         # build(scheme, scheme_options) -> model
    make_batch: Callable[[], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
    baseline: str                           # scheme of the normalized baseline
    floor: tuple[str, dict | None]          # scheme (and options) of the no-normalization floor
    schemes: tuple[str, ...]                # the normalization-free schemes
    conv: bool = True                       # channels_last applies
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy


def _images(size: int, classes: int = 5, frames: int | None = None):
    def make():
        g = torch.Generator().manual_seed(0)
        shape = (2, 3, size, size) if frames is None else (2, 3, frames, size, size)
        return (torch.randn(shape, generator=g) + 0.3,), torch.arange(2) % classes
    return make


def _tokens():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 100, (2, 8), generator=g)
    tgt = torch.randint(4, 100, (2, 9), generator=g)
    return (src, tgt[:, :-1]), tgt[:, 1:]


def _seq_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def _conv(arch: str, **kwargs):
    def build(scheme: str, options: dict | None = None) -> nn.Module:
        return rescale_core.create_model(arch, scheme=scheme, scheme_options=options, num_classes=5, **kwargs)
    return build


def _transformer(scheme: str, options: dict | None = None) -> nn.Module:
    return rescale_core.create_model("transformer_tiny", scheme=scheme, scheme_options=options,
                                     src_vocab_size=100)


# the normalization-free schemes, then NF-ResNet's and DyT's (BatchNorm's place taken by the pointwise
# layer: the counter-example of docs/studies.md)
_CONV_SCHEMES = ("rescale", "skipinit", "fixup", "rezero", "nf", "dyt")
FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("ResNet-50", _conv("resnet50", base_width=8), _images(64), "bn", ("none", None), _CONV_SCHEMES),
    Family("ResNeXt-50 32x4d", _conv("resnext50_32x4d", base_width=16), _images(64), "bn", ("none", None),
           _CONV_SCHEMES),
    Family("ResNet-18", _conv("resnet18", base_width=8), _images(64), "bn", ("none", None), _CONV_SCHEMES),
    Family("Wide-ResNet 16-4", _conv("wide_resnet", depth=16, width=4, base_width=4), _images(32), "bn",
           ("none", None), _CONV_SCHEMES),
    Family("R3D-18 (3D)", _conv("r3d_18", base_width=8), _images(32, frames=4), "bn", ("none", None),
           _CONV_SCHEMES),
    Family("VGG-11", _conv("vgg11", base_width=8, hidden_dim=32), _images(32), "bn", ("none", None),
           ("rescale",)),
    Family("Transformer", _transformer, _tokens, "post_ln", ("skipinit", {"gain": None}),
           ("rescale", "rezero", "skipinit", "tfixup", "deepnorm", "dyt", "derf"), conv=False, loss=_seq_loss),
]}


@dataclass
class StepCount:
    launches: int
    dispatches: int
    by_op: Counter = field(default_factory=Counter)
    kernels: int = 0     # what a device launches, casts included (OpCounter.ran_kernel)
    casts: int = 0       # the dtype conversions among them
    by_kernel: Counter = field(default_factory=Counter)


def count_step(model: nn.Module, inputs: tuple, targets: torch.Tensor, loss: Callable,
               optimizer: torch.optim.Optimizer, autocast: bool = True, train: bool = True,
               inference_mode: bool = True, counter_type: type[OpCounter] | None = None) -> StepCount:
    """The ops of one train step (zero_grad, forward, loss, backward, optimizer step), or of one
    eval forward (``train=False``, under ``torch.inference_mode``, or ``torch.no_grad`` with
    ``inference_mode=False``); ``counter_type``: :class:`WriteCounter` counts the in-place ops
    that return nothing too (SGD's three foreach updates), which the train tables leave out."""
    counter = (counter_type or OpCounter)()
    with counter:
        if train:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                value = loss(model(*inputs), targets)
            value.backward()
            optimizer.step()
        else:
            mode = torch.inference_mode() if inference_mode else torch.no_grad()
            with mode, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                model(*inputs)
    return StepCount(counter.launches, counter.dispatches, counter.by_op, counter.kernels, counter.casts,
                     counter.by_kernel)


@dataclass
class ContenderCount:
    family: str
    name: str          # scheme label
    role: str          # "baseline" | "floor" | "scheme"
    plan: str
    train: StepCount
    measuring: StepCount | None = None


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    # lr 0: the floors would diverge on real updates; the update is still computed in full
    return torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=1e-4, foreach=True)


def _built(family: Family, scheme: str, options: dict | None, plan: str, channels_last: bool = True):
    torch.manual_seed(0)
    model = family.build(scheme, options)
    rescale_core.set_plan(model, plan)
    inputs, targets = family.make_batch()
    if family.conv and channels_last:
        fmt = torch.channels_last_3d if inputs[0].dim() == 5 else torch.channels_last
        model = model.to(memory_format=fmt)
        inputs = tuple(x.contiguous(memory_format=fmt) for x in inputs)
    return model, inputs, targets


def count_contender(family: Family, scheme: str, options: dict | None = None, plan: str = "auto",
                    role: str = "scheme", label: str | None = None) -> ContenderCount:
    """The ops of a train step (and of a measuring step, for RescaleNet) on ``plan``."""
    model, inputs, targets = _built(family, scheme, options, plan)
    model.train()
    opt = _sgd(model)
    measuring = None
    if rescale_core.mean_shift_layers(model):  # step 1 creates the momentum buffers; step 2 counts
        count_step(model, inputs, targets, family.loss, opt)
        measuring = count_step(model, inputs, targets, family.loss, opt)
        assert any(m.measuring for m in rescale_core.mean_shift_layers(model))
        rescale_core.finish_measuring(model)
    for _ in range(2):
        count_step(model, inputs, targets, family.loss, opt)
    train = count_step(model, inputs, targets, family.loss, opt)
    return ContenderCount(family.name, label or scheme, role, plan, train, measuring)


def op_counts(families: list[str] | None = None, plans: tuple[str, ...] = ("folded", "lean"),
              schemes: list[str] | None = None) -> list[ContenderCount]:
    """Baseline, floor and every normalization-free scheme under each plan, per family."""
    out = []
    for name in families or list(FAMILIES):
        fam = FAMILIES[name]
        out.append(count_contender(fam, fam.baseline, None, "auto", "baseline"))
        floor_scheme, floor_options = fam.floor
        out.append(count_contender(fam, floor_scheme, floor_options, "auto", "floor", "floor"))
        for scheme in fam.schemes:
            if schemes is not None and scheme not in schemes:
                continue
            for plan in plans:
                out.append(count_contender(fam, scheme, None, plan))
    return out


def _label(c) -> str:
    return {"baseline": f"{c.name} (baseline)", "floor": "floor (no norm)"}.get(c.role, c.name)


def op_table(counts: list[ContenderCount]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows: launches per train step, its ratio to the family's floor and baseline,
    a measuring step's launches (RescaleNet) and all dispatches."""
    columns = ["family", "contender", "plan", "train launches", "x floor", "x baseline", "measuring step",
               "dispatches"]
    rows = []
    for c in counts:
        floor = next(o for o in counts if o.family == c.family and o.role == "floor")
        base = next(o for o in counts if o.family == c.family and o.role == "baseline")
        plan = "-" if c.role != "scheme" else c.plan
        rows.append([c.family, _label(c), plan, str(c.train.launches),
                     f"{c.train.launches / floor.train.launches:.2f}",
                     f"{c.train.launches / base.train.launches:.2f}",
                     "-" if c.measuring is None else
                     f"{c.measuring.launches} ({c.measuring.launches / c.train.launches:.2f}x)",
                     str(c.train.dispatches)])
    return columns, rows


# --------------------------------------------------------------- eval forwards
@dataclass
class EvalCount:
    family: str
    name: str            # scheme label
    role: str            # "baseline" | "floor" | "scheme"
    frozen: StepCount    # the frozen plan (what evaluation runs), under torch.inference_mode
    before: StepCount    # the frozen plan off: the default plan evaluating, under torch.inference_mode
    frozen_no_grad: StepCount | None = None   # the same two under torch.no_grad
    before_no_grad: StepCount | None = None


def count_eval(family: Family, scheme: str, options: dict | None = None, role: str = "scheme",
               label: str | None = None, autocast: bool = True, channels_last: bool = True) -> EvalCount:
    """One eval forward's ops (``torch.inference_mode`` and ``torch.no_grad``) in the steady
    state, with and without the frozen plan, on the default plan (``auto``: folded on the CPU),
    of a network that has measured its mean-shift statistics (as a trained one has)."""
    model, inputs, targets = _built(family, scheme, options, "auto", channels_last)
    rescale_core.finish_measuring(model)
    model.eval()
    counts = {}
    for enabled in (True, False):
        rescale_core.plans.set_frozen(model, enabled)
        for inference_mode in (True, False):
            count_step(model, inputs, targets, family.loss, None, autocast, False, inference_mode)  # folds once
            counts[enabled, inference_mode] = count_step(model, inputs, targets, family.loss, None, autocast,
                                                         False, inference_mode)
    return EvalCount(family.name, label or scheme, role, counts[True, True], counts[False, True],
                     counts[True, False], counts[False, False])


def eval_counts(families: list[str] | None = None, autocast: bool = True,
                channels_last: bool = True) -> list[EvalCount]:
    """Baseline, floor and every normalization-free scheme of each family, evaluating."""
    out = []
    for name in families or list(FAMILIES):
        fam = FAMILIES[name]
        out.append(count_eval(fam, fam.baseline, None, "baseline", None, autocast, channels_last))
        out.append(count_eval(fam, *fam.floor, "floor", "floor", autocast, channels_last))
        out += [count_eval(fam, scheme, None, "scheme", None, autocast, channels_last) for scheme in fam.schemes]
    return out


def eval_table(counts: list[EvalCount]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows: the kernels an eval forward launches, casts included, on the frozen plan
    against the family's floor and baseline, its casts, and before the frozen plan (the default
    plan evaluating). Counted under ``torch.no_grad``; a count under ``torch.inference_mode``
    that differs is given beside it."""
    columns = ["family", "contender", "eval launches", "casts", "x floor", "x baseline", "before (frozen off)",
               "before casts", "before x floor"]

    def both(no_grad: StepCount, inference: StepCount) -> str:
        text = str(no_grad.kernels)
        return text if inference.kernels == no_grad.kernels else f"{text} (inference_mode {inference.kernels})"

    rows = []
    for c in counts:
        floor = next(o for o in counts if o.family == c.family and o.role == "floor").frozen_no_grad.kernels
        base = next(o for o in counts if o.family == c.family and o.role == "baseline").frozen_no_grad.kernels
        frozen, before = c.frozen_no_grad, c.before_no_grad
        rows.append([c.family, _label(c), both(frozen, c.frozen), str(frozen.casts), f"{frozen.kernels / floor:.2f}",
                     f"{frozen.kernels / base:.2f}", both(before, c.before), str(before.casts),
                     f"{before.kernels / floor:.2f}"])
    return columns, rows


# --------------------------------------------------------------- adaptive gradient clipping
class WriteCounter(OpCounter):
    """:class:`OpCounter` that also counts, as launches, the aten ops that write their arguments
    and return nothing (the in-place foreach ops: ``_foreach_copy_``, ``_foreach_mul_`` ...)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func.namespace == "aten" and func._schema.is_mutable and not func._schema.returns:
            self.launches += 1
            self.by_op[str(func)] += 1
        return out


@dataclass
class AgcCount:
    family: str
    name: str            # scheme label
    parameters: int      # the parameters clipped (all but the output layer's)
    unit_sizes: int      # their distinct unit sizes (rescale_core.agc.unit_size)
    launches: int        # one adaptive_clip_grad_ call, its in-place foreach copy included
    timm: int | None     # timm's per-parameter adaptive_clip_grad on the same parameters (None: no timm)


def count_agc(family: Family, scheme: str, options: dict | None = None, plan: str = "lean") -> AgcCount:
    """The launches of one AGC call on the parameters of ``family`` under ``scheme`` that AGC
    clips in training (the output layer left out, :func:`rescale_tasks.common.training.output_layers`),
    with gradients in the layout a train step leaves them (the weights', channels_last for the
    conv families)."""
    model, _, _ = _built(family, scheme, options, plan)
    skip = {id(p) for m in output_layers(model) for p in m.parameters()}
    params = [p for p in model.parameters() if id(p) not in skip]
    for p in params:
        p.grad = torch.randn_like(p)
    counter = WriteCounter()
    with counter:
        adaptive_clip_grad_(params, 0.01)
    timm = None
    try:
        from timm.utils.agc import adaptive_clip_grad  # an optional dependency (the bench extra)
    except ImportError:
        pass
    else:
        loop = WriteCounter()
        with loop:
            adaptive_clip_grad(params, 0.01)
        timm = loop.launches
    return AgcCount(family.name, scheme, len(params), len({unit_size(p) for p in params}), counter.launches, timm)


def agc_table(agc: list[AgcCount], counts: list[ContenderCount]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows: one AGC call's launches against the lean train step of the same network."""
    columns = ["family", "contender", "parameters clipped", "unit sizes", "AGC launches", "x lean train step",
               "timm's loop"]
    rows = []
    for a in agc:
        train = next(c for c in counts if c.family == a.family and c.name == a.name and c.plan == "lean")
        rows.append([a.family, a.name, str(a.parameters), str(a.unit_sizes), str(a.launches),
                     f"{a.launches / train.train.launches:.3f}", "-" if a.timm is None else str(a.timm)])
    return columns, rows


#: what the train tables count (and leave out)
TRAIN_LAUNCHES_NOTE = (
    "launches: aten ops that are not views or bare allocations and return a tensor, so not SGD's three in-place "
    "foreach updates (momentum and weights: 3 more launches per step for every contender); an eager H100 step "
    "costs about max(kernel time, launches x 9 us); dispatches: every aten call, views included")


def section_ops(settings: Settings) -> SectionResult:
    """``make bench``'s op-count section (device independent: counted on the CPU)."""
    counts = op_counts()
    columns, rows = op_table(counts)
    result = SectionResult("ops")
    result.tables.append(Table(
        "Ops launched per eager train step (CPU count of what a GPU step launches; bf16 autocast, "
        "channels_last, batch 2, foreach SGD)", columns, rows,
        notes=[TRAIN_LAUNCHES_NOTE,
               "x floor / x baseline: against the family's network without normalization (scheme none; "
               "the Transformer without LayerNorm or gains) and its BN / post-LN baseline",
               "plans (rescale_core.plans): folded is the CPU default (auto), lean the accelerator default"]))
    for c in counts:
        if c.role == "scheme":
            floor = next(o for o in counts if o.family == c.family and o.role == "floor")
            result.metrics[f"ops {c.family} {c.name} {c.plan} x floor"] = c.train.launches / floor.train.launches
    agc = [count_agc(FAMILIES[name], "rescale") for name in FAMILIES]
    columns, rows = agc_table(agc, counts)
    result.tables.append(Table(
        "Adaptive gradient clipping: launches of one call (rescale_core.agc, --model.init_args.agc_clip) on the "
        "parameters it clips, against the lean train step", columns, rows,
        notes=["AGC launches: one gather of every gradient and weight, a norm and a scaling per unit size, the "
               "clipping factors (6 ops) and one foreach copy back: 2 x unit sizes + 9, whatever the number of "
               "parameters; timm's adaptive_clip_grad: about 10 per parameter",
               "x lean train step: against the step's launches in the first table (which leaves out SGD's three "
               "in-place foreach updates; the AGC count includes its in-place copy)",
               "parameters clipped: all but the output layer's (the paper's final linear layer; agc_clip_classifier "
               "clips it too)"]))
    for a, row in zip(agc, rows):
        result.metrics[f"ops agc {a.family} {a.name} x lean train step"] = float(row[5])
    for autocast, setting in ((True, "bf16 autocast, channels_last"), (False, "float32, contiguous: the CPU default")):
        evals = eval_counts(autocast=autocast, channels_last=autocast)
        columns, rows = eval_table(evals)
        result.tables.append(Table(
            f"Kernels launched per eval forward ({setting}; batch 2, torch.no_grad and torch.inference_mode, "
            "casts included)", columns, rows,
            notes=["eval launches: the kernels the frozen plan launches (rescale_core.plans.frozen: weights folded "
                   "once per evaluation and kept in autocast's dtype, counted after the first forward): every op "
                   "that writes an argument or returns a tensor of its own, autocast's casts included, the same "
                   "under torch.no_grad and torch.inference_mode; before: the same model with the frozen plan off "
                   "(set_frozen(model, False)), the plan auto evaluating as training computes",
                   "casts: the dtype conversions among them; under bf16 autocast the frozen plan's only one is the "
                   "input image's (CPU autocast pools 3D in float32: R3D-18's pools cast twice more each; the "
                   "Transformer's unfolded linear layers cast their weights as a post-LN model's do)",
                   "RescaleNet's projection shortcuts average-pool before their 1x1 convolution (the floor's stride "
                   "it): one op each above the floor (3 in a 4-stage ResNet)",
                   "float32 contiguous on a CPU: RescaleNet's 2D shortcut pools are several faster ops "
                   "(strided sums)"]))
        precision = "bf16" if autocast else "fp32"
        for c in evals:
            if c.role == "scheme":
                floor = next(o for o in evals if o.family == c.family and o.role == "floor")
                result.metrics[f"ops eval {precision} {c.family} {c.name} x floor"] = (
                    c.frozen_no_grad.kernels / floor.frozen_no_grad.kernels)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.opcount", description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=None)
    p.add_argument("--plans", nargs="+", choices=["folded", "lean", "reference"], default=["folded", "lean"])
    p.add_argument("--top", type=int, default=0, help="also list the N most launched ops per contender")
    p.add_argument("--eval", action="store_true", help="count eval forwards (frozen plan on and off) instead")
    p.add_argument("--fp32", action="store_true", help="with --eval: float32 on contiguous tensors (CPU default)")
    args = p.parse_args(argv)
    if args.eval:
        evals = eval_counts(args.families, autocast=not args.fp32, channels_last=not args.fp32)
        _print(eval_table(evals), [(f"{c.family} {c.name} eval", c.frozen_no_grad.by_kernel) for c in evals], args.top)
    else:
        counts = op_counts(args.families, tuple(args.plans))
        _print(op_table(counts), [(f"{c.family} {c.name} {c.plan}", c.train.by_op) for c in counts], args.top)
    return 0


def _print(table: tuple[list[str], list[list[str]]], steps: list[tuple[str, Counter]], top: int) -> None:
    """The table, then (``top`` > 0) each step's most launched ops."""
    columns, rows = table
    widths = [max(len(r[i]) for r in rows + [columns]) for i in range(len(columns))]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    for name, ops in steps if top else ():
        print(f"\n{name}: " + ", ".join(f"{op} {n}" for op, n in ops.most_common(top)))


if __name__ == "__main__":
    sys.exit(main())
