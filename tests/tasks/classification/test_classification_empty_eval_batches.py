"""A validation, test or predict batch made only of corrupt files (``data.skip_corrupt``) is skipped,
its files counted, and the metrics are those of the images that were read: the same as on the folder
without the bad files (rescale_tasks.common.data.empty_batches). Passed on, a batch of two holding
only a garbage file and a truncated JPEG would end validation in torchmetrics (``cannot reshape
tensor of 0 elements``)."""
from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.classification.data import ImageFolderDataModule
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.run import SkippedDataReport

BAD = ("a_garbage.jpg", "a_truncated.JPEG")  # sorted first in val/n001: the first batch of two


def _data(root: Path) -> ImageFolderDataModule:
    return ImageFolderDataModule(str(root), num_classes=3, image_size=32, eval_resize=36, batch_size=2,
                                 num_workers=0, pin_memory=False, persistent_workers=False, skip_corrupt=True)


def _trainer(folder) -> L.Trainer:
    """A bare Trainer whose files (predict's predictions) go to ``folder``."""
    return L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[SkippedDataReport()],
                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                     default_root_dir=folder)


def test_a_batch_of_corrupt_files_is_skipped_at_every_evaluation_stage(imagenet_folder, tmp_path):
    clean = tmp_path / "clean"
    shutil.copytree(imagenet_folder, clean)
    good = imagenet_folder / "val/n001/n001_0.JPEG"
    (imagenet_folder / "val/n001" / BAD[0]).write_bytes(b"this is not an image")
    (imagenet_folder / "val/n001" / BAD[1]).write_bytes(good.read_bytes()[:300])
    L.seed_everything(0)
    module = ClassificationModule("cifar_resnet", "skipinit", network_options={"depth": 8, "base_width": 4},
                                  num_classes=3)

    expected = {stage: getattr(_trainer(tmp_path), stage)(module, datamodule=_data(clean))[0]
                for stage in ("validate", "test")}
    for stage in ("validate", "test"):
        data = _data(imagenet_folder)
        with pytest.warns(UserWarning, match=r"skipped 2 corrupt input file\(s\)"):
            [metrics] = getattr(_trainer(tmp_path), stage)(module, datamodule=data)
        assert data.skipped_corrupt == 2
        assert metrics.keys() == expected[stage].keys()
        for name, value in metrics.items():  # over the six images read, as without the bad files
            assert value == pytest.approx(expected[stage][name], rel=1e-5), (stage, name)

    data = _data(imagenet_folder)
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt input file\(s\)"):
        predictions = _trainer(tmp_path).predict(module, datamodule=data)
    assert predictions[0] is None  # the bad batch: no prediction
    probabilities = torch.cat(predictions[1:])
    clean_predictions = torch.cat(_trainer(tmp_path).predict(module, datamodule=_data(clean)))
    assert torch.allclose(probabilities, clean_predictions, atol=1e-6)
