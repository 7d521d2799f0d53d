"""COCO polygons that cannot form a mask (no polygon, under 3 points, an odd number of coordinates,
zero area) and RLEs not of their image's size (or whose runs do not add up to it): dropped and
counted in a training json like degenerate boxes, and (malformed ones) refused in one line when a validation json is read, before any training (the COCO mask evaluation
scores against every annotation of that json and crashes on some of them). Kept, they would teach
training empty masks and end ``rescale fit`` after training in a pycocotools traceback."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from test_detection_cli import tiny_config

from rescale_tasks.cli import main
from rescale_tasks.common.errors import DataError
from rescale_tasks.detection.coco import CocoDetection, mask_problem

UNUSABLE = {  # annotation id -> segmentation that cannot form a mask
    9001: [],
    9002: [[10, 10, 20, 10]],  # two points: pycocotools reads four numbers as a box
    9003: [[10, 10, 20, 10, 20, 20, 10]],  # odd
    9004: [[10, 10, 20, 10, 30, 10, 15, 10]],  # collinear: zero area
    9005: [[10, 10, 10.3, 10, 10.3, 10.3]],  # a sliver covering no pixel
    9007: [["10", "10", "20", "10", "20", "20"]],  # text, not numbers
    9008: [[10, 10, 20, 10, float("nan"), 20]],  # json's NaN
    9009: [[10, 10, 1e5, 10, 1e5, 20]],  # far outside the image (1e8 made pycocotools crash)
}
SQUARE = [10, 10, 20, 10, 20, 20, 10, 20]


def _add(annotations: Path, image_index: int, segmentations: dict[int, list]) -> int:
    """Annotations with a usable 10x10 box and the given segmentations on image ``image_index``;
    returns its image id."""
    data = json.loads(annotations.read_text())
    image_id = data["images"][image_index]["id"]
    for aid, segmentation in segmentations.items():
        data["annotations"].append({"id": aid, "image_id": image_id, "category_id": 3, "iscrowd": 0,
                                    "bbox": [10, 10, 10, 10], "area": 100.0, "segmentation": segmentation})
    annotations.write_text(json.dumps(data))
    return image_id


def test_unusable_polygons_are_dropped_and_counted_in_training(coco_canvases_copy, caplog):
    root = coco_canvases_copy.root
    annotations = root / "annotations" / "instances_train2017.json"
    before = CocoDetection(annotations, root / "train2017")
    _add(annotations, 0, {**UNUSABLE, 9006: [SQUARE, [1, 2, 3, 4]]})  # 9006: one good part, one bad
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.coco"):
        ds = CocoDetection(annotations, root / "train2017")
    assert (ds.dropped_unusable_masks, ds.partly_unusable_masks) == (len(UNUSABLE), 1)
    assert ds.dropped_degenerate == before.dropped_degenerate
    assert f"dropped {len(UNUSABLE)} annotation(s) whose segmentation cannot form a mask" in caplog.text
    _, target = ds[0]
    _, old = before[0]
    assert len(target["labels"]) == len(old["labels"]) + 1  # only the object with a usable part is added
    assert int(target["masks"][-1].sum()) == 100 and bool(target["masks"].flatten(1).any(1).all())


def test_the_unusable_parts_beside_a_usable_one_are_left_out_of_the_mask(coco_canvases_copy):
    """The warning says they are left out; rasterised, a part with text stopped the sample and one with
    json's NaN or Infinity made pycocotools allocate without bound (the process killed for memory)."""
    root = coco_canvases_copy.root
    annotations = root / "annotations" / "instances_train2017.json"
    parts = [["x", 20, 30, 20, 30, 30], [30, 20, 40, 20, float("nan"), 30], [30, 20, float("inf"), 20, 40, 30]]
    _add(annotations, 0, {9010 + k: [SQUARE, part] for k, part in enumerate(parts)})  # the text first
    ds = CocoDetection(annotations, root / "train2017")
    assert ds.partly_unusable_masks == len(parts)
    _, target = ds[0]
    assert [int(m.sum()) for m in target["masks"][-len(parts):]] == [100] * len(parts)  # the square alone

def test_an_unusable_polygon_in_the_validation_json_stops_fit_before_training(coco_canvases_copy, tmp_path,
                                                                             monkeypatch, error_line):
    root = coco_canvases_copy.root
    image_id = _add(root / "annotations" / "instances_val2017.json", 1, {9002: UNUSABLE[9002]})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["fit", "--config", str(tiny_config(tmp_path / "tiny.yaml", root))]) == 2
    message = error_line()
    assert str(root / "annotations" / "instances_val2017.json") in message
    assert f"annotation id 9002 of image id {image_id} has a polygon of fewer than 3 points" in message
    assert "remove the annotation" in message
    assert not list(Path("runs").rglob("*.ckpt"))  # nothing trained


def _swap_size(rle: dict) -> None:
    rle["size"] = rle["size"][::-1]  # [width, height]


def _cut_short(rle: dict) -> None:
    rle["counts"] = rle["counts"][:-1]  # the last run (or its last character) lost


RLE_EDITS = {"size": _swap_size, "runs": _cut_short}


def _edit_rles(annotations: Path, path: Path, edit) -> list[dict]:
    """``annotations`` with ``edit`` made to every RLE, written to ``path``; returns the annotations
    with an RLE."""
    data = json.loads(annotations.read_text())
    edited = [a for a in data["annotations"] if isinstance(a["segmentation"], dict)]
    for ann in edited:
        edit(ann["segmentation"])
    path.write_text(json.dumps(data))
    return edited


@pytest.mark.parametrize("edit", RLE_EDITS)
def test_an_rle_not_of_its_images_size_is_dropped_and_counted_in_training(edit, coco_canvases, tmp_path, caplog):
    """pycocotools decodes an RLE at its own size: kept, it would stack with the image's other masks;
    one whose runs do not add up to it stopped the sample (``Invalid RLE mask representation``)."""
    root = coco_canvases.root
    annotations = tmp_path / "edited.json"
    edited = _edit_rles(root / "annotations" / "instances_train2017.json", annotations, RLE_EDITS[edit])
    assert {bool(a["iscrowd"]) for a in edited} == {False, True}  # compressed and uncompressed RLEs
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.coco"):
        ds = CocoDetection(annotations, root / "train2017")
    assert ds.dropped_unusable_masks == len(edited)
    assert f"dropped {len(edited)} annotation(s) whose segmentation cannot form a mask" in caplog.text
    kept = {aid for objects in ds._objects for aid in objects.ann_ids}
    assert kept and not kept & {a["id"] for a in edited}
    for index in range(len(ds)):
        image, target = ds[index]
        assert target["masks"].shape == (len(target["boxes"]), *image.shape[1:])


@pytest.mark.parametrize("edit", RLE_EDITS)
def test_an_rle_not_of_its_images_size_in_the_validation_json_is_refused_in_one_line(edit, coco_canvases, tmp_path):
    """One whose runs do not add up to its image made COCOeval's mask IoU run without end."""
    root = coco_canvases.root
    annotations = tmp_path / "edited.json"
    (ann,) = _edit_rles(root / "annotations" / "instances_val2017.json", annotations, RLE_EDITS[edit])
    height, width = ann["segmentation"]["size"][::-1] if edit == "size" else ann["segmentation"]["size"]
    with pytest.raises(DataError) as excinfo:
        CocoDetection(annotations, root / "val2017", evaluation=True)
    message = str(excinfo.value)
    assert "\n" not in message and str(annotations) in message
    problem = (f"an RLE of {width}x{height} pixels (height x width) on an image of {height}x{width}" if edit == "size"
               else f"an RLE whose runs do not cover its {height}x{width} pixels (its 'counts' cut short or damaged)")
    assert f"annotation id {ann['id']} of image id {ann['image_id']} has {problem}, which cannot form a mask" in message
    assert "an RLE of the image's height x width" in message


def test_a_box_only_run_reads_the_same_validation_json(coco_canvases_copy):
    root = coco_canvases_copy.root
    annotations = root / "annotations" / "instances_val2017.json"
    _add(annotations, 1, {9002: UNUSABLE[9002]})
    ds = CocoDetection(annotations, root / "val2017", masks=False, evaluation=True)
    assert 9002 in ds._objects[1].ann_ids and torch.is_tensor(ds[1][1]["boxes"])


def test_a_zero_area_polygon_in_the_validation_json_is_scored_as_it_is(coco_canvases_copy):
    """A well-formed polygon covering no pixel (COCO's own jsons hold tiny objects) rasterises to an
    empty mask in the COCO evaluation: dropped from the targets and counted, never refused."""
    root = coco_canvases_copy.root
    annotations = root / "annotations" / "instances_val2017.json"
    _add(annotations, 1, {9004: UNUSABLE[9004], 9005: UNUSABLE[9005]})
    ds = CocoDetection(annotations, root / "val2017", evaluation=True)
    assert ds.dropped_unusable_masks == 2 and 9004 in ds.coco.anns


def test_segmentations_written_as_one_flat_polygon_are_named_as_such(coco_canvases_copy):
    """An exporter that writes each segmentation as one polygon's coordinates ([x1, y1, ...], not
    [[x1, y1, ...]]): the problem is named as it is (it was 'an empty polygon'), and a training json
    left without boxes by it says so, not to set keep_empty_train (training on no object)."""
    from rescale_tasks.detection.data import CocoDataModule

    root = coco_canvases_copy.root
    for split in ("train", "val"):
        annotations = root / "annotations" / f"instances_{split}2017.json"
        data = json.loads(annotations.read_text())
        for ann in data["annotations"]:
            x, y, w, h = ann["bbox"]
            ann["segmentation"] = [x, y, x + w, y, x + w, y + h, x, y + h]
        annotations.write_text(json.dumps(data))
    first = min(a["id"] for a in json.loads((root / "annotations" / "instances_val2017.json").read_text())["annotations"])
    with pytest.raises(DataError) as err:
        CocoDetection(root / "annotations" / "instances_val2017.json", root / "val2017", evaluation=True)
    assert (f"annotation id {first} of image id" in str(err.value) and "has a flat list of coordinates instead of a "
            "list of polygons ([[x1, y1, x2, y2, ...]]), which cannot form a mask" in str(err.value))
    data = CocoDataModule(root=str(root), num_workers=0, pin_memory=False, persistent_workers=False)
    with pytest.raises(DataError) as err:
        data.setup("fit")
    message = str(err.value)
    assert "\n" not in message and "keep_empty_train" not in message
    assert message.startswith(f"no training images with boxes in {root / 'annotations' / 'instances_train2017.json'} "
                              "(data.root): the ")
    assert ("annotation(s) whose segmentation cannot form a mask were dropped, e.g. annotation id" in message
            and message.endswith(": a flat list of coordinates instead of a list of polygons ([[x1, y1, x2, y2, ...]]). "
                                 "Fix the segmentations, or set --data.masks false for a box-only detector."))


def test_an_uncompressed_rle_of_whole_number_floats_is_a_mask():
    """pycocotools reads counts 5.0 as 5 runs' length: such an RLE is usable, 1.5 is not."""
    assert mask_problem({"size": [2, 3], "counts": [1.0, 5]}, 2, 3) == (None, True)
    assert mask_problem({"size": [2, 3], "counts": [1.5, 4.5]}, 2, 3)[1] is False


def test_a_polygon_far_outside_its_image_in_the_validation_json_is_refused_in_one_line(coco_canvases_copy):
    """COCOeval rasterises it point by point along its edges: at 1e8 px it crashed at the end of the validation."""
    root = coco_canvases_copy.root
    annotations = root / "annotations" / "instances_val2017.json"
    image_id = _add(annotations, 0, {9009: UNUSABLE[9009]})
    with pytest.raises(DataError) as excinfo:
        CocoDetection(annotations, root / "val2017", evaluation=True)
    message = str(excinfo.value)
    assert "\n" not in message and f"annotation id 9009 of image id {image_id} has a polygon reaching beyond" in message


def test_the_usable_parts_are_found_once_when_the_set_is_built(coco_canvases_copy):
    """Which polygons of a segmentation are usable is decided when the data set is built; loading a
    sample draws those parts without checking every coordinate again (a Python loop per polygon per
    load, ~1.7% of a data step), and draws the same masks."""
    root = coco_canvases_copy.root
    annotations = root / "annotations" / "instances_train2017.json"
    _add(annotations, 0, {9020: [SQUARE, [1, 2, 3, 4]], 9021: [SQUARE]})
    ds = CocoDetection(annotations, root / "train2017")
    assert ds.usable_parts == {9020: [SQUARE]}  # only where some part is not usable
    assert ds.usable_segmentation(9021) == [SQUARE]
    _, target = ds[0]
    assert [int(m.sum()) for m in target["masks"][-2:]] == [100, 100]
