"""Adaptive Gradient Clipping (Brock, De, Smith & Simonyan, ICML 2021, "High-performance
large-scale image recognition without normalization", Sec. 4, Eq. 3), in a few launches.

For every unit ``i`` of a parameter (a row of dim 0: an output channel of a convolution, an
output feature of a linear layer; a whole tensor for a vector or a scalar, as the paper's code
and timm do), with ``G_i`` its gradient and ``W_i`` its weights::

    G_i <- lambda * max(||W_i||, eps) / ||G_i|| * G_i    where ||G_i|| / max(||W_i||, eps) > lambda

(Frobenius norms; ``eps`` = 1e-3 keeps the gradients of zero-initialised parameters, such as a
SkipInit gain, from being clipped to zero). As in the paper's code (``max(||G_i||, 1e-6)`` in the
denominator) and timm's ``timm.utils.agc.adaptive_clip_grad``, which computes the same thing with
about ten ops per parameter.

How it stays a few launches, whatever the number of parameters: the units of every parameter
are grouped by their size (a ResNet-50 has about a dozen: its fan-ins, and the lengths of its
vectors), and the gradients and weights of all of them are gathered into one buffer with one
``torch.cat``, laid out group after group as a ``(2, units, size)`` block (the gradients' rows,
then the weights'). A group's norms are one ``vector_norm`` over its block, the clipping factors of
every unit a handful of ops on one ``(2, units)`` tensor, a group's scaling one in-place multiply
of its gradient rows (broadcast over the row), and the gradients go back with one
``torch._foreach_copy_``: ``2 x groups + 9`` aten ops per call, against ``10 x parameters``
for a per-parameter loop. A tensor is read in its memory order (a ``channels_last`` weight is
not copied to a contiguous one first: a unit's elements are contiguous in either format, and a
norm does not care about their order). The cost is transient memory: one copy of the clipped
gradients and weights.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Optional, Union

import torch

__all__ = ["adaptive_clip_grad_", "check_agc", "unit_size"]

#: the floor of a unit's gradient norm in the clipping factor's denominator (the paper's code)
GRAD_NORM_FLOOR = 1e-6
#: the floor of a unit's weight norm, ``eps``, by default (the paper's 1e-3)
DEFAULT_EPS = 1e-3


def check_agc(clip: object, eps: object = DEFAULT_EPS) -> None:
    """Raise ``ValueError`` (naming the value) unless ``clip`` (lambda) and ``eps`` are positive,
    finite numbers."""
    for name, value in (("clip", clip), ("eps", eps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"AGC {name} must be a number, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"AGC {name} must be a positive finite number, got {value!r}")


def unit_size(p: torch.Tensor) -> int:
    """The number of elements of one of ``p``'s units: a row of dim 0 of a matrix or kernel (its
    fan-in), the whole tensor for a vector or a scalar."""
    return p.numel() // p.shape[0] if p.dim() > 1 else p.numel()


def _memory_order(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A contiguous view of ``t`` with its elements in memory order and dim 0's units still
    whole blocks (``t`` itself when contiguous; a ``channels_last`` kernel permuted to N, H, W,
    C), or None when ``t`` has no such view (it is then read through a copy)."""
    if t.is_contiguous():
        return t
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    view = t.permute(order)
    if view.is_contiguous() and (order[0] == 0 or t.shape[0] == 1 or t.dim() <= 1):
        return view
    return None


def adaptive_clip_grad_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], clip: float = 0.01,
                        eps: float = DEFAULT_EPS) -> None:
    """Clip the gradients of ``parameters`` in place, unit by unit, at ``clip`` (the paper's
    lambda) times ``max(||W_i||, eps)`` (module docstring). Parameters without a gradient are
    left alone; a sparse gradient is refused. Call it on gradients that are final: after AMP
    unscaling and, under data parallelism, after the all-reduce."""
    check_agc(clip, eps)
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    # (device, dtype) -> unit size -> parameters; one buffer per (device, dtype)
    buffers: dict[tuple, dict[int, list[torch.Tensor]]] = {}
    for p in parameters:
        if p.grad is None or p.numel() == 0:
            continue
        if p.grad.is_sparse:
            raise ValueError("adaptive gradient clipping needs dense gradients (a sparse embedding's are not)")
        buffers.setdefault((p.device, p.dtype), {}).setdefault(unit_size(p), []).append(p)
    for groups in buffers.values():
        _clip_buffer(groups, clip, eps)


def _flat(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``t``'s elements as a vector in memory order (:func:`_memory_order`), and whether that
    vector is a view of ``t`` (False: a copy, for a tensor without such a view)."""
    view = _memory_order(t)
    return (t.reshape(-1), False) if view is None else (view.view(-1), True)


@torch.no_grad()
def _clip_buffer(groups: dict[int, list[torch.Tensor]], clip: float, eps: float) -> None:
    """Clip the parameters of one device and dtype, grouped by unit size. Few dispatches per
    parameter (a view of its gradient and one of its weight): the host time of a GPU step."""
    pieces, blocks, grads = [], [], []  # what the buffer gathers; per group (offset, units, size); gradients
    offset = 0
    for size, params in groups.items():
        flat = [_flat(p.grad) for p in params]
        pieces += [v for v, _ in flat] + [_flat(p)[0] for p in params]
        grads.append([(v, p.grad, is_view) for (v, is_view), p in zip(flat, params)])
        units = sum(p.numel() for p in params) // size
        blocks.append((offset, units, size))
        offset += 2 * units * size
    buffer = torch.cat(pieces)
    acc = torch.float32 if buffer.dtype in (torch.float16, torch.bfloat16) else None  # norms summed in fp32
    norms = torch.cat([torch.linalg.vector_norm(buffer[o:o + 2 * u * s].view(2, u, s), dim=2, dtype=acc)
                       for o, u, s in blocks], dim=1)  # (2, all units): the gradients' norms, the weights'
    grad_norm, max_norm = norms[0], norms[1].clamp_(min=eps).mul_(clip)
    scale = (max_norm / grad_norm.clamp(min=GRAD_NORM_FLOOR)).masked_fill_(grad_norm <= max_norm, 1.0)
    dst, src = [], []
    for (o, u, s), factors, group in zip(blocks, scale.split([u for _, u, _ in blocks]), grads):
        rows = buffer[o:o + u * s]
        rows.view(u, s).mul_(factors.unsqueeze(1))
        for chunk, (flat, grad, is_view) in zip(rows.split([g.numel() for _, g, _ in group]), group):
            dst.append(flat if is_view else grad)  # a view of the gradient in memory order, or the gradient
            src.append(chunk if is_view else chunk.view(grad.shape))
    torch._foreach_copy_(dst, src)
