"""What ``rescale export`` writes for the detection task: the detector's backbone with its FPN, the
normalization-free network of the task, on the batch the detector's transform makes of real images.

torchvision's detection heads do not export with ``torch.export``: the region proposals and the
box post-processing keep a number of boxes that depends on the scores (score thresholds, NMS), a
size no graph of fixed-rank tensors can be traced through (``GuardOnDataDependentSymNode`` in
``torchvision.ops.boxes``). :data:`HEADS_NOTE` says so in one line when the command runs.
"""
from __future__ import annotations

import torch
from torch import nn

from ..common.export import ExportProgram, batch_dynamic

__all__ = ["HEADS_NOTE", "detection_programs"]

HEADS_NOTE = ("the detector's heads (region proposals, RoI heads: a data-dependent number of boxes after score "
              "thresholds and NMS) do not export with torch.export; written: the backbone with its FPN, run on the "
              "detector's transform of the images (normalized, resized, padded to one batch)")


@torch.no_grad()
def detection_programs(net: nn.Module, images: list[torch.Tensor]) -> list[ExportProgram]:
    """The backbone (with its FPN) of the torchvision detector ``net`` (eval mode) on the batch its
    transform makes of ``images``."""
    batch = net.transform(list(images))[0].tensors
    return [ExportProgram("backbone", net.backbone, (batch,), batch_dynamic((batch,), ((0, 2, 3),)),
                          note=HEADS_NOTE)]
