"""COCO data for detection: known answers on real images (digit canvases, imgaug's quokka photo)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import ExifTags, Image

from rescale_tasks.common.data import BatchListLoader
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.detection.coco import CocoDetection
from rescale_tasks.detection.data import (AspectRatioBatchSampler, BatchOfSamples, CocoDataModule,
                                          SequentialBatchSampler, collate_detection)
from rescale_tasks.detection.transforms import eval_transforms, train_transforms
from rescale_tasks.detection.evaluation import load_ground_truth


def _train(root: Path, **kwargs) -> CocoDetection:
    return CocoDetection(root / "annotations" / "instances_train2017.json", root / "train2017", **kwargs)


def _mask_box(mask: torch.Tensor) -> list[float]:
    rows, cols = torch.nonzero(mask.any(1)).flatten(), torch.nonzero(mask.any(0)).flatten()
    return [float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)]


def _one_line_error(excinfo, *fragments: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ----------------------------------------------------------------------------- annotations


def test_labels_boxes_masks_and_crowd_match_the_written_canvases(coco_canvases):
    root, truth = coco_canvases
    ds = _train(root)
    assert ds.num_classes == 4 and ds.class_names == ["__background__", "zero", "one", "two"]
    assert ds.category_to_label == {3: 1, 7: 2, 11: 3}
    assert ds.label_to_category == {1: 3, 2: 7, 3: 11}
    assert len(ds) == len(truth["train"])
    kinds = set()
    for index, record in enumerate(truth["train"]):
        image, target = ds[index]
        assert target["image_id"] == record["id"] == ds.image_ids[index]
        assert image.dtype == torch.uint8 and tuple(image.shape) == (3, record["height"], record["width"])
        assert tuple(target["boxes"].canvas_size) == (record["height"], record["width"])
        objects = record["objects"]
        assert [ds.label_to_category[int(label)] for label in target["labels"]] == [o["category_id"] for o in objects]
        assert target["boxes"].tolist() == [o["box"] for o in objects]
        assert target["iscrowd"].tolist() == [o["iscrowd"] for o in objects]
        assert target["area"].dtype == torch.float32
        assert target["area"].tolist() == [float(o["mask"].sum()) for o in objects]
        masks = target["masks"]
        assert masks.dtype == torch.uint8 and tuple(masks.shape) == (len(objects), record["height"], record["width"])
        for mask, obj in zip(masks, objects):  # polygon square, compressed RLE ink, uncompressed crowd RLE
            assert torch.equal(mask.bool(), torch.from_numpy(obj["mask"])), obj["kind"]
            kinds.add(obj["kind"])
    assert kinds == {"polygon", "rle", "crowd"}


def test_empty_images_are_kept_or_dropped_and_aspect_ratios_come_from_the_json(coco_canvases):
    root, truth = coco_canvases
    empty = [r["id"] for r in truth["train"] if not r["objects"]]
    assert len(empty) == 1
    kept, dropped = _train(root, keep_empty=True), _train(root, keep_empty=False)
    assert empty[0] in kept.image_ids and empty[0] not in dropped.image_ids
    assert len(dropped) == len(kept) - 1
    assert kept.image_ids == [r["id"] for r in truth["train"]]
    np.testing.assert_allclose(kept.aspect_ratios, [r["width"] / r["height"] for r in truth["train"]])
    assert kept.image_info(1)["file_name"] == truth["train"][1]["file_name"]
    assert kept.coco.getImgIds() == kept.image_ids  # pycocotools' index, for the evaluation


def test_degenerate_box_is_dropped_and_counted_once(coco_canvases, caplog):
    root, truth = coco_canvases
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.coco"):
        ds = _train(root)
    assert ds.dropped_degenerate == 1
    assert sum("dropped 1 degenerate" in r.getMessage() for r in caplog.records) == 1
    (index,) = [i for i, r in enumerate(truth["train"]) if r["degenerate_ann_ids"]]
    _, target = ds[index]
    assert len(target["boxes"]) == len(truth["train"][index]["objects"]) == 1
    # read as an evaluation json, the line says COCOeval still scores it (it had read as left out)
    assert "still scores" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.coco"):
        _train(root, evaluation=True)
    assert "dropped 1 degenerate box(es)" in caplog.text and "the COCO evaluation still scores them" in caplog.text


def test_without_masks_the_target_has_none_and_segmentation_is_optional(tmp_path, coco_writer):
    coco_writer(tmp_path, ("train",))
    path = tmp_path / "annotations" / "instances_train2017.json"
    data = json.loads(path.read_text())
    for ann in data["annotations"]:
        del ann["segmentation"]
    path.write_text(json.dumps(data))
    _, target = _train(tmp_path, masks=False)[0]
    assert "masks" not in target and len(target["boxes"]) == 2
    with pytest.raises(DataError) as excinfo:
        _train(tmp_path)
    _one_line_error(excinfo, "has no 'segmentation'", "--data.masks false")


def test_an_annotation_with_a_mask_but_no_bbox_gets_its_masks_box_in_one_line(tmp_path, coco_writer, caplog):
    """A segmentation without a ``bbox`` (exporters that write masks only): the box is computed from
    the mask, in training and in the COCO evaluation's ground truth, with one warning line; where
    there is no usable mask either, one error line says what the annotation has and what to add."""
    coco_writer(tmp_path, ("train",))
    path = tmp_path / "annotations" / "instances_train2017.json"
    data = json.loads(path.read_text())
    first = data["annotations"][0]
    box = first.pop("bbox")
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.coco"):
        ds = _train(tmp_path)
    assert ds.boxes_from_masks == [first["id"]] and ds.coco.anns[first["id"]]["bbox"] == box
    assert "1 annotation(s) have a 'segmentation' but no 'bbox' (e.g. annotation id" in caplog.text
    assert load_ground_truth(str(path)).anns[first["id"]]["bbox"] == box  # scored with the same box

    first["segmentation"] = [[1, 2, 3, 4]]
    path.write_text(json.dumps(data))
    with pytest.raises(DataError) as excinfo:
        _train(tmp_path)
    _one_line_error(excinfo, f"annotation id {first['id']} of image id {first['image_id']} has no 'bbox', and its "
                    "'segmentation' has a polygon of fewer than 3 points", "Add its \"bbox\": [x, y, width, height]")
    del first["segmentation"]
    path.write_text(json.dumps(data))
    with pytest.raises(DataError) as excinfo:
        _train(tmp_path, masks=False)
    _one_line_error(excinfo, "has no 'bbox' and no 'segmentation' to compute one from")


# ----------------------------------------------------------------------------- transforms


def test_train_transforms_move_boxes_and_masks_together(coco_canvases):
    root, truth = coco_canvases
    ds = _train(root, keep_empty=False, transforms=train_transforms(train_sizes=(96,), max_size=1000, flip=1.0))
    for index in range(len(ds)):
        record = next(r for r in truth["train"] if r["id"] == ds.image_ids[index])
        image, target = ds[index]
        scale = 96 / min(record["width"], record["height"])
        width = round(record["width"] * scale)
        assert image.dtype == torch.float32 and tuple(image.shape) == (3, round(record["height"] * scale), width)
        assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0 and float(image.max()) > 0.5
        expected = [[width - o["box"][2] * scale, o["box"][1] * scale, width - o["box"][0] * scale,
                     o["box"][3] * scale] for o in record["objects"]]
        torch.testing.assert_close(target["boxes"], torch.tensor(expected), atol=1e-3, rtol=0)
        assert target["masks"].dtype == torch.uint8
        for box, mask in zip(target["boxes"], target["masks"]):
            assert np.abs(np.array(_mask_box(mask)) - box.numpy()).max() <= 2.0


def test_transforms_drop_boxes_made_degenerate_with_all_their_fields(coco_canvases):
    root, _ = coco_canvases
    ds = _train(root)
    image, target = ds[0]
    target["boxes"][1] = torch.tensor([10.0, 10.0, 10.4, 30.0])  # 0.4 px wide
    image, out = train_transforms(train_sizes=(48,), flip=0.0)(image, target)
    assert len(out["boxes"]) == len(out["labels"]) == len(out["masks"]) == len(out["iscrowd"]) == len(out["area"]) == 1
    assert out["labels"].tolist() == [target["labels"][0].item()] and out["area"][0] == target["area"][0]


def test_eval_transforms_keep_the_original_resolution(coco_canvases):
    root, _ = coco_canvases
    raw = _train(root)[0]
    image, target = _train(root, transforms=eval_transforms())[0]
    assert image.dtype == torch.float32 and image.shape == raw[0].shape
    torch.testing.assert_close(image, raw[0].float() / 255)
    assert torch.equal(target["boxes"], raw[1]["boxes"].as_subclass(torch.Tensor))


def test_quokka_photo_box_and_polygon_load_and_follow_flip_and_resize(quokka_coco):
    q = quokka_coco
    ds = CocoDetection(q.annotation_file, q.image_folder)
    image, target = ds[0]
    width, height = q.size
    assert tuple(image.shape) == (3, height, width) == (3, 643, 960)
    assert target["boxes"].tolist() == [q.box]
    mask = target["masks"][0]
    poly_box = [q.polygon[:, 0].min(), q.polygon[:, 1].min(), q.polygon[:, 0].max(), q.polygon[:, 1].max()]
    assert np.abs(np.array(_mask_box(mask)) - poly_box).max() <= 1.0
    assert abs(int(mask.sum()) - float(target["area"][0])) / float(target["area"][0]) < 0.02  # shoelace area
    assert np.abs(np.array(_mask_box(mask)) - np.array(q.box)).max() <= 6  # the box and polygon agree

    flipped = CocoDetection(q.annotation_file, q.image_folder,
                            transforms=train_transforms(train_sizes=(320,), max_size=1333, flip=1.0))
    image2, target2 = flipped[0]
    new_width = int(width * 320 / height)  # the long side is truncated (477.8 -> 477)
    assert tuple(image2.shape) == (3, 320, new_width)
    sx, sy = new_width / width, 320 / height
    x1, y1, x2, y2 = q.box
    expected = torch.tensor([[new_width - x2 * sx, y1 * sy, new_width - x1 * sx, y2 * sy]])
    torch.testing.assert_close(target2["boxes"], expected, atol=1e-3, rtol=0)
    mx1, my1, mx2, my2 = _mask_box(mask)
    expected_mask_box = [new_width - mx2 * sx, my1 * sy, new_width - mx1 * sx, my2 * sy]
    assert np.abs(np.array(_mask_box(target2["masks"][0])) - expected_mask_box).max() <= 2.0
    # the flipped photo is the mirror image of the resized one
    assert float(image2[:, :, new_width // 3].mean()) != pytest.approx(float(image2[:, :, -new_width // 3].mean()))


# ----------------------------------------------------------------------------- batch samplers


class _Sized(torch.utils.data.Dataset):
    def __init__(self, ratios):
        self.aspect_ratios = np.asarray(ratios)

    def __len__(self):
        return len(self.aspect_ratios)

    def __getitem__(self, index):
        return index


def _ratios(n: int = 23) -> np.ndarray:
    return np.random.default_rng(1).choice([4 / 3, 1.0, 0.75, 0.5], size=n)


def test_aspect_ratio_batches_group_orientations_and_keep_their_count():
    ratios = _ratios()
    sampler = AspectRatioBatchSampler(_Sized(ratios), batch_size=3, seed=5, num_replicas=1, rank=0)
    portrait = ratios < 1
    n_landscape, n_portrait = int((~portrait).sum()), int(portrait.sum())
    leftover = n_landscape % 3 + n_portrait % 3
    assert sampler.num_batches() == n_landscape // 3 + n_portrait // 3 + -(-leftover // 3)
    orders = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        batches = sampler.epoch_batches()
        assert len(batches) == sampler.num_batches() == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(ratios)))  # each image once
        grouped = batches[:n_landscape // 3 + n_portrait // 3]
        assert all(len(b) == 3 and len({bool(portrait[i]) for i in b}) == 1 for b in grouped)
        assert sum(len(b) for b in batches[len(grouped):]) == leftover
        keys = list(sampler)
        assert [[i for i, _ in key] for key in keys] == batches
        assert len({seed for key in keys for _, seed in key}) == len(ratios)  # per-sample seeds
        orders.append(batches)
    assert orders[0] != orders[1]
    sampler.set_epoch(0)
    assert sampler.epoch_batches() == orders[0]  # (seed, epoch) alone decides the order


def test_aspect_ratio_batches_shard_over_two_ranks():
    ratios = _ratios()
    one = AspectRatioBatchSampler(_Sized(ratios), batch_size=3, seed=2, num_replicas=1, rank=0)
    ranks = [AspectRatioBatchSampler(_Sized(ratios), batch_size=3, seed=2, num_replicas=2, rank=r) for r in (0, 1)]
    for s in (one, *ranks):
        s.set_epoch(3)
    full = list(one)
    shares = [list(s) for s in ranks]
    assert len(shares[0]) == len(shares[1]) == -(-len(full) // 2)  # equal step counts
    merged = [key for pair in zip(*shares) for key in pair]
    assert merged[:len(full)] == full and all(k in full for k in merged[len(full):])  # padding repeats


def test_train_loader_resumes_mid_epoch_with_the_same_batches_and_augmentation(coco_canvases):
    root, _ = coco_canvases
    dm = CocoDataModule(root=str(root), batch_size=3, num_workers=0, train_sizes=[40, 56, 64], seed=7)
    loader = dm.train_loader()
    assert isinstance(loader, BatchListLoader) and len(loader) == 3  # 4 landscape + 4 portrait by 3
    loader.sampler.set_epoch(1)
    epoch = list(loader)
    images, targets = epoch[0]
    assert isinstance(images, list) and isinstance(targets[0], dict) and len(images) == 3
    assert sorted(t["image_id"] for _, ts in epoch for t in ts) == sorted(dm.train_set.image_ids)

    interrupted = dm.train_loader()
    interrupted.sampler.set_epoch(1)
    iterator = iter(interrupted)
    next(iterator)
    state = interrupted.state_dict()
    assert state["batches_seen"] == 1 and state["epoch"] == 1

    resumed = dm.train_loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == 2
    for (imgs_a, tg_a), (imgs_b, tg_b) in zip(epoch[1:], rest):
        assert [t["image_id"] for t in tg_a] == [t["image_id"] for t in tg_b]
        for a, b in zip(imgs_a, imgs_b):  # same random sizes and flips: per-sample seeds
            assert torch.equal(a, b)
        for a, b in zip(tg_a, tg_b):
            assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["masks"], b["masks"])


def test_eval_batches_are_in_natural_order_and_cover_every_image_over_ranks(coco_canvases):
    root, truth = coco_canvases
    dm = CocoDataModule(root=str(root), eval_batch_size=3, num_workers=0)
    batches = list(dm.eval_loader("val", num_replicas=1, rank=0))
    assert [[t["image_id"] for t in ts] for _, ts in batches] == [[r["id"] for r in truth["val"][:3]],
                                                                  [truth["val"][3]["id"]]]
    shares = [list(dm.eval_loader("val", num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(shares[0]) == len(shares[1])
    seen = {t["image_id"] for share in shares for _, ts in share for t in ts}
    assert seen == {r["id"] for r in truth["val"]}
    sampler = SequentialBatchSampler(_Sized(np.ones(7)), batch_size=2, num_replicas=2, rank=1)
    assert list(sampler) == [[2, 3], [6]]


def test_collate_keeps_the_torchvision_format_and_drops_skipped_images():
    image, target = torch.zeros(3, 4, 5), {"boxes": torch.zeros(0, 4)}
    assert collate_detection([None, (image, target)]) == ([image], [target])
    assert collate_detection([None, None]) == ([], [])
    assert BatchOfSamples(_Sized([1.0, 2.0]))[[1, 0]] == [1, 0]


# ----------------------------------------------------------------------------- the data module


def test_data_module_knows_the_classes_at_init_and_shares_val_for_test_and_predict(coco_canvases):
    root, truth = coco_canvases
    dm = CocoDataModule(root=str(root))
    assert dm.num_classes == 4 and dm.class_names[1:] == ["zero", "one", "two"]
    assert dm.label_to_category == {1: 3, 2: 7, 3: 11} and dm.datasets == {}  # nothing indexed yet
    dm.setup("fit")
    assert len(dm.train_set) == len(truth["train"]) - 1  # keep_empty_train=False
    assert len(dm.val_set) == len(truth["val"])
    assert dm.dataset("test") is dm.val_set is dm.dataset("predict")
    assert dm.val_set.coco.getImgIds() == [r["id"] for r in truth["val"]]
    explicit = CocoDataModule(root=str(root),
                              val_annotations=str(root / "annotations" / "instances_train2017.json"),
                              val_images=str(root / "train2017"))
    assert len(explicit.dataset("val")) == len(truth["train"])  # explicit paths override root's



def test_a_machine_holding_only_the_images_to_predict_on_predicts(coco_canvases, tmp_path):
    """COCO test-dev's image info (no annotations) and its images, without the train or val json (an
    inference machine, or a config whose data.root holds no annotations there): the categories are
    the predict json's, and predict runs on it; it had refused to start for want of a val json."""
    root, truth = coco_canvases
    info = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    del info["annotations"]
    test_dev = _write_json(tmp_path / "image_info_test-dev.json", info)
    expected = CocoDataModule(root=str(root))
    for kwargs in ({}, {"root": str(tmp_path / "elsewhere")}):
        (tmp_path / "elsewhere").mkdir(exist_ok=True)
        dm = CocoDataModule(predict_annotations=str(test_dev), predict_images=str(root / "val2017"), num_workers=0,
                            **kwargs)
        assert (dm.class_names, dm.label_to_category) == (expected.class_names, expected.label_to_category)
        assert dm.labels().names == expected.labels().names and dm.labels().ids == expected.labels().ids
        dm.setup("predict")
        assert len(dm.dataset("predict")) == len(truth["val"])
        images, targets = next(iter(dm.predict_dataloader()))
        assert len(images) == 1 and len(targets[0]["boxes"]) == 0


def test_a_json_to_predict_on_without_categories_is_refused_with_what_to_add(coco_canvases, tmp_path):
    """The line told one predicting with --data.predict_annotations to predict with it."""
    root, _ = coco_canvases
    images = json.loads((root / "annotations" / "instances_val2017.json").read_text())["images"]
    path = _write_json(tmp_path / "image_info.json", {"images": images})
    with pytest.raises(DataError) as excinfo:
        CocoDataModule(root=str(root), predict_annotations=str(path), predict_images=str(root / "val2017")) \
            .dataset("predict")
    message = _one_line_error(excinfo, str(path), "(data.predict_annotations) has no 'categories' list",
                              "Add the 'categories' list of the json the model was trained on")
    assert "predict on it with --data.predict_annotations" not in message

def test_data_module_errors_name_the_path_and_the_key(tmp_path, coco_canvases):
    root, _ = coco_canvases
    with pytest.raises(ConfigError) as excinfo:
        CocoDataModule()
    _one_line_error(excinfo, "--data.root")
    with pytest.raises(DataError) as excinfo:
        CocoDataModule(root=str(tmp_path / "nowhere"))
    _one_line_error(excinfo, str(tmp_path / "nowhere"), "data.root")
    (tmp_path / "annotations").mkdir()
    with pytest.raises(DataError) as excinfo:
        CocoDataModule(root=str(tmp_path))
    _one_line_error(excinfo, "instances_val2017.json", "(data.root)", "--data.val_annotations")
    with pytest.raises(DataError) as excinfo:
        CocoDataModule(root=str(root), train_annotations=str(tmp_path / "mine.json")).setup("fit")
    _one_line_error(excinfo, "mine.json", "data.train_annotations")
    with pytest.raises(ConfigError) as excinfo:
        CocoDataModule(train_annotations=str(root / "annotations" / "instances_train2017.json"))
    _one_line_error(excinfo, "--data.train_images")


def test_data_module_rejects_splits_with_other_categories(tmp_path, coco_writer):
    coco_writer(tmp_path)
    path = tmp_path / "annotations" / "instances_train2017.json"
    data = json.loads(path.read_text())
    data["categories"].append({"id": 12, "name": "three"})
    path.write_text(json.dumps(data))
    dm = CocoDataModule(root=str(tmp_path), num_workers=0)
    with pytest.raises(DataError) as excinfo:
        dm.setup("fit")
    _one_line_error(excinfo, "instances_train2017.json", "same 'categories'")


def test_a_split_left_without_images_is_refused_in_one_line(tmp_path, coco_canvases):
    """An evaluation json without images would validate nothing: no metric and no message."""
    root, _ = coco_canvases
    val, train = root / "annotations" / "instances_val2017.json", root / "annotations" / "instances_train2017.json"
    good = json.loads(val.read_text())
    empty = _write_json(tmp_path / "empty.json", dict(good, images=[], annotations=[]))
    boxless = _write_json(tmp_path / "boxless.json", dict(good, annotations=[]))

    def refused(stage: str, *fragments: str, val_json: Path = val, train_json: Path = train, **kwargs) -> None:
        dm = CocoDataModule(train_annotations=str(train_json), train_images=str(root / "train2017"),
                            val_annotations=str(val_json), val_images=str(root / "val2017"), num_workers=0, **kwargs)
        with pytest.raises(DataError) as excinfo:
            dm.setup(stage)
        _one_line_error(excinfo, *fragments)

    refused("validate", f"no images in {empty} (data.val_annotations)", "nothing to validate and test on",
            "--data.val_annotations", val_json=empty)
    refused("predict", f"no images in {empty} (data.predict_annotations)", "nothing to predict on",
            predict_annotations=str(empty), predict_images=str(root / "val2017"))
    refused("fit", f"no images in {empty} (data.train_annotations)", "nothing to train on", train_json=empty)
    refused("validate", f"no val images with boxes in {boxless} (data.val_annotations)",
            "--data.keep_empty_eval true", val_json=boxless, keep_empty_eval=False)
    refused("fit", f"no training images with boxes in {boxless} (data.train_annotations)",
            "--data.keep_empty_train true", train_json=boxless)
    # boxes written as fractions of the image (a YOLO-style converter): every one under 1 px, dropped;
    # the line says so, not to keep the images without boxes (a detector trained on no object)
    data = json.loads(train.read_text())
    sizes = {image["id"]: (image["width"], image["height"]) for image in data["images"]}
    for ann in data["annotations"]:
        width, height = sizes[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        ann["bbox"] = [x / width, y / height, w / width, h / height]
    fractions = _write_json(tmp_path / "fractions.json", data)
    first = data["annotations"][0]
    message = str(pytest.raises(DataError, CocoDataModule(
        train_annotations=str(fractions), train_images=str(root / "train2017"), val_annotations=str(val),
        val_images=str(root / "val2017"), num_workers=0, masks=False).setup, "fit").value)
    assert "keep_empty_train" not in message and "\n" not in message
    assert message == (f"no training images with boxes in {fractions} (data.train_annotations): its "
                       f"{len(data['annotations'])} box(es) were dropped as under 1 px wide or high once clipped to "
                       f"their image, e.g. annotation id {first['id']}: bbox {str(first['bbox'])[:60]}. COCO boxes are "
                       "[x, y, width, height] in pixels of the image's width x height: convert boxes given as "
                       "fractions of the image to pixels.")


# ----------------------------------------------------------------------------- bad input


def _write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_annotation_file_errors_are_one_line(tmp_path, coco_canvases):
    root, _ = coco_canvases
    images = root / "train2017"
    good = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    with pytest.raises(DataError) as excinfo:
        CocoDetection(tmp_path / "missing.json", images)
    _one_line_error(excinfo, "not found", "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError) as excinfo:
        CocoDetection(tmp_path / "bad.json", images)
    _one_line_error(excinfo, "bad.json", "as JSON")
    with pytest.raises(DataError) as excinfo:
        CocoDetection(_write_json(tmp_path / "list.json", [1, 2]), images)
    _one_line_error(excinfo, "list.json", "JSON list")
    for key in ("images", "annotations"):
        with pytest.raises(DataError) as excinfo:
            CocoDetection(_write_json(tmp_path / f"no_{key}.json", {k: v for k, v in good.items() if k != key}), images)
        _one_line_error(excinfo, f"no_{key}.json", f"no '{key}' list")
    unknown_image = dict(good, annotations=good["annotations"] + [dict(good["annotations"][0], id=777, image_id=999)])
    with pytest.raises(DataError) as excinfo:
        CocoDetection(_write_json(tmp_path / "a.json", unknown_image), images)
    _one_line_error(excinfo, "annotation id 777", "image id 999")
    unknown_category = dict(good, annotations=good["annotations"] + [dict(good["annotations"][0], id=778,
                                                                           category_id=4)])
    with pytest.raises(DataError) as excinfo:
        CocoDetection(_write_json(tmp_path / "c.json", unknown_category), images)
    _one_line_error(excinfo, "annotation id 778", "category id 4")
    with pytest.raises(DataError) as excinfo:
        CocoDetection(root / "annotations" / "instances_train2017.json", tmp_path / "no_folder")
    _one_line_error(excinfo, "image folder not found", "no_folder")


@pytest.mark.parametrize("bbox", [[4.0, 4.0, float("nan"), 24.0], [4.0, 4.0, float("inf"), 24.0],
                                  [float("-inf"), 4.0, 24.0, 24.0], ["4", "4", "24", "24"]])
def test_a_bbox_of_anything_but_finite_numbers_is_refused_in_one_line(tmp_path, coco_canvases, bbox):
    """json's NaN and Infinity parse as floats: a NaN box would vanish in the transforms (an image
    trained without its object), an infinite width would reach the image's edge."""
    root, _ = coco_canvases
    data = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    aid = data["annotations"][0]["id"]
    data["annotations"][0]["bbox"] = bbox
    path = _write_json(tmp_path / "bbox.json", data)
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "train2017")
    _one_line_error(excinfo, str(path), f"annotation id {aid} has bbox", "of finite numbers")


@pytest.mark.parametrize("iscrowd", ["0", "1", 2, None])
def test_iscrowd_other_than_the_number_0_or_1_is_refused_in_one_line(tmp_path, coco_canvases, iscrowd):
    """pycocotools' evaluation reads ``iscrowd`` with int() and as a truth value: "0" is a crowd
    region to its matching, an object to training and to its IoU."""
    root, _ = coco_canvases
    data = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    ann = data["annotations"][0]
    ann["iscrowd"] = iscrowd
    path = _write_json(tmp_path / "crowd.json", data)
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "train2017")
    _one_line_error(excinfo, str(path), f"annotation id {ann['id']} of image id {ann['image_id']} has iscrowd "
                    f"{iscrowd!r}", "expected the number 0 or 1")


@pytest.mark.parametrize("field", ["iscrowd", "area"])
def test_iscrowd_and_area_have_defaults_except_in_an_evaluation_json(field, tmp_path, coco_canvases):
    """pycocotools' evaluation reads ``iscrowd`` and ``area`` on every annotation (KeyError without
    them, once the whole validation has run): refused when an evaluation json is read; training takes
    0 and the box's width x height."""
    root, _ = coco_canvases
    data = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    ann = data["annotations"][0]
    del ann[field]
    path = _write_json(tmp_path / f"no_{field}.json", data)
    _, target = CocoDetection(path, root / "val2017")[0]
    assert target[field][0].item() == pytest.approx(0 if field == "iscrowd" else ann["bbox"][2] * ann["bbox"][3])
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "val2017", evaluation=True)
    _one_line_error(excinfo, str(path), f"annotation id {ann['id']} of image id {ann['image_id']} has no '{field}'",
                    {"iscrowd": "Add \"iscrowd\": 0", "area": "Add each annotation's \"area\""}[field])


def test_the_area_of_a_degenerate_box_of_an_evaluation_json_is_checked(tmp_path, coco_canvases):
    """The evaluation scores it too (as a ground truth nothing can match), by its area."""
    root, _ = coco_canvases
    data = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    ann = dict(data["annotations"][0], id=999, bbox=[1.0, 1.0, 0.0, 5.0], area="big")
    path = _write_json(tmp_path / "degenerate.json", dict(data, annotations=data["annotations"] + [ann]))
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "val2017", evaluation=True)
    _one_line_error(excinfo, str(path), f"annotation id 999 of image id {ann['image_id']} has area 'big'")


def test_an_annotation_id_met_twice_is_refused_in_one_line(tmp_path, coco_canvases):
    """Two jsons merged without renumbering: pycocotools keeps one annotation per id, so the first
    image trained on the other's mask and perfect detections scored an AP below 1."""
    root, _ = coco_canvases
    for split in ("train", "val"):
        data = json.loads((root / "annotations" / f"instances_{split}2017.json").read_text())
        first, other = data["annotations"][0], next(a for a in data["annotations"]
                                                    if a["image_id"] != data["annotations"][0]["image_id"])
        other["id"] = first["id"]
        path = _write_json(tmp_path / f"merged_{split}.json", data)
        with pytest.raises(DataError) as excinfo:
            CocoDetection(path, root / f"{split}2017", evaluation=split == "val")
        _one_line_error(excinfo, str(path), f"annotation id {first['id']} appears twice in 'annotations' "
                        f"(image ids {first['image_id']} and {other['image_id']})", "Give every annotation its own id")

@pytest.mark.parametrize("aid", [0, "a7"])
def test_an_annotation_id_the_evaluation_cannot_match_is_refused_in_one_line(aid, tmp_path, coco_canvases):
    """COCOeval records a match as the matched annotation's id and reads 0 as none: perfect detections
    of a json whose annotations start at id 0 scored an AP below 1, and a text id stopped it after the
    whole validation. Training reads ids only as keys."""
    root, _ = coco_canvases
    data = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    ann = data["annotations"][0]
    ann["id"] = aid
    path = _write_json(tmp_path / "ids.json", data)
    assert len(CocoDetection(path, root / "val2017")) == len(data["images"])
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "val2017", evaluation=True)
    _one_line_error(excinfo, str(path), f"annotation id {aid!r} of image id {ann['image_id']} is not a non-zero "
                    "integer", "Number the annotations from 1")

def test_ids_that_are_not_integers_are_refused_in_one_line(tmp_path, coco_canvases):
    """pycocotools' evaluation compares the detections' integer ids with the json's as they are: a
    text id "3" matches none of them (every AP NaN), so it is refused when the json is read."""
    root, _ = coco_canvases
    good = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    text_categories = dict(good, categories=[dict(c, id=str(c["id"])) for c in good["categories"]],
                           annotations=[dict(a, category_id=str(a["category_id"])) for a in good["annotations"]])
    path = _write_json(tmp_path / "categories.json", text_categories)
    with pytest.raises(DataError) as excinfo:
        CocoDataModule(val_annotations=str(path), val_images=str(root / "val2017"))
    _one_line_error(excinfo, str(path), "(data.val_annotations)", "category id '3' is not an integer (2 more alike)")
    text_image = dict(good, images=[dict(i, id=str(i["id"])) for i in good["images"]],
                      annotations=[dict(a, image_id=str(a["image_id"])) for a in good["annotations"]])
    path = _write_json(tmp_path / "images.json", text_image)
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "val2017", evaluation=True)
    image, ann = good["images"][0], good["annotations"][0]
    _one_line_error(excinfo, str(path), f"image id '{image['id']}' of {image['file_name']} is not an integer")
    text_annotation = dict(good, annotations=[dict(a, category_id=str(a["category_id"])) if a is ann else a
                                              for a in good["annotations"]])
    path = _write_json(tmp_path / "annotation.json", text_annotation)
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "val2017")
    _one_line_error(excinfo, str(path), f"annotation id {ann['id']} has category_id '{ann['category_id']}', "
                    "not an integer")


@pytest.mark.parametrize("field", ["width", "area"])
def test_a_size_or_area_that_is_not_a_number_is_refused_in_one_line(field, tmp_path, coco_canvases):
    root, _ = coco_canvases
    good = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    image, ann = good["images"][0], good["annotations"][0]
    if field == "width":
        edited = dict(good, images=[dict(i, width="64") if i is image else i for i in good["images"]])
        expected = f"image id {image['id']} has size '64'x{image['height']}, expected positive integers"
    else:
        edited = dict(good, annotations=[dict(a, area="big") if a is ann else a for a in good["annotations"]])
        expected = f"annotation id {ann['id']} of image id {ann['image_id']} has area 'big', expected a finite number"
    path = _write_json(tmp_path / f"{field}.json", edited)
    with pytest.raises(DataError) as excinfo:
        CocoDetection(path, root / "val2017")
    _one_line_error(excinfo, str(path), expected)


def test_missing_image_files_raise_or_are_skipped_and_counted(coco_canvases_copy):
    root, truth = coco_canvases_copy
    lost = root / "train2017" / truth["train"][2]["file_name"]
    lost.unlink()
    with pytest.raises(DataError) as excinfo:
        _train(root)
    _one_line_error(excinfo, "1 image file(s)", str(lost), "--data.skip_corrupt true")
    ds = _train(root, skip_corrupt=True)
    assert ds[2] is None and ds[2] is None and ds.skipped == 1
    assert ds[3] is not None



def test_file_names_written_on_windows_name_their_files(coco_canvases_copy):
    """A json exported by an annotation tool on Windows names its images images\\0001.jpg: the images
    are read from images/0001.jpg, not reported missing (nor all skipped with skip_corrupt)."""
    root, truth = coco_canvases_copy
    expected = _train(root)
    names, items = [Path(expected.image_path(i)).name for i in range(len(expected))], list(expected)
    folder = root / "train2017"
    (folder / "images").mkdir()
    ann = root / "annotations" / "instances_train2017.json"
    data = json.loads(ann.read_text())
    for image in data["images"]:
        (folder / image["file_name"]).rename(folder / "images" / image["file_name"])
        image["file_name"] = "images\\" + image["file_name"]
    ann.write_text(json.dumps(data))
    ds = _train(root)
    assert len(ds) == len(items)
    for i, (name, (want_image, want_target)) in enumerate(zip(names, items)):
        assert ds.image_path(i) == str(folder / "images" / name)
        image, target = ds[i]
        assert torch.equal(image, want_image) and torch.equal(target["boxes"], want_target["boxes"])
    (folder / "images" / truth["train"][2]["file_name"]).unlink()  # a file truly missing is still named
    with pytest.raises(DataError) as excinfo:
        _train(root)
    _one_line_error(excinfo, "1 image file(s)", "images\\" + truth["train"][2]["file_name"])


def test_file_names_in_other_accents_than_the_files_name_their_files(coco_canvases_copy):
    """A json written on Linux names 'café 0.jpg' with a composed é; the folder, copied through macOS, holds
    it decomposed (e + a combining accent). Every image was missing (or, with skip_corrupt, all skipped);
    they are read, with their boxes, and a file truly missing is still named."""
    import unicodedata

    root, truth = coco_canvases_copy
    expected = list(_train(root))
    folder, ann = root / "train2017", root / "annotations" / "instances_train2017.json"
    data = json.loads(ann.read_text())
    for n, image in enumerate(data["images"]):
        name = f"café {n}.jpg"
        (folder / image["file_name"]).rename(folder / unicodedata.normalize("NFD", name))
        image["file_name"] = unicodedata.normalize("NFC", name)
    ann.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    ds = _train(root)
    assert len(ds) == len(expected)
    for i, (want_image, want_target) in enumerate(expected):
        assert ds.image_path(i) == str(folder / unicodedata.normalize("NFD", f"café {i}.jpg"))
        image, target = ds[i]
        assert torch.equal(image, want_image) and torch.equal(target["boxes"], want_target["boxes"])
    (folder / unicodedata.normalize("NFD", "café 2.jpg")).unlink()
    with pytest.raises(DataError) as excinfo:
        _train(root)
    _one_line_error(excinfo, "1 image file(s)", "café 2.jpg")


def test_corrupt_images_raise_or_are_skipped_and_counted_across_workers(coco_canvases_copy):
    root, truth = coco_canvases_copy
    broken = root / "val2017" / truth["val"][1]["file_name"]
    broken.write_bytes(b"\x89PNG garbage, not an image" * 10)
    with pytest.raises(DataError) as excinfo:
        CocoDataModule(root=str(root), num_workers=0).dataset("val")[1]
    _one_line_error(excinfo, "Cannot decode image", str(broken), "--data.skip_corrupt true")
    dm = CocoDataModule(root=str(root), num_workers=1, eval_batch_size=2, skip_corrupt=True,
                        persistent_workers=False)
    batches = list(dm.val_dataloader())  # decoded in a worker process
    ids = [t["image_id"] for _, ts in batches for t in ts]
    assert ids == [r["id"] for i, r in enumerate(truth["val"]) if i != 1]
    assert [len(images) for images, _ in batches] == [1, 2]
    assert dm.skipped_corrupt == 1  # counted in the worker, visible here


# ----------------------------------------------------------------------------- EXIF orientation


def _retag(path: Path, pixels: np.ndarray, orientation: int) -> None:
    """Rewrite the PNG ``path`` as ``pixels`` with an EXIF orientation."""
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    Image.fromarray(np.ascontiguousarray(pixels)).save(path, exif=exif)


def test_exif_orientation_is_applied_where_the_json_gives_the_turned_size_and_counted_where_not(
        coco_canvases_copy, caplog):
    root, truth = coco_canvases_copy
    files = [root / "val2017" / record["file_name"] for record in truth["val"]]
    canvases = [np.asarray(Image.open(f).convert("RGB")) for f in files]  # what the json annotates
    _retag(files[0], np.rot90(canvases[0], 1), 6)  # a camera's sideways pixels: turned, the json's size
    _retag(files[3], np.rot90(canvases[3], 2), 3)  # upside down: the same size either way, turned
    _retag(files[1], canvases[1], 8)  # turned it would not have the json's size: annotated as stored
    dm = CocoDataModule(root=str(root), num_workers=1, eval_batch_size=2, persistent_workers=False)
    batches = list(dm.val_dataloader())  # decoded in a worker process
    images = [image for batch, _ in batches for image in batch]
    targets = [target for _, batch in batches for target in batch]
    assert len(images) == len(truth["val"])
    for image, target, canvas, record in zip(images, targets, canvases, truth["val"]):
        pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(pixels, canvas, err_msg=record["file_name"])
        assert target["boxes"].tolist() == [o["box"] for o in record["objects"]]
        outside = np.ones(canvas.shape[:2], dtype=bool)  # the digits lie in their boxes, black around them
        for x1, y1, x2, y2 in target["boxes"].int().tolist():
            outside[y1:y2, x1:x2] = False
        assert pixels[outside].max() < 16 and pixels[~outside].max() > 100  # (JPEG's ringing stays below 16)
        for mask, obj in zip(target["masks"], record["objects"]):
            assert torch.equal(mask.bool(), torch.from_numpy(obj["mask"]))
    assert dm.dataset("val").kept_as_stored == 1  # counted in the worker, visible here
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.data"):
        dm.teardown("validate")
        dm.teardown("validate")  # nothing new met: said once
    (line,) = [r.getMessage() for r in caplog.records if r.name == "rescale_tasks.detection.data"]
    assert "1 image(s) kept without their EXIF orientation" in line and str(files[1]) in line


def test_predict_covers_every_image_whatever_keep_empty_eval(coco_canvases, tmp_path):
    """With --data.keep_empty_eval false, predict on the validation json had left its images without
    boxes out of coco_results.predict.json, and refused an image-info json (no boxes at all)."""
    root, truth = coco_canvases
    val = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    boxless = val["images"][0]["id"]
    val_json = _write_json(tmp_path / "val.json", dict(val, annotations=[a for a in val["annotations"]
                                                                          if a["image_id"] != boxless]))
    info = _write_json(tmp_path / "info.json", {k: v for k, v in val.items() if k != "annotations"})
    folder = str(root / "val2017")
    dm = CocoDataModule(val_annotations=str(val_json), val_images=folder, keep_empty_eval=False, num_workers=0)
    assert boxless not in dm.dataset("val").image_ids and dm.dataset("test") is dm.dataset("val")
    assert dm.dataset("predict").image_ids == [image["id"] for image in truth["val"]]
    dm = CocoDataModule(val_annotations=str(val_json), val_images=folder, predict_annotations=str(info),
                        predict_images=folder, keep_empty_eval=False, num_workers=0)
    assert len(dm.dataset("predict")) == len(truth["val"])
