"""What the fast plans compute the same way (``docs/design.md``, "Why each fold is exact"): the
activations' dtype, which blocks are plain once folded and which carry RescaleNet's skip
multipliers (Shao et al. 2020) and in what units, the stem's offset in the stem conv's bias slot,
and the merge's add of the skip path in place.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from ..blocks import ResidualBlock, ResidualMerge
from ..layers import ScalarBias, StridedAvgPool
from .conditions import is_updating
from .folds import is_offset_module

__all__ = ["activation_dtype", "plain_block", "carries_scale", "carried_scales", "offset_stem", "add_skip",
           "add_scaled_skip", "network_part"]


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the network's activations will have: autocast's where it is on, else ``x``'s
    (floating) dtype."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


# --------------------------------------------------------------- which blocks are plain
def _offset_modules(block: ResidualBlock) -> list[nn.Module]:
    mods = [getattr(block, f"shift{i}") for i in range(1, block.num_convs + 1)]
    return mods + ([m for m in block.downsample if is_offset_module(m)] if block.downsample is not None else [])


def plain_block(block: ResidualBlock) -> bool:
    """Whether ``block`` is a conv/ReLU block once its offsets, biases and multipliers are folded:
    no norm layer (each ``bn{i}`` an identity or Fixup's scalar bias, no ``merge_norm``), offset
    modules in front of its convolutions, a shortcut of pools, offsets and convolutions."""
    if not all(isinstance(getattr(block, f"bn{i}"), (nn.Identity, ScalarBias))
               and is_offset_module(getattr(block, f"shift{i}")) for i in range(1, block.num_convs + 1)):
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
