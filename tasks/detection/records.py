"""One image's detections, compact and on the CPU: what the COCO evaluation scores
(:mod:`.evaluation`) and the COCO results file holds (:mod:`.results`).

Boxes, scores and labels as small CPU tensors, and masks thresholded at 0.5 (torchvision's and
Detectron2's rule for Mask R-CNN's probabilities) and RLE-encoded at once, so 5000 validation
images never hold dense masks; picklable, so the records of every rank can be merged by image id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from pycocotools import mask as mask_utils

from rescale_tasks.common.errors import DataError

__all__ = ["ImageRecord", "image_record", "encode_masks", "MASK_THRESHOLD"]

#: a predicted mask probability above this is foreground (torchvision's and Detectron2's rule)
MASK_THRESHOLD = 0.5
#: the label torchvision's detectors keep for the background (categories start at 1)
BACKGROUND = 0


def encode_masks(masks: torch.Tensor, threshold: float | None = None) -> list[dict]:
    """COCO RLEs (``{"size": [h, w], "counts": bytes}``) of (N, H, W) or (N, 1, H, W) masks:
    foreground where ``mask > threshold`` (probabilities) or non-zero (``threshold=None``)."""
    if masks.dim() == 4:
        masks = masks[:, 0]
    binary = masks > threshold if threshold is not None else masks != 0
    if binary.shape[0] == 0:
        return []
    array = np.asfortranarray(binary.permute(1, 2, 0).to("cpu", torch.uint8).numpy())
    return mask_utils.encode(array)


@dataclass
class ImageRecord:
    """One image's predictions, compact and on the CPU (picklable across ranks); its ground truth
    is the annotation json's.

    ``boxes`` (N, 4) float32 xyxy in the original image's pixels, ``scores`` (N,), ``labels`` (N,)
    int64 (the model's contiguous labels); ``masks``: one RLE per detection or None (a box-only
    detector). ``size``: (height, width) when known (from the masks)."""
    image_id: int
    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    masks: list[dict] | None = None
    size: tuple[int, int] | None = None


def _image_id(target: Mapping[str, Any]) -> int:
    if "image_id" not in target:
        raise DataError("a detection target has no 'image_id'; the dataset must give each target the "
                        "image's COCO id (tasks/detection/coco.py does)")
    value = target["image_id"]
    return int(value.item() if isinstance(value, torch.Tensor) else value)


def image_record(prediction: Mapping[str, torch.Tensor], target: Mapping[str, Any] | None = None,
                 image_id: int | None = None) -> ImageRecord:
    """The :class:`ImageRecord` of one torchvision prediction (``boxes``, ``scores``, ``labels``,
    optional ``masks`` (N, 1, H, W) probabilities) of the image ``image_id`` (else the dataset
    target's ``image_id``)."""
    if image_id is None:
        if target is None:
            raise ValueError("image_record needs a target or an image_id")
        image_id = _image_id(target)
    # label 0 is the background: RetinaNet scores it as a class it never trains positive
    kept = prediction["labels"].detach() != BACKGROUND
    size = None
    masks = None
    if prediction.get("masks") is not None:
        masks = encode_masks(prediction["masks"].detach()[kept], MASK_THRESHOLD)
        size = tuple(int(s) for s in prediction["masks"].shape[-2:])
    return ImageRecord(image_id=int(image_id),
                       boxes=prediction["boxes"].detach()[kept].to("cpu", torch.float32).reshape(-1, 4),
                       scores=prediction["scores"].detach()[kept].to("cpu", torch.float32),
                       labels=prediction["labels"].detach()[kept].to("cpu", torch.int64),
                       masks=masks, size=size)
