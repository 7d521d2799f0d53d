"""The frozen plan: evaluation from weights folded once (``docs/design.md``, "The frozen plan").

Training pays for the schemes' offsets, scalar biases and gains every step because they are
learned (RescaleNet, Shao et al. 2020; SkipInit, De & Smith 2020; Fixup, Zhang et al. 2019;
ReZero, Bachlechner et al. 2020); evaluation need not. In eval mode with autograd off
(``torch.no_grad``, ``torch.inference_mode``: Lightning's validate, test and predict) on a fast
plan, a module computes from weights and biases folded once and kept on it: a plain conv/ReLU
network, the ops of the network without normalization (:mod:`rescale_core.plans.dispatch` asks
this plan first there).

Every fold is one of the identities of :mod:`rescale_core.plans.folds`, and one more:

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

NF-ResNets (Brock et al. 2021; :data:`~rescale_core.plans.conditions.PLAN_FIELDS`, docs/nf_resnets.md):
each Scaled WS convolution's standardized weight is computed once and used as a plain weight;
the pre-activation block is ``relu(s)``, its ``1 / beta`` folded into the weights of the first
convolution and of the projection shortcut's, the branch, one add of the skip (no ReLU after);
the stem has no ReLU, the head one before pooling.

RescaleNet's skip multiplier is the ``alpha`` of the merge's add (``f.add_(skip, alpha)``, one op
as a plain add), not carried.

**The dtype it computes in.** The folds are made in the parameters' dtype; under autocast the
folded weights and biases are then kept in autocast's dtype (:func:`as_autocast`: what autocast
would cast them to at every call, rounded once, as autocast rounds them), so that a convolution
or linear layer receives them as they are and no cast is launched; offsets and ReLU floors are
kept in the activations' dtype.

**The cache** (:func:`~rescale_core.plans.cache.kept`, slot ``_frozen_state``): one program per
module and key (what the module is asked for, the activations' dtypes), rebuilt eagerly when a
parameter or buffer it was folded from changes, a module is registered anywhere, or autocast's
dtype changes (:class:`~rescale_core.plans.cache.WeightStamp` with that dtype as context);
compiled code folds once in its graph and reads the kept program afterwards;
:class:`~rescale_core.plans.dispatch.Planned` drops it at every event that may change the weights
(``train()``, ``to``, ``load_state_dict``, an optimizer step, ``set_plan``). Under
``torch.export`` and ``torch.jit.trace`` a kept program is used as it is (its tensors become the
graph's constants: evaluate once under ``no_grad``, then export).

One function per module type, each under the reference ``forward`` it must equal:
:func:`frozen_block` (a block called on its own: a detection backbone's layer getter),
:func:`frozen_resnet` (the whole network, offsets riding in the stream), :func:`frozen_vgg` and
:func:`frozen_sublayer` (the Transformer's, with its branch's last linear layer folded).
"""
from __future__ import annotations

import itertools
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import ResidualBlock, ResidualSublayer
from ..layers import MeanShiftBias, PointwiseNorm, ScalarBias, StridedAvgPool
from ..models.resnet import ResNet
from ..models.vgg import VGG
from .cache import FROZEN_SLOT, WeightStamp, kept
from .conditions import has_hooks_below, has_hooks_in
from .dispatch import FROZEN, register
from .folds import (FrozenLinear, add_bias, branch_multiplier, fold_input_offset, fold_output_scale,
                    is_offset_module, merge_bias, offset_of, pads, shifted_relu)
from .shared import (activation_dtype, add_skip, autocast_dtype, plain_block, run_stages, scaled_sublayer,
                     takes_out_scale)

__all__ = ["frozen_program", "as_autocast", "FrozenConv", "FrozenRelu", "FrozenBlock", "FrozenHead", "FrozenNet",
           "freeze_block", "run_frozen_block", "frozen_block", "frozen_resnet", "frozen_vgg", "frozen_sublayer"]


def frozen_program(module: nn.Module, key: str, x: torch.Tensor, build: Callable):
    """``build()`` folded once for calls on ``x`` and kept on ``module`` under ``key`` (the
    module docstring says when it is rebuilt)."""
    return kept(module, FROZEN_SLOT, key, build, WeightStamp, autocast_dtype(x), guarded=True)


def as_autocast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """``t`` (detached) as autocast hands it to a convolution or linear layer computing in
    ``dtype`` (None: autocast is off): cast where autocast would cast it (a floating tensor
    other than float64)."""
    if t is None:
        return None
    t = t.detach()
    if dtype is None or t.dtype in (dtype, torch.float64) or not t.is_floating_point():
        return t
    return t.to(dtype)


# --------------------------------------------------------------- the steps of a frozen program
class FrozenConv(NamedTuple):
    """A convolution (its module gives stride, padding, dilation, groups) with folded weights."""

    module: nn.Module
    weight: torch.Tensor
    bias: torch.Tensor | None


class FrozenRelu(NamedTuple):
    """``relu`` (``floor`` None) or ``max(., floor)``: a ReLU with an offset carried across it."""

    floor: torch.Tensor | None


def _conv(step: FrozenConv, x: torch.Tensor) -> torch.Tensor:
    return step.module._conv_forward(x, step.weight, step.bias)


def _relu(z: torch.Tensor, floor: torch.Tensor | None) -> torch.Tensor:
    """``relu(z)`` or ``max(z, floor)`` (2), in place on ``z`` (a fresh output) in eager mode."""
    return torch.relu_(z) if floor is None else shifted_relu(z, floor)


def run_frozen_steps(steps: tuple, x: torch.Tensor) -> torch.Tensor:
    """A sequence of steps: a :class:`FrozenConv`, a :class:`~rescale_core.plans.folds.FrozenLinear`,
    a :class:`FrozenRelu`, an offset tensor to add, or a module to call (a pool)."""
    for step in steps:
        if isinstance(step, FrozenConv):
            x = _conv(step, x)
        elif isinstance(step, FrozenLinear):
            x = F.linear(x, step.weight, step.bias)
        elif isinstance(step, FrozenRelu):
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


def _bias(bias: torch.Tensor | None, n: int, dtype: torch.dtype | None) -> torch.Tensor | None:
    """A folded bias as a layer takes it: ``n`` values in one block of memory (a scalar term
    broadcast once), as autocast hands it over."""
    if bias is None:
        return None
    bias = bias.detach().reshape(-1)
    return as_autocast((bias.expand(n) if bias.shape[0] != n else bias).contiguous(), dtype)


def _frozen_conv(conv: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype | None) -> FrozenConv:
    return FrozenConv(conv, as_autocast(weight, dtype), _bias(bias, conv.out_channels, dtype))


def _conv_weight(conv: nn.Module) -> torch.Tensor:
    """The weight ``conv`` convolves with: a Scaled WS convolution's standardized one (gain and
    gamma in it), computed once here; any other's own."""
    standardized = getattr(conv, "standardized_weight", None)
    return conv.weight if standardized is None else standardized()


# --------------------------------------------------------------- ResidualBlock
# reference: relu(merge_norm(merge(downsample(x), branch(x)))), where the branch runs
# post(drop(conv(shift(h)))) per layer with a ReLU between layers, and the merge is
# skip_scale * skip + branch_scale * gain * f (+ Fixup's bias)
class FrozenBlock(NamedTuple):
    """A residual block as a plain one: ``relu(conv_m(...relu(conv_1(s + pre))...) + alpha
    * skip)``, each ReLU with its floor (None: a plain ReLU), ``skip`` the stream or the
    shortcut's steps on it. ``preact`` (NF-ResNet): ``conv_m(...relu(conv_1(a + pre))...) + alpha *
    skip`` with ``a = relu(s)``, ``skip`` the stream or the shortcut's steps on ``a`` (the
    block's ``input_scale`` is in the first conv's and the shortcut's weights), no ReLU after."""

    pre: torch.Tensor | None
    convs: tuple
    floors: tuple
    shortcut: tuple | None
    alpha: float
    floor: torch.Tensor | None
    preact: bool = False


def _carries_input_offset(block: ResidualBlock) -> bool:
    """Whether ``block``'s first offset should ride in the stream: there is one, and the first
    convolution pads (so it cannot be a bias); never in the pre-activation layout, where it
    comes after the block's first ReLU (one add there)."""
    shift, conv, _ = block.branch_layers()[0]
    return not block.preact and isinstance(shift, (MeanShiftBias, ScalarBias)) and pads(conv)


def freeze_block(block: ResidualBlock, carried: bool, floor: torch.Tensor | None, dtype: torch.dtype,
                 in_dtype: torch.dtype, weight_dtype: torch.dtype | None) -> FrozenBlock:
    """``block`` (a :func:`~rescale_core.plans.shared.plain_block`, in eval mode) as a
    :class:`FrozenBlock` for activations of ``dtype``, an input of ``in_dtype`` and autocast's
    ``weight_dtype``. ``carried``: the stream holds the block's input plus its first offset;
    ``floor``: the offset its output carries for the next block (None: none)."""
    layers = block.branch_layers()
    merge, alpha = block.merge, block.merge.skip_scale
    dims = layers[0].conv.weight.dim() - 2
    e1 = offset_of(layers[0].shift)
    carried = carried and e1 is not None
    pre, convs, floors = None, [], []
    scale = block.input_scale if block.preact else 1.0  # relu(x) * input_scale: into the weights
    for i, (shift, conv, post) in enumerate(layers):
        weight, bias = _conv_weight(conv), conv.bias
        e = offset_of(shift)
        if i == 0 and e is not None and not carried and pads(conv):
            pre = _channels(e / scale, dims, in_dtype)  # preact: added before the weight takes input_scale
        elif e is not None and not pads(conv) and not (i == 0 and carried):
            bias = fold_input_offset(conv, bias, e, weight)  # (1), on the weight it convolves with
        if i == 0 and scale != 1.0:
            weight = weight * scale
        # (an offset before a later padded conv crossed the ReLU before it, below)
        if i < len(layers) - 1:
            bias = add_bias(bias, offset_of(post))  # Fixup's bias before the activation (3)
            nshift, nconv = layers[i + 1].shift, layers[i + 1].conv
            ne = offset_of(nshift)
            if ne is not None and pads(nconv):  # across the ReLU (2)
                bias = add_bias(bias, ne)
                floors.append(_channels(ne, dims, dtype))
            else:
                floors.append(None)
        else:  # gain * branch_scale and Fixup's bias after it into the last conv (3)
            weight, bias = fold_output_scale(weight, bias, branch_multiplier(merge))
            bias = add_bias(bias, merge_bias(merge))
            if carried and block.downsample is None:  # the skip path carries e1: alpha * (s - e1)
                bias = add_bias(bias, -alpha * e1)
            if floor is not None:  # the next block's offset, across this block's ReLU (2)
                bias = add_bias(bias, floor)
                floor = _channels(floor, dims, dtype)
        convs.append(_frozen_conv(conv, weight, bias, weight_dtype))
    shortcut = None
    if block.downsample is not None:
        shortcut = _freeze_shortcut(block.downsample, -e1 if carried else None, dims, dtype, weight_dtype, scale)
    return FrozenBlock(pre, tuple(convs), tuple(floors), shortcut, alpha, floor, block.preact)


def _freeze_shortcut(seq: nn.Sequential, pending: torch.Tensor | None, dims: int, dtype: torch.dtype,
                     weight_dtype: torch.dtype | None, scale: float = 1.0) -> tuple:
    """The shortcut's steps, every offset (and the stream's ``pending`` one) folded into the
    bias of the convolution after it (1; an average pool in between commutes with it, 4), and
    ``scale`` (a multiplier of its input) into the weight of its first convolution."""
    steps = []
    for mod in seq:
        if isinstance(mod, nn.modules.conv._ConvNd):
            bias, weight = mod.bias, _conv_weight(mod)
            if pending is not None and pads(mod):
                steps.append(_channels(pending, dims, dtype))
            else:
                bias = fold_input_offset(mod, bias, pending, weight)
            pending = None
            if scale != 1.0:
                weight, scale = weight * scale, 1.0
            steps.append(_frozen_conv(mod, weight, bias, weight_dtype))
        elif is_offset_module(mod):
            pending = add_bias(pending, offset_of(mod))
        elif isinstance(mod, StridedAvgPool) and mod.spatial_dims == 3:
            # one avg_pool3d: in a forward on a CPU up to 1.8x faster than the eight strided
            # sums the module's forward takes there (which pay off in training's backward)
            steps.append(mod.pool)
        else:
            steps.append(mod)
    return tuple(steps)


def run_frozen_block(block: FrozenBlock, s: torch.Tensor) -> torch.Tensor:
    """A frozen block on the stream ``s``."""
    if block.preact:
        a = torch.relu(s)  # not in place: the stream is the skip
        h = a if block.pre is None else a + block.pre.to(a.dtype)  # the branch's first offset, after the ReLU
    else:
        h = a = s if block.pre is None else s + block.pre.to(s.dtype)
    for step, floor in zip(block.convs, block.floors):
        h = _relu(_conv(step, h), floor)
    f = _conv(block.convs[-1], h)
    skip = s if block.shortcut is None else run_frozen_steps(block.shortcut, a if block.preact else s)
    out = add_skip(f, skip, block.alpha)
    return out if block.preact else _relu(out, block.floor)


def _frozen_plain(block: ResidualBlock) -> bool:
    """Whether the frozen plan computes ``block``: a :func:`plain_block` (in the pre-activation
    layout too, with Fixup's scalar biases: the first one an add after the block's ReLU)."""
    return plain_block(block)


def _block_applies(block: ResidualBlock, x: torch.Tensor) -> bool:
    return not has_hooks_below(block) and _frozen_plain(block)


@register(FROZEN, ResidualBlock, applies=_block_applies)
def frozen_block(block: ResidualBlock, x: torch.Tensor) -> torch.Tensor:
    """A block called on its own (a detection backbone's layer getter): input and output in
    true units, its first offset a bias or, before a padded convolution, one add."""
    dtype = activation_dtype(x)
    program = frozen_program(block, f"block {dtype} {x.dtype}", x,
                             lambda: freeze_block(block, False, None, dtype, x.dtype, autocast_dtype(x)))
    return run_frozen_block(program, x)


# --------------------------------------------------------------- ResNet
# reference (ResNet._run): maxpool(relu(bn1(conv1(x)))), each stage (after its temporal pool),
# then fc(fc_bias(dropout(head_norm(flatten(avgpool(pool_shift(x)))))))
class FrozenHead(NamedTuple):
    pool: nn.Module
    shift: torch.Tensor | None       # the offset before pooling, where it does not fold
    norm: nn.Module
    dropout: nn.Module
    linear: FrozenLinear | None
    after: torch.Tensor | None       # Fixup's classifier bias without a classifier
    act: bool = False                # NF-ResNet's ReLU before pooling (final_act)


class FrozenNet(NamedTuple):
    stem: FrozenConv
    stem_floor: torch.Tensor | None
    stem_pool: nn.Module
    stages: tuple                    # (temporal pool or None, blocks) per stage
    head: FrozenHead
    stem_act: bool = True            # the stem's ReLU (none in NF-ResNet's)


def _plain_resnet(model: ResNet) -> bool:
    return (is_offset_module(model.bn1) and is_offset_module(model.pool_shift)
            and is_offset_module(model.fc_bias) and isinstance(model.fc, (nn.Linear, nn.Identity))
            and isinstance(model.relu, nn.Identity if model.preact else nn.ReLU)
            and all(isinstance(b, ResidualBlock) and b.frozen_ok and _frozen_plain(b) and b.preact == model.preact
                    for _, stage in model.stage_modules() for b in stage))


def _resnet_applies(model: ResNet, x: torch.Tensor) -> bool:
    return not has_hooks_in(model) and _plain_resnet(model)


def _freeze_head(model: ResNet, dtype: torch.dtype, weight_dtype: torch.dtype | None) -> FrozenHead:
    e, fc_bias = offset_of(model.pool_shift), offset_of(model.fc_bias)
    linear = after = None
    if isinstance(model.fc, nn.Linear):
        bias = fold_input_offset(model.fc, model.fc.bias, fc_bias)
        if e is not None and isinstance(model.head_norm, nn.Identity):
            bias, e = fold_input_offset(model.fc, bias, e), None  # (4, then 1)
        linear = FrozenLinear(as_autocast(model.fc.weight, weight_dtype),
                              _bias(bias, model.fc.out_features, weight_dtype))
    elif fc_bias is not None:
        after = fc_bias.detach().to(dtype)
    shift = None if e is None else e.detach().reshape(1, -1).to(dtype)
    return FrozenHead(model.avgpool, shift, model.head_norm, model.dropout, linear, after, model.preact)


def _freeze_resnet(model: ResNet, apart: bool, dtype: torch.dtype, weight_dtype: torch.dtype | None) -> FrozenNet:
    """The network as a plain one. ``apart``: every stage returns true units (its output is
    wanted: ``stage_outputs``), so no offset rides across a stage boundary."""
    blocks = [(s, b) for s, (_, stage) in enumerate(model.stage_modules()) for b in stage]
    carried = [_carries_input_offset(b) and not (apart and j > 0 and blocks[j - 1][0] != s)
               for j, (s, b) in enumerate(blocks)]
    riding = [offset_of(b.branch_layers()[0].shift) if c else None for (_, b), c in zip(blocks, carried)]
    frozen = [freeze_block(b, carried[j], riding[j + 1] if j + 1 < len(blocks) else None, dtype, dtype, weight_dtype)
              for j, (_, b) in enumerate(blocks)]
    conv = model.conv1
    bias = add_bias(conv.bias, offset_of(model.bn1))  # the stem's offset after its conv
    floor = riding[0] if blocks else None
    if floor is not None:
        bias = add_bias(bias, floor)
        floor = _channels(floor, conv.weight.dim() - 2, dtype)
    stages, j = [], 0
    for tpool, stage in model.stage_modules():
        stages.append((tpool, tuple(frozen[j:j + len(stage)])))
        j += len(stage)
    return FrozenNet(_frozen_conv(conv, _conv_weight(conv), bias, weight_dtype), floor, model.maxpool,
                     tuple(stages), _freeze_head(model, dtype, weight_dtype), not model.preact)


def _run_frozen_head(head: FrozenHead, x: torch.Tensor) -> torch.Tensor:
    v = torch.flatten(head.pool(torch.relu(x) if head.act else x), 1)
    if head.shift is not None:
        v = v + head.shift.to(v.dtype)
    v = head.dropout(head.norm(v))
    if head.linear is not None:
        return F.linear(v, head.linear.weight, head.linear.bias)
    return v if head.after is None else v + head.after.to(v.dtype)


def _frozen_stage(blocks: tuple, x: torch.Tensor, c: float) -> tuple[torch.Tensor, float]:
    for block in blocks:
        x = run_frozen_block(block, x)
    return x, c


@register(FROZEN, ResNet, applies=_resnet_applies)
def frozen_resnet(model: ResNet, x: torch.Tensor, part: str, stages: list | None = None) -> torch.Tensor:
    """``part`` of the network (``ResNet``'s reference ``_run``) as a plain conv/ReLU network."""
    dtype, mode = activation_dtype(x), "apart" if stages is not None else "net"
    net = frozen_program(model, f"{mode} {dtype}", x,
                         lambda: _freeze_resnet(model, stages is not None, dtype, autocast_dtype(x)))
    if part == "head":
        return _run_frozen_head(net.head, x)
    h = _conv(net.stem, x)
    h = net.stem_pool(_relu(h, net.stem_floor) if net.stem_act else h)
    h, _ = run_stages(net.stages, h, _frozen_stage, stages)
    return h if part == "features" else _run_frozen_head(net.head, h)


# --------------------------------------------------------------- VGG
# reference: classifier(flatten(avgpool(features(x)))), each Sequential module by module
_VGG_MODULES = (nn.Conv2d, nn.ReLU, nn.MaxPool2d, MeanShiftBias, nn.Linear, nn.Dropout, nn.Identity)


def _vgg_applies(model: VGG, x: torch.Tensor) -> bool:
    return not has_hooks_in(model) and all(
        isinstance(m, _VGG_MODULES) for m in itertools.chain(model.features, model.classifier))


def _freeze_vgg_features(model: VGG, dtype: torch.dtype, in_dtype: torch.dtype,
                         weight_dtype: torch.dtype | None) -> tuple:
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
                steps[relu] = FrozenRelu(_channels(e, 2, dtype))
            relu = None
        elif isinstance(mod, nn.Conv2d):
            steps.append(FrozenConv(mod, mod.weight, mod.bias))
            relu = None
        elif isinstance(mod, nn.ReLU):
            relu = len(steps) if steps and isinstance(steps[-1], FrozenConv) else None
            steps.append(FrozenRelu(None))
        else:  # a max-pool passes an offset
            steps.append(mod)
    return tuple(_frozen_conv(s.module, s.weight, s.bias, weight_dtype) if isinstance(s, FrozenConv) else s
                 for s in steps)


def _freeze_vgg_classifier(model: VGG, dtype: torch.dtype, weight_dtype: torch.dtype | None) -> tuple:
    """The classifier with each offset folded into the next linear layer's bias (1)."""
    steps: list = []
    pending = None
    for mod in model.classifier:
        if isinstance(mod, MeanShiftBias):
            pending = add_bias(pending, offset_of(mod))
        elif isinstance(mod, nn.Linear):
            bias = fold_input_offset(mod, mod.bias, pending)
            steps.append(FrozenLinear(as_autocast(mod.weight, weight_dtype),
                                      _bias(bias, mod.out_features, weight_dtype)))
            pending = None
        elif isinstance(mod, nn.ReLU):
            steps.append(FrozenRelu(None))
        else:
            steps.append(mod)
    if pending is not None:
        steps.append(pending.detach().to(dtype))
    return tuple(steps)


@register(FROZEN, VGG, applies=_vgg_applies)
def frozen_vgg(model: VGG, x: torch.Tensor) -> torch.Tensor:
    """The network as a plain one: its conv stack, then its classifier."""
    dtype, weight_dtype = activation_dtype(x), autocast_dtype(x)
    features, classifier = frozen_program(model, f"vgg {dtype} {x.dtype}", x, lambda: (
        _freeze_vgg_features(model, dtype, x.dtype, weight_dtype), _freeze_vgg_classifier(model, dtype, weight_dtype)))
    return run_frozen_steps(classifier, torch.flatten(model.avgpool(run_frozen_steps(features, x)), 1))


# --------------------------------------------------------------- ResidualSublayer
# reference: post_norm(merge(x, dropout(fn(pre_norm(x)))))
def _sublayer_applies(sub: ResidualSublayer, x: torch.Tensor) -> bool:
    return takes_out_scale(sub, x) and hasattr(sub.fn, "out_scale_layer")


def _freeze_out_layer(sub: ResidualSublayer, weight_dtype: torch.dtype | None) -> FrozenLinear:
    """The branch's last linear layer with ``gain * branch_scale`` folded in (3), as autocast
    hands it over."""
    layer = getattr(sub.fn, sub.fn.out_scale_layer)
    weight, bias = fold_output_scale(layer.weight, layer.bias, branch_multiplier(sub.merge))
    return FrozenLinear(as_autocast(weight, weight_dtype), as_autocast(bias, weight_dtype))


def _freeze_in_layers(sub: ResidualSublayer, names: tuple[str, ...],
                      weight_dtype: torch.dtype | None) -> dict[str, FrozenLinear]:
    """The layers that read the pre-norm's output with its ``weight`` (gamma) and ``bias``
    (beta) folded in: ``W (gamma * t + beta) + b = (W diag(gamma)) t + (W beta + b)``."""
    norm, out = sub.pre_norm, {}
    for name in names:
        layer = getattr(sub.fn, name)
        weight = layer.weight * norm.weight
        bias = torch.mv(layer.weight, norm.bias) + (0.0 if layer.bias is None else layer.bias)
        out[name] = FrozenLinear(as_autocast(weight, weight_dtype), as_autocast(bias, weight_dtype))
    return out


@register(FROZEN, ResidualSublayer, applies=_sublayer_applies)
def frozen_sublayer(sub: ResidualSublayer, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The sublayer with its branch's last linear layer folded once, then one add of the skip.
    Under DyT and Derf, the pre-norm's ``weight`` and ``bias`` are folded into the layers that
    read its output (attention's projections of ``x``, not of ``memory``; the feed-forward's
    ``fc1``), and the pointwise function alone runs."""
    weight_dtype = autocast_dtype(x)
    if not (isinstance(sub.pre_norm, PointwiseNorm) and getattr(sub.fn, "in_layers", None)):
        program = frozen_program(sub, "sublayer", x, lambda: _freeze_out_layer(sub, weight_dtype))
        return scaled_sublayer(sub, x, program, *args, **kwargs)
    names = sub.fn.in_layers[:1] if "memory" in kwargs else sub.fn.in_layers  # cross-attention: q only
    out_layer, in_layers = frozen_program(sub, f"sublayer {len(names)}", x, lambda: (
        _freeze_out_layer(sub, weight_dtype), _freeze_in_layers(sub, names, weight_dtype)))
    return scaled_sublayer(sub, x, out_layer, *args, in_layers=in_layers, **kwargs)
