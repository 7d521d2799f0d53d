"""Decisions every process of a distributed run must take together.

A training step that one rank skips and the others run deadlocks DDP: the others wait in the
gradient all-reduce (and in the collectives of ``self.log(sync_dist=True)`` and of the mean-shift
measurement) for a rank that never arrives. :func:`every_rank_has_samples` turns the local "my
batch is empty" (every file of it was corrupt and skipped) into one decision shared by all ranks.
Lightning refuses a ``None`` from ``training_step`` with several processes, so there every rank
returns :func:`zero_loss` instead: no forward, no logging, a backward that gives every parameter a
zero gradient (DDP's all-reduce runs as usual; accumulated gradients are kept). The optimizer still
takes its step, so momentum and weight decay act as after any zero-gradient batch. One process
returns ``None`` and Lightning skips the step entirely.

The vote travels over a gloo process group on host integers: the batch size is known on the host,
so the vote never waits for the GPU (an NCCL all-reduce read back with ``.item()`` would add a
device synchronisation to every step). With a gloo default group (CPU runs) that group is reused;
otherwise one gloo group is created once, by all ranks, at the first vote.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["world_size", "rank", "every_rank_has_samples", "sum_over_ranks", "sum_tensor_over_ranks",
           "max_over_ranks", "reduce_tensor_to_rank_zero", "broadcast_from_rank_zero", "gather_objects",
           "gather_by_key", "zero_loss"]

_HOST_GROUPS: dict[int, object] = {}


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _host_group():
    """A gloo group over all ranks (the default group when it is gloo already)."""
    if dist.get_backend() == "gloo":
        return None
    key = id(dist.group.WORLD)  # a new default group (a new run in this process) gets a new one
    if key not in _HOST_GROUPS:
        _HOST_GROUPS[key] = dist.new_group(backend="gloo")
    return _HOST_GROUPS[key]


def every_rank_has_samples(count: int) -> bool:
    """True when this rank's batch has ``count > 0`` samples and so has every other rank's.

    Call it on every rank at every step (it is a collective when the world size exceeds 1); a
    False result is the same on all ranks, so all of them skip the step together.
    """
    if world_size() == 1:
        return count > 0
    empty = torch.tensor([int(count == 0)], dtype=torch.int32)
    dist.all_reduce(empty, op=dist.ReduceOp.MAX, group=_host_group())
    return not bool(empty.item())


def sum_tensor_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """A CPU tensor summed over every rank, in place (statistics such as BLEU's n-gram counts);
    a collective when the world size exceeds 1."""
    if world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=_host_group())
    return values


def sum_over_ranks(value: int) -> int:
    """A host integer summed over every rank (e.g. the target tokens of a step, by which the
    translation loss is normalised); a collective when the world size exceeds 1."""
    return int(sum_tensor_over_ranks(torch.tensor([int(value)], dtype=torch.int64)).item())


def max_over_ranks(value: int) -> int:
    """The largest of every rank's host integer (e.g. a size every rank must agree on); a
    collective when the world size exceeds 1."""
    if world_size() == 1:
        return int(value)
    values = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=_host_group())
    return int(values.item())


def reduce_tensor_to_rank_zero(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """A CPU tensor reduced (``op``: ``"sum"`` or ``"max"``) over every rank onto rank 0, in place
    (a collective when the world size exceeds 1). Only rank 0's result is meaningful: statistics
    that only rank 0 needs (per-video evaluation sums) travel once, instead of being gathered on
    every rank."""
    if world_size() > 1:
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        dist.reduce(values, dst=0, op=reduce_op, group=_host_group())
    return values


def broadcast_from_rank_zero(values: torch.Tensor) -> torch.Tensor:
    """Rank 0's CPU tensor on every rank, in place (a collective when the world size exceeds 1):
    the few numbers rank 0 computed from what :func:`reduce_tensor_to_rank_zero` brought it."""
    if world_size() > 1:
        dist.broadcast(values, src=0, group=_host_group())
    return values


def gather_objects(items: list) -> list:
    """Every rank's list of picklable items, concatenated in rank order (a collective)."""
    if world_size() == 1:
        return list(items)
    parts: list = [None] * world_size()
    dist.all_gather_object(parts, items, group=_host_group())
    return [item for part in parts for item in part]


def gather_by_key(items: dict) -> dict:
    """Every rank's ``{key: value}`` merged, on every rank (a collective), in key order.

    Evaluation keyed by sample (COCO image id, video and view): a padded ``DistributedSampler``
    hands the last samples to two ranks, so a key met twice is kept once (the first rank's value;
    both ranks computed it from the same input). The result equals a single-process evaluation.
    """
    merged: dict = {}
    for key, value in gather_objects(list(items.items())):
        merged.setdefault(key, value)
    return dict(sorted(merged.items()))


def zero_loss(module: torch.nn.Module) -> torch.Tensor:
    """A loss of exactly 0 whose backward reaches every trainable parameter of ``module``: each gets
    a zero gradient, so DDP's gradient hooks fire on every rank as in an ordinary step."""
    terms = [p.sum() for p in module.parameters() if p.requires_grad]
    return torch.stack(terms).sum() * 0.0
