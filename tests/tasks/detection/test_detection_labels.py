"""A detection checkpoint carries the COCO categories (names and ids) its labels stand for;
evaluation on a json that numbers the same categories otherwise maps them by name (the same
detections, written under that json's ids), and a json with other categories is refused in one line."""
from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.common.errors import DataError
from rescale_tasks.common.run import ResultsFolder
from rescale_tasks.detection.data import CocoDataModule
from rescale_tasks.detection.module import RESULTS_FILE, DetectionModule

TINY_DETECTOR = {"rpn_batch_size_per_image": 64, "box_batch_size_per_image": 64, "box_detections_per_img": 20}


def _data(annotations: Path, images: Path, **kwargs) -> CocoDataModule:
    return CocoDataModule(val_annotations=str(annotations), val_images=str(images), masks=False, batch_size=2,
                          eval_batch_size=2, num_workers=0, train_sizes=[48], max_size=64, pin_memory=False,
                          persistent_workers=False, **kwargs)


def _module(num_classes: int) -> DetectionModule:
    return DetectionModule("resnet18", "rescale", network_options={"base_width": 8}, detector="fasterrcnn",
                           num_classes=num_classes, fpn_channels=16, min_size=48, max_size=64,
                           detector_options=TINY_DETECTOR)


@pytest.fixture(scope="module")
def trained(coco_canvases, tmp_path_factory, cpu_trainer) -> tuple[Path, Path]:
    """(val json, checkpoint) of 2 training steps on the canvases (categories 3, 7, 11)."""
    root = coco_canvases.root
    data = _data(root / "annotations/instances_val2017.json", root / "val2017",
                 train_annotations=str(root / "annotations/instances_train2017.json"),
                 train_images=str(root / "train2017"))
    L.seed_everything(0)
    trainer = cpu_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(_module(data.num_classes), data)
    ckpt = tmp_path_factory.mktemp("detection_labels") / "two_steps.ckpt"
    trainer.save_checkpoint(ckpt)
    return root / "annotations/instances_val2017.json", ckpt


def _rewritten(source: Path, path: Path, ids: dict[int, int] | None = None,
               names: dict[str, str] | None = None) -> Path:
    """``source`` with its categories' ids (and every annotation's) replaced per ``ids``, names per ``names``."""
    data = json.loads(source.read_text())
    ids, names = ids or {}, names or {}
    for category in data["categories"]:
        category["id"] = ids.get(category["id"], category["id"])
        category["name"] = names.get(category["name"], category["name"])
    for annotation in data["annotations"]:
        annotation["category_id"] = ids.get(annotation["category_id"], annotation["category_id"])
    path.write_text(json.dumps(data))
    return path


def _test(cpu_trainer, annotations: Path, images: Path, ckpt: Path, output: Path) -> tuple[dict, list[tuple]]:
    """``rescale test``'s metrics and written detections, each as (image id, box, score, category name)."""
    data = _data(annotations, images)
    metrics = cpu_trainer(callbacks=[ResultsFolder(str(output))]).test(
        _module(data.num_classes), data, ckpt_path=str(ckpt), verbose=False)[0]
    name = {c["id"]: c["name"] for c in json.loads(annotations.read_text())["categories"]}
    results = json.loads((output / RESULTS_FILE.format(split="test")).read_text())
    return metrics, sorted((r["image_id"], tuple(round(v, 3) for v in r["bbox"]), round(r["score"], 5),
                            name[r["category_id"]]) for r in results)


def test_a_checkpoint_carries_its_categories(trained):
    _, ckpt = trained
    labels = torch.load(ckpt, map_location="cpu", weights_only=True)["labels"]
    assert labels == {"class_names": ["__background__", "zero", "one", "two"], "ids": [None, 3, 7, 11]}


def test_renumbered_categories_are_mapped_by_name(trained, coco_canvases, tmp_path, capsys, cpu_trainer):
    """The val json with ids 3, 7, 11 exchanged ('two' is now 3, first): the labels, sorted by id,
    come in another order; the same detections must come out, under the new ids."""
    val, ckpt = trained
    images = coco_canvases.root / "val2017"
    original_metrics, original = _test(cpu_trainer, val, images, ckpt, tmp_path / "original")
    renumbered = _rewritten(val, tmp_path / "renumbered.json", ids={3: 7, 7: 11, 11: 3})
    capsys.readouterr()
    metrics, detections = _test(cpu_trainer, renumbered, images, ckpt, tmp_path / "renumbered")
    assert original and {name for *_, name in original} > {"zero"}  # detections of more than one category
    assert detections == original
    assert metrics == pytest.approx(original_metrics, nan_ok=True)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("labels: ")]
    assert len(notes) == 1 and f"the categories of {renumbered}" in notes[0] and "in another order" in notes[0]


def test_other_categories_are_refused_in_one_line(trained, coco_canvases, tmp_path, cpu_trainer):
    val, ckpt = trained
    renamed = _rewritten(val, tmp_path / "renamed.json", names={"two": "deux"})
    with pytest.raises(DataError) as err:
        _test(cpu_trainer, renamed, coco_canvases.root / "val2017", ckpt, tmp_path / "renamed")
    message = str(err.value)
    assert "\n" not in message and "not in the data: 'two'; not in the checkpoint: 'deux'" in message
    assert f"checkpoint {ckpt}" in message and "Point --data.val_annotations at the data" in message


def test_a_val_json_lacking_a_category_names_the_category_not_the_class_count(trained, coco_canvases, tmp_path,
                                                                             cpu_trainer):
    """A val json without category 'two' (and its boxes): the model built from it has num_classes 3,
    the checkpoint 4; the line named num_classes and said to run with the config the checkpoint was
    trained with. It names the category the data lacks."""
    val, ckpt = trained
    data = json.loads(val.read_text())
    data["categories"] = [c for c in data["categories"] if c["name"] != "two"]
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] != 11]
    (tmp_path / "lacking.json").write_text(json.dumps(data))
    with pytest.raises(DataError) as err:
        _test(cpu_trainer, tmp_path / "lacking.json", coco_canvases.root / "val2017", ckpt, tmp_path / "lacking")
    message = str(err.value)
    assert "\n" not in message and "not in the data: 'two'" in message and "num_classes" not in message
