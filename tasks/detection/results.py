"""COCO results files and drawn detections.

:func:`coco_results` turns the evaluator's per-image records (:class:`.records.ImageRecord`) or
raw torchvision predictions into the COCO results format (https://cocodataset.org/#format-results):
one dict per detection with ``image_id``, ``category_id`` (the dataset's own ids, via
``label_to_category``), ``bbox`` ``[x, y, w, h]``, ``score`` and, for masks, ``segmentation`` as an
RLE with ``counts`` as text. Built from the records :class:`.evaluation.CocoEvaluator` scored, the
file holds exactly what was evaluated: ``COCO.loadRes`` + ``COCOeval`` on it against the dataset's
annotation file give the evaluator's numbers. For mask AP drop the ``bbox`` of each result first,
as Detectron2's evaluator does: with a ``bbox`` present ``loadRes`` takes the box area as the
detection's area, which changes the small/medium/large split.

:func:`draw_detections` / :func:`drawn_png` draw the detections above a score on the image
(torchvision's ``draw_segmentation_masks`` and ``draw_bounding_boxes``), for a look at a model's
output.
"""
from __future__ import annotations

import colorsys
import io
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from PIL import Image
from torchvision.ops import box_convert
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

from rescale_tasks.common.errors import DataError

from .records import MASK_THRESHOLD, ImageRecord, image_record

__all__ = ["coco_results", "draw_detections", "drawn_png", "category_of"]


def category_of(label_to_category: Mapping[int, int] | Sequence[int] | None):
    """A function label -> dataset category id (identity for None)."""
    if label_to_category is None:
        return int
    table = dict(label_to_category) if isinstance(label_to_category, Mapping) else dict(enumerate(label_to_category))

    def lookup(label: int) -> int:
        try:
            return int(table[int(label)])
        except KeyError:
            raise DataError(f"predicted label {int(label)} has no category in label_to_category "
                            f"(labels {sorted(table)}); build the detector with the dataset's number of classes") from None
    return lookup


def _records(items, image_ids: Sequence[int] | None) -> list[ImageRecord]:
    if isinstance(items, Mapping):
        items = list(items.values())
    items = list(items)
    if image_ids is not None:  # raw torchvision predictions
        if len(image_ids) != len(items):
            raise ValueError(f"{len(image_ids)} image ids for {len(items)} predictions")
        items = [image_record(p, image_id=int(i)) for p, i in zip(items, image_ids)]
    elif items and not isinstance(items[0], ImageRecord):
        raise ValueError("coco_results needs ImageRecords, or predictions together with image_ids")
    return sorted(items, key=lambda r: r.image_id)


def coco_results(records: Mapping[int, ImageRecord] | Iterable[ImageRecord] | Sequence[Mapping[str, torch.Tensor]],
                 label_to_category: Mapping[int, int] | Sequence[int] | None = None,
                 image_ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """COCO result dicts of ``records`` (ImageRecords, e.g. ``CocoEvaluator.gather()``) or of raw
    torchvision ``predictions`` with their ``image_ids``, in image-id order and, within an image,
    in the detector's (score) order. ``bbox`` is the xyxy box as ``[x, y, w, h]`` in the same float32
    arithmetic the evaluator scores."""
    category = category_of(label_to_category)
    out: list[dict[str, Any]] = []
    for record in _records(records, image_ids):
        boxes = box_convert(record.boxes, "xyxy", "xywh").tolist() if len(record.boxes) else []
        for k, (box, score, label) in enumerate(zip(boxes, record.scores.tolist(), record.labels.tolist())):
            result = {"image_id": record.image_id, "category_id": category(label), "bbox": box, "score": score}
            if record.masks is not None:
                rle = record.masks[k]
                counts = rle["counts"]
                result["segmentation"] = {"size": [int(s) for s in rle["size"]],
                                          "counts": counts.decode("ascii") if isinstance(counts, bytes) else counts}
            out.append(result)
    return out


def _color(label: int) -> tuple[int, int, int]:
    """A distinct, fixed colour per label (hues spaced by the golden ratio)."""
    r, g, b = colorsys.hsv_to_rgb((int(label) * 0.618033988749895) % 1.0, 0.85, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def _name(class_names: Mapping[int, str] | Sequence[str] | None, label: int) -> str:
    if class_names is None:
        return str(label)
    if isinstance(class_names, Mapping):
        return str(class_names.get(label, label))
    return str(class_names[label]) if 0 <= label < len(class_names) else str(label)


def draw_detections(image: torch.Tensor, prediction: Mapping[str, torch.Tensor],
                    class_names: Mapping[int, str] | Sequence[str] | None = None,
                    score_threshold: float = 0.5, width: int = 2, mask_alpha: float = 0.5) -> torch.Tensor:
    """``image`` (uint8 C x H x W, the original size) with the detections scoring at least
    ``score_threshold`` drawn: masks (probabilities above 0.5) as translucent colour, boxes with
    ``"name score"``; one colour per class. Returns a new uint8 C x H x W tensor on the CPU."""
    if image.dtype != torch.uint8:
        raise ValueError(f"draw_detections needs a uint8 image, got {image.dtype}")
    image = image.detach().cpu()
    keep = prediction["scores"].detach().cpu() >= score_threshold
    boxes = prediction["boxes"].detach().cpu().float()[keep]
    labels = prediction["labels"].detach().cpu()[keep].tolist()
    scores = prediction["scores"].detach().cpu()[keep].tolist()
    if not labels:
        return image.clone()
    colors = [_color(label) for label in labels]
    if prediction.get("masks") is not None:
        masks = prediction["masks"].detach().cpu()[keep]
        masks = (masks[:, 0] if masks.dim() == 4 else masks) > MASK_THRESHOLD
        image = draw_segmentation_masks(image, masks, alpha=mask_alpha, colors=colors)
    text = [f"{_name(class_names, label)} {score:.2f}" for label, score in zip(labels, scores)]
    return draw_bounding_boxes(image, boxes, labels=text, colors=colors, width=width)


def drawn_png(image: torch.Tensor, prediction: Mapping[str, torch.Tensor],
              class_names: Mapping[int, str] | Sequence[str] | None = None, score_threshold: float = 0.5) -> bytes:
    """:func:`draw_detections` as the bytes of a PNG file."""
    drawn = draw_detections(image, prediction, class_names, score_threshold)
    array = np.ascontiguousarray(drawn.permute(1, 2, 0).numpy())
    picture = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    out = io.BytesIO()
    picture.save(out, format="PNG")
    return out.getvalue()
