"""Fast paths: the normalisation-free residual blocks (RescaleNet, Shao et al. 2020; SkipInit,
De & Smith 2020; Fixup, Zhang et al. 2019; ReZero, Bachlechner et al. 2020) computed with their
elementwise passes folded into the convolutions. Same function, same parameters, same state dict
as the reference code; only fewer passes over the activations (each costs ~3% of a ResNet-50
step on CPU). The identities, exact in real arithmetic (``tests/core/test_core_fastpath.py``
checks outputs, gradients and mean-shift state against the reference path):

1. **pre-conv offset -> conv bias.** ``conv(x + e) = conv(x; b + W.sum(spatial) @ e)`` for a
   convolution without padding (every 1x1 conv: bottleneck conv1/conv3, the shortcut conv).
   Autograd gives ``W`` and ``e`` the reference gradients (``dW`` gains the rank-one term
   ``dbias (x) e``). Used where it is cheaper than the add: ``W.numel() <= x.numel()``.
2. **offset across a ReLU.** ``relu(z) + e = max(z + e, e)``: the offset in front of a padded
   (3x3) conv, whose border makes (1) inexact, moves into the previous conv's bias and the ReLU
   becomes ``max(., e)`` (in place, ReLU's tie rule in backward). Only where nothing sits
   between that conv and the ReLU: not under active dropout (it would scale ``e``), not after a
   norm layer, not while that offset is being measured (it needs the ReLU's output first).
3. **post-conv biases and merge multipliers -> last conv.** ``s * conv(x; W, b) + t =
   conv(x; s W, s b + t)`` for Fixup's scalar biases, the learned gain times ``branch_scale``
   (scalar or per channel) and Fixup's bias after the multiplier. ``dropout(s y) = s dropout(y)``,
   so the multiplier folds under conv dropout too; the additive terms do not (they are added
   after the dropout as in the reference). A multiplier folds only where the weight is not
   larger than the conv's output (:func:`folds_output_scale`); else the merge scales the output
   (3D nets at small batches, whose weights outweigh their activations).
4. ``avgpool(x + e) = avgpool(x) + e`` (RescaleNet's bias before global pooling).

The merge then is one in-place ``add_(skip, alpha=skip_scale)`` on the branch output followed by
an in-place ReLU, as in torchvision's Bottleneck. Folded weights and biases are recomputed every
call (small next to a conv), so training, evaluation and ``torch.compile`` share one path.

Fallback to the reference path: per module ``fused = False`` (or :func:`reference_path` for a
whole model), and automatically whenever a module the fast path bypasses carries hooks (the
analysis probes hook the merge, the mean-shift layers and the ReLUs), global module hooks exist
or ``torch.fx`` traces the model. And for every scheme the fast path was not written for: each
module built from a scheme (``ResidualBlock``, ``ResidualSublayer``, ``ResNet``, ``VGG``) runs it
only if :func:`implements` its scheme, i.e. every field of the scheme (``dataclasses.fields``:
those of a ``Scheme`` subclass too) is listed in :data:`IMPLEMENTED_FIELDS` with its value among
the listed ones. Anything else (a new switch, a new merge rule) computes the reference function,
never a fast one that silently ignores the switch; setting ``fused = True`` does not override
this. A new field is listed here once the fast path handles it (block, shortcut sequential,
stem, head and the scale carried along a ResNet).
"""
from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.nn.modules import module as _module_mod

from .layers import MeanShiftBias, ScalarBias
from .plans import drop_cached
from .schemes import Scheme

__all__ = ["IMPLEMENTED_FIELDS", "implements", "unimplemented",
           "reference_path", "measuring_step", "eager_while_measuring", "has_hooks", "has_hooks_in",
           "has_hooks_below", "offset_of",
           "is_updating", "is_offset_module", "folds_input_offset", "folds_output_scale", "conv_out_numel",
           "input_offset_bias", "add_bias", "conv_bias", "scaled", "scaled_module",
           "scale_out", "scale_bias", "shifted_relu", "fused_sequential", "scaled_linear"]


# --------------------------------------------------------------- the schemes it implements
_logger = logging.getLogger(__name__)

_BOOL = (False, True)

# Every ``Scheme`` field the fast path was written for, with the values it implements (None: any
# value). Checked field by field against the fast-path code: a field is listed when the fast path
# reads it, or calls the modules it builds, as the reference path does, or when it acts only at
# construction or in the optimizer (never in ``forward``). Categorical fields list their values:
# a new value (a new merge rule) is as unknown as a new field.
IMPLEMENTED_FIELDS: dict[str, tuple | None] = {
    "name": None,                 # a label
    "families": None,             # checked at construction
    # --- the branch
    "norm": (None, "bn", "gn", "ln"),  # norm layers run as modules; nothing folds across them,
    #                               no scale is carried through them (carries_scale)
    "zero_gamma": _BOOL,          # init only
    "norm_position": ("post", "pre"),  # the sublayer's fast path calls pre_norm and post_norm
    "mean_shift": _BOOL,          # MeanShiftBias folded (1, 2, 4): blocks, shortcut, stem, head, VGG
    "measure_batches": None,      # inside MeanShiftBias: offset() measures as the reference does
    "scalar_biases": _BOOL,       # Fixup's ScalarBias folded (1, 3); a sublayer's runs the reference
    "conv_bias": _BOOL,           # conv.bias enters every folded bias (scaled when carrying)
    "conv_dropout": None,         # self.drop applied; the folds dropout would change are skipped
    "conv_dropout_stages": None,  # which blocks get dropout: construction
    # --- the merge
    "merge": ("add", "rescale"),  # ResidualMerge.skip_scale / branch_multiplier
    "c": None,                    # a number inside skip_scale / branch_scale
    "fixed_beta": _BOOL,          # branch_scale and init
    "gain": (None, "scalar", "vector"),  # branch_multiplier: none, one or per-channel values
    "gain_init": None,            # init value of the gain
    "block_scale": None,          # inside skip_scale / branch_scale (Fixup's bias unscaled on both)
    "merge_norm": _BOOL,          # merge_norm runs as a module; no scale is carried through it
    # --- the network
    "head_norm": _BOOL,           # runs as a module in ResNet._head on both paths
    "classifier_dropout": None,   # runs as a module in the head on both paths
    "init": ("he_fan_out", "he_fan_in", "rescale", "fixup"),  # construction only; by value, as
    #                               a new rule may build something forward has to know about
    "zero_classifier": _BOOL,     # init only
    "scalar_lr_factor": None,     # optimizer only (param_groups)
}

_logged: set = set()


def unimplemented(scheme: Scheme) -> list[str]:
    """The fields of ``scheme`` (a ``Scheme`` or a subclass) the fast path was not written for:
    not in :data:`IMPLEMENTED_FIELDS`, or with a value it does not list."""
    out = []
    for f in dataclasses.fields(scheme):
        if f.name not in IMPLEMENTED_FIELDS:
            out.append(f.name)
            continue
        values = IMPLEMENTED_FIELDS[f.name]
        if values is not None and getattr(scheme, f.name) not in values:
            out.append(f.name)
    return out


def implements(scheme: Scheme) -> bool:
    """Whether the fast path computes ``scheme``'s function (:func:`unimplemented` is empty).
    Logs once per scheme name and set of unimplemented fields (INFO) when it does not."""
    missing = unimplemented(scheme)
    if missing:
        key = (type(scheme).__qualname__, scheme.name, tuple(missing))
        if key not in _logged:
            _logged.add(key)
            _logger.info("scheme %r: the fast path does not implement %s; its modules run the "
                         "reference path", scheme.name,
                         ", ".join(f"{n}={getattr(scheme, n)!r}" for n in missing))
    return not missing


# --------------------------------------------------------------- switching paths
@contextmanager
def reference_path(model: nn.Module, enabled: bool = True):
    """Run ``model`` on its reference (layer-by-layer) path: every ``fused`` flag of its modules
    is set to False inside the block and restored afterwards."""
    if not enabled:
        yield model
        return
    saved = [(m, m.fused) for m in model.modules() if isinstance(getattr(m, "fused", None), bool)]
    try:
        for m, _ in saved:
            m.fused = False
        yield model
    finally:
        for m, flag in saved:
            m.fused = flag
        drop_cached(model)  # the lean plan's cached schedules follow the flags


def _global_hooks() -> bool:
    """Global module hooks, or torch.fx symbolic tracing (which records module calls and cannot
    branch on shapes): every module must be called as in the reference path."""
    return bool(_module_mod._global_forward_hooks or _module_mod._global_forward_pre_hooks
                or _module_mod._global_backward_hooks or _module_mod._global_backward_pre_hooks
                or is_fx_symbolic_tracing())


def _module_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks)


def has_hooks(*modules: nn.Module | None) -> bool:
    """Whether any of ``modules`` (not their children) has hooks, or global module hooks exist:
    the fast path does not call the modules it folds, so their hooks would never fire."""
    return _global_hooks() or any(m is not None and _module_hooks(m) for m in modules)


def has_hooks_in(module: nn.Module) -> bool:
    """Hooks on ``module`` or any of its submodules (or global hooks)."""
    return _global_hooks() or any(_module_hooks(m) for m in module.modules())


def has_hooks_below(module: nn.Module) -> bool:
    """Hooks on any strict submodule of ``module`` (its own hooks fire around its forward)."""
    if _global_hooks():
        return True
    it = module.modules()
    next(it)
    return any(_module_hooks(m) for m in it)


# --------------------------------------------------------------- offsets
def is_updating(mod: nn.Module) -> bool:
    """A mean-shift layer that would measure on a call now."""
    return isinstance(mod, MeanShiftBias) and mod.updating


# Bumped whenever any module anywhere registers a submodule (assignment or ``add_module``): the
# cached list of a model's mean-shift layers is rebuilt after a layer is added or replaced (a
# detection wrapper, a new classifier), and never walked again otherwise.
_module_tree_version = 0


def _on_module_registration(module, name, submodule):
    global _module_tree_version
    _module_tree_version += 1


_module_mod.register_module_module_registration_hook(_on_module_registration)


def measuring_step(model: nn.Module) -> bool:
    """Whether a forward of ``model`` now measures some mean-shift statistics (training mode,
    gradients on, a layer still measuring). Reads only the layers' ``_measuring`` flags, from a
    list cached until a module is next registered anywhere."""
    if not (model.training and torch.is_grad_enabled()):
        return False
    cached = model.__dict__.get("_mean_shift_layers")
    # under torch.compile the cached list is reused as it is: compiling registers fx modules,
    # which moves the version, and a guard on it would recompile every step
    if cached is None or (cached[0] != _module_tree_version and not torch.compiler.is_compiling()):
        cached = (_module_tree_version, tuple(m for m in model.modules() if isinstance(m, MeanShiftBias)))
        model.__dict__["_mean_shift_layers"] = cached
    return any(m._measuring for m in cached[1])


@torch.compiler.disable
def _eagerly(fn, *args):
    return fn(*args)


def eager_while_measuring(model: nn.Module, fn, *args):
    """``fn(*args)``, run eagerly under ``torch.compile`` while ``model`` measures mean-shift
    statistics (the first few steps: compiled code never sees the per-step counters, and the
    graph is built once measuring is over)."""
    return _eagerly(fn, *args) if measuring_step(model) else fn(*args)


def offset_of(mod: nn.Module, x: torch.Tensor | None = None) -> torch.Tensor | None:
    """The additive term of a pre-conv bias module (measuring ``x`` first when due), or None."""
    if isinstance(mod, MeanShiftBias):
        return mod.offset(x)
    if isinstance(mod, ScalarBias):
        return mod.bias
    return None


def is_offset_module(mod: nn.Module) -> bool:
    return isinstance(mod, (nn.Identity, MeanShiftBias, ScalarBias))


def _zero_padding(conv: nn.modules.conv._ConvNd) -> bool:
    pad = conv.padding
    if isinstance(pad, str):
        return pad == "valid" or all(k == 1 for k in conv.kernel_size)
    return all(p == 0 for p in pad)


def folds_input_offset(conv: nn.Module, in_numel: int) -> bool:
    """Fold an input offset into this conv's bias (identity 1): exact without padding; worth it
    when the weight is not larger than the input (the fold costs a few passes over ``W``)."""
    return (isinstance(conv, nn.modules.conv._ConvNd) and _zero_padding(conv)
            and conv.weight.numel() <= in_numel)


def folds_output_scale(conv: nn.modules.conv._ConvNd, x: torch.Tensor) -> bool:
    """Fold a multiplier of this conv's output into its weight (identity 3) when the weight is
    not larger than the output; else the merge scales the output (small batches, 3D nets)."""
    return conv.weight.numel() <= conv_out_numel(conv, x)


def conv_out_numel(conv: nn.modules.conv._ConvNd, x: torch.Tensor) -> int:
    """Number of elements of ``conv(x)`` (without running it)."""
    pad = conv.padding
    n = x.shape[0] * conv.out_channels
    for i, size in enumerate(x.shape[2:]):
        if isinstance(pad, str):
            out = size if pad == "same" else size - conv.dilation[i] * (conv.kernel_size[i] - 1)
        else:
            out = (size + 2 * pad[i] - conv.dilation[i] * (conv.kernel_size[i] - 1) - 1) // conv.stride[i] + 1
        n *= out
    return n


def input_offset_bias(weight: torch.Tensor, e: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """``W.sum(spatial) @ e`` per output channel: what ``conv(x + e) - conv(x)`` adds (no padding).
    ``e`` is per input channel (any shape with C_in elements) or a scalar."""
    cout = weight.shape[0]
    if weight.dim() > 2 and any(k != 1 for k in weight.shape[2:]):
        w = weight.sum(dim=tuple(range(2, weight.dim())))
    else:
        w = weight.reshape(cout, -1)  # a view for 1x1 kernels, contiguous or channels_last
    if e.numel() == 1:
        return w.sum(1) * e.reshape(1)
    e = e.reshape(-1)
    if groups == 1:
        return torch.mv(w, e)
    cin_g = w.shape[1]
    return torch.bmm(w.reshape(groups, cout // groups, cin_g), e.reshape(groups, cin_g, 1)).reshape(cout)


def add_bias(bias: torch.Tensor | None, term: torch.Tensor | None) -> torch.Tensor | None:
    """``bias + term`` for per-output-channel vectors (or scalars of shape (1,)); None is 0."""
    if term is None:
        return bias
    term = term.reshape(-1)
    return term if bias is None else bias + term


def conv_bias(bias: torch.Tensor | None, out_channels: int) -> torch.Tensor | None:
    """A bias of shape (C_out,) for the conv call (scalar terms broadcast)."""
    if bias is not None and bias.shape[0] != out_channels:
        bias = bias.expand(out_channels)
    return bias


def scale_out(weight: torch.Tensor, scale) -> torch.Tensor:
    """Scale a weight's output channels by a float, a scalar tensor or a per-channel tensor."""
    if isinstance(scale, torch.Tensor):
        return weight * scale.reshape((-1,) + (1,) * (weight.dim() - 1))
    return weight * scale


def scaled(t: torch.Tensor | None, c: float) -> torch.Tensor | None:
    """``t / c`` (an additive term in activations carried in units of ``c``)."""
    return t if t is None or c == 1.0 else t / c


def scaled_module(mod: nn.Module, x: torch.Tensor, c: float) -> torch.Tensor:
    """``mod(c * x) / c`` for a scalar-bias module (identity for the others with c == 1)."""
    if c != 1.0 and isinstance(mod, ScalarBias):
        return x + mod.bias / c
    return mod(x)


def scale_bias(bias: torch.Tensor | None, scale) -> torch.Tensor | None:
    if bias is None:
        return None
    return bias * (scale.reshape(-1) if isinstance(scale, torch.Tensor) else scale)


# --------------------------------------------------------------- the ReLU with an offset
def _relu_grad_above(g: torch.Tensor, y: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``g`` where ``y > e``, else 0: ``y - e > 0`` exactly when ``z > e`` (``y == e`` bit for
    bit otherwise). Two float kernels writing one new buffer (the difference, overwritten by
    the result): ~10x faster on CPU than a broadcast compare and select."""
    diff = y - e
    return torch.ops.aten.threshold_backward.grad_input(g, diff, 0, grad_input=diff)


class _ShiftedReLU(torch.autograd.Function):
    """``y = max(z, e)``, with ``z = u + e`` (``e`` entered ``z`` through the previous conv's
    bias, detached): ``y = relu(u) + e``. In place on ``z`` in eager mode; out of place under
    ``torch.compile``, where saving the output keeps inductor from saving a bool mask of
    ``z > e`` per ReLU (an extra buffer, and on CPU a store several times slower than the
    ReLU). Backward as the reference ``relu(u) + e``: ``du = g * (y > e)`` (ReLU's tie rule:
    no gradient at 0) and ``de = sum(g)``."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, e: torch.Tensor, inplace: bool) -> torch.Tensor:
        if inplace:
            y = torch.maximum(z, e, out=z)
            ctx.mark_dirty(z)
        else:
            y = torch.maximum(z, e)
        ctx.save_for_backward(y, e)
        ctx.inplace = inplace
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        y, e = ctx.saved_tensors
        gz = None
        if ctx.needs_input_grad[0]:  # functional under compile: inductor fuses it into one kernel
            gz = _relu_grad_above(g, y, e) if ctx.inplace else torch.ops.aten.threshold_backward(g, y - e, 0)
        ge = g.sum_to_size(e.shape) if ctx.needs_input_grad[1] else None
        return gz, ge, None


def shifted_relu(z: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``relu(z - e) + e`` for ``z`` that already contains ``e.detach()`` (identity 2). Works in
    place on ``z`` (a conv output nothing else needs) in eager mode."""
    e = e.to(z.dtype)
    if torch.compiler.is_compiling():
        return _ShiftedReLU.apply(z, e, False)
    if not (torch.is_grad_enabled() and (z.requires_grad or e.requires_grad)):
        return torch.maximum(z, e, out=z)
    return _ShiftedReLU.apply(z, e, True)


# --------------------------------------------------------------- a linear layer with a multiplier
def _per_feature(scale, dims: int = 1):
    """A float stays a float; a tensor becomes one value per output feature, shaped to broadcast
    over a weight's rows (``dims=2``) or a bias / the last axis of an activation (``dims=1``)."""
    if not isinstance(scale, torch.Tensor):
        return scale
    return scale.reshape((-1,) + (1,) * (dims - 1))


def _scale_on_weight(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Scale the weight when it is not larger than the output, else the output (in place)."""
    return weight.numel() <= x.numel() // x.shape[-1] * weight.shape[0]


def _scaled_linear_forward(x, weight, bias, scale):
    """Into a fresh tensor, not a view of one (the merge adds the skip path to it in place).
    ``s`` is applied in the parameters' dtype, then the weight cast to ``x.dtype`` (autocast):
    one rounding, as ``F.linear`` under autocast rounds the unscaled weight."""
    on_weight = _scale_on_weight(x, weight)
    if on_weight:
        weight = weight * _per_feature(scale, 2)
        bias = None if bias is None else bias * _per_feature(scale)
    weight = weight.to(x.dtype)
    y = x.new_empty(x.shape[:-1] + (weight.shape[0],))
    x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, weight.shape[0])
    if bias is None:
        torch.mm(x2, weight.t(), out=y2)
    else:
        torch.addmm(bias.to(x.dtype), x2, weight.t(), out=y2)
    return y if on_weight else y.mul_(_per_feature(scale))


class _ScaledLinear(torch.autograd.Function):
    """``y = s * (x W^T + b)``, ``s`` a float, a scalar tensor or one per output feature (the
    Transformer sublayer's ``gain * branch_scale``), saving only ``x``, ``W``, ``b`` and ``s``.
    Folding ``s`` into a new weight ``s W`` would save that copy for backward, one per sublayer:
    in a Transformer the weights are larger than a batch's activations, so the copies cost ~20%
    of a step's memory. With ``G = g^T x`` and ``g_b = sum(g)``, the gradients of the plain
    layer: ``dW = s G``, ``db = s g_b``, ``ds = sum_i(W * G) + b g_b`` per output feature and
    ``dx = (s g) W``; ``s`` is applied to the smaller of the weight and the activations. ``x``
    may have a lower precision than the parameters (autocast): the products run in ``x``'s
    dtype, the parameter gradients are formed in the parameters' dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale):
        if isinstance(scale, torch.Tensor):
            ctx.save_for_backward(x, weight, bias, scale)
        else:
            ctx.save_for_backward(x, weight, bias)
            ctx.float_scale = scale
        return _scaled_linear_forward(x, weight, bias, scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, weight, bias, *rest = ctx.saved_tensors
        scale = rest[0] if rest else ctx.float_scale
        need_x, need_w, need_b, need_s = ctx.needs_input_grad
        gx = gw = gb = gs = None
        if need_x:
            if _scale_on_weight(x, weight):
                gx = g @ (weight * _per_feature(scale, 2)).to(g.dtype)
            else:
                gx = (g * _per_feature(scale)).to(g.dtype) @ weight.to(g.dtype)
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        if need_w or need_s:
            plain = (g2.t() @ x2).to(weight.dtype)  # dL/dW of the unscaled layer
            gw = plain * _per_feature(scale, 2) if need_w else None
            gs = (weight * plain).sum(1) if need_s else None
        if bias is not None and (need_b or need_s):
            plain_b = g2.sum(0, dtype=bias.dtype)
            gb = plain_b * _per_feature(scale) if need_b else None
            gs = gs + bias * plain_b if need_s else None
        if need_s:
            gs = gs.sum().reshape(scale.shape) if scale.numel() == 1 else gs.reshape(scale.shape)
        return gx, gw, gb, gs


def scaled_linear(layer: nn.Linear, x: torch.Tensor, scale=None) -> torch.Tensor:
    """``scale * layer(x)`` for a float, a scalar tensor or one per output feature, without
    saving a scaled weight copy for backward (:class:`_ScaledLinear`); None: ``layer(x)``.
    Under autocast the input is cast to the autocast dtype, as ``F.linear`` does."""
    if scale is None:
        return layer(x)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        x = x.to(torch.get_autocast_dtype(device))
        with torch.autocast(device, enabled=False):
            return _apply_scaled_linear(x, layer.weight, layer.bias, scale)
    return _apply_scaled_linear(x, layer.weight, layer.bias, scale)


def _apply_scaled_linear(x, weight, bias, scale):
    if not torch.is_grad_enabled():
        return _scaled_linear_forward(x, weight, bias, scale)
    return _ScaledLinear.apply(x, weight, bias, scale)


# --------------------------------------------------------------- sequential shortcuts
def fused_sequential(seq: nn.Sequential, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Run a shortcut such as ``[avgpool, bias, conv1x1]`` or ``[scalar bias, conv1x1(stride)]``
    with each bias folded into the conv after it (identity 1) where that is cheaper.
    ``scale`` != 1 (activations in units of ``1 / scale``; only for pools, biases and convs):
    every additive term is multiplied by ``scale``."""
    pending = None
    c = 1.0 / scale
    for mod in seq:
        if isinstance(mod, (MeanShiftBias, ScalarBias)):
            if pending is not None:
                x, pending = x + pending.to(x.dtype), None
            pending = scaled(offset_of(mod, x), c)
        elif pending is not None and folds_input_offset(mod, x.numel()):
            bias = add_bias(scaled(mod.bias, c), input_offset_bias(mod.weight, pending, mod.groups))
            x = mod._conv_forward(x, mod.weight, conv_bias(bias, mod.out_channels))
            pending = None
        else:
            if pending is not None:
                x, pending = x + pending.to(x.dtype), None
            if c != 1.0 and isinstance(mod, nn.modules.conv._ConvNd) and mod.bias is not None:
                x = mod._conv_forward(x, mod.weight, mod.bias / c)
            else:
                x = mod(x)
    return x if pending is None else x + pending.to(x.dtype)
