"""The identities every fold rests on (``docs/design.md``, "Why each fold is exact"), one
function each, as functions of weights, biases and offsets (RescaleNet's mean-shift offsets, Shao
et al. 2020; Fixup's scalar biases, Zhang et al. 2019; the schemes' branch multipliers). The folded
plan (:mod:`rescale_core.plans.folded`, every step) and the frozen plan
(:mod:`rescale_core.plans.frozen`, once per evaluation) call these and nothing else to fold. Exact
in real arithmetic; ``tests/core/test_core_fastpath.py`` and ``test_core_frozen.py`` check them.

1. **pre-conv offset -> conv bias** (:func:`fold_input_offset`, on :func:`input_offset_bias`;
   where :func:`folds_input_offset`): ``conv(x + e) = conv(x; b + W.sum(spatial) @ e)`` for a
   convolution (or linear layer) without padding.
2. **offset across a ReLU** (:func:`shifted_relu`; the previous conv's bias takes ``e``):
   ``relu(z) + e = max(z + e, e)``.
3. **post-conv biases and multipliers -> the conv** (:func:`fold_output_scale`, where
   :func:`folds_output_scale`; :func:`branch_multiplier` and :func:`merge_bias` of a merge;
   :func:`scaled_linear` for a linear layer): ``s * conv(x; W, b) + t = conv(x; s W, s b + t)``.
4. ``avgpool(x + e) = avgpool(x) + e``.

Activations carried in units of ``c`` (RescaleNet's skip multipliers, ``docs/design.md``) take
their additive terms divided by ``c`` (:func:`scaled`, :func:`scaled_module`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import (MeanShiftBias, ScalarBias, apply_function, backward_writes_into_buffers, with_combined_form,
                      writes_into_buffers)

if TYPE_CHECKING:
    from ..blocks import ResidualMerge

__all__ = ["offset_of", "is_offset_module", "pads", "folds_input_offset", "folds_output_scale", "conv_out_numel",
           "input_offset_bias", "fold_input_offset", "add_bias", "conv_bias", "scale_out", "scale_bias",
           "fold_output_scale", "branch_multiplier", "merge_bias", "scaled", "scaled_module", "shifted_relu",
           "FrozenLinear", "scaled_linear"]


# --------------------------------------------------------------- offsets into biases
def offset_of(mod: nn.Module, x: torch.Tensor | None = None) -> torch.Tensor | None:
    """The additive term of a pre-conv bias module (measuring ``x`` first when due), or None."""
    if isinstance(mod, MeanShiftBias):
        return mod.offset(x)
    if isinstance(mod, ScalarBias):
        return mod.bias
    return None


def is_offset_module(mod: nn.Module) -> bool:
    return isinstance(mod, (nn.Identity, MeanShiftBias, ScalarBias))


def pads(conv: nn.modules.conv._ConvNd) -> bool:
    """Whether the convolution pads its input: then an offset of its input is not a bias (the
    border sees the padding's zeros, not the offset), and identity 1 does not hold."""
    pad = conv.padding
    if isinstance(pad, str):
        return not (pad == "valid" or all(k == 1 for k in conv.kernel_size))
    return any(p != 0 for p in pad)


def folds_input_offset(conv: nn.Module, in_numel: int) -> bool:
    """Fold an input offset into this conv's bias (identity 1): exact without padding; worth it
    when the weight is not larger than the input (the fold costs a few passes over ``W``)."""
    return (isinstance(conv, nn.modules.conv._ConvNd) and not pads(conv)
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


def fold_input_offset(layer: nn.Module, bias: torch.Tensor | None, e: torch.Tensor | None,
                      weight: torch.Tensor | None = None) -> torch.Tensor | None:
    """Identity 1: the bias that makes ``layer`` (a convolution without padding, or a linear
    layer) with ``bias`` compute ``layer(x + e)`` from ``x``. ``weight``: the weight the layer
    computes with where that is not ``layer.weight`` (a Scaled WS convolution's standardized one)."""
    if e is None:
        return bias
    weight = layer.weight if weight is None else weight
    return add_bias(bias, input_offset_bias(weight, e, getattr(layer, "groups", 1)))


def add_bias(bias: torch.Tensor | None, term: torch.Tensor | None) -> torch.Tensor | None:
    """``bias + term`` for per-output-channel vectors (or scalars of shape (1,), or per-channel
    offsets of any shape); None is 0."""
    if term is None:
        return bias
    term = term.reshape(-1)
    if bias is None:
        return term
    return (bias if bias.dim() == 1 else bias.reshape(-1)) + term


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


def scale_bias(bias: torch.Tensor | None, scale) -> torch.Tensor | None:
    if bias is None:
        return None
    return bias * (scale.reshape(-1) if isinstance(scale, torch.Tensor) else scale)


def fold_output_scale(weight: torch.Tensor, bias: torch.Tensor | None, scale) -> tuple:
    """Identity 3: ``(s W, s b)`` for a multiplier ``s`` of the layer's output (a float, one
    value or one per output channel; None is 1)."""
    if scale is None:
        return weight, bias
    return scale_out(weight, scale), scale_bias(bias, scale)


def branch_multiplier(merge: ResidualMerge, factor: float = 1.0):
    """``gain * branch_scale * factor`` (a tensor, one kernel), ``branch_scale * factor`` (a
    float) or None when it is 1: the merge's multiplier of the branch, which identity 3 folds
    into the branch's last layer."""
    scale = merge.branch_scale * factor
    if merge.gain is not None:
        return merge.gain.weight * scale
    return scale if scale != 1.0 else None


def merge_bias(merge: ResidualMerge, c: float = 1.0) -> torch.Tensor | None:
    """Fixup's bias after the merge's multiplier in units of ``c``, or None: the term identity 3
    adds to the branch's last bias."""
    return None if merge.bias is None else scaled(merge.bias.bias, c)


def scaled(t: torch.Tensor | None, c: float) -> torch.Tensor | None:
    """``t / c`` (an additive term in activations carried in units of ``c``)."""
    return t if t is None or c == 1.0 else t / c


def scaled_module(mod: nn.Module, x: torch.Tensor, c: float) -> torch.Tensor:
    """``mod(c * x) / c`` for a scalar-bias module (identity for the others with c == 1)."""
    if c != 1.0 and isinstance(mod, ScalarBias):
        return x + mod.bias / c
    return mod(x)


# --------------------------------------------------------------- the ReLU with an offset
def _relu_grad_above(g: torch.Tensor, y: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``g`` where ``y > e``, else 0: ``y - e > 0`` exactly when ``z > e`` (``y == e`` bit for
    bit otherwise). Two float kernels writing one new buffer (the difference, overwritten by
    the result): ~10x faster on CPU than a broadcast compare and select."""
    diff = y - e
    return torch.ops.aten.threshold_backward.grad_input(g, diff, 0, grad_input=diff)


@with_combined_form
class _ShiftedReLU(torch.autograd.Function):
    """``y = max(z, e)``, with ``z = u + e`` (``e`` entered ``z`` through the previous conv's
    bias, detached): ``y = relu(u) + e``. In place on ``z`` in eager mode; out of place under
    ``torch.compile``, where saving the output keeps inductor from saving a bool mask of
    ``z > e`` per ReLU (an extra buffer, and on CPU a store several times slower than the
    ReLU), and under ``torch.func``'s transforms (:func:`writes_into_buffers`). Backward as the
    reference ``relu(u) + e``: ``du = g * (y > e)`` (ReLU's tie rule: no gradient at 0) and
    ``de = sum(g)``, differentiable where grad mode is on (``create_graph=True``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z: torch.Tensor, e: torch.Tensor, inplace: bool) -> torch.Tensor:
        return torch.maximum(z, e, out=z) if inplace else torch.maximum(z, e)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        z, e, inplace = inputs
        if inplace:
            ctx.mark_dirty(z)
        ctx.save_for_backward(output, e)
        ctx.inplace = inplace

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        y, e = ctx.saved_tensors
        gz = None
        if ctx.needs_input_grad[0]:  # functional under compile: inductor fuses it into one kernel
            if ctx.inplace and backward_writes_into_buffers(g):
                gz = _relu_grad_above(g, y, e)
            else:
                gz = torch.ops.aten.threshold_backward(g, y - e, 0)
        ge = g.sum_to_size(e.shape) if ctx.needs_input_grad[1] else None
        return gz, ge, None


def shifted_relu(z: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``relu(z - e) + e`` for ``z`` that already contains ``e.detach()`` (identity 2): ``max(z,
    e)``. Works in place on ``z`` (a conv output nothing else needs) in eager mode."""
    if e.dtype != z.dtype:
        e = e.to(z.dtype)
    inplace = writes_into_buffers()
    if not (torch.is_grad_enabled() and (z.requires_grad or e.requires_grad)):
        return torch.maximum(z, e, out=z) if inplace else torch.maximum(z, e)
    return apply_function(_ShiftedReLU, z, e, inplace)


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
    if not writes_into_buffers():
        y = F.linear(x, weight, None if bias is None else bias.to(x.dtype))
        return y if on_weight else y * _per_feature(scale)
    y = x.new_empty(x.shape[:-1] + (weight.shape[0],))
    x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, weight.shape[0])
    if bias is None:
        torch.mm(x2, weight.t(), out=y2)
    else:
        torch.addmm(bias.to(x.dtype), x2, weight.t(), out=y2)
    return y if on_weight else y.mul_(_per_feature(scale))


@with_combined_form
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

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight, bias, scale):
        return _scaled_linear_forward(x, weight, bias, scale)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, scale = inputs
        if isinstance(scale, torch.Tensor):
            ctx.save_for_backward(x, weight, bias, scale)
        else:
            ctx.save_for_backward(x, weight, bias)
            ctx.float_scale = scale

    @staticmethod
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


class FrozenLinear(NamedTuple):
    """A linear layer's weight and bias with its output's multiplier folded in once (the frozen
    plan, :mod:`rescale_core.plans.frozen`): passed as ``scale`` to :func:`scaled_linear`."""

    weight: torch.Tensor
    bias: torch.Tensor | None


def scaled_linear(layer: nn.Linear, x: torch.Tensor, scale=None) -> torch.Tensor:
    """``scale * layer(x)`` for a float, a scalar tensor or one per output feature, without
    saving a scaled weight copy for backward (:class:`_ScaledLinear`); None: ``layer(x)``; a
    :class:`FrozenLinear`: the linear layer with those weights (the multiplier folded in).
    Under autocast the input is cast to the autocast dtype, as ``F.linear`` does."""
    if isinstance(scale, FrozenLinear):
        return F.linear(x, scale.weight, scale.bias)
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
    return apply_function(_ScaledLinear, x, weight, bias, scale)
