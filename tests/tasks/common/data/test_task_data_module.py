"""Every task's data module is described without setting its data up (``TaskDataModule``)."""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import pytest

from rescale_tasks.classification.data import ClassificationDataModule
from rescale_tasks.common.cli import build_run
from rescale_tasks.common.data import TaskDataModule
from rescale_tasks.detection.data import CocoDataModule
from rescale_tasks.translation.data import TranslationDataModule
from rescale_tasks.video.data import KineticsDataModule

EXPERIMENTS = Path(__file__).resolve().parents[4] / "experiments"


@pytest.mark.parametrize("cls", [ClassificationDataModule, CocoDataModule, KineticsDataModule, TranslationDataModule])
def test_every_task_data_module_is_one(cls):
    assert issubclass(cls, TaskDataModule)


def test_building_a_run_leaves_its_data_as_it_was(offline_in_tmp):
    """jsonargparse writes the data module into a message for each data -> model link it has no
    attribute for (the digits have no vocab_size); Lightning's text of a data module sets the data
    up to count it, so every run loaded its data while it was being built."""
    data = build_run(["--config", str(EXPERIMENTS / "mnist5k/resnet20_bn.yaml")]).datamodule
    assert data.split_indices is None  # nothing loaded
    assert str(data).startswith("MNIST5kDataModule({'batch_size': ")
    assert data.split_indices is None
    L.LightningDataModule.__str__(data)  # what Lightning's own text does
    assert data.split_indices is not None
