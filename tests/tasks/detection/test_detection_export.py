"""`rescale export` on the detection task: torchvision's Mask R-CNN around a tiny rescale ResNet, trained a
step on the digit canvases (see conftest.py). The detector's heads do not export with torch.export (it
says so in one line); the backbone with its FPN is written in every format and checked against PyTorch
on the detector's own batch of real images. COCO evaluation (`rescale test`) computes on the inference
plan."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from rescale_tasks.cli import main
from rescale_tasks.detection.export import HEADS_NOTE
from rescale_tasks.detection.module import DetectionModule

pytestmark = pytest.mark.usefixtures("offline_in_tmp")

TINY = {"network": "resnet18", "scheme": "rescale", "network_options": {"base_width": 8}, "detector": "maskrcnn",
        "fpn_channels": 16, "min_size": 48, "max_size": 64,
        "detector_options": {"head_channels": 8, "fc_dim": 32, "box_detections_per_img": 20}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, coco_canvases, fit_checkpoint) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("detection_export")
    config = folder / "maskrcnn.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"class_path": "rescale_tasks.detection.module.DetectionModule", "init_args": TINY},
        "data": {"class_path": "rescale_tasks.detection.data.CocoDataModule", "init_args": {
            "root": str(coco_canvases.root), "batch_size": 2, "num_workers": 0, "train_sizes": [48], "max_size": 64}},
        "trainer": {"max_steps": 1, "limit_val_batches": 0, "accelerator": "cpu", "devices": 1,
                    "enable_progress_bar": False, "logger": False}}))
    return str(config), fit_checkpoint(folder, ["--config", str(config)])


def test_the_detector_does_not_export_whole():
    """What the one line says: torch.export cannot trace the heads' data-dependent box counts."""
    net = DetectionModule(**TINY, num_classes=4).net.eval()
    with torch.no_grad(), pytest.raises(Exception, match="data-dependent"):
        torch.export.export(net, ([torch.rand(3, 48, 64)],))


def test_the_backbone_exports_in_every_format_and_matches_pytorch(trained, export_files):
    config, ckpt = trained
    written, printed = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "onnx",
                                     "exported-program", "torchscript", "--out", "maskrcnn"])
    assert sorted(written) == ["maskrcnn.onnx", "maskrcnn.pt2", "maskrcnn.torchscript.pt"]
    assert max(written.values()) < 1e-4, written
    assert f"backbone: {HEADS_NOTE}" in printed.splitlines()  # what is not exported, in one line


def test_the_sidecar_names_the_categories_and_the_detectors_transform(trained, export_files, coco_canvases):
    """``maskrcnn.json`` beside the backbone: the class names in the detector's label order (background
    first) with their COCO category ids, and the transform that makes the backbone's input."""
    import json

    config, ckpt = trained
    export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program", "--out", "maskrcnn"])
    meta = json.loads(Path("maskrcnn.json").read_text())
    categories = json.loads(Path(coco_canvases.root, "annotations", "instances_train2017.json").read_text())["categories"]
    assert meta["task"] == "detection" and meta["classes"][0] == "__background__"
    assert dict(zip(meta["classes"][1:], meta["class_ids"][1:])) == {c["name"]: c["id"] for c in categories}
    pre = meta["preprocessing"]
    assert (pre["resize"]["size"], pre["resize"]["max_size"], pre["pad_to_multiple"]) == (48, 64, 32)
    assert pre["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert pre["decode"]["exif_orientation"] == "applied" and pre["decode"]["transparency"] == "composited over white"


def test_coco_evaluation_runs_on_the_inference_plan(trained, frozen_calls):
    config, ckpt = trained
    assert main(["test", "--config", config, "--ckpt_path", str(ckpt), "--output_dir", "results"]) == 0
    assert (Path("results") / "coco_results.test.json").is_file()
    assert frozen_calls and {(grad, training) for _, grad, training in frozen_calls} == {(False, False)}


def _follow_the_sidecar(photo, pre: dict) -> np.ndarray:
    """What a runtime with numpy and PIL makes of ``photo`` (a PIL image) by the sidecar's
    ``preprocessing`` alone: ``[3, H, W]`` float32, the backbone's input."""
    x = np.asarray(photo.convert("RGB"), dtype=np.float64) * pre["pixel_scale"]
    x = (x - np.array(pre["mean"])) / np.array(pre["std"])
    resize, (height, width) = pre["resize"], x.shape[:2]
    if resize["to"] == "shorter side":
        scale = min(resize["size"] / min(height, width), resize["max_size"] / max(height, width))
        rounding = {"floor": math.floor, "round": round}[resize.get("rounding", "round")]
        out_h, out_w = rounding(height * scale), rounding(width * scale)
    else:
        out_h, out_w = resize["size"]
    assert resize["interpolation"] == "bilinear"
    if resize.get("antialias", True):  # PIL's bilinear widens its filter when it shrinks
        x = np.stack([np.asarray(Image.fromarray(x[..., c].astype(np.float32), "F").resize(
            (out_w, out_h), Image.Resampling.BILINEAR)) for c in range(3)], axis=-1)
    else:  # the two nearest pixels per axis, pixel centres at +0.5 (align_corners false)
        for axis, (n_in, n_out) in enumerate(((height, out_h), (width, out_w))):
            at = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, None)
            low = np.minimum(at.astype(int), n_in - 1)
            high, frac = np.minimum(low + 1, n_in - 1), at - low
            shape = [1, 1, 1]
            shape[axis] = n_out
            x = np.take(x, low, axis) * (1 - frac.reshape(shape)) + np.take(x, high, axis) * frac.reshape(shape)
    step = pre["pad_to_multiple"]
    padded = np.zeros((-(-out_h // step) * step, -(-out_w // step) * step, 3))
    padded[:out_h, :out_w] = x
    return padded.transpose(2, 0, 1).astype(np.float32)


def test_a_runtime_following_the_sidecar_makes_the_detectors_input(quokka_coco):
    """The sidecar's preprocessing, followed with numpy and PIL on a real photo (the quokka, shrunk to
    the tiny test size, where an antialiased resize and torchvision's differ most), gives the batch the
    detector's own transform makes of it, within a pixel level; it is read off that transform, so the
    two cannot drift apart (here: a transform built with other sizes and statistics)."""
    module = DetectionModule(**{**TINY, "min_size": 40, "max_size": 56}, num_classes=2).eval()
    module.net.transform.image_mean, module.net.transform.image_std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    pre = module.export_metadata(None, ".", "detector")["preprocessing"]
    assert (pre["resize"]["size"], pre["resize"]["max_size"], pre["mean"]) == (40, 56, [0.5, 0.4, 0.3])
    with Image.open(quokka_coco.image_folder / "quokka.jpg") as photo:
        ours = _follow_the_sidecar(photo, pre)
        image = torch.from_numpy(np.asarray(photo.convert("RGB")).copy()).permute(2, 0, 1)
    with torch.no_grad():
        theirs = module.net.transform([image.float() / 255])[0].tensors[0].numpy()
    assert ours.shape == theirs.shape
    levels = np.abs(ours - theirs) * np.array(pre["std"])[:, None, None] * 255
    assert levels.max() <= 1.0, levels.max()
