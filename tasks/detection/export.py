"""What ``rescale export`` writes for the detection task: the detector's backbone with its FPN, the
normalization-free network of the task, on the batch the detector's transform makes of real images.

torchvision's detection heads do not export with ``torch.export``: the region proposals and the
box post-processing keep a number of boxes that depends on the scores (score thresholds, NMS), a
size no graph of fixed-rank tensors can be traced through (``GuardOnDataDependentSymNode`` in
``torchvision.ops.boxes``). :data:`HEADS_NOTE` says so in one line when the command runs.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from ..common.data import describe_transforms
from ..common.export import ExportProgram, batch_dynamic
from .transforms import eval_transforms

__all__ = ["HEADS_NOTE", "detection_programs", "detector_preprocessing"]

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


def detector_preprocessing(transform: nn.Module) -> dict[str, Any]:
    """The sidecar's ``preprocessing``: how an image becomes the backbone's input, read off the
    objects that do the work, so the two cannot drift apart: ``pixel_scale`` off the data's
    evaluation transform (:func:`~.transforms.eval_transforms`, which neither resizes nor normalises),
    ``mean``/``std``, the resize and ``pad_to_multiple`` off the detector's ``transform`` (torchvision's
    ``GeneralizedRCNNTransform``, in evaluation: ``(x - mean) / std``, then the shorter side to
    ``min_size[-1]`` unless the longer would pass ``max_size``, ``scale = min(size / shorter, max_size /
    longer)``, each side ``floor(side * scale)``, bilinear without antialiasing, pixel centres at
    +0.5; then zero-padded, bottom and right, to a multiple of ``size_divisible``)."""
    if type(transform) is not GeneralizedRCNNTransform:
        raise TypeError(f"{type(transform).__name__} as the detector's transform: the export's preprocessing "
                        "describes torchvision's GeneralizedRCNNTransform")
    data = describe_transforms([eval_transforms()])
    if any(data[key] is not None for key in ("resize", "center_crop", "mean", "std")):
        raise TypeError("the detection data's evaluation transform resizes, crops or normalises: the export's "
                        "preprocessing describes the detector's transform doing so")
    fixed = transform.fixed_size
    resize: dict[str, Any] = ({"size": [int(fixed[1]), int(fixed[0])], "to": "exact"} if fixed is not None else
                              {"size": int(transform.min_size[-1]), "to": "shorter side",
                               "max_size": int(transform.max_size), "rounding": "floor"})
    resize.update(interpolation="bilinear", antialias=False, align_corners=False)
    return {"layout": "NCHW", "channels": 3, "channel_order": "RGB", "pixel_scale": data["pixel_scale"],
            "mean": [float(v) for v in transform.image_mean], "std": [float(v) for v in transform.image_std],
            "resize": resize, "center_crop": None, "pad_to_multiple": int(transform.size_divisible),
            "pad": {"value": 0.0, "where": "bottom and right"}, "order": "normalize, resize, pad"}
