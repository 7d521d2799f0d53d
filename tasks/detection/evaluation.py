"""COCO box and mask AP of a detector's predictions (issue #10), by the official COCO evaluation.

The scores are pycocotools' ``COCOeval`` (Lin et al. 2014; the protocol Detectron2 and torchvision
report), run through torchmetrics' ``MeanAveragePrecision(iou_type=..., backend="pycocotools")``.
What this class adds around it:

* Compact per-image records (:class:`ImageRecord`): boxes, scores, labels on the CPU, and masks
  thresholded at 0.5 (torchvision's and Detectron2's rule for Mask R-CNN's probabilities) and
  RLE-encoded at once, so 5000 validation images never hold dense masks. The targets' masks are
  kept as RLE as well; ``iscrowd`` and ``area`` go to COCOeval (crowd regions are ignored: a
  detection on one is neither a true nor a false positive; the area decides small/medium/large).
* DDP: a padded ``DistributedSampler`` sends a few images to two ranks, and torchmetrics' own
  state sync aborts when the ranks hold different image counts (METHOD.md). :meth:`CocoEvaluator.compute`
  merges the records by image id over the ranks instead (``gather_by_key``: a duplicate counts
  once), then every rank feeds a fresh metric in image-id order, with its sync turned off. The
  result equals a one-process evaluation, on every rank.
* The same records make the results JSON (:mod:`.results`), so a written file holds exactly what
  was scored.

Returned keys (floats, COCO's fractions, not percent): ``{iou}/AP`` (mean over IoU 0.50:0.95),
``{iou}/AP50``, ``{iou}/AP75``, ``{iou}/APs``, ``{iou}/APm``, ``{iou}/APl``, ``{iou}/AR1``,
``{iou}/AR10``, ``{iou}/AR100``, ``{iou}/ARs``, ``{iou}/ARm``, ``{iou}/ARl`` for ``iou`` in
``bbox``, ``segm``. COCO's -1 ("no ground truth in that area range", e.g. no small objects)
becomes NaN, so it is never averaged or plotted as a score.

Deviations from Detectron2's ``COCOEvaluator``: categories are the model's contiguous labels (the
mapping to COCO ids only matters for the results JSON; AP is the same), and an evaluation on
several ranks is computed by every rank instead of rank 0 alone.
"""
from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from pycocotools import mask as mask_utils
from torchmetrics.detection import MeanAveragePrecision

from rescale_tasks.common.distributed import gather_by_key
from rescale_tasks.common.errors import ConfigError, DataError

__all__ = ["CocoEvaluator", "ImageRecord", "image_record", "encode_masks", "decode_masks", "IOU_TYPES",
           "STAT_NAMES", "MASK_THRESHOLD"]

IOU_TYPES = ("bbox", "segm")
#: torchmetrics' names of COCOeval's 12 summary numbers -> this module's names
STAT_NAMES = {"map": "AP", "map_50": "AP50", "map_75": "AP75", "map_small": "APs", "map_medium": "APm",
              "map_large": "APl", "mar_1": "AR1", "mar_10": "AR10", "mar_100": "AR100", "mar_small": "ARs",
              "mar_medium": "ARm", "mar_large": "ARl"}
#: a predicted mask probability above this is foreground (torchvision's and Detectron2's rule)
MASK_THRESHOLD = 0.5


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


def decode_masks(rles: Sequence[dict], size: tuple[int, int]) -> torch.Tensor:
    """(N, H, W) bool masks from COCO RLEs (``size``: (H, W), used when there are none)."""
    if not rles:
        return torch.zeros((0, *size), dtype=torch.bool)
    return torch.from_numpy(mask_utils.decode(list(rles))).permute(2, 0, 1).to(torch.bool)


@dataclass
class ImageRecord:
    """One image's predictions and ground truth, compact and on the CPU (picklable across ranks).

    ``boxes`` (N, 4) float32 xyxy in the original image's pixels, ``scores`` (N,), ``labels`` (N,)
    int64 (the model's contiguous labels); ``masks``: one RLE per detection or None (a box-only
    detector). ``gt``: ``boxes``, ``labels``, ``iscrowd``, ``area`` tensors and ``masks`` (RLEs or
    None), or None for an image without annotations at hand (a results file only).
    ``size``: (height, width) when known (from a mask), for decoding an empty set of masks."""
    image_id: int
    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    masks: list[dict] | None = None
    gt: dict[str, Any] | None = None
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
    optional ``masks`` (N, 1, H, W) probabilities) and its dataset target (``boxes``, ``labels``,
    optional ``masks`` (N, H, W), ``iscrowd``, ``area``, and ``image_id``)."""
    if image_id is None:
        if target is None:
            raise ValueError("image_record needs a target or an image_id")
        image_id = _image_id(target)
    size = None
    masks = None
    if prediction.get("masks") is not None:
        masks = encode_masks(prediction["masks"].detach(), MASK_THRESHOLD)
        size = tuple(prediction["masks"].shape[-2:])
    gt = None
    if target is not None and "boxes" in target:
        labels = torch.as_tensor(target["labels"]).detach().to("cpu", torch.int64)
        zeros = torch.zeros_like(labels)
        gt = {"boxes": torch.as_tensor(target["boxes"]).detach().to("cpu", torch.float32).reshape(-1, 4),
              "labels": labels,
              "iscrowd": torch.as_tensor(target.get("iscrowd", zeros)).detach().to("cpu", torch.int64),
              "area": torch.as_tensor(target.get("area", zeros)).detach().to("cpu", torch.float32),
              "masks": None}
        if target.get("masks") is not None:
            gt["masks"] = encode_masks(torch.as_tensor(target["masks"]).detach())
            size = size or tuple(target["masks"].shape[-2:])
    return ImageRecord(image_id=int(image_id),
                       boxes=prediction["boxes"].detach().to("cpu", torch.float32).reshape(-1, 4),
                       scores=prediction["scores"].detach().to("cpu", torch.float32),
                       labels=prediction["labels"].detach().to("cpu", torch.int64),
                       masks=masks, gt=gt, size=tuple(int(s) for s in size) if size else None)


class CocoEvaluator:
    """COCO AP of a detector over an evaluation set, per image id (see the module docstring).

    Args:
        iou_types: ``("bbox", "segm")`` for Mask R-CNN, ``("bbox",)`` for box-only detectors.
        label_to_category: the model's contiguous label -> the dataset's category id (a mapping or a
            sequence indexed by label), kept for the results JSON (:meth:`results`); None: identity.
    """

    def __init__(self, iou_types: Sequence[str] = IOU_TYPES,
                 label_to_category: Mapping[int, int] | Sequence[int] | None = None) -> None:
        iou_types = tuple(iou_types)
        if not iou_types or any(t not in IOU_TYPES for t in iou_types) or len(set(iou_types)) != len(iou_types):
            raise ConfigError(f"iou_types must be 'bbox' and/or 'segm', got {list(iou_types)}")
        self.iou_types = iou_types
        self.label_to_category = label_to_category
        self._records: dict[int, ImageRecord] = {}

    def reset(self) -> None:
        self._records = {}

    def __len__(self) -> int:
        return len(self._records)

    @property
    def records(self) -> dict[int, ImageRecord]:
        """This rank's records by image id (an image seen twice keeps its last record)."""
        return self._records

    def update(self, predictions: Sequence[Mapping[str, torch.Tensor]],
               targets: Sequence[Mapping[str, Any]]) -> None:
        """Record a batch: torchvision detector outputs at the original image size and the dataset
        targets (with ``image_id``) of the same images, in the same order."""
        if len(predictions) != len(targets):
            raise ValueError(f"{len(predictions)} predictions for {len(targets)} targets")
        for prediction, target in zip(predictions, targets):
            if "segm" in self.iou_types and prediction.get("masks") is None:
                raise ConfigError("iou_types includes 'segm' but the detector predicts no masks; "
                                  "evaluate Faster R-CNN / RetinaNet with iou_types=['bbox']")
            record = image_record(prediction, target)
            self._records[record.image_id] = record

    def gather(self) -> dict[int, ImageRecord]:
        """Every rank's records merged by image id, in id order (a collective under DDP)."""
        return gather_by_key(self._records)

    def results(self, records: Mapping[int, ImageRecord] | None = None) -> list[dict]:
        """The COCO results list of the (gathered) records (:func:`.results.coco_results`)."""
        from .results import coco_results
        return coco_results(self.gather() if records is None else records, self.label_to_category)

    def compute(self, records: Mapping[int, ImageRecord] | None = None) -> dict[str, float]:
        """COCO AP/AR of all records (gathered over the ranks unless ``records`` is given: a
        collective under DDP), as ``{"bbox/AP": ..., "segm/AP": ...}``; NaN where COCO says -1."""
        records = self.gather() if records is None else dict(sorted(records.items()))
        if not records:
            return {f"{t}/{name}": math.nan for t in self.iou_types for name in STAT_NAMES.values()}
        metric = MeanAveragePrecision(box_format="xyxy", iou_type=self.iou_types, backend="pycocotools",
                                      sync_on_compute=False)  # already merged: a sync would double-count
        metric.warn_on_many_detections = False
        for record in records.values():
            prediction, target = self._metric_inputs(record)
            metric.update([prediction], [target])
        with contextlib.redirect_stdout(io.StringIO()):  # COCOeval prints its summary
            values = metric.compute()
        out = {}
        for iou_type in self.iou_types:
            prefix = f"{iou_type}_" if len(self.iou_types) > 1 else ""
            for key, name in STAT_NAMES.items():
                value = float(values[prefix + key])
                out[f"{iou_type}/{name}"] = math.nan if value == -1.0 else value
        return out

    def _metric_inputs(self, record: ImageRecord) -> tuple[dict, dict]:
        """torchmetrics' inputs for one record, masks decoded to bool only now."""
        gt = record.gt
        if gt is None:
            raise DataError(f"image {record.image_id} has no ground truth; COCO AP needs annotated "
                            "images (a results file can still be written from its predictions)")
        prediction = {"boxes": record.boxes, "scores": record.scores, "labels": record.labels}
        target = {"boxes": gt["boxes"], "labels": gt["labels"], "iscrowd": gt["iscrowd"], "area": gt["area"]}
        if "segm" in self.iou_types:
            if record.masks is None or gt["masks"] is None:
                raise DataError(f"image {record.image_id} has no {'predicted' if record.masks is None else 'ground-truth'} "
                                "masks for 'segm' AP; use iou_types=['bbox'] or a dataset with masks")
            size = record.size or (0, 0)
            prediction["masks"] = decode_masks(record.masks, size)
            target["masks"] = decode_masks(gt["masks"], size)
        return prediction, target

