"""What the plans compute the same way (``docs/design.md``, "Why each fold is exact"): the
activations' dtype, which blocks are plain once folded and which carry RescaleNet's skip
multipliers (Shao et al. 2020) and in what units, the stem's offset in the stem conv's bias slot,
the merge's add of the skip path in place, the ResNet stage loop, a network's parts, and a
Transformer sublayer whose branch takes its multiplier.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from ..blocks import ResidualBlock, ResidualMerge, ResidualSublayer
from ..layers import ScalarBias, StridedAvgPool
from .conditions import has_hooks_below, is_updating
from .folds import is_offset_module

__all__ = ["autocast_dtype", "activation_dtype", "plain_block", "carries_scale", "carried_scales", "offset_stem",
           "add_skip", "add_scaled_skip", "run_stages", "network_part", "takes_out_scale", "scaled_sublayer"]


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes convolutions and linear layers in on ``x``'s device, or None
    where it is off."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the network's activations will have: autocast's where it is on, else ``x``'s
    (floating) dtype."""
    dtype = autocast_dtype(x)
    if dtype is not None:
        return dtype
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


# --------------------------------------------------------------- which blocks are plain
def _offset_modules(block: ResidualBlock) -> list[nn.Module]:
    mods = [shift for shift, _, _ in block.branch_layers()]
    return mods + ([m for m in block.downsample if is_offset_module(m)] if block.downsample is not None else [])


def plain_block(block: ResidualBlock) -> bool:
    """Whether ``block`` is a conv/ReLU block once its offsets, biases and multipliers are folded:
    no norm layer (each ``post`` an identity or Fixup's scalar bias, no ``merge_norm``), offset
    modules in front of its convolutions, a shortcut of pools, offsets and convolutions."""
    if not all(isinstance(post, (nn.Identity, ScalarBias)) and is_offset_module(shift)
               and isinstance(conv, nn.modules.conv._ConvNd) for shift, conv, post in block.branch_layers()):
        return False
    if not isinstance(block.merge_norm, nn.Identity):
        return False
    return block.downsample is None or all(
        isinstance(m, (StridedAvgPool, nn.modules.conv._ConvNd)) or is_offset_module(m) for m in block.downsample)


# --------------------------------------------------------------- RescaleNet's scale schedule
def carries_scale(block: ResidualBlock) -> bool:
    """Whether a fast plan may run ``block`` on activations in scaled units (``c_in``, ``c_out``
    != 1): true when the block is positively homogeneous once its additive terms are scaled
    (:func:`plain_block`) and no mean-shift layer measures now."""
    return plain_block(block) and not any(is_updating(m) for m in _offset_modules(block))


def carried_scales(blocks: Iterable[nn.Module], c: float = 1.0) -> Iterator[tuple]:
    """``(block, c_in, c_out)`` for each of ``blocks`` in order, the first taking activations in
    units of ``c``: a block on a fast plan that :func:`carries_scale` takes its input in units of
    ``c_in`` and returns its output in units of ``c_out = c_in * skip_scale`` (RescaleNet's
    ``alpha_k``, so that ``relu(alpha c_in x + f) = c_out relu(x + f / c_out)`` and no block
    multiplies its skip path); any other block gets ``(None, None)``: it takes and returns true
    units, and the product starts again from 1."""
    for block in blocks:
        if (isinstance(block, ResidualBlock) and block.fused and block.merge.skip_scale > 0
                and carries_scale(block)):
            c_out = c * block.merge.skip_scale
            yield block, c, c_out
            c = c_out
        else:
            yield block, None, None
            c = 1.0


# --------------------------------------------------------------- the stem
def offset_stem(conv: nn.modules.conv._ConvNd, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``relu(conv(x) + e)`` with the offset ``e`` (one value or one per channel) in the conv's
    bias slot: a ResNet stem whose ``bn1`` adds ``e``."""
    e = e.reshape(-1)
    if e.shape[0] != conv.out_channels:
        e = e.expand(conv.out_channels)
    bias = e if conv.bias is None else conv.bias.to(e.dtype) + e
    return torch.relu_(conv._conv_forward(x, conv.weight, bias))


# --------------------------------------------------------------- the merge
def add_skip(branch: torch.Tensor, skip: torch.Tensor, skip_scale: float) -> torch.Tensor:
    """``branch + skip_scale * skip`` in :meth:`ResidualMerge.result_dtype`: in place on
    ``branch`` (a fresh tensor nothing else holds) when it has that dtype already, else in a new
    tensor."""
    if branch.dtype == skip.dtype:  # (asked first: no dtype promotion in a traced graph)
        return branch.add_(skip, alpha=skip_scale)
    dtype = ResidualMerge.result_dtype(branch, skip)
    if branch.dtype == dtype:
        return branch.add_(skip, alpha=skip_scale)
    if skip.dtype != dtype:
        branch = branch.to(dtype)
    return torch.add(branch, skip, alpha=skip_scale)  # promotes: computed in ``dtype``


def add_scaled_skip(branch: torch.Tensor, scale, skip: torch.Tensor, skip_scale: float) -> torch.Tensor:
    """``scale * branch + skip_scale * skip`` (``scale`` a float or a tensor broadcasting over
    channels) in :meth:`ResidualMerge.result_dtype`, laid out as the branch: for a branch whose
    last weight is larger than its output (two passes over the output beat three over the
    weight)."""
    out = branch * (scale.to(branch.dtype) if isinstance(scale, torch.Tensor) else scale)
    dtype = ResidualMerge.result_dtype(branch, skip)
    if out.dtype != dtype:
        out = out.to(dtype)
    return out.add_(skip, alpha=skip_scale)


# --------------------------------------------------------------- a network's parts
def run_stages(stages: Iterable[tuple], x: torch.Tensor, run_stage: Callable, outputs: list | None = None,
               c: float = 1.0) -> tuple[torch.Tensor, float]:
    """The ResNet stage loop (``ResNet._run``'s): each stage's temporal max-pool, then
    ``run_stage(stage, x, c) -> (x, c)`` on activations in units of ``c`` (true ones = ``c *
    x``); each stage's output, in true units, appended to ``outputs``. ``stages``: ``(temporal
    pool or None, stage)`` pairs. A carried ``c > 0`` and an offset riding in the stream pass
    the max-pool: ``max(c x + e) = c max(x) + e``."""
    for tpool, stage in stages:
        if tpool is not None:
            x = tpool(x)
        x, c = run_stage(stage, x, c)
        if outputs is not None:
            outputs.append(x if c == 1.0 else x * c)
    return x, c


def network_part(features: Callable, head: Callable, x: torch.Tensor, part: str) -> torch.Tensor:
    """``part`` of a network whose features ``features(x) -> (x, c)`` come in units of ``c`` and
    whose ``head(x, c)`` takes them so: ``"logits"``, ``"features"`` (in true units) or
    ``"head"`` (on features in true units)."""
    if part == "head":
        return head(x, 1.0)
    x, c = features(x)
    if part == "features":
        return x if c == 1.0 else x * c
    return head(x, c)


# --------------------------------------------------------------- the Transformer sublayer
def takes_out_scale(sub: ResidualSublayer, x: torch.Tensor) -> bool:
    """A branch that takes ``out_scale`` (the suite's attention and feed-forward), no Fixup bias
    after the multiplier, no hook below."""
    return (getattr(sub.fn, "supports_out_scale", False) and sub.merge.bias is None
            and not has_hooks_below(sub))


def scaled_sublayer(sub: ResidualSublayer, x: torch.Tensor, out_scale, *args, in_layers: dict | None = None,
                    **kwargs) -> torch.Tensor:
    """The sublayer (``post_norm(merge(x, dropout(fn(pre_norm(x)))))``) with ``out_scale`` (its
    merge's branch multiplier, or the branch's last layer with it folded in:
    :class:`~rescale_core.plans.folds.FrozenLinear`) handed to its branch (dropout commutes with
    the scaling), then one in-place add of the skip. ``in_layers`` (the frozen plan, a pointwise
    pre-norm): the layers that read the pre-norm's output with its ``weight`` and ``bias`` folded
    in, so that only its function runs (``PointwiseNorm.unscaled``)."""
    if in_layers is None:
        out = sub.fn(sub.pre_norm(x), *args, out_scale=out_scale, **kwargs)
    else:
        out = sub.fn(sub.pre_norm.unscaled(x), *args, out_scale=out_scale, in_layers=in_layers, **kwargs)
    return sub.post_norm(add_skip(sub.dropout(out), x, sub.merge.skip_scale))
