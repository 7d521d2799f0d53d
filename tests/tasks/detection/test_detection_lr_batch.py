"""``model.init_args.lr_batch`` for detection: the experiments/coco recipes' lr (0.02, RetinaNet 0.01)
and iterations (90k, steps at 60k/80k) are Detectron2's for 16 images a step (8 GPUs x 2). A fit at
another global batch keeps its lr and says, in one warning line, the lr the linear scaling rule gives
and by how much the iterations scale, as classification's recipes do for theirs."""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.common.cli.config_files import load_yaml
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.detection.data import CocoDataModule
from rescale_tasks.detection.module import DetectionModule

REPO = Path(__file__).resolve().parents[3]
TINY = dict(network="resnet18", scheme="rescale", network_options={"base_width": 8}, detector="fasterrcnn",
            fpn_channels=16, min_size=48, max_size=64,
            detector_options={"rpn_batch_size_per_image": 32, "box_batch_size_per_image": 32})


def fit_one_step(root: Path, lr_batch) -> None:
    data = CocoDataModule(root=str(root), batch_size=2, num_workers=0, train_sizes=[48], max_size=64, masks=False)
    module = DetectionModule(**TINY, num_classes=data.num_classes, lr_batch=lr_batch,
                             optimizer=partial(torch.optim.SGD, lr=0.02, momentum=0.9))
    trainer = L.Trainer(max_steps=1, limit_val_batches=0, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=data)


def test_a_fit_at_another_global_batch_than_the_recipes_is_warned(coco_canvases, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.module"):
        fit_one_step(coco_canvases.root, lr_batch=16)
    (line,) = [r.getMessage() for r in caplog.records if "lr_batch" in r.getMessage()]
    assert "lr 0.02 is set for a global batch of 16" in line and "this run's is 2" in line
    assert "--model.init_args.optimizer.init_args.lr 0.0025" in line and "warmup_iters" in line and "x 8 " in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.detection.module"):
        fit_one_step(coco_canvases.root, lr_batch=2)
    assert not [r for r in caplog.records if "lr_batch" in r.getMessage()]
    with pytest.raises(ConfigError, match="lr_batch must be at least 1"):
        DetectionModule(**TINY, lr_batch=0)


def test_the_coco_recipes_name_the_batch_of_their_lr():
    recipe = load_yaml((REPO / "experiments/coco/_defaults.yaml").read_text())
    assert recipe["model"]["init_args"]["lr_batch"] == 16  # Detectron2's IMS_PER_BATCH: lr 0.02, 90k iterations
    assert recipe["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.02
