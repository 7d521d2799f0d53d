"""COCO box and mask AP of a detector's predictions, by the official COCO evaluation.

The scores are pycocotools' ``COCOeval`` (Lin et al. 2014; the protocol Detectron2 and torchvision
report) run exactly as on a results file: ``COCOeval(gt, gt.loadRes(results), iou_type)`` with
``gt`` the data set's own annotation json (pycocotools' ``COCO`` index of it, as the data set loaded
it) and ``results`` the records turned into the COCO results format (:mod:`.results`), so the logged
numbers are those any COCO tool gives for the written ``coco_results.*.json`` against that json
(ground truth rebuilt from the training targets, as torchmetrics' ``MeanAveragePrecision`` needs it,
differs in the fourth decimal, ``docs/design.md``, "Detection": degenerate boxes the data set drops,
boxes clipped to the image, crowd regions and areas re-encoded). Mask AP scores the results without
their boxes, as Detectron2 does (with a ``bbox``, ``loadRes`` takes the box area for the mask's).
The evaluation covers the images that were evaluated (``params.imgIds``: all of them after a full
pass; a ``limit_val_batches`` pass scores its images only).

What this class adds around it:

* Compact per-image records (:class:`~.records.ImageRecord`: boxes, scores, labels and RLE masks on
  the CPU), so 5000 validation images never hold dense masks. The ground truth stays in the json.
* DDP: a padded ``DistributedSampler`` sends a few images to two ranks. :meth:`CocoEvaluator.compute`
  merges the records by image id over the ranks (``gather_by_key``: a duplicate counts once), then
  every rank scores them in image-id order. The result equals a one-process evaluation, on every rank.
* The same records make the results JSON (:mod:`.results`), so a written file holds exactly what
  was scored.

Returned keys (floats, COCO's fractions, not percent): ``{iou}/AP`` (mean over IoU 0.50:0.95),
``{iou}/AP50``, ``{iou}/AP75``, ``{iou}/APs``, ``{iou}/APm``, ``{iou}/APl``, ``{iou}/AR1``,
``{iou}/AR10``, ``{iou}/AR100``, ``{iou}/ARs``, ``{iou}/ARm``, ``{iou}/ARl`` for ``iou`` in
``bbox``, ``segm``: ``COCOeval.stats`` in its order. COCO's -1 ("no ground truth in that area
range", e.g. no small objects) becomes NaN, so it is never averaged or plotted as a score.

Deviation from Detectron2's ``COCOEvaluator``: an evaluation on several ranks is computed by every
rank instead of rank 0 alone.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
import os
from typing import Any, Mapping, Sequence

import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.system import gather_by_key

from .coco import fill_boxes
from .records import ImageRecord, image_record
from .results import coco_results

__all__ = ["CocoEvaluator", "IOU_TYPES", "STAT_NAMES", "coco_eval", "load_ground_truth"]

IOU_TYPES = ("bbox", "segm")
#: COCOeval's 12 summary numbers (``stats``, in order): the names this module gives them
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
def load_ground_truth(annotations: "COCO | str | os.PathLike") -> COCO:
    """pycocotools' index of an annotation json (a path), or the given ``COCO`` as it is."""
    if isinstance(annotations, COCO):
        return annotations
    path = os.fspath(annotations)
    if not os.path.isfile(path):
        raise DataError(f"COCO annotation file not found: {path}; the evaluation scores against the data "
                        "set's own json")
    with contextlib.redirect_stdout(io.StringIO()):  # COCO() prints its progress
        coco = COCO(path)
    # a segmentation without a bbox: scored with its mask's box, as the data set trains on (and says)
    fill_boxes(coco.dataset.get("annotations", []),
               {i: (img["width"], img["height"]) for i, img in coco.imgs.items()})
    return coco


def coco_eval(ground_truth: COCO, results: list[dict], iou_type: str,
              image_ids: Sequence[int] | None = None) -> list[float]:
    """``COCOeval(gt, gt.loadRes(results), iou_type).stats`` over ``image_ids`` (None: every image of
    the json), -1 as NaN. ``segm`` scores the results without their boxes (Detectron2's rule).
    ``loadRes`` refuses an empty list; no detections score as an empty results set does."""
    # fresh dicts: loadRes and COCOeval add keys (area, id, bbox) to each result, never change a value in place
    results = [{k: v for k, v in r.items() if not (iou_type == "segm" and k == "bbox")} for r in results]
    with contextlib.redirect_stdout(io.StringIO()):  # loadRes and summarize print
        if results:
            detections = ground_truth.loadRes(results)
        else:
            detections = COCO()
            detections.dataset = {"images": list(ground_truth.dataset["images"]), "annotations": [],
                                  "categories": copy.deepcopy(ground_truth.dataset["categories"])}
            detections.createIndex()
        evaluation = COCOeval(ground_truth, detections, iouType=iou_type)
        if image_ids is not None:
            evaluation.params.imgIds = sorted(int(i) for i in image_ids)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return [math.nan if value == -1 else float(value) for value in evaluation.stats]


class CocoEvaluator:
    """COCO AP of a detector over an evaluation set, per image id (see the module docstring).

    Args:
        ground_truth: the evaluation set's annotation json (a path) or its pycocotools ``COCO``
            (:attr:`~.coco.CocoDetection.coco`): the ground truth every score is computed against.
        iou_types: ``("bbox", "segm")`` for Mask R-CNN, ``("bbox",)`` for box-only detectors.
        label_to_category: the model's contiguous label -> the dataset's category id (a mapping or a
            sequence indexed by label); None: identity.
    """

    def __init__(self, ground_truth: "COCO | str | os.PathLike", iou_types: Sequence[str] = IOU_TYPES,
                 label_to_category: Mapping[int, int] | Sequence[int] | None = None) -> None:
        iou_types = tuple(iou_types)
        if not iou_types or any(t not in IOU_TYPES for t in iou_types) or len(set(iou_types)) != len(iou_types):
            raise ConfigError(f"iou_types must be 'bbox' and/or 'segm', got {list(iou_types)}")
        self.ground_truth = load_ground_truth(ground_truth)
        if "segm" in iou_types:
            bare = next((a["id"] for a in self.ground_truth.dataset.get("annotations", [])
                         if "segmentation" not in a), None)
            if bare is not None:
                raise DataError(f"annotation id {bare} of the evaluation json has no 'segmentation': mask AP "
                                "needs masks in the ground truth; evaluate with iou_types=['bbox']")
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
        targets (their ``image_id``) of the same images, in the same order."""
        if len(predictions) != len(targets):
            raise ValueError(f"{len(predictions)} predictions for {len(targets)} targets")
        for prediction, target in zip(predictions, targets):
            if "segm" in self.iou_types and prediction.get("masks") is None:
                raise ConfigError("iou_types includes 'segm' but the detector predicts no masks; "
                                  "evaluate Faster R-CNN / RetinaNet with iou_types=['bbox']")
            record = image_record(prediction, target)
            if record.image_id not in self.ground_truth.imgs:
                raise DataError(f"image id {record.image_id} is not in the evaluation's annotation json; "
                                "evaluate a data set against its own json")
            self._records[record.image_id] = record

    def gather(self) -> dict[int, ImageRecord]:
        """Every rank's records merged by image id, in id order (a collective under DDP)."""
        return gather_by_key(self._records)

    def results(self, records: Mapping[int, ImageRecord] | None = None) -> list[dict]:
        """The COCO results list of the (gathered) records (:func:`.results.coco_results`)."""
        return coco_results(self.gather() if records is None else records, self.label_to_category)

    def compute(self, records: Mapping[int, ImageRecord] | None = None,
                results: list[dict] | None = None) -> dict[str, float]:
        """COCO AP/AR of all records (gathered over the ranks unless ``records`` is given: a
        collective under DDP), as ``{"bbox/AP": ..., "segm/AP": ...}``; NaN where COCO says -1.
        ``results``: :meth:`results` of those records when the caller has it already."""
        records = self.gather() if records is None else dict(sorted(records.items()))
        if not records:
            return {f"{t}/{name}": math.nan for t in self.iou_types for name in STAT_NAMES}
        results = self.results(records) if results is None else results
        out = {}
        for iou_type in self.iou_types:
            stats = coco_eval(self.ground_truth, results, iou_type, image_ids=list(records))
            out.update({f"{iou_type}/{name}": value for name, value in zip(STAT_NAMES, stats)})
        return out
