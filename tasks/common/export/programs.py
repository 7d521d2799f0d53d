"""What ``rescale export`` writes for a task: one or more :class:`ExportProgram`, each a module
called on real inputs of the task.

By default the task module's network (``module.net``) on a batch's network inputs
(:func:`~..training.inputs.network_inputs`); a task whose model needs more says so with an
``export_programs(batch)`` method on its module (translation: the encoder and one decoding step;
detection: the backbone with its FPN).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch import nn

from ..training import network_inputs

__all__ = ["ExportProgram", "export_programs", "any_size_only", "batch_dynamic"]


@dataclass
class ExportProgram:
    """One graph to export: ``module(*inputs)``, on real ``inputs`` of the task.

    ``dynamic_shapes``: :func:`torch.export.export`'s (None: every size as in ``inputs``);
    ``note``: one line on what of the task's model the program leaves out. A program that a file
    fixed at the inputs' sizes (a format captured at them, TorchScript) cannot serve is named, with
    why, in its module's ``export_any_size_only`` (:func:`any_size_only`), known before any batch."""

    name: str
    module: nn.Module
    inputs: tuple
    dynamic_shapes: Any = None
    note: Optional[str] = None


def any_size_only(module) -> dict[str, str]:
    """``{program name: why}`` for each program of ``module`` that must take sizes other than its
    batch's (a file traced at them cannot serve it): the module's ``export_any_size_only``, a class
    attribute, so that a format fixed at the batch's sizes is refused before any data is read."""
    return dict(getattr(module, "export_any_size_only", None) or {})


def batch_dynamic(inputs: tuple, dims: Optional[tuple[tuple[int, ...], ...]] = None) -> tuple:
    """``dynamic_shapes`` leaving ``dims`` of each input (default: the batch dimension, 0) to
    ``torch.export``, which keeps each symbolic where the network allows it (and says the range
    it allows), else fixes it."""
    dims = dims if dims is not None else ((0,),) * len(inputs)
    return tuple({d: torch.export.Dim.AUTO for d in ds} for ds in dims)


def free_sizes_of_two(program: ExportProgram) -> ExportProgram:
    """``program`` with each input size it leaves to ``torch.export`` (``Dim.AUTO``) that is 1 in its
    inputs repeated to 2 (the sample twice): ``torch.export`` fixes a size it samples at 1, so a
    batch of one (``--data.batch_size 1``) would give a program that takes batches of one only. The
    size-1 check (:func:`~.formats.size_one_runs`) then names 1 in the range again."""
    if not isinstance(program.dynamic_shapes, (tuple, list)):
        return program
    inputs = []
    for tensor, dims in zip(program.inputs, program.dynamic_shapes):
        for dim, spec in (dims or {}).items():
            if spec is torch.export.Dim.AUTO and isinstance(tensor, torch.Tensor) and tensor.size(dim) == 1:
                tensor = torch.cat([tensor, tensor], dim=dim)
        inputs.append(tensor)
    return replace(program, inputs=tuple(inputs))


def export_programs(module, batch) -> list[ExportProgram]:
    """What ``rescale export`` writes for ``module`` on ``batch``: the module's own
    ``export_programs(batch)`` when it has one, else its network (``module.net``) on the batch's
    network inputs; each free size sampled at 2 or more (:func:`free_sizes_of_two`)."""
    method = getattr(module, "export_programs", None)
    if callable(method):
        return [free_sizes_of_two(p) for p in method(batch)]
    inputs = network_inputs(module, batch)
    return [free_sizes_of_two(ExportProgram("network", module.net, inputs, batch_dynamic(inputs)))]
