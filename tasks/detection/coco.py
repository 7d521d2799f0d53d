"""A COCO-format detection / instance-segmentation data set (any ``instances_*.json`` + image folder).

The json is read once, checked (every problem a one-line
:class:`~rescale_tasks.common.errors.DataError` naming the file and the fix) and indexed with
pycocotools' ``COCO`` (kept as :attr:`CocoDetection.coco` for the evaluation). Conventions follow
torchvision's detection models and references (``references/detection/coco_utils.py``) and
Detectron2's COCO loader:

- category ids (sorted) become contiguous labels ``1..K``; 0 is the background, so
  ``num_classes = K + 1`` (:attr:`~CocoDetection.label_to_category` maps back for results);
- boxes: ``bbox`` ``[x, y, w, h]`` -> ``[x1, y1, x2, y2]`` clipped to the image; boxes narrower or
  lower than 1 px after clipping are dropped at construction and counted
  (:attr:`~CocoDetection.dropped_degenerate`), the same rule ``SanitizeBoundingBoxes(min_size=1)``
  applies after the transforms;
- masks: polygons, compressed and uncompressed RLE decoded with ``pycocotools.mask`` to uint8
  ``[N, H, W]`` at the image size, in ``__getitem__`` (never held for the whole set). Segmentations
  that cannot form a mask (:func:`mask_problem`: a polygon part empty, under 3 points, with an odd
  number of coordinates or coordinates far outside the image, or no part covering a pixel; an RLE whose ``size`` is not the image's or
  whose runs do not add up to it: pycocotools' decoding fails on it and its mask IoU never ends) are
  dropped with their annotation at construction and counted
  (:attr:`~CocoDetection.dropped_unusable_masks`; unusable parts beside usable ones in
  :attr:`~CocoDetection.partly_unusable_masks`), like degenerate boxes; in an evaluation set
  (``evaluation=True``) a malformed one stops the run at once with a one-line error naming the annotation
  (the COCO evaluation scores against the json as it is and crashes on it), while a zero-area one is kept;
- ``iscrowd`` annotations stay in the target flagged ``iscrowd=1`` (the detector's loss excludes
  them; the COCO evaluation reads its own ground truth from :attr:`~CocoDetection.coco`); ``iscrowd``
  is the number 0 or 1 (pycocotools reads it with ``int()`` and as a truth value, which disagree on
  text such as ``"0"``), 0 where absent, except in an evaluation set, where pycocotools needs it;
- ``area`` is the annotation's own field (what COCO evaluation buckets by), not recomputed, and is
  not rescaled by the transforms; the box's width x height where absent, except in an evaluation
  set, where pycocotools reads it on every annotation (a ``KeyError`` once the validation has run);
- annotation ids are distinct in a json (as in jsons merged without renumbering, they are refused):
  pycocotools indexes annotations by id, so a repeated id would give one annotation's mask to the
  other in training and score a copy of it in place of the other in the evaluation; in an evaluation
  set they are non-zero integers (``COCOeval`` records a match as the matched annotation's id, 0
  meaning none: a detection matching annotation 0 counted as a false positive; text that is no
  number crashes it).

Images are decoded to 8-bit RGB whatever their mode (:func:`~rescale_tasks.common.data.open_rgb`:
16-bit and float images scaled, transparency over white). An unreadable file (missing, not an image,
or not the size the json says) raises :class:`~rescale_tasks.common.data.CorruptImageError`,
or with ``skip_corrupt`` yields ``None`` (dropped by the collate function), is logged once and is
counted in a shared-memory tensor visible across DataLoader workers.

EXIF orientation: the json's ``width``/``height`` say which pixels its boxes and masks refer to.
An image whose size once turned by its EXIF orientation is the json's is turned (what annotation
tools and viewers show); one whose stored pixels alone have the json's size (a quarter-turn
orientation, annotated by a tool that ignores the tag) is kept as stored, so its annotations still
fit, and counted like unreadable files (:attr:`~CocoDetection.kept_as_stored`;
:meth:`~CocoDetection.orientation_report` is the warning line the data module logs when a stage ends).
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as TF

from rescale_tasks.common.data import (DECODE_ERRORS, CorruptImageError, found_path, open_rgb, orientation,
                                       oriented_size, say_large_image, unreadable_image)
from rescale_tasks.common.errors import DataError

__all__ = ["CocoDetection", "decode_masks", "load_coco_json", "category_labels", "mask_problem", "fill_boxes",
           "box_from_segmentation"]

log = logging.getLogger(__name__)

_ANN_KEYS = ("id", "image_id", "category_id", "bbox")
_IMAGE_KEYS = ("id", "file_name", "width", "height")


def load_coco_json(path: str | os.PathLike, key: str = "annotation_file",
                   image_info: bool = False) -> dict[str, Any]:
    """The parsed json at ``path``, checked to be a dict with ``images``, ``annotations`` and
    ``categories`` lists; ``key`` names the setting in the error messages. ``image_info``: an
    image-info json without ``annotations`` (COCO's ``image_info_test-dev2017.json``, what one
    predicts on) is read as one with an empty list."""
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        raise DataError(f"COCO annotation file not found: {path} ({key}). Point {key} at an "
                        "instances_*.json file in COCO format.")
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataError(f"Cannot read COCO annotation file {path} ({key}) as JSON "
                        f"({type(exc).__name__}: {exc}). Re-download or re-export it.") from None
    if not isinstance(data, dict):
        raise DataError(f"COCO annotation file {path} ({key}) holds a JSON {type(data).__name__}, not an "
                        "object with 'images', 'annotations' and 'categories'. Point it at a COCO json.")
    if image_info and "annotations" not in data:
        data["annotations"] = []
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(data.get(k), list)]
    if image_info and missing:  # read with --data.predict_annotations already
        raise DataError(f"COCO json {path} ({key}) has no {' / '.join(repr(k) for k in missing)} list; a json to "
                        "predict on needs 'images' and the 'categories' the results name by id (COCO test-dev's "
                        "image info lists them). Add the 'categories' list of the json the model was trained on.")
    if missing:
        raise DataError(f"COCO annotation file {path} ({key}) has no {' / '.join(repr(k) for k in missing)} "
                        "list; a COCO detection json needs 'images', 'annotations' and 'categories' "
                        "(an image-info-only json cannot be used for training or evaluation: predict on it "
                        "with --data.predict_annotations).")
    return data


def _is_id(value: Any) -> bool:
    """Whether ``value`` is a json integer: pycocotools' evaluation matches the detections' integer
    image and category ids against the json's as they are (a text id ``"3"`` matches nothing)."""
    return isinstance(value, int) and not isinstance(value, bool)


def category_labels(categories: list[dict], where: str) -> tuple[dict[int, int], list[str]]:
    """``category id -> contiguous label 1..K`` (ids sorted) and the names by label (``[0]`` is
    ``"__background__"``)."""
    if not all(isinstance(c, dict) and "id" in c for c in categories):
        raise DataError(f"COCO annotation file {where}: every entry of 'categories' needs an integer "
                        "'id' (and a 'name'). Fix the json.")
    bad = [c["id"] for c in categories if not _is_id(c["id"])]
    if bad:
        more = f" ({len(bad) - 1} more alike)" if len(bad) > 1 else ""
        raise DataError(f"COCO annotation file {where}: category id {repr(bad[0])[:20]} is not an integer{more}; "
                        "the COCO evaluation compares the detections' integer category ids with the json's as "
                        "they are and would match none. Write the ids as json integers (3, not \"3\").")
    by_id = {c["id"]: str(c.get("name", c["id"])) for c in categories}
    if len(by_id) != len(categories):
        raise DataError(f"COCO annotation file {where}: duplicate category ids in 'categories'. Fix the json.")
    ids = sorted(by_id)
    return {cid: label for label, cid in enumerate(ids, start=1)}, ["__background__"] + [by_id[i] for i in ids]


def decode_masks(segmentations: list, height: int, width: int, checked: bool = False) -> torch.Tensor:
    """COCO ``segmentation`` entries (polygon lists, uncompressed RLE with ``counts`` a list,
    compressed RLE with ``counts`` a string) -> uint8 ``[N, H, W]``. ``checked``: the polygons are the
    usable parts already (:meth:`CocoDetection.usable_segmentation`), not checked again at every load."""
    if not segmentations:
        return torch.zeros((0, height, width), dtype=torch.uint8)
    masks = mask_utils.decode([_rle(seg, height, width, checked) for seg in segmentations])  # [H, W, N], Fortran order
    return torch.from_numpy(np.ascontiguousarray(masks.transpose(2, 0, 1)))


def _rle(seg: Any, height: int, width: int, checked: bool = False) -> dict:
    """pycocotools' RLE of one object's ``segmentation``."""
    if isinstance(seg, list):  # polygons of one object: rasterise each, then union
        # the well-formed parts only (_part_problem): fewer than 3 points is no polygon (pycocotools
        # would read 4 numbers as a box), and a coordinate that is no finite number or far outside
        # the image made pycocotools allocate without bound (NaN, infinity, 1e8) or stop (text)
        polygons = seg if checked else [p for p in seg if _part_problem(p, height, width) is None]
        return (mask_utils.merge(mask_utils.frPyObjects(polygons, height, width)) if polygons else
                mask_utils.encode(np.zeros((height, width), dtype=np.uint8, order="F")))
    if isinstance(seg.get("counts"), list):  # uncompressed RLE (crowd regions)
        return mask_utils.frPyObjects(seg, height, width)
    return seg  # compressed RLE, decoded as it is


def box_from_segmentation(segmentation: Any, height: int, width: int) -> list[float]:
    """The ``[x, y, width, height]`` box around a usable ``segmentation`` (its well-formed parts), as
    pycocotools' ``toBbox`` computes it for a mask."""
    return [float(v) for v in mask_utils.toBbox(_rle(segmentation, height, width))]


def fill_boxes(annotations: list, sizes: dict[int, tuple[int, int]]) -> list:
    """Give every annotation that has a usable ``segmentation`` but no ``bbox`` the box of its mask
    (in place); ``sizes``: image id -> (width, height). The ids of the annotations given one."""
    filled = []
    for ann in annotations:
        if isinstance(ann, dict) and "bbox" not in ann and "segmentation" in ann and ann.get("image_id") in sizes:
            width, height = sizes[ann["image_id"]]
            if mask_problem(ann["segmentation"], height, width)[1]:
                ann["bbox"] = box_from_segmentation(ann["segmentation"], height, width)
                filled.append(ann.get("id"))
    return filled


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (json's ``NaN`` and ``Infinity`` are read as floats)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


#: a segmentation written as one polygon's coordinates (``[x1, y1, ...]``) instead of a list of
#: polygons (``[[x1, y1, ...]]``), as some exporters write it: pycocotools reads neither mask nor score of it
FLAT_POLYGON = "a flat list of coordinates instead of a list of polygons ([[x1, y1, x2, y2, ...]])"


#: how far from its image a polygon may reach, in times the image's longer side: pycocotools rasterises a
#: polygon point by point along its edges, so coordinates in another unit (1e8) made it allocate
#: without bound or crash (a segmentation fault) in training and in the COCO evaluation
FAR_OUTSIDE = 16


def _part_problem(part: Any, height: int, width: int) -> str | None:
    """Why one polygon (``[x1, y1, x2, y2, ...]``) of a ``height`` x ``width`` image is malformed, or None."""
    if not isinstance(part, list) or not part:
        return "an empty polygon"
    if len(part) < 6:  # pycocotools reads four numbers as a box and fails on fewer
        return "a polygon of fewer than 3 points"
    if len(part) % 2:
        return "a polygon with an odd number of coordinates"
    if not all(_finite(v) for v in part):
        return "a polygon with coordinates that are not finite numbers"
    limit = FAR_OUTSIDE * max(height, width)
    if any(abs(v) > limit for v in part):
        return f"a polygon reaching beyond {limit} px, far outside its {height}x{width} image (in another unit?)"
    return None


#: a well-formed polygon that covers no pixel: dropped from training targets, but scorable (the COCO
#: evaluation rasterises it to an empty mask), so an evaluation json keeps it
ZERO_AREA = "polygons of zero area"


def _covers_a_pixel(part: list, height: int, width: int) -> bool:
    """Whether a well-formed polygon rasterises to at least one pixel (the shoelace area decides, and
    pycocotools' rasterisation where that area is under one pixel)."""
    xs, ys = part[0::2], part[1::2]
    twice_area = abs(sum(x0 * y1 - x1 * y0
                         for x0, y0, x1, y1 in zip(xs, ys, xs[1:] + xs[:1], ys[1:] + ys[:1])))
    if twice_area >= 2:
        return True
    return bool(mask_utils.area(mask_utils.frPyObjects([part], height, width))[0] > 0)


def _rle_problem(rle: dict, height: int, width: int) -> str | None:
    """Why an RLE (``{"size": [height, width], "counts": ...}``) cannot be the mask of an object of a
    ``height`` x ``width`` image, or None. pycocotools decodes an RLE at its own size."""
    size, counts = rle.get("size"), rle.get("counts")
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) for v in size)
            and isinstance(counts, (str, list))):
        return "an RLE without a 'size' [height, width] and 'counts'"
    if size != [height, width]:
        return f"an RLE of {size[0]}x{size[1]} pixels (height x width) on an image of {height}x{width}"
    runs = _rle_runs(counts)
    if runs is None or sum(runs) != height * width:
        return (f"an RLE whose runs do not cover its {height}x{width} pixels (its 'counts' cut short or "
                "damaged)")
    return None


def _rle_runs(counts: str | list) -> list[int] | None:
    """The run lengths of an RLE's ``counts`` (a list of numbers, or COCO's compressed text as
    pycocotools' ``rleFrString`` reads it: 5 bits a character, differences to the run two before from
    the third run on, 32-bit unsigned); None where a run is no count (negative or not a whole number).
    pycocotools reads runs that do not add up to the image as they are: its decoding then fails and
    its mask IoU (COCOeval) never ends."""
    if isinstance(counts, list):  # whole numbers, as pycocotools reads them (5.0 is 5)
        ok = all(_finite(c) and not isinstance(c, bool) and c >= 0 and float(c).is_integer() for c in counts)
        return [int(c) for c in counts] if ok else None
    runs: list[int] = []
    p, text = 0, counts.encode("latin-1", "replace")
    while p < len(text):
        x = k = 0
        more = True
        while more:
            if p == len(text):
                return None  # a run cut off inside its characters
            c = text[p] - 48
            x |= (c & 0x1F) << 5 * k
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << 5 * k
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x % 2 ** 32)
    return runs


def mask_problem(segmentation: Any, height: int, width: int) -> tuple[str | None, bool]:
    """``(problem, usable)`` of one annotation's ``segmentation``: why (part of) it cannot form a
    mask (None: nothing wrong), and whether a mask is left (a well-formed part covering a pixel).
    An RLE dict is usable when it has the image's size; a list holds the polygons of the object's parts."""
    if isinstance(segmentation, dict):
        problem = _rle_problem(segmentation, height, width)
        return problem, problem is None
    if not isinstance(segmentation, list) or not segmentation:
        return "no polygon", False
    if all(isinstance(part, (int, float)) for part in segmentation):
        return FLAT_POLYGON, False
    problem, usable = None, False
    for part in segmentation:
        reason = _part_problem(part, height, width)
        if reason is not None:
            problem = problem or reason
        elif not usable:
            usable = _covers_a_pixel(part, height, width)
    if problem is None and not usable:
        problem = ZERO_AREA
    return problem, usable


def _quiet_coco(data: dict) -> COCO:
    """pycocotools' index over an already-parsed json (``COCO(path)`` would read it again and print)."""
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


class CocoDetection(Dataset):
    """Images of a COCO json with their boxes, labels and (optionally) masks.

    Args:
        annotation_file: the COCO json (``images``, ``annotations``, ``categories``).
        image_folder: the folder the images' ``file_name`` are relative to.
        transforms: ``transforms(image, target) -> (image, target)`` (:mod:`.transforms`).
        keep_empty: keep images without non-crowd boxes (evaluation) or drop them (training,
            as Detectron2 does).
        skip_corrupt: yield ``None`` for unreadable images instead of raising.
        masks: decode instance masks into the targets (Mask R-CNN); ``segmentation`` is then
            required on every annotation.
        evaluation: an evaluation set: a segmentation that cannot form a mask raises a DataError at
            construction instead of being dropped (with ``masks``).
        image_info: a set to predict on: a json without ``annotations`` (COCO test-dev's image
            info) is one whose images have none.
        keys: how the settings are called in error messages (``annotation_file``/``image_folder``
            by default; the DataModule passes its ``data.*`` keys).

    ``dataset[i]`` is ``(image, target)``: ``image`` a uint8 ``tv_tensors.Image`` before the
    transforms; ``target`` a dict with ``boxes`` (``tv_tensors.BoundingBoxes`` XYXY),
    ``labels`` int64, ``masks`` (``tv_tensors.Mask`` uint8 ``[N, H, W]``, with ``masks``),
    ``iscrowd`` int64, ``area`` float32 and ``image_id`` (the json's id).
    """

    def __init__(self, annotation_file: str | os.PathLike, image_folder: str | os.PathLike,
                 transforms: Callable | None = None, keep_empty: bool = True, skip_corrupt: bool = False,
                 masks: bool = True, keys: tuple[str, str] = ("annotation_file", "image_folder"),
                 evaluation: bool = False, image_info: bool = False) -> None:
        ann_key, folder_key = keys
        self.annotation_file = Path(os.path.expanduser(str(annotation_file)))
        data = load_coco_json(self.annotation_file, ann_key, image_info=image_info)
        folder = Path(os.path.expanduser(str(image_folder)))
        if not folder.is_dir():
            raise DataError(f"COCO image folder not found: {folder} ({folder_key}). Point {folder_key} at "
                            f"the folder holding the images of {self.annotation_file}.")
        self.image_folder = folder
        self.transforms, self.keep_empty, self.skip_corrupt, self.with_masks = (
            transforms, keep_empty, skip_corrupt, masks)
        self.evaluation = evaluation
        where = f"{self.annotation_file} ({ann_key})"
        self.category_to_label, self.class_names = category_labels(data["categories"], where)
        self.label_to_category = {label: cid for cid, label in self.category_to_label.items()}
        self.num_classes = len(self.class_names)

        sizes = self._check_images(data["images"], where)
        per_image = self._index_annotations(data["annotations"], sizes, where)
        self.coco = _quiet_coco(data)
        kept = [i for i in sizes if keep_empty or not per_image[i].all_crowd]
        self.image_ids: list[int] = kept
        self._objects = [per_image[i] for i in kept]
        self.aspect_ratios = np.array([sizes[i][0] / sizes[i][1] for i in kept], dtype=np.float64)
        self.corrupt = torch.zeros(len(kept), dtype=torch.bool).share_memory_()
        # images kept as stored although their EXIF orientation would turn them (see the module docstring)
        self.as_stored = torch.zeros(len(kept), dtype=torch.bool).share_memory_()
        self.large = torch.zeros(len(kept), dtype=torch.bool).share_memory_()  # said over Pillow's warning limit
        self._found_paths: dict[int, str] = {}  # index -> its file, where file_name writes it otherwise (found_path)
        self._check_files(folder_key)
        if self.boxes_from_masks:
            log.warning("%s: %d annotation(s) have a 'segmentation' but no 'bbox' (e.g. annotation id %s): their "
                        "boxes are computed from their masks (pycocotools' toBbox), in training and in the COCO "
                        "evaluation; write each box into the json ([x, y, width, height]) to use boxes of your own",
                        self.annotation_file, len(self.boxes_from_masks), self.boxes_from_masks[0])
        if self.dropped_degenerate:
            scored = ("; the COCO evaluation still scores them, from its json, as objects to find (a box "
                      "that thin is rarely matched): fix or remove them there" if evaluation else "")
            log.warning("%s: dropped %d degenerate box(es) (under 1 px wide or high after clipping to the "
                        "image) from the targets%s", self.annotation_file, self.dropped_degenerate, scored)
        if self.dropped_unusable_masks or self.partly_unusable_masks:
            log.warning("%s: dropped %d annotation(s) whose segmentation cannot form a mask and left out the "
                        "unusable polygons of %d more (empty, under 3 points, an odd number of coordinates, far outside, "
                        "no pixel covered, or an RLE not of the image's size or not covering it), e.g. annotation "
                        "id %s: %s",
                        self.annotation_file, self.dropped_unusable_masks, self.partly_unusable_masks,
                        *self.first_unusable_mask)

    # --- construction -----------------------------------------------------------------------
    @staticmethod
    def _check_images(images: list, where: str) -> dict[int, tuple[int, int]]:
        """``image id -> (width, height)`` in json order."""
        sizes: dict[int, tuple[int, int]] = {}
        for image in images:
            if not isinstance(image, dict) or any(k not in image for k in _IMAGE_KEYS):
                raise DataError(f"COCO annotation file {where}: an entry of 'images' lacks one of "
                                f"{', '.join(_IMAGE_KEYS)} ({str(image)[:80]}). Fix the json.")
            if not _is_id(image["id"]):
                raise DataError(f"COCO annotation file {where}: image id {repr(image['id'])[:20]} of "
                                f"{str(image['file_name'])[:80]} is not an integer; the COCO evaluation compares "
                                "the detections' integer image ids with the json's as they are and would match "
                                "none. Write the image ids (and the annotations' image_id) as json integers.")
            if not (_is_id(image["width"]) and _is_id(image["height"]) and image["width"] > 0 and image["height"] > 0):
                raise DataError(f"COCO annotation file {where}: image id {image['id']} has size "
                                f"{image['width']!r}x{image['height']!r}, expected positive integers. Fix its "
                                "width/height in the json.")
            if image["id"] in sizes:
                raise DataError(f"COCO annotation file {where}: image id {image['id']} appears twice in "
                                "'images'. Fix the json.")
            sizes[image["id"]] = (int(image["width"]), int(image["height"]))
        return sizes

    def _index_annotations(self, annotations: list, sizes: dict[int, tuple[int, int]],
                           where: str) -> dict[int, _Objects]:
        """Per image, its annotations with usable boxes (and masks); degenerate boxes are counted in
        :attr:`dropped_degenerate`, segmentations that cannot form a mask in :attr:`dropped_unusable_masks`
        (or refused in an evaluation set), and both left out."""
        rows: dict[int, list] = {i: [] for i in sizes}
        self.boxes_from_masks = fill_boxes(annotations, sizes)  # a segmentation but no bbox: its mask's box
        self.usable_parts: dict[Any, list] = {}  # annotation id -> its usable polygons, where some are not
        self.dropped_degenerate = self.dropped_unusable_masks = self.partly_unusable_masks = 0
        self.first_unusable_mask: tuple[Any, str] | None = None  # (annotation id, problem), for the messages
        self.first_degenerate: tuple[Any, list] | None = None  # (annotation id, bbox), for the messages
        unscorable: list[tuple[Any, Any, str]] = []  # (annotation id, image id, problem), evaluation sets
        image_of: dict[Any, Any] = {}  # annotation id -> its image id, for the duplicates
        for ann in annotations:
            if isinstance(ann, dict) and [k for k in _ANN_KEYS if k not in ann] == ["bbox"]:
                raise DataError(_no_box(ann, sizes, where))
            if not isinstance(ann, dict) or any(k not in ann for k in _ANN_KEYS):
                raise DataError(f"COCO annotation file {where}: an annotation lacks one of "
                                f"{', '.join(_ANN_KEYS)} ({str(ann)[:80]}). Fix the json.")
            aid, image_id = ann["id"], ann["image_id"]
            bad = next((k for k in ("image_id", "category_id") if not _is_id(ann[k])), None)
            if bad is not None:
                raise DataError(f"COCO annotation file {where}: annotation id {aid} has {bad} "
                                f"{repr(ann[bad])[:20]}, not an integer; the COCO evaluation compares ids as they "
                                f"are and would leave it out. Write its {bad} as a json integer.")
            if not isinstance(aid, (int, str)) or isinstance(aid, bool):
                raise DataError(f"COCO annotation file {where}: an annotation of image id {image_id} has id "
                                f"{repr(aid)[:20]}, expected an integer. Fix the json.")
            if self.evaluation and not (_is_id(aid) and aid != 0):
                raise DataError(f"COCO annotation file {where}: annotation id {repr(aid)[:20]} of image id {image_id} "
                                "is not a non-zero integer: the COCO evaluation records each match as the matched "
                                "annotation's id and takes 0 for no match (a perfect detection of it would count as a "
                                "false positive; a text id that is no number stops it). Number the annotations from 1.")
            if aid in image_of:  # pycocotools indexes annotations by id: one of the two would stand for both
                raise DataError(f"COCO annotation file {where}: annotation id {aid} appears twice in 'annotations' "
                                f"(image ids {image_of[aid]} and {image_id}), as in jsons merged without renumbering; "
                                "pycocotools keeps one annotation per id, so the other's mask and the evaluation's "
                                "ground truth would be a copy of it. Give every annotation its own id.")
            image_of[aid] = image_id
            if image_id not in rows:
                raise DataError(f"COCO annotation file {where}: annotation id {aid} refers to image id "
                                f"{image_id}, which is not in 'images'. Fix or remove the annotation.")
            if ann["category_id"] not in self.category_to_label:
                raise DataError(f"COCO annotation file {where}: annotation id {aid} has category id "
                                f"{ann['category_id']}, which is not in 'categories'. Fix or remove the "
                                "annotation.")
            if self.with_masks and "segmentation" not in ann:
                raise DataError(f"COCO annotation file {where}: annotation id {aid} has no 'segmentation'. "
                                "Add masks to the json or set --data.masks false (box-only detectors).")
            bbox = ann["bbox"]
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(_finite(v) for v in bbox)):
                raise DataError(f"COCO annotation file {where}: annotation id {aid} has bbox {str(bbox)[:40]}, "
                                "expected [x, y, width, height] of finite numbers. Fix the json.")
            crowd = ann.get("iscrowd", 0)
            if crowd not in (0, 1):  # pycocotools reads it both with int() and as a truth value ("0": 0, crowd)
                raise DataError(f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has "
                                f"iscrowd {repr(crowd)[:20]}, expected the number 0 or 1 (the COCO evaluation "
                                "ignores an object whose iscrowd is text, as it ignores crowd regions). Fix the json.")
            if self.evaluation and "iscrowd" not in ann:
                raise DataError(f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has no "
                                "'iscrowd', which the COCO evaluation reads on every annotation of this json. Add "
                                "\"iscrowd\": 0 (1 for crowd regions) to its annotations.")
            # the evaluation reads the area of every annotation (degenerate boxes included)
            if self.evaluation and "area" not in ann:
                raise DataError(f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has no "
                                "'area', which the COCO evaluation reads on every annotation of this json to sort "
                                "objects into small, medium and large. Add each annotation's \"area\" (its mask's "
                                "pixel count, or the box's width x height).")
            area = ann.get("area", bbox[2] * bbox[3])
            if not _finite(area) or isinstance(area, bool):
                raise DataError(f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has area "
                                f"{repr(area)[:20]}, expected a finite number (the COCO evaluation buckets objects "
                                "by it). Fix the json.")
            area = float(area)
            width, height = sizes[image_id]
            problem, usable = (mask_problem(ann["segmentation"], height, width) if self.with_masks
                               else (None, True))
            if problem not in (None, ZERO_AREA) and self.evaluation:  # the evaluation reads every annotation
                unscorable.append((aid, image_id, problem))
                continue
            x, y, w, h = bbox
            box = (min(max(x, 0.0), width), min(max(y, 0.0), height),
                   min(max(x + w, 0.0), width), min(max(y + h, 0.0), height))
            if box[2] - box[0] < 1 or box[3] - box[1] < 1:  # SanitizeBoundingBoxes(min_size=1)'s rule
                self.dropped_degenerate += 1
                self.first_degenerate = self.first_degenerate or (aid, bbox)
                continue
            if problem is not None and self.first_unusable_mask is None:
                self.first_unusable_mask = (aid, problem)
            if not usable:
                self.dropped_unusable_masks += 1
                continue
            self.partly_unusable_masks += problem is not None
            if problem is not None and isinstance(ann["segmentation"], list):  # checked here once, not at every load
                self.usable_parts[aid] = [p for p in ann["segmentation"] if _part_problem(p, height, width) is None]
            rows[image_id].append((aid, box, self.category_to_label[ann["category_id"]],
                                   int(crowd), area))
        if unscorable:
            aid, image_id, problem = unscorable[0]
            more = f" ({len(unscorable) - 1} more annotation(s) alike)" if len(unscorable) > 1 else ""
            raise DataError(f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has "
                            f"{problem}, which cannot form a mask{more}; the COCO mask evaluation scores "
                            "against every annotation of this json. Fix its 'segmentation' (polygons of 3 or "
                            "more x, y points covering a pixel, or an RLE of the image's height x width) or remove "
                            "the annotation; a box-only detector can evaluate with --data.masks false.")
        return {i: _Objects.of(r) for i, r in rows.items()}

    def _check_files(self, folder_key: str) -> None:
        """Every image file must exist (one ``stat`` each: ~1 s for COCO train); with
        ``skip_corrupt`` the missing ones are only reported here and skipped when read. A ``file_name``
        written on Windows (``images\\0001.jpg``, as annotation tools running there export it) names
        the file its ``\\`` read as ``/`` gives, where only that one exists; so does one written in the other
        Unicode form of its accents than the file (a folder copied through macOS holds them decomposed)."""
        missing = [i for i in range(len(self)) if not os.path.isfile(self.image_path(i))]
        for i in missing:
            path = found_path(self.image_folder, str(self.image_info(i)["file_name"]))
            if path is not None:
                self._found_paths[i] = path
        missing = [self.image_path(i) for i in missing if i not in self._found_paths]
        if not missing:
            return
        if not self.skip_corrupt:
            raise DataError(f"{len(missing)} image file(s) of {self.annotation_file} are missing from "
                            f"{self.image_folder} ({folder_key}), e.g. {missing[0]}. Restore them, point "
                            f"{folder_key} at the right folder, or set --data.skip_corrupt true to skip them.")
        log.warning("%d image file(s) of %s are missing from %s (e.g. %s); they will be skipped",
                    len(missing), self.annotation_file, self.image_folder, missing[0])

    # --- access -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.image_ids)

    def usable_segmentation(self, ann_id: Any) -> Any:
        """An annotation's segmentation as its masks are drawn: the well-formed polygons only, where
        some of its parts are not (found once, when the set was built: :attr:`usable_parts`)."""
        return self.usable_parts.get(ann_id, self.coco.anns[ann_id]["segmentation"])

    def image_info(self, index: int) -> dict[str, Any]:
        """The json's ``images`` entry of sample ``index`` (``id``, ``file_name``, ``width``, ``height``)."""
        return self.coco.imgs[self.image_ids[index]]

    def image_path(self, index: int) -> str:
        return self._found_paths.get(index) or os.path.join(self.image_folder, self.image_info(index)["file_name"])

    @property
    def skipped(self) -> int:
        """Distinct unreadable images met so far (in any process)."""
        return int(self.corrupt.sum())

    @property
    def skipped_ids(self) -> list[int]:
        """The json ids of the distinct unreadable images met so far (in any process), in json order."""
        return [self.image_ids[i] for i in self.corrupt.nonzero().flatten().tolist()]

    @property
    def kept_as_stored(self) -> int:
        """Distinct images met so far (in any process) whose EXIF orientation was not applied because
        only their stored pixels have the json's size."""
        return int(self.as_stored.sum())

    def orientation_report(self) -> str | None:
        """One warning line counting the images kept as stored, with an example; None without any."""
        flagged = torch.nonzero(self.as_stored).flatten().tolist()
        if not flagged:
            return None
        return (f"{self.annotation_file}: {len(flagged)} image(s) kept without their EXIF orientation, "
                f"e.g. {self.image_path(flagged[0])}: turned, they would not have the width/height the json "
                "gives them, so its boxes and masks refer to the stored pixels; if the annotation tool showed "
                "them turned, fix the json's width/height (and the annotations) or remove the tag")

    def load_image(self, index: int) -> tv_tensors.Image | None:
        """The decoded RGB image, or ``None`` (with ``skip_corrupt``) when it cannot be read; turned by
        its EXIF orientation unless only the stored pixels have the json's size."""
        path, info = self.image_path(index), self.image_info(index)
        record = (info["width"], info["height"])
        turn = stored = None

        def orient(image: Image.Image) -> bool:
            nonlocal turn, stored
            turn, stored = orientation(image), image.size == record and oriented_size(image) != record
            return not stored

        try:
            image = open_rgb(path, orient)
            if image.size != record:
                turned = f" once turned by its EXIF orientation {turn}" if turn else ""
                raise ValueError(f"{image.size[0]}x{image.size[1]} pixels{turned} but the json says "
                                 f"{info['width']}x{info['height']}")
        except DECODE_ERRORS as exc:  # FileNotFoundError is an OSError
            what, fix = unreadable_image(path, exc)
            if not self.skip_corrupt:
                raise CorruptImageError(f"{what}. {fix} the file (and its json entry), or set --data.skip_corrupt "
                                        "true to skip unreadable images.") from None
            if not bool(self.corrupt[index]):
                self.corrupt[index] = True
                log.warning("skipping: %s", what)
            return None
        say_large_image(path, image, self.large, index)
        if stored and not bool(self.as_stored[index]):
            self.as_stored[index] = True
        return tv_tensors.Image(TF.pil_to_tensor(image))

    def target(self, index: int) -> dict[str, Any]:
        """The annotations of sample ``index`` as a torchvision detection target (before transforms)."""
        info, objects = self.image_info(index), self._objects[index]
        height, width = info["height"], info["width"]
        target = {
            "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(objects.boxes.copy()), format="XYXY",
                                              canvas_size=(height, width)),
            "labels": torch.from_numpy(objects.labels.copy()),
        }
        if self.with_masks:
            target["masks"] = tv_tensors.Mask(decode_masks([self.usable_segmentation(a) for a in objects.ann_ids],
                                                           height, width, checked=True))
        target["iscrowd"] = torch.from_numpy(objects.iscrowd.copy())
        target["area"] = torch.from_numpy(objects.area.copy())
        target["image_id"] = int(info["id"])
        return target

    def __getitem__(self, index: int):
        image = self.load_image(index)
        if image is None:
            return None
        target = self.target(index)
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target


def _no_box(ann: dict, sizes: dict[int, tuple[int, int]], where: str) -> str:
    """The error line of an annotation without a ``bbox`` that :func:`fill_boxes` could not give one."""
    aid, image_id = ann["id"], ann["image_id"]
    if "segmentation" not in ann:
        return (f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has no 'bbox' and no "
                "'segmentation' to compute one from. Add its \"bbox\": [x, y, width, height] to the json.")
    if image_id not in sizes:
        return (f"COCO annotation file {where}: annotation id {aid} refers to image id {image_id}, which is not in "
                "'images'. Fix or remove the annotation.")
    width, height = sizes[image_id]
    problem = mask_problem(ann["segmentation"], height, width)[0]
    return (f"COCO annotation file {where}: annotation id {aid} of image id {image_id} has no 'bbox', and its "
            f"'segmentation' has {problem}, which cannot form a mask to compute the box from. Add its \"bbox\": "
            "[x, y, width, height] to the json, or fix its 'segmentation'.")


class _Objects(NamedTuple):
    """The kept annotations of one image, as compact arrays."""

    ann_ids: list
    boxes: np.ndarray  # float32 [N, 4] XYXY, clipped
    labels: np.ndarray  # int64 [N]
    iscrowd: np.ndarray  # int64 [N]
    area: np.ndarray  # float32 [N]

    @property
    def all_crowd(self) -> bool:
        """No box to train on (none at all, or only crowd regions)."""
        return bool(self.iscrowd.all())  # True for N = 0

    @classmethod
    def of(cls, rows: list) -> "_Objects":
        return cls([r[0] for r in rows], np.array([r[1] for r in rows], dtype=np.float32).reshape(-1, 4),
                   np.array([r[2] for r in rows], dtype=np.int64), np.array([r[3] for r in rows], dtype=np.int64),
                   np.array([r[4] for r in rows], dtype=np.float32))
