"""Detection transforms (torchvision ``transforms.v2``): boxes and masks move with the image.

Where the resizing happens differs between training and evaluation, as in torchvision's detection
references with v2 transforms (``references/detection/presets.py``):

- **Training** (:func:`train_transforms`): the data pipeline resizes. Each image gets a random
  shortest side from ``train_sizes`` with the longest side capped at ``max_size`` (Detectron2's
  ``ResizeShortestEdge``, multi-scale training 640-800 / 1333), and a horizontal flip. The detector
  is then built with ``_skip_resize=True``, so its ``GeneralizedRCNNTransform`` only normalises and
  batches the images and does not resize them again.
- **Evaluation** (:func:`eval_transforms`): no resizing here. The detector's own
  ``GeneralizedRCNNTransform`` resizes to the test size (``min_size``/``max_size``) and maps the
  predictions back to the original image, so predictions and the COCO evaluation are in the
  original image's pixels. (``_skip_resize`` only takes effect in training mode.)

Boxes a transform made degenerate are dropped by ``SanitizeBoundingBoxes`` together with their
labels, masks, ``iscrowd`` and ``area`` (:func:`instance_fields`). ``area`` stays the annotation's
original value: it is only used by the COCO evaluation, which runs at the original resolution.
Images end as float32 in ``[0, 1]`` (the detector normalises them with its own mean/std) and all
outputs as plain tensors.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchvision.transforms import v2

__all__ = ["train_transforms", "eval_transforms", "instance_fields", "TRAIN_SIZES", "MAX_SIZE"]

TRAIN_SIZES = (640, 672, 704, 736, 768, 800)  # Detectron2's multi-scale training (shortest side)
MAX_SIZE = 1333


def instance_fields(inputs: Any) -> tuple[torch.Tensor, ...]:
    """The per-box tensors of an ``(image, target)`` pair besides boxes and masks (which
    ``SanitizeBoundingBoxes`` finds by type): labels, iscrowd, area when present.
    A module-level function so that the transforms pickle into spawned workers."""
    target = inputs[1]
    return tuple(target[k] for k in ("labels", "iscrowd", "area") if k in target)


def train_transforms(train_sizes: Sequence[int] = TRAIN_SIZES, max_size: int = MAX_SIZE,
                     flip: float = 0.5) -> v2.Compose:
    """Random shortest-side resize, horizontal flip, drop degenerate boxes, float image."""
    return v2.Compose([
        v2.ToImage(),
        v2.RandomShortestSize(min_size=list(train_sizes), max_size=max_size, antialias=True),
        v2.RandomHorizontalFlip(p=flip),
        v2.ClampBoundingBoxes(),
        v2.SanitizeBoundingBoxes(min_size=1, labels_getter=instance_fields),
        v2.ToDtype(torch.float32, scale=True),  # the image only; masks stay uint8
        v2.ToPureTensor(),
    ])


def eval_transforms() -> v2.Compose:
    """Original resolution (the detector resizes and maps back), float image."""
    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()])
