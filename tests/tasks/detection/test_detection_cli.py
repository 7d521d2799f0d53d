"""The detection task through the `rescale` CLI on real COCO-format data (digits pasted on
canvases, see conftest.py): fit / validate / test / predict with W&B offline runs, the results
json scored again by pycocotools, a tiny Mask R-CNN that learns the canvases, 2-process DDP
evaluation equal to 1-process, bad input, and every config of experiments/coco/."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.training import IterationMultiStepLR
from rescale_tasks.detection.evaluation import STAT_NAMES
from rescale_tasks.detection.module import DetectionModule

REPO = Path(__file__).resolve().parents[3]
COCO_CONFIGS = sorted(p for p in (REPO / "experiments/coco").glob("*.yaml") if not p.name.startswith("_"))
# narrow heads, few RoIs, images at their own size (48-64 px): a Mask R-CNN step in ~0.1 s
TINY_DETECTOR = {"head_channels": 8, "fc_dim": 32, "rpn_batch_size_per_image": 64,
                 "box_batch_size_per_image": 64, "box_detections_per_img": 20}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def tiny_config(path: Path, root: Path, **model) -> Path:
    config = {
        "model": {"class_path": "rescale_tasks.detection.module.DetectionModule", "init_args": {
            "network": "resnet18", "scheme": "rescale", "network_options": {"base_width": 8},
            "detector": "maskrcnn", "fpn_channels": 16, "min_size": 48, "max_size": 64,
            "detector_options": TINY_DETECTOR,
            "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.005, "momentum": 0.9}},
            **model}},
        "data": {"class_path": "rescale_tasks.detection.data.CocoDataModule", "init_args": {
            "root": str(root), "batch_size": 2, "num_workers": 0, "train_sizes": [48], "max_size": 64,
            "pin_memory": False, "persistent_workers": False}},
        "trainer": {"max_steps": 3, "max_epochs": -1, "accelerator": "cpu", "devices": 1,
                    "enable_progress_bar": False, "num_sanity_val_steps": 0, "log_every_n_steps": 1,
                    "logger": {"class_path": "rescale_tasks.common.reporting.SuiteWandbLogger",
                               "init_args": {"save_dir": "runs", "project": "coco-test"}}},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _runs(folder: str = "runs") -> list:
    return [read_offline_run(d) for d in find_offline_runs(folder)]


def _stats(gt_file: Path, results_file: Path, iou_type: str) -> dict[str, float]:
    """COCOeval's 12 numbers for a results file, by pycocotools alone (mask AP from the masks, as
    Detectron2), -1 as NaN."""
    results = json.loads(results_file.read_text())
    if iou_type == "segm":
        results = [{k: v for k, v in r.items() if k != "bbox"} for r in results]
    gt = COCO(str(gt_file))
    evaluation = COCOeval(gt, gt.loadRes(results), iou_type)
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return {name: math.nan if v == -1 else float(v) for name, v in zip(STAT_NAMES, evaluation.stats)}


def _score(gt_file: Path, results_file: Path, iou_type: str) -> float:
    return _stats(gt_file, results_file, iou_type)["AP"]


def with_found_objects(gt_file: Path, detections: list[dict], path: Path, per_image: int = 2) -> Path:
    """``gt_file`` with, on every image that has objects, the ``per_image`` best of ``detections``
    (non-empty masks) added as objects of their own (box, mask and class as detected), written to
    ``path``: a barely trained model scores far from zero on it, so that two computations of its
    scores agreeing means something (0 == 0 passes whatever either computes)."""
    data = json.loads(gt_file.read_text())
    next_id = max(a["id"] for a in data["annotations"]) + 1
    for image_id in sorted({a["image_id"] for a in data["annotations"] if not a["iscrowd"]}):
        found = sorted((d for d in detections if d["image_id"] == image_id and min(d["bbox"][2:]) >= 1
                        and mask_utils.area(d["segmentation"]) > 0), key=lambda d: -d["score"])[:per_image]
        for d in found:
            data["annotations"].append({"id": next_id, "image_id": image_id, "category_id": d["category_id"],
                                        "iscrowd": 0, "bbox": d["bbox"], "segmentation": d["segmentation"],
                                        "area": float(mask_utils.area(d["segmentation"]))})
            next_id += 1
    path.write_text(json.dumps(data))
    return path


def test_fit_validate_test_predict_through_the_cli(coco_canvases, tmp_path, capsys, summary_matches_wandb):
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root)
    assert main(["fit", "--config", str(config), "--trainer.val_check_interval", "3"]) == 0
    [run] = _runs()
    assert run.config["model"]["init_args"]["detector"] == "maskrcnn"
    for key in ("val/bbox_AP", "val/bbox_AP50", "val/segm_AP", "val/segm_APs", "train/loss_mask"):
        assert run.metric(key), key  # COCO metrics logged to W&B at validation
    summary_matches_wandb("runs")  # the run summary holds the validation W&B received
    [ckpt] = sorted(Path("runs").rglob("last.ckpt"))

    assert main(["validate", "--config", str(config), "--ckpt_path", str(ckpt)]) == 0

    # drawing is asked for at predict time (the command line wins over the checkpoint's hyper-parameters);
    # --output_dir puts the results where it says
    capsys.readouterr()
    assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt), "--output_dir", "predicted",
                 "--model.init_args.draw_predictions", "2"]) == 0
    predicted = Path("predicted/coco_results.predict.json")
    drawn = sorted(predicted.parent.glob("predictions/*.png"))
    assert len(drawn) == 2 and drawn[0].read_bytes()[:4] == b"\x89PNG"
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"detections in {predicted}, 2 drawn images in predicted/predictions; next:" in closing, closing

    # tested on the validation set plus objects where the model finds them: scores far from zero
    gt = with_found_objects(coco_canvases.root / "annotations" / "instances_val2017.json",
                            json.loads(predicted.read_text()), tmp_path / "found.json")
    capsys.readouterr()
    assert main(["test", "--config", str(config), "--ckpt_path", str(ckpt),
                 "--data.init_args.val_annotations", str(gt)]) == 0
    printed = capsys.readouterr().out
    # the results land beside the run that wrote the checkpoint, not in the test command's new run
    folder = ckpt.parent.parent / "results" / "last"
    results = folder / "coco_results.test.json"
    assert f"written to {results.resolve()} (COCO results format)" in printed
    assert [p.name for p in Path("runs").rglob("coco_results.test.json")] == [results.name]
    [test_run] = [r for r in _runs() if "test/bbox_AP" in r.summary]
    categories = {c["id"] for c in json.loads(gt.read_text())["categories"]}
    detections = json.loads(results.read_text())
    assert detections and {d["category_id"] for d in detections} <= categories
    assert all(len(d["bbox"]) == 4 and isinstance(d["segmentation"]["counts"], str) for d in detections)
    # the file scores, by pycocotools alone, what the run logged
    for iou_type in ("bbox", "segm"):
        logged = test_run.summary[f"test/{iou_type}_AP"]
        assert logged > 0.1 and _score(gt, results, iou_type) == pytest.approx(logged, abs=1e-6), (iou_type, logged)
    assert json.loads(predicted.read_text()) == detections  # the same model, the same images


def test_a_tiny_mask_rcnn_learns_the_canvases(coco_canvases, fit_then_validate):
    """Trained and evaluated on the same 8 canvases: it learns them, not just runs."""
    from rescale_tasks.detection.data import CocoDataModule

    root = coco_canvases.root
    train = (str(root / "annotations/instances_train2017.json"), str(root / "train2017"))
    data = CocoDataModule(train_annotations=train[0], train_images=train[1], val_annotations=train[0],
                          val_images=train[1], batch_size=4, num_workers=0, train_sizes=[48], max_size=64,
                          pin_memory=False, persistent_workers=False)
    module = DetectionModule("resnet18", "rescale", network_options={"base_width": 8}, detector="maskrcnn",
                             num_classes=data.num_classes, fpn_channels=16, min_size=48, max_size=64,
                             detector_options=TINY_DETECTOR,
                             optimizer=lambda p: torch.optim.AdamW(p, lr=0.006, weight_decay=0.0))
    scores = fit_then_validate(module, data, steps=100)
    assert scores["val/bbox_AP50"] > 0.85 and scores["val/segm_AP50"] > 0.85, scores
    mean_shift = [m for m in module.net.backbone.modules() if type(m).__name__ == "MeanShiftBias"]
    assert mean_shift and all(not m.measuring for m in mean_shift)  # measured on the first batches


def _logged(folder: Path) -> dict[str, float]:
    """The last row's values of a CSVLogger's metrics.csv under ``folder``."""
    [path] = sorted(folder.rglob("metrics.csv"))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: float(v) for row in rows for k, v in row.items() if v != ""}


@pytest.mark.ddp
def test_two_process_evaluation_equals_one_process_and_cocoeval(coco_canvases, tmp_path, rescale_processes):
    """`rescale test` with 2 CPU processes (gloo) writes the same detections and logs the same AP
    as with one: images are merged by id, the sampler's padding counts once. The evaluation set is
    the canvases' train split (crowd regions, RLE and polygon masks, an empty image, a degenerate
    box, non-contiguous ids) plus objects where the model finds them (its scores are far from zero);
    every logged number is COCOeval's on the written file against the json."""
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root)
    assert main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.logger", "false",
                 "--trainer.default_root_dir", "one"]) == 0
    [ckpt] = sorted(Path("one").rglob("last.ckpt"))
    root = coco_canvases.root
    train_split = ["--data.init_args.val_annotations", str(root / "annotations" / "instances_train2017.json"),
                   "--data.init_args.val_images", str(root / "train2017")]
    assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt), *train_split,
                 "--trainer.logger", "false", "--output_dir", "found"]) == 0
    annotation_file = with_found_objects(root / "annotations" / "instances_train2017.json",
                                         json.loads(Path("found/coco_results.predict.json").read_text()),
                                         tmp_path / "found.json")
    evaluation_set = ["--data.init_args.val_annotations", str(annotation_file),
                      "--data.init_args.val_images", str(root / "train2017")]
    outputs = {}
    for devices in (1, 2):
        folder = tmp_path / f"test{devices}"
        rescale_processes(["test", "--config", str(config), "--ckpt_path", str(ckpt), *evaluation_set,
                           "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                           "--trainer.logger.init_args.save_dir", str(folder), "--output_dir", str(folder)], devices)
        outputs[devices] = json.loads((folder / "coco_results.test.json").read_text())
        logged = _logged(folder)
        for iou_type in ("bbox", "segm"):
            official = _stats(annotation_file, folder / "coco_results.test.json", iou_type)
            assert official["AP"] > 0.1 and official["AR100"] > 0.1, (devices, iou_type, official)
            for name, value in official.items():
                mine = logged.get(f"test/{iou_type}_{name}", math.nan)
                assert (math.isnan(value) and math.isnan(mine)) or abs(mine - value) <= 1e-6, \
                    (devices, iou_type, name, mine, value)
    images = {d["image_id"] for d in outputs[1]}
    assert len(images) >= 3 and outputs[2] == outputs[1]


def test_a_missing_annotation_file_is_one_line_and_exit_2(coco_canvases, tmp_path, capsys):
    config = tiny_config(tmp_path / "tiny.yaml", tmp_path / "nowhere")
    assert main(["fit", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nowhere" in err[0] and "data.root" in err[0]


def test_a_missing_backbone_checkpoint_is_one_line(coco_canvases, tmp_path, capsys):
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root, backbone_checkpoint="gone.ckpt")
    assert main(["fit", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gone.ckpt" in err[0] and "model.init_args.backbone_checkpoint" in err[0]


def test_mask_rcnn_on_data_without_masks_is_one_line_and_exit_2(coco_canvases, tmp_path, capsys):
    """data.masks false (a box-only json) under a Mask R-CNN: one line saying which setting to
    change, not torchvision's traceback at the first step; evaluating that way stays fine (the
    masks are scored against the json's)."""
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root)
    assert main(["fit", "--config", str(config), "--trainer.logger", "false", "--data.init_args.masks", "false"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: model.detector maskrcnn trains on instance masks")
    assert "--data.init_args.masks true" in errors[0] and not list(tmp_path.rglob("*.ckpt"))


def test_a_missing_backbone_checkpoint_stops_before_any_data_work(tmp_path, error_line):
    """The annotation files are not JSON: had the data module read them, their error would come
    first. The line names the path and how to train the backbone from scratch instead."""
    root = tmp_path / "coco"
    for split in ("train2017", "val2017"):
        (root / split).mkdir(parents=True)
    (root / "annotations").mkdir()
    for name in ("instances_train2017.json", "instances_val2017.json"):
        (root / "annotations" / name).write_text("not json: the data module must not read this")
    config = tiny_config(tmp_path / "tiny.yaml", root, backbone_checkpoint="checkpoints/imagenet/rescale50.ckpt")
    assert main(["fit", "--config", str(config)]) == 2
    assert error_line() == (
        "backbone checkpoint not found: checkpoints/imagenet/rescale50.ckpt (model.init_args.backbone_checkpoint, "
        f"relative to {tmp_path}); pass a .ckpt written by `rescale fit` of the classification task, or set "
        "backbone_checkpoint: null (--model.init_args.backbone_checkpoint null) to train the backbone from scratch")


def test_backbone_checkpoint_null_trains_from_scratch(coco_canvases, tmp_path):
    """What the line above suggests: the same config with --model.init_args.backbone_checkpoint null."""
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root, backbone_checkpoint="gone.ckpt")
    cli = run_lightning(["--config", str(config), "--model.init_args.backbone_checkpoint", "null"], run=False)
    assert cli.model.hparams.backbone_checkpoint is None


def test_the_backbone_starts_from_a_classification_checkpoint(classification_checkpoint):
    """A `rescale fit` checkpoint of the same network and scheme initialises the backbone (weights
    and RescaleNet's finished mean-shift measurement), FrozenBN and 3 trainable stages by default."""
    net, path = classification_checkpoint("resnet18", scheme="rescale", base_width=8, num_classes=10)
    module = DetectionModule("resnet18", "rescale", network_options={"base_width": 8}, num_classes=4,
                             fpn_channels=16, detector_options=TINY_DETECTOR, backbone_checkpoint=str(path))
    body = module.net.backbone.body
    assert torch.equal(body.conv1.weight, net.conv1.weight) and torch.equal(body.bn1.mu0, net.bn1.mu0)
    assert not body.bn1.measuring
    assert not any(p.requires_grad for p in body.layer1.parameters())
    assert all(p.requires_grad for p in body.layer2.parameters())


def test_the_comparison_grid_is_there():
    names = {p.stem for p in COCO_CONFIGS}
    backbones = ("bn", "gn", "rescale50", "fixup50", "skipinit50", "nf")
    expected = {f"{d}_r50_fpn_1x_{b}" for d in ("maskrcnn", "fasterrcnn", "retinanet") for b in backbones}
    assert names == expected | {"maskrcnn_r50_fpn_3x_gn_scratch"}


@pytest.mark.slow
@pytest.mark.parametrize("config", COCO_CONFIGS, ids=lambda p: p.stem)
def test_every_coco_config_builds_its_recipe(config, coco_canvases):
    """Each config of experiments/coco/ builds its detector and the Detectron2 1x/3x recipe (the
    ImageNet checkpoint it names is left out: there is none here). Built on the meta device, as
    the classification configs are: the full-size detector's modules, no weights filled."""
    with torch.device("meta"):
        cli = run_lightning(["fit", "--config", str(config), "--data.init_args.root", str(coco_canvases.root),
                             "--model.init_args.backbone_checkpoint", "null"], run=False)
    module, data = cli.model, cli.datamodule
    stem = config.stem
    detector, _, _, schedule, backbone = stem.split("_", 4)
    assert module.hparams.detector == detector and module.hparams.num_classes == data.num_classes == 4
    assert type(module.net).__name__ == {"maskrcnn": "MaskRCNN", "fasterrcnn": "FasterRCNN",
                                         "retinanet": "RetinaNet"}[detector]
    scheme = {"bn": "bn", "gn": "gn", "gn_scratch": "gn"}.get(backbone, backbone.rstrip("0123456789"))
    assert module.scheme_name == scheme
    assert module.hparams.heads_norm == ("gn" if scheme == "gn" else None)
    named = yaml.safe_load(config.read_text())["model"]["init_args"].get("backbone_checkpoint")
    assert (named is None) == (backbone == "gn_scratch")  # every 1x run starts from ImageNet
    # built without its checkpoint (route 2, docs/tasks/detection.md): every stage trains and BN with it,
    # not FrozenBatchNorm2d at its initial values on a frozen random stem
    body = module.net.backbone.body
    assert all(p.requires_grad for p in body.parameters())
    assert not [m for m in body.modules() if type(m).__name__ == "FrozenBatchNorm2d"]
    optimizer = module.optimizer_factory(module.net.parameters())
    assert optimizer.defaults["lr"] == (0.01 if detector == "retinanet" else 0.02)
    assert module.hparams.norm_weight_decay == 0.0 and optimizer.defaults["weight_decay"] == 1e-4
    scheduler = module.scheduler_factory(optimizer, steps_per_epoch=1, max_epochs=None)
    assert isinstance(scheduler, IterationMultiStepLR) and scheduler.warmup_iters == 1000
    total = cli.trainer.max_steps
    assert (total, scheduler.milestones) == ((270000, [210000, 250000]) if schedule == "3x"
                                             else (90000, [60000, 80000]))
    assert list(data.train_sizes) == [640, 672, 704, 736, 768, 800] and data.max_size == 1333
    assert module.hparams.min_size == 800 and math.isclose(module.net.transform.max_size, 1333)


def test_compile_compiles_the_backbone_with_its_fpn():
    module = DetectionModule("resnet18", scheme="rescale", network_options={"base_width": 8}, num_classes=4,
                             fpn_channels=16, min_size=48, max_size=64, detector_options=TINY_DETECTOR, compile=True)
    assert module.net.backbone._compiled_call_impl is not None and module.net._compiled_call_impl is None


def test_mixed_precision_fit(fit_at_precision, coco_canvases, tmp_path):
    """A Mask R-CNN on a RescaleNet backbone trained and COCO-evaluated under autocast (bf16; on a
    GPU also fp16 with gradient scaling), eager and compiled: finite losses, AP and weights."""
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root)
    fit_at_precision(["--config", str(config), "--trainer.max_steps", "-1", "--trainer.max_epochs", "1",
                      "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"], steps=3,
                     undefined=r"_A[PR][sml]$")  # COCO's -1 (read as NaN): no object of that size


def test_a_test_size_other_than_the_training_cap_runs_and_logs_both(coco_canvases, tmp_path):
    """model.max_size (the test-time long side) and data.max_size (the training resize's cap) are two
    settings of one name: a run with them apart trains instead of stopping in Lightning's merge of
    the hyper-parameters for the loggers, which get the model's under the flat name."""
    config = tiny_config(tmp_path / "tiny.yaml", coco_canvases.root, max_size=72)
    assert main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
                 "--data.init_args.max_size", "60", "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                 "--trainer.logger.save_dir", "csv"]) == 0
    [logged] = Path("csv").rglob("hparams.yaml")
    lines = logged.read_text().splitlines()  # flat, as Lightning merged them (config paths as python objects)
    assert "max_size: 72" in lines and "min_size: 48" in lines and f"root: {coco_canvases.root}" in lines
