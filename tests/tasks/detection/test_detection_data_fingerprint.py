"""The COCO data module's fingerprint (run_summary.json's ``data``): per split its kept images and
a hash of its annotation file, the same for a copy of the data elsewhere, another for other data."""
from __future__ import annotations

import json
import shutil

from rescale_tasks.detection.data import CocoDataModule


def _fingerprint(root) -> dict:
    dm = CocoDataModule(root=str(root), num_workers=0)
    dm.setup("fit")
    return dm.data_fingerprint()


def test_the_fingerprint_follows_the_annotations_not_the_folder(coco_canvases, tmp_path):
    root, truth = coco_canvases
    found = _fingerprint(root)
    assert found["class"] == "CocoDataModule" and found["root"] == str(root)
    assert found["splits"]["val"]["count"] == len(truth["val"]) and len(found["splits"]["val"]["hash"]) == 12
    assert found["splits"]["train"]["count"] == len(truth["train"]) - 1  # keep_empty_train=False
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    moved = _fingerprint(copy)
    assert moved["splits"] == found["splits"] and moved["resolved_root"] != found["resolved_root"]
    annotations = copy / "annotations" / "instances_val2017.json"
    data = json.loads(annotations.read_text())
    data["images"], data["annotations"] = data["images"][:-1], [
        a for a in data["annotations"] if a["image_id"] != data["images"][-1]["id"]]
    annotations.write_text(json.dumps(data))
    fewer = _fingerprint(copy)["splits"]["val"]
    assert fewer["count"] == len(truth["val"]) - 1 and fewer["hash"] != found["splits"]["val"]["hash"]
