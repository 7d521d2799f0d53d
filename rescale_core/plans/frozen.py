"""The frozen plan: evaluation from weights folded once (``docs/design.md``, "The frozen plan").

Training pays for the schemes' offsets, scalar biases and gains every step because they are
learned (RescaleNet, Shao et al. 2020; SkipInit, De & Smith 2020; Fixup, Zhang et al. 2019;
ReZero, Bachlechner et al. 2020); evaluation need not. In eval mode with autograd off
(``torch.no_grad``, ``torch.inference_mode``: Lightning's validate, test and predict) on a fast
plan, a module computes from weights and biases folded once and cached on it: a plain conv/ReLU
network, the ops of the network without normalization (:mod:`rescale_core.plans.dispatch` asks
this plan first there).

Every fold is exact, from the identities of :mod:`rescale_core.plans.folds` and one more:

- an offset in front of a convolution without padding becomes its bias (1); a multiplier of a
  convolution's output and an offset after it (``gain * branch_scale``, Fixup's scalar biases)
  fold into its weight and bias (3);
- an offset in front of a zero-padded convolution (where it is not a bias: the border sees the
  padding's zeros) crosses the ReLU before it, ``relu(z) + e = max(z + e, e)`` (2), and the
  max-pools after that ReLU (their padding is ``-inf``: ``maxpool(y + e) = maxpool(y) + e``);
- **a block's input offset rides in the residual stream**: where a block's first convolution is
  padded, the stem or the block before it returns ``max(s + e, e) = relu(s) + e`` for the
  block's offset ``e``, and the convolution reads the stream as it is; the skip path then
  carries ``e`` too, so ``-alpha e`` folds into the bias of the convolution the skip path is
  added to, or, with a projection shortcut, into its 1x1 convolution's bias (average pooling
  commutes with a constant, 4);
- the offset before global average pooling and Fixup's bias before the classifier fold into the
  classifier's bias: ``fc(avgpool(y) + e) = fc(avgpool(y)) + W e`` (4, then 1).

RescaleNet's skip multiplier is the ``alpha`` of the merge's add (``f.add_(skip, alpha)``, one op
as a plain add), not carried. Under autocast the folds are made in the parameters' dtype and
autocast casts the folded weights as it casts a convolution's; the ReLUs' floors are cast once to
the activations' dtype.

**The cache** (:func:`frozen_program`): one :class:`FrozenState` per module, holding one program
per key (what the module is asked for and the activations' dtypes). Eagerly, it is rebuilt
when any parameter or buffer it was folded from changed (version counter or storage: an
optimizer step, ``load_state_dict``, an in-place edit, a move) or a module, parameter or buffer
was registered anywhere (:func:`~rescale_core.plans.conditions.module_tree_version`). Compiled
code does not read version counters: the first compiled call folds in its graph and keeps the
result (``torch.compile`` replays the assignment after the graph runs), later calls read it;
:class:`~rescale_core.plans.dispatch.Planned` drops it at every event that may change the
weights (``train()``, ``to``, ``load_state_dict``, an optimizer step, ``set_plan``). Under
``torch.export`` and ``torch.jit.trace`` a kept program is used as it is (its tensors become the
graph's constants: evaluate once under ``no_grad``, then export), and without one the folds are
traced from the parameters and not kept.

One function per module type: :func:`residual_block` (a block called on its own: a detection
backbone's layer getter), :func:`resnet` (the whole network, offsets riding in the stream),
:func:`vgg` and :func:`sublayer` (the Transformer's, with its branch's last linear layer folded).
"""
from __future__ import annotations

import itertools
import operator
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import ResidualBlock, ResidualSublayer
from ..layers import MeanShiftBias, ScalarBias, StridedAvgPool
from ..models.resnet import ResNet
from ..models.vgg import VGG
from .conditions import has_hooks_below, has_hooks_in, module_tree_version
from .dispatch import FROZEN, FROZEN_SLOT, register
from .folded import branch_multiplier, run_sublayer, sublayer_applies
from .folds import (FrozenLinear, add_bias, input_offset_bias, is_offset_module, offset_of, pads, scale_bias,
                    scale_out)
from .shared import activation_dtype, add_skip, plain_block

__all__ = ["FrozenState", "frozen_program", "Conv", "Relu", "Block", "fold_block", "run_block",
           "residual_block", "resnet", "vgg", "sublayer"]


# --------------------------------------------------------------- the cache
_VERSION = operator.attrgetter("_version")


def _stamp(tensors: tuple) -> tuple:
    return tuple(map(_VERSION, tensors)), tuple(map(torch.Tensor.data_ptr, tensors))


class FrozenState:
    """What a module's frozen plan folded: ``programs`` by key; for an eager build also the
    parameters and buffers it was folded from, their version counters and storages, and the
    module-tree version (a build in compiled code has none: it is never current eagerly)."""

    def __init__(self, module: nn.Module | None = None) -> None:
        self.programs: dict = {}
        if module is None:
            self.tensors, self.stamp, self.tree = (), None, None
        else:
            self.tensors = tuple(itertools.chain(module.parameters(), module.buffers()))
            self.stamp = _stamp(self.tensors)
            self.tree = module_tree_version()

    def current(self) -> bool:
        """Whether nothing it was folded from has changed since."""
        return self.stamp is not None and self.tree == module_tree_version() and _stamp(self.tensors) == self.stamp


def frozen_program(module: nn.Module, key: str, build: Callable):
    """``build()`` (under no autograd) folded once and kept on ``module`` under ``key``, rebuilt
    when what it was folded from changes (the module docstring says how, eagerly and compiled)."""
    state = getattr(module, FROZEN_SLOT)
    if torch.compiler.is_exporting() or torch.jit.is_tracing() or (
            torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling()):
        # the parameters are the tracer's: use what an evaluation kept, or fold in the graph
        if state is not None and key in state.programs:
            return state.programs[key]
        return build()
    if torch.compiler.is_dynamo_compiling():
        if state is None:
            state = FrozenState()
            setattr(module, FROZEN_SLOT, state)
    elif state is None or not state.current():
        state = FrozenState(module)
        setattr(module, FROZEN_SLOT, state)
    if key not in state.programs:
        state.programs[key] = build()
    return state.programs[key]


# --------------------------------------------------------------- the steps of a frozen program
class Conv(NamedTuple):
    """A convolution (its module gives stride, padding, dilation, groups) with folded weights."""

    module: nn.Module
    weight: torch.Tensor
    bias: torch.Tensor | None


class Relu(NamedTuple):
    """``relu`` (``floor`` None) or ``max(., floor)``: a ReLU with an offset carried across it."""

    floor: torch.Tensor | None


def _conv(step: Conv, x: torch.Tensor) -> torch.Tensor:
    return step.module._conv_forward(x, step.weight, step.bias)


def _relu(z: torch.Tensor, floor: torch.Tensor | None) -> torch.Tensor:
    """``relu(z)`` or ``max(z, floor)``, in place on ``z`` (a fresh output) in eager mode."""
    if floor is None:
        return torch.relu_(z)
    if torch.compiler.is_compiling():
        return torch.maximum(z, floor)
    return torch.maximum(z, floor, out=z)


def _run_steps(steps: tuple, x: torch.Tensor) -> torch.Tensor:
    """A sequence of steps: a :class:`Conv`, a :class:`~rescale_core.plans.folds.FrozenLinear`,
    a :class:`Relu`, an offset tensor to add, or a module to call (a pool)."""
    for step in steps:
        if isinstance(step, Conv):
            x = _conv(step, x)
        elif isinstance(step, FrozenLinear):
            x = F.linear(x, step.weight, step.bias)
        elif isinstance(step, Relu):
            x = _relu(x, step.floor)
        elif isinstance(step, torch.Tensor):
            x = x + step.to(x.dtype)
        else:
            x = step(x)
    return x


def _channels(t: torch.Tensor, dims: int, dtype: torch.dtype) -> torch.Tensor:
    """An offset (one value or one per channel) shaped to broadcast over (N, C, *spatial)
    activations with ``dims`` spatial dims, in ``dtype``."""
    return t.detach().reshape((1, -1) + (1,) * dims).to(dtype)


def _bias(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """A folded bias as a layer takes it: ``n`` values in one block of memory (a scalar term
    broadcast once)."""
    if bias is None:
        return None
    bias = bias.detach().reshape(-1)
    return (bias.expand(n) if bias.shape[0] != n else bias).contiguous()


def _sum(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """The sum of two offsets (one value or one per channel; None is 0)."""
    if a is None or b is None:
        return b if a is None else a
    return a.reshape(-1) + b.reshape(-1)


# --------------------------------------------------------------- the residual block
class Block(NamedTuple):
    """A residual block as a plain one: ``relu(conv_m(...relu(conv_1(s + pre))...) + alpha
    * skip)``, each ReLU with its floor (None: a plain ReLU), ``skip`` the stream or the
    shortcut's steps on it."""

    pre: torch.Tensor | None
    convs: tuple
    floors: tuple
    shortcut: tuple | None
    alpha: float
    floor: torch.Tensor | None


def _carries_input_offset(block: ResidualBlock) -> bool:
    """Whether ``block``'s first offset should ride in the stream: there is one, and the first
    convolution pads (so it cannot be a bias)."""
    return isinstance(block.shift1, (MeanShiftBias, ScalarBias)) and pads(block.conv1)


def fold_block(block: ResidualBlock, carried: bool, floor: torch.Tensor | None, dtype: torch.dtype,
               in_dtype: torch.dtype) -> Block:
    """``block`` (a :func:`~rescale_core.plans.shared.plain_block`, in eval mode) as a
    :class:`Block` for activations of ``dtype`` and an input of ``in_dtype``. ``carried``: the
    stream holds the block's input plus its first offset; ``floor``: the offset its output
    carries for the next block (None: none)."""
    m = block.num_convs
    convs = [getattr(block, f"conv{i}") for i in range(1, m + 1)]
    dims = convs[0].weight.dim() - 2
    weights = [c.weight for c in convs]
    biases = [c.bias for c in convs]
    floors = [None] * (m - 1)
    e1 = offset_of(block.shift1)
    carried = carried and e1 is not None
    pre = None
    if e1 is not None and not carried:
        if pads(convs[0]):
            pre = _channels(e1, dims, in_dtype)
        else:
            biases[0] = add_bias(biases[0], input_offset_bias(weights[0], e1, convs[0].groups))
    for i in range(1, m):  # conv i + 1 reads relu(conv_i(h) + post_i) + e_{i+1}
        post = getattr(block, f"bn{i}")
        if isinstance(post, ScalarBias):  # Fixup's bias before the activation (3)
            biases[i - 1] = add_bias(biases[i - 1], post.bias)
        e = offset_of(getattr(block, f"shift{i + 1}"))
        if e is None:
            continue
        if pads(convs[i]):  # across the ReLU (2)
            biases[i - 1] = add_bias(biases[i - 1], e)
            floors[i - 1] = _channels(e, dims, dtype)
        else:  # into the next conv's bias (1)
            biases[i] = add_bias(biases[i], input_offset_bias(weights[i], e, convs[i].groups))
    merge = block.merge
    scale = branch_multiplier(merge)
    if scale is not None:  # gain * branch_scale into the last conv (3)
        weights[-1], biases[-1] = scale_out(weights[-1], scale), scale_bias(biases[-1], scale)
    if merge.bias is not None:  # Fixup's bias after the multiplier
        biases[-1] = add_bias(biases[-1], merge.bias.bias)
    alpha = merge.skip_scale
    if carried and block.downsample is None:  # the skip path carries e1: alpha * (s - e1)
        biases[-1] = add_bias(biases[-1], -alpha * e1)
    if floor is not None:  # the next block's offset, across this block's ReLU (2)
        biases[-1] = add_bias(biases[-1], floor)
        floor = _channels(floor, dims, dtype)
    shortcut = None
    if block.downsample is not None:
        shortcut = _fold_shortcut(block.downsample, -e1 if carried else None, dims, dtype)
    steps = tuple(Conv(c, w.detach(), _bias(b, c.out_channels)) for c, w, b in zip(convs, weights, biases))
    return Block(pre, steps, tuple(floors), shortcut, alpha, floor)


def _fold_shortcut(seq: nn.Sequential, pending: torch.Tensor | None, dims: int, dtype: torch.dtype) -> tuple:
    """The shortcut's steps, every offset (and the stream's ``pending`` one) folded into the
    bias of the convolution after it (1; an average pool in between commutes with it, 4)."""
    steps = []
    for mod in seq:
        if isinstance(mod, nn.modules.conv._ConvNd):
            bias = mod.bias
            if pending is not None and pads(mod):
                steps.append(_channels(pending, dims, dtype))
            elif pending is not None:
                bias = add_bias(bias, input_offset_bias(mod.weight, pending, mod.groups))
            pending = None
            steps.append(Conv(mod, mod.weight, _bias(bias, mod.out_channels)))
        elif is_offset_module(mod):
            pending = _sum(pending, offset_of(mod))
        elif isinstance(mod, StridedAvgPool) and mod.spatial_dims == 3:
            # one avg_pool3d: in a forward on a CPU up to 1.8x faster than the eight strided
            # sums the module's forward takes there (which pay off in training's backward)
            steps.append(mod.pool)
        else:
            steps.append(mod)
    return tuple(steps)


def run_block(block: Block, s: torch.Tensor) -> torch.Tensor:
    """A folded block on the stream ``s``."""
    h = s if block.pre is None else s + block.pre.to(s.dtype)
    for step, floor in zip(block.convs, block.floors):
        h = _relu(_conv(step, h), floor)
    f = _conv(block.convs[-1], h)
    skip = s if block.shortcut is None else _run_steps(block.shortcut, s)
    return _relu(add_skip(f, skip, block.alpha), block.floor)


def _block_applies(block: ResidualBlock, x: torch.Tensor) -> bool:
    return not has_hooks_below(block) and plain_block(block)


@register(FROZEN, ResidualBlock, applies=_block_applies)
def residual_block(block: ResidualBlock, x: torch.Tensor) -> torch.Tensor:
    """A block called on its own (a detection backbone's layer getter): input and output in
    true units, its first offset a bias or, before a padded convolution, one add."""
    dtype = activation_dtype(x)
    program = frozen_program(block, f"block {dtype} {x.dtype}",
                             lambda: fold_block(block, False, None, dtype, x.dtype))
    return run_block(program, x)


# --------------------------------------------------------------- the ResNet
class _Head(NamedTuple):
    pool: nn.Module
    shift: torch.Tensor | None       # the offset before pooling, where it does not fold
    norm: nn.Module
    dropout: nn.Module
    linear: FrozenLinear | None
    after: torch.Tensor | None       # Fixup's classifier bias without a classifier


class _Net(NamedTuple):
    stem: Conv
    stem_floor: torch.Tensor | None
    stem_pool: nn.Module
    stages: tuple                    # (temporal pool or None, blocks) per stage
    head: _Head


def _plain_resnet(model: ResNet) -> bool:
    return (is_offset_module(model.bn1) and is_offset_module(model.pool_shift)
            and is_offset_module(model.fc_bias) and isinstance(model.fc, (nn.Linear, nn.Identity))
            and all(isinstance(b, ResidualBlock) and b.fused and plain_block(b)
                    for _, stage in model.stage_modules() for b in stage))


def _resnet_applies(model: ResNet, x: torch.Tensor) -> bool:
    return not has_hooks_in(model) and _plain_resnet(model)


def _fold_head(model: ResNet) -> _Head:
    e, fc_bias = offset_of(model.pool_shift), offset_of(model.fc_bias)
    linear = after = None
    if isinstance(model.fc, nn.Linear):
        w, bias = model.fc.weight, model.fc.bias
        if fc_bias is not None:
            bias = add_bias(bias, input_offset_bias(w, fc_bias))
        if e is not None and isinstance(model.head_norm, nn.Identity):
            bias, e = add_bias(bias, input_offset_bias(w, e)), None
        linear = FrozenLinear(w, _bias(bias, model.fc.out_features))
    elif fc_bias is not None:
        after = fc_bias.detach()
    shift = None if e is None else e.detach().reshape(1, -1)
    return _Head(model.avgpool, shift, model.head_norm, model.dropout, linear, after)


def _fold_resnet(model: ResNet, apart: bool, dtype: torch.dtype) -> _Net:
    """The network as a plain one. ``apart``: every stage returns true units (its output is
    wanted: ``stage_outputs``), so no offset rides across a stage boundary."""
    blocks = [(s, b) for s, (_, stage) in enumerate(model.stage_modules()) for b in stage]
    carried = [_carries_input_offset(b) and not (apart and j > 0 and blocks[j - 1][0] != s)
               for j, (s, b) in enumerate(blocks)]
    riding = [offset_of(b.shift1) if c else None for (_, b), c in zip(blocks, carried)]
    folded = [fold_block(b, carried[j], riding[j + 1] if j + 1 < len(blocks) else None, dtype, dtype)
              for j, (_, b) in enumerate(blocks)]
    conv = model.conv1
    bias = add_bias(conv.bias, offset_of(model.bn1))  # the stem's offset after its conv
    floor = riding[0] if blocks else None
    if floor is not None:
        bias = add_bias(bias, floor)
        floor = _channels(floor, conv.weight.dim() - 2, dtype)
    stem = Conv(conv, conv.weight, _bias(bias, conv.out_channels))
    stages, j = [], 0
    for tpool, stage in model.stage_modules():
        stages.append((tpool, tuple(folded[j:j + len(stage)])))
        j += len(stage)
    return _Net(stem, floor, model.maxpool, tuple(stages), _fold_head(model))


def _run_head(head: _Head, x: torch.Tensor) -> torch.Tensor:
    v = torch.flatten(head.pool(x), 1)
    if head.shift is not None:
        v = v + head.shift.to(v.dtype)
    v = head.dropout(head.norm(v))
    if head.linear is not None:
        return F.linear(v, head.linear.weight, head.linear.bias)
    return v if head.after is None else v + head.after.to(v.dtype)


@register(FROZEN, ResNet, applies=_resnet_applies)
def resnet(model: ResNet, x: torch.Tensor, part: str, stages: list | None = None) -> torch.Tensor:
    """``part`` of the network (``ResNet``'s reference ``_run``) as a plain conv/ReLU network."""
    dtype, mode = activation_dtype(x), "apart" if stages is not None else "net"
    net = frozen_program(model, f"{mode} {dtype}", lambda: _fold_resnet(model, stages is not None, dtype))
    if part == "head":
        return _run_head(net.head, x)
    h = net.stem_pool(_relu(_conv(net.stem, x), net.stem_floor))
    for tpool, blocks in net.stages:
        if tpool is not None:  # a max-pool: an offset riding in the stream passes
            h = tpool(h)
        for block in blocks:
            h = run_block(block, h)
        if stages is not None:
            stages.append(h)
    return h if part == "features" else _run_head(net.head, h)


# --------------------------------------------------------------- VGG
_VGG_MODULES = (nn.Conv2d, nn.ReLU, nn.MaxPool2d, MeanShiftBias, nn.Linear, nn.Dropout, nn.Identity)


def _vgg_applies(model: VGG, x: torch.Tensor) -> bool:
    return not has_hooks_in(model) and all(
        isinstance(m, _VGG_MODULES) for m in itertools.chain(model.features, model.classifier))


def _fold_features(model: VGG, dtype: torch.dtype, in_dtype: torch.dtype) -> tuple:
    """The conv stack with each offset across the ReLU and max-pools before it (2) into the
    previous conv's bias; the first (on the input) added."""
    steps: list = []
    relu = None  # the step of the last ReLU whose output reaches here through max-pools only
    for mod in model.features:
        if isinstance(mod, MeanShiftBias):
            e = offset_of(mod)
            if relu is None:
                steps.append(_channels(e, 2, dtype if steps else in_dtype))
            else:
                conv = steps[relu - 1]
                steps[relu - 1] = conv._replace(bias=add_bias(conv.bias, e))
                steps[relu] = Relu(_channels(e, 2, dtype))
            relu = None
        elif isinstance(mod, nn.Conv2d):
            steps.append(Conv(mod, mod.weight, mod.bias))
            relu = None
        elif isinstance(mod, nn.ReLU):
            relu = len(steps) if steps and isinstance(steps[-1], Conv) else None
            steps.append(Relu(None))
        else:  # a max-pool passes an offset
            steps.append(mod)
    return tuple(s._replace(bias=_bias(s.bias, s.module.out_channels)) if isinstance(s, Conv) else s
                 for s in steps)


def _fold_classifier(model: VGG) -> tuple:
    """The classifier with each offset folded into the next linear layer's bias (1)."""
    steps: list = []
    pending = None
    for mod in model.classifier:
        if isinstance(mod, MeanShiftBias):
            pending = _sum(pending, offset_of(mod))
        elif isinstance(mod, nn.Linear):
            bias = mod.bias if pending is None else add_bias(mod.bias, input_offset_bias(mod.weight, pending))
            steps.append(FrozenLinear(mod.weight, _bias(bias, mod.out_features)))
            pending = None
        elif isinstance(mod, nn.ReLU):
            steps.append(Relu(None))
        else:
            steps.append(mod)
    if pending is not None:
        steps.append(pending.detach())
    return tuple(steps)


@register(FROZEN, VGG, applies=_vgg_applies)
def vgg(model: VGG, x: torch.Tensor) -> torch.Tensor:
    dtype = activation_dtype(x)
    features, classifier = frozen_program(model, f"vgg {dtype} {x.dtype}", lambda: (
        _fold_features(model, dtype, x.dtype), _fold_classifier(model)))
    return _run_steps(classifier, torch.flatten(model.avgpool(_run_steps(features, x)), 1))


# --------------------------------------------------------------- the Transformer sublayer
def _sublayer_applies(sub: ResidualSublayer, x: torch.Tensor) -> bool:
    return sublayer_applies(sub, x) and hasattr(sub.fn, "out_scale_layer")


def _fold_out_layer(sub: ResidualSublayer) -> FrozenLinear | None:
    """The branch's last linear layer with ``gain * branch_scale`` folded in (3); None: 1."""
    scale = branch_multiplier(sub.merge)
    if scale is None:
        return None
    layer = getattr(sub.fn, sub.fn.out_scale_layer)
    bias = None if layer.bias is None else scale_bias(layer.bias, scale).detach()
    return FrozenLinear(scale_out(layer.weight, scale).detach(), bias)


@register(FROZEN, ResidualSublayer, applies=_sublayer_applies)
def sublayer(sub: ResidualSublayer, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The sublayer with its branch's last linear layer folded once, then one add of the skip."""
    return run_sublayer(sub, x, frozen_program(sub, "sublayer", lambda: _fold_out_layer(sub)), *args, **kwargs)
