"""COCO evaluation (pycocotools' COCOeval against the data set's own json), the results JSON and
drawn detections: known answers, crowd regions ignored, the logged numbers equal to COCOeval on the
written file (a set with crowd regions, RLE and polygon masks, an empty image, a degenerate box and
non-contiguous category ids, read through the real data set), and a 2-process gloo evaluation over
a padded sampler's overlapping shards equal to one process and to COCOeval."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.detection.evaluation import STAT_NAMES, CocoEvaluator
from rescale_tasks.common.system import write_atomically
from rescale_tasks.detection.results import coco_results, draw_detections, drawn_png

H, W = 64, 80


def _box_mask(box, h=H, w=W) -> torch.Tensor:
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    mask = torch.zeros(h, w, dtype=torch.uint8)
    mask[y1:y2, x1:x2] = 1
    return mask


def _target(image_id, boxes, labels, iscrowd=None):
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    masks = torch.stack([_box_mask(b) for b in boxes.tolist()]) if len(boxes) else torch.zeros(0, H, W, dtype=torch.uint8)
    return {"image_id": image_id, "boxes": boxes, "labels": torch.tensor(labels, dtype=torch.int64), "masks": masks,
            "iscrowd": torch.tensor(iscrowd or [0] * len(labels)), "area": masks.flatten(1).sum(1).float()}


def _prediction(boxes, labels, scores):
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    masks = torch.stack([_box_mask(b).float() * 0.9 for b in boxes.tolist()])[:, None] if len(boxes) \
        else torch.zeros(0, 1, H, W)
    return {"boxes": boxes, "labels": torch.tensor(labels, dtype=torch.int64),
            "scores": torch.tensor(scores, dtype=torch.float32), "masks": masks}


def _ground_truth(targets) -> COCO:
    """A COCO index of the synthetic targets: box-shaped polygon masks, crowd regions as RLE."""
    anns, images = [], []
    for t in targets:
        image_id = int(t["image_id"])
        images.append({"id": image_id, "width": W, "height": H, "file_name": f"{image_id}.png"})
        for box, label, crowd, mask in zip(t["boxes"].tolist(), t["labels"].tolist(), t["iscrowd"].tolist(),
                                           t["masks"]):
            x1, y1, x2, y2 = box
            if crowd:
                rle = mask_utils.encode(np.asfortranarray(mask.numpy()))
                segmentation = {"size": [H, W], "counts": rle["counts"].decode()}
            else:
                segmentation = [[x1, y1, x2, y1, x2, y2, x1, y2]]
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": int(label), "iscrowd": int(crowd),
                         "bbox": [x1, y1, x2 - x1, y2 - y1], "area": float(mask.sum()), "segmentation": segmentation})
    return _quiet_coco({"images": images, "annotations": anns,
                        "categories": [{"id": c, "name": str(c)} for c in (1, 2, 3)]})


def _score(predictions, targets, iou_types=("bbox", "segm")):
    evaluator = CocoEvaluator(_ground_truth(targets), iou_types)
    evaluator.update(predictions, targets)
    return evaluator.compute()


def test_perfect_predictions_score_one_and_empty_size_ranges_are_nan():
    # 20x20 (small) and 40x40 (medium) objects of two classes over two images; nothing large
    targets = [_target(7, [[2, 2, 22, 22], [30, 10, 70, 50]], [1, 2]), _target(3, [[10, 5, 50, 45]], [2])]
    predictions = [_prediction(t["boxes"].tolist(), t["labels"].tolist(), [0.9] * len(t["labels"])) for t in targets]
    out = _score(predictions, targets)
    assert set(out) == {f"{t}/{n}" for t in ("bbox", "segm") for n in STAT_NAMES}
    for iou in ("bbox", "segm"):
        for name in ("AP", "AP50", "AP75", "APs", "APm", "AR100"):
            assert out[f"{iou}/{name}"] == pytest.approx(1.0), (iou, name)
        assert math.isnan(out[f"{iou}/APl"])  # COCO's -1: no large objects at all


def test_one_box_at_iou_072_passes_ap50_not_ap75():
    targets = [_target(1, [[10, 10, 60, 60]], [1])]
    predictions = [_prediction([[10, 10, 60, 46]], [1], [0.8])]  # 50x36 inside 50x50: IoU 0.72
    out = _score(predictions, targets)
    for iou in ("bbox", "segm"):
        assert out[f"{iou}/AP50"] == pytest.approx(1.0)
        assert out[f"{iou}/AP75"] == pytest.approx(0.0)
        assert out[f"{iou}/AP"] == pytest.approx(0.5)  # IoU thresholds 0.50..0.70 of 0.50..0.95


def test_a_detection_on_a_crowd_region_is_ignored():
    crowd = _target(1, [[5, 5, 25, 25], [40, 10, 78, 60]], [1, 1], iscrowd=[0, 1])
    # the higher-scored detection lies on the crowd region: counted, it would be a false positive
    predictions = [_prediction([[41, 12, 76, 58], [5, 5, 25, 25]], [1, 1], [0.95, 0.9])]
    out = _score(predictions, [crowd])
    assert out["bbox/AP"] == pytest.approx(1.0) and out["segm/AP"] == pytest.approx(1.0)
    without = {k: (v[1:] if k not in ("image_id",) else v) for k, v in crowd.items()}
    without["iscrowd"] = torch.zeros(1, dtype=torch.int64)  # the same region, an object now
    out = _score(predictions, [without])
    assert out["bbox/AP"] < 0.9 and out["segm/AP"] < 0.9


def test_segm_needs_masks_and_iou_types_are_checked():
    target = _target(1, [[10, 10, 60, 60]], [1])
    prediction = {k: v for k, v in _prediction([[10, 10, 60, 60]], [1], [0.9]).items() if k != "masks"}
    with pytest.raises(ConfigError, match="iou_types"):
        CocoEvaluator(_ground_truth([target])).update([prediction], [target])
    assert _score([prediction], [target], ("bbox",))["bbox/AP"] == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        CocoEvaluator(_ground_truth([target]), ("bbox", "keypoints"))
    with pytest.raises(DataError, match="not in the evaluation's annotation json"):
        CocoEvaluator(_ground_truth([target]), ("bbox",)).update([prediction], [{**target, "image_id": 99}])


def test_results_map_labels_back_to_category_ids():
    target = _target(42, [[10, 10, 60, 60], [2, 2, 20, 20]], [1, 2])
    prediction = _prediction([[10, 10, 60, 60], [2, 2, 20, 20]], [1, 2], [0.9, 0.7])
    gt = _ground_truth([target])
    gt.dataset["categories"] = [{"id": 18, "name": "a"}, {"id": 44, "name": "b"}]
    evaluator = CocoEvaluator(gt, label_to_category={1: 18, 2: 44})
    evaluator.update([prediction], [target])
    results = evaluator.results()
    assert [(r["image_id"], r["category_id"], r["score"]) for r in results] == \
        [(42, 18, pytest.approx(0.9)), (42, 44, pytest.approx(0.7))]
    assert results[0]["bbox"] == [10.0, 10.0, 50.0, 50.0]
    assert isinstance(results[0]["segmentation"]["counts"], str) and results[0]["segmentation"]["size"] == [H, W]
    # raw predictions with their ids and a label list give the same file
    assert coco_results([prediction], [0, 18, 44], image_ids=[42]) == results



def test_a_background_detection_is_no_result():
    """RetinaNet scores label 0 (the background, no category) as a class: a detection of it is
    dropped, with its mask, not a DataError ending the evaluation."""
    target = _target(42, [[10, 10, 60, 60]], [1])
    prediction = _prediction([[10, 10, 60, 60], [2, 2, 20, 20]], [1, 0], [0.9, 0.7])
    gt = _ground_truth([target])
    gt.dataset["categories"] = [{"id": 18, "name": "a"}]
    evaluator = CocoEvaluator(gt, label_to_category={1: 18})
    evaluator.update([prediction], [target])
    assert [(r["category_id"], r["score"]) for r in evaluator.results()] == [(18, pytest.approx(0.9))]
    assert coco_results([prediction], [0, 18], image_ids=[42]) == evaluator.results()

# ------------------------------------------------------------------ a tiny COCO annotation file
CATEGORIES = [18, 44, 90]  # original ids; the model's labels are 1, 2, 3


def _coco_gt() -> dict:
    """Five images: polygons of several sizes, one object as a compressed RLE, an RLE crowd region,
    a degenerate box (0.5 px wide at the image's edge: data sets drop it, COCO keeps it), an image
    without objects."""
    def poly(x, y, w, h):  # a rectangle with a notch: a polygon whose mask differs from its box
        return [[x, y, x + w, y, x + w, y + h, x + w / 2, y + h - 4, x, y + h]]
    anns, rows = [], [
        (11, 18, (4, 4, 16, 14)), (11, 44, (30, 8, 40, 36)), (11, 18, (10, 40, 24, 20)),
        (12, 90, (2, 2, 74, 58)), (12, 44, (50, 30, 12, 12)),
        (14, 44, (10, 10, 50, 50)), (15, 18, (3, 3, 30, 20)), (15, 90, (40, 20, 39, 43)),
    ]
    for k, (image_id, cat, (x, y, w, h)) in enumerate(rows, start=1):
        seg = poly(x, y, w, h)
        area = float(mask_utils.area(mask_utils.frPyObjects(seg, H, W)).sum())
        anns.append({"id": k, "image_id": image_id, "category_id": cat, "segmentation": seg, "area": area,
                     "bbox": [x, y, w, h], "iscrowd": 0})
    blob = np.zeros((H, W), dtype=np.uint8, order="F")
    blob[20:34, 6:18] = 1
    blob[24:30, 18:26] = 1
    rle = mask_utils.encode(blob)
    anns.append({"id": 8, "image_id": 12, "category_id": 18, "iscrowd": 0, "area": float(mask_utils.area(rle)),
                 "bbox": [6, 20, 20, 14], "segmentation": {"size": [H, W], "counts": rle["counts"].decode()}})
    crowd = np.zeros((H, W), dtype=np.uint8, order="F")
    crowd[40:62, 40:78] = 1
    rle = mask_utils.encode(crowd)
    anns.append({"id": 9, "image_id": 11, "category_id": 18, "iscrowd": 1, "area": float(mask_utils.area(rle)),
                 "bbox": [40, 40, 38, 22], "segmentation": {"size": [H, W], "counts": rle["counts"].decode()}})
    anns.append({"id": 10, "image_id": 14, "category_id": 90, "iscrowd": 0, "area": 4.0, "bbox": [W - 0.5, 5, 6, 8],
                 "segmentation": [[W - 1, 5, W, 5, W, 13, W - 1, 13]]})
    images = [{"id": i, "width": W, "height": H, "file_name": f"{i}.jpg"} for i in (11, 12, 13, 14, 15)]
    return {"images": images, "annotations": anns, "categories": [{"id": c, "name": str(c)} for c in CATEGORIES]}


def _quiet_coco(dataset: dict) -> COCO:
    coco = COCO()
    coco.dataset = copy.deepcopy(dataset)
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _targets_and_predictions(gt: dict):
    """Dataset-style targets from the annotation file and noisy Mask R-CNN-style predictions."""
    coco = _quiet_coco(gt)
    label = {c: i + 1 for i, c in enumerate(CATEGORIES)}
    g = torch.Generator().manual_seed(0)
    targets, predictions = [], []
    for image_id in sorted(coco.getImgIds()):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        boxes = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                              for a in anns], dtype=torch.float32).reshape(-1, 4)
        masks = torch.from_numpy(np.stack([coco.annToMask(a) for a in anns])) if anns \
            else torch.zeros(0, H, W, dtype=torch.uint8)
        targets.append({"image_id": torch.tensor(image_id), "boxes": boxes,
                        "labels": torch.tensor([label[a["category_id"]] for a in anns], dtype=torch.int64),
                        "masks": masks, "iscrowd": torch.tensor([a["iscrowd"] for a in anns], dtype=torch.int64),
                        "area": torch.tensor([a["area"] for a in anns], dtype=torch.float32)})
        n = len(anns) + 2  # every object (crowd too) shifted a little, plus two false positives
        jitter = torch.randn(n, 4, generator=g) * 3
        base = torch.cat([boxes, torch.tensor([[5.0, 30, 30, 55], [50, 2, 75, 20]])]) + jitter
        base = torch.stack([base[:, 0].clamp(0, W - 2), base[:, 1].clamp(0, H - 2),
                            base[:, 2].clamp(1, W), base[:, 3].clamp(1, H)], 1)
        base[:, 2:] = torch.maximum(base[:, 2:], base[:, :2] + 1)
        probs = torch.zeros(n, 1, H, W)
        for k, (x1, y1, x2, y2) in enumerate(base.tolist()):
            probs[k, 0, int(y1):int(math.ceil(y2)), int(x1):int(math.ceil(x2))] = torch.rand(1, generator=g) * 0.6 + 0.4
        scores, order = torch.rand(n, generator=g).sort(descending=True)
        labels = torch.cat([targets[-1]["labels"], torch.tensor([1, 2])])
        predictions.append({"boxes": base[order], "scores": scores, "labels": labels[order], "masks": probs[order]})
    return targets, predictions


def _cocoeval_stats(gt: COCO, results: list[dict], iou_type: str) -> list[float]:
    if iou_type == "segm":  # as Detectron2: with a bbox, loadRes takes the box area as the mask's
        results = [{k: v for k, v in r.items() if k != "bbox"} for r in results]
    with contextlib.redirect_stdout(io.StringIO()):
        dt = gt.loadRes(copy.deepcopy(results))
        ev = COCOeval(gt, dt, iouType=iou_type)
        ev.evaluate(), ev.accumulate(), ev.summarize()
    return [float("nan") if s == -1 else float(s) for s in ev.stats]


def _official(gt_file, results: list[dict]) -> dict[str, float]:
    """COCOeval's 12 numbers per IoU type for ``results`` against the json file, as any COCO user
    computes them: ``COCO(annotation_file).loadRes(results)``."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(gt_file))
    return {f"{iou}/{name}": value for iou in ("bbox", "segm")
            for name, value in zip(STAT_NAMES, _cocoeval_stats(gt, results, iou))}


def _assert_same(mine: dict, official: dict) -> None:
    assert mine.keys() == official.keys()
    for key, value in official.items():
        assert (math.isnan(value) and math.isnan(mine[key])) or abs(mine[key] - value) <= 1e-6, \
            (key, mine[key], value)


def test_written_results_give_the_same_ap_under_pycocotools(tmp_path):
    gt_json = _coco_gt()
    (tmp_path / "gt.json").write_text(json.dumps(gt_json))
    targets, predictions = _targets_and_predictions(gt_json)
    evaluator = CocoEvaluator(tmp_path / "gt.json", label_to_category=[0] + CATEGORIES)
    evaluator.update(predictions[:2], targets[:2])
    evaluator.update(predictions[2:], targets[2:])
    ours = evaluator.compute()
    path = tmp_path / "out" / "results.json"
    path.parent.mkdir()
    write_atomically(path, json.dumps(evaluator.results()))
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temporary file left
    results = json.loads(path.read_text())
    assert len(results) == sum(len(p["scores"]) for p in predictions)
    assert 0.05 < ours["bbox/AP"] < 0.95 and 0.05 < ours["segm/AP"] < 0.95  # not a trivial score
    _assert_same(ours, _official(tmp_path / "gt.json", results))


def test_no_detections_score_as_cocoeval_scores_an_empty_results_set(tmp_path):
    (tmp_path / "gt.json").write_text(json.dumps(_coco_gt()))
    targets, predictions = _targets_and_predictions(_coco_gt())
    evaluator = CocoEvaluator(tmp_path / "gt.json", label_to_category=[0] + CATEGORIES)
    evaluator.update([{k: v[:0] for k, v in p.items()} for p in predictions], targets)
    out = evaluator.compute()
    assert evaluator.results() == [] and out["bbox/AP"] == 0.0 and out["segm/AR100"] == 0.0


def test_the_real_data_sets_ap_is_cocoevals_on_its_own_json(coco_canvases, tmp_path):
    """The logged AP is COCOeval's on the results file against the data set's own json (scored from
    targets rebuilt by the data set, it would differ in the fourth decimal). The canvases' train
    split, read by the real data module as an evaluation set, has every case: crowd regions
    (uncompressed RLE), compressed-RLE and polygon masks, an image without annotations, a
    degenerate box the data set drops, non-contiguous category ids. Predictions: every object (crowd regions too) moved a little, its mask cut to the
    moved box, plus a false positive per image."""
    from rescale_tasks.detection.data import CocoDataModule

    root = coco_canvases.root
    annotation_file = root / "annotations/instances_train2017.json"
    data = CocoDataModule(val_annotations=str(annotation_file), val_images=str(root / "train2017"),
                          num_workers=0, pin_memory=False, persistent_workers=False)
    dataset = data.dataset("val")
    evaluator = CocoEvaluator(data.ground_truth("val"), label_to_category=data.label_to_category)
    g = torch.Generator().manual_seed(0)
    for index in range(len(dataset)):
        image, target = dataset[index]
        h, w = image.shape[-2:]
        boxes = torch.cat([torch.as_tensor(target["boxes"]).float().reshape(-1, 4), torch.tensor([[2.0, 2, 20, 16]])])
        boxes = boxes + torch.randn(boxes.shape, generator=g) * 1.5
        boxes = torch.stack([boxes[:, 0].clamp(0, w - 2), boxes[:, 1].clamp(0, h - 2), boxes[:, 2].clamp(1, w),
                             boxes[:, 3].clamp(1, h)], 1)
        boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        truth = torch.as_tensor(target["masks"]).float()
        masks = torch.cat([truth, torch.ones(1, h, w)])
        cut = torch.zeros_like(masks)
        for k, (x1, y1, x2, y2) in enumerate(boxes.round().int().tolist()):
            cut[k, y1:y2, x1:x2] = masks[k, y1:y2, x1:x2]
        labels = torch.cat([torch.as_tensor(target["labels"]), torch.tensor([1])])
        scores = torch.rand(len(boxes), generator=g) * 0.9 + 0.05
        evaluator.update([{"boxes": boxes, "labels": labels, "scores": scores, "masks": cut[:, None] * 0.9}],
                         [target])
    assert len(evaluator) == 9  # the empty image too
    path = tmp_path / "results.json"
    write_atomically(path, json.dumps(evaluator.results()))
    ours = evaluator.compute()
    assert 0.2 < ours["bbox/AP"] < 0.95 and 0.2 < ours["segm/AP"] < 0.95  # not a trivial score
    _assert_same(ours, _official(annotation_file, json.loads(path.read_text())))


# ------------------------------------------------------------------ 2 processes over gloo
def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str, shards: list[list[int]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        targets, predictions = _targets_and_predictions(_coco_gt())
        evaluator = CocoEvaluator(os.path.join(out_dir, "gt.json"), label_to_category=[0] + CATEGORIES)
        for i in shards[rank]:
            evaluator.update([predictions[i]], [targets[i]])
        out = {"metrics": evaluator.compute(), "results": evaluator.results(), "local": len(evaluator)}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_processes_with_overlapping_shards_equal_one_process_and_cocoeval(tmp_path):
    (tmp_path / "gt.json").write_text(json.dumps(_coco_gt()))
    targets, predictions = _targets_and_predictions(_coco_gt())
    single = CocoEvaluator(tmp_path / "gt.json", label_to_category=[0] + CATEGORIES)
    single.update(predictions, targets)
    expected = json.loads(json.dumps({"metrics": single.compute(), "results": single.results()}))
    official = _official(tmp_path / "gt.json", expected["results"])
    # a padded DistributedSampler over 5 images, 2 ranks, no shuffle: [0, 2, 4] and [1, 3, 0]
    shards = [[0, 2, 4], [1, 3, 0]]
    # fork: the children start with this process's imports (spawn re-imports torch, ~4 s more)
    mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path), shards), nprocs=2,
                       join=True, start_method="fork")
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["local"] == 3
        assert got["results"] == expected["results"]
        _assert_same(got["metrics"], expected["metrics"])
        _assert_same(got["metrics"], official)


# ------------------------------------------------------------------ drawing
def test_draw_detections_marks_the_box_and_skips_low_scores(tmp_path):
    image = torch.full((3, H, W), 40, dtype=torch.uint8)
    prediction = _prediction([[10, 10, 40, 50], [50, 5, 75, 30]], [1, 2], [0.9, 0.2])
    drawn = draw_detections(image, prediction, ["__background__", "cat", "dog"], score_threshold=0.5)
    assert drawn.shape == image.shape and drawn.dtype == torch.uint8
    changed = (drawn != image).any(0)
    assert changed[10:50, 10:40].float().mean() > 0.9  # mask fill and outline inside the first box
    assert not changed[5:30, 52:80].any()  # the low-scored detection is not drawn
    assert not changed[55:, 45:].any()
    path = tmp_path / "drawn.png"
    path.write_bytes(drawn_png(image, prediction, ["__background__", "cat", "dog"]))
    with Image.open(path) as picture:
        assert picture.size == (W, H) and np.array_equal(np.asarray(picture), drawn.permute(1, 2, 0).numpy())
