"""What ``rescale export`` writes for a task: one or more :class:`ExportProgram`, each a module
called on real inputs of the task.

By default the task module's network (``module.net``) on a batch's network inputs
(:func:`~..training.inputs.network_inputs`); a task whose model needs more says so with an
``export_programs(batch)`` method on its module (translation: the encoder and one decoding step;
detection: the backbone with its FPN).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ..training import network_inputs

__all__ = ["ExportProgram", "export_programs", "batch_dynamic"]


@dataclass
class ExportProgram:
    """One graph to export: ``module(*inputs)``, on real ``inputs`` of the task.

    ``dynamic_shapes``: :func:`torch.export.export`'s (None: every size as in ``inputs``);
    ``note``: one line on what of the task's model the program leaves out."""

    name: str
    module: nn.Module
    inputs: tuple
    dynamic_shapes: Any = None
    note: Optional[str] = None


def batch_dynamic(inputs: tuple, dims: Optional[tuple[tuple[int, ...], ...]] = None) -> tuple:
    """``dynamic_shapes`` leaving ``dims`` of each input (default: the batch dimension, 0) to
    ``torch.export``, which keeps each symbolic where the network allows it (and says the range
    it allows), else fixes it."""
    dims = dims if dims is not None else ((0,),) * len(inputs)
    return tuple({d: torch.export.Dim.AUTO for d in ds} for ds in dims)


def export_programs(module, batch) -> list[ExportProgram]:
    """What ``rescale export`` writes for ``module`` on ``batch``: the module's own
    ``export_programs(batch)`` when it has one, else its network (``module.net``) on the batch's
    network inputs."""
    method = getattr(module, "export_programs", None)
    if callable(method):
        return list(method(batch))
    inputs = network_inputs(module, batch)
    return [ExportProgram("network", module.net, inputs, batch_dynamic(inputs))]
