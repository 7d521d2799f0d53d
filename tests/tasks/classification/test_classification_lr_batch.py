"""``model.init_args.lr_batch``: the global batch a recipe's lr is set for (the ImageNet recipe's
lr 0.4 at 1024 = 8 devices x 128). A fit at another global batch keeps its lr and says, in one
warning line, the lr the linear scaling rule gives (lr x batch / lr_batch)."""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.classification.data import DigitsDataModule
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.cli.config_files import load_yaml
from rescale_tasks.common.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def fit_one_step(lr_batch, accumulate: int = 1) -> ClassificationModule:
    module = ClassificationModule("cifar_resnet", scheme="rescale", network_options={"depth": 8, "base_width": 4},
                                  num_classes=10, in_channels=1, lr_batch=lr_batch,
                                  optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9))
    trainer = L.Trainer(max_steps=1, limit_val_batches=0, accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        accumulate_grad_batches=accumulate)
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=32))
    return module


def test_a_fit_at_another_global_batch_is_warned_with_the_scaled_lr(caplog):
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.classification.module"):
        module = fit_one_step(lr_batch=256, accumulate=2)
    (line,) = [r.getMessage() for r in caplog.records if "lr_batch" in r.getMessage()]
    assert "lr 0.1 is set for a global batch of 256" in line and "this run's is 64" in line
    assert "--model.init_args.optimizer.init_args.lr 0.025" in line
    assert module.trainer.optimizers[0].defaults["lr"] == 0.1  # the lr stays as configured


def test_the_global_batch_the_lr_is_set_for_and_no_lr_batch_are_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="rescale_tasks.classification.module"):
        fit_one_step(lr_batch=32)
        fit_one_step(lr_batch=None)
    assert not [r for r in caplog.records if "lr_batch" in r.getMessage()]


def test_lr_batch_below_one_is_one_clear_line():
    with pytest.raises(ConfigError, match="lr_batch must be at least 1"):
        ClassificationModule("cifar_resnet", network_options={"depth": 8}, lr_batch=0)


def test_the_imagenet_recipe_names_the_batch_of_its_lr():
    recipe = load_yaml((REPO / "experiments/imagenet/_defaults.yaml").read_text())["model"]["init_args"]
    assert recipe["lr_batch"] == 1024  # lr 0.1 x batch / 256 = 0.4
    assert recipe["optimizer"]["init_args"]["lr"] == pytest.approx(0.1 * recipe["lr_batch"] / 256)
