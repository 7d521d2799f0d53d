"""A wrongly laid out ImageNet folder, seen through the `rescale` command: one `error:` line that
names the folder and the expected layout, exit status 2, no traceback."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rescale_tasks.classification.data import ImageFolderDataModule
from rescale_tasks.cli import main
from rescale_tasks.common.errors import DataError

REPO = Path(__file__).resolve().parents[3]
CONFIG = str(REPO / "experiments/imagenet/resnet50_bn.yaml")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


def fit(root: Path) -> int:
    return main(["fit", "--config", CONFIG, "--data.root", str(root), "--data.num_classes", "3",
                 "--data.image_size", "32", "--data.eval_resize", "36", "--data.batch_size", "4",
                 "--data.num_workers", "0", "--model.init_args.network_options", "{base_width: 8}",
                 "--trainer.fast_dev_run", "1", "--trainer.logger", "false",
                 "--trainer.accelerator", "cpu", "--trainer.devices", "1"])


def test_images_directly_under_train_without_class_folders(tmp_path, imagenet_folder, error_line):
    flat = tmp_path / "flat"
    for split in ("train", "val"):
        (flat / split).mkdir(parents=True)
        for image in (imagenet_folder / split).rglob("*.JPEG"):
            shutil.copy(image, flat / split / image.name)  # no <class>/ level
    assert fit(flat) == 2
    line = error_line()
    assert f"No class folders in {flat / 'train'}" in line and "one sub-folder per class" in line


def test_missing_val_folder(imagenet_folder, error_line):
    shutil.rmtree(imagenet_folder / "val")
    assert fit(imagenet_folder) == 2
    line = error_line()
    assert f"has no val/ sub-folder: expected {imagenet_folder / 'val'}/<class>/<image>" in line


def test_root_holding_class_folders_instead_of_splits(imagenet_folder, error_line):
    """A common mistake: --data.root pointing at train/ itself."""
    assert fit(imagenet_folder / "train") == 2
    assert "has no train/ sub-folder" in error_line()


def test_empty_class_folder(imagenet_folder, error_line):
    for image in (imagenet_folder / "train/n002").iterdir():
        image.unlink()
    (imagenet_folder / "train/n002/notes.txt").write_text("not an image")
    assert fit(imagenet_folder) == 2
    line = error_line()
    assert f"Class folders without images in {imagenet_folder / 'train'}: n002" in line
    assert "Add image files" in line


def test_empty_class_folder_in_the_data_module(imagenet_folder):
    shutil.rmtree(imagenet_folder / "val/n003")
    (imagenet_folder / "val/n003").mkdir()
    dm = ImageFolderDataModule(str(imagenet_folder), num_classes=3, image_size=32, eval_resize=36,
                               batch_size=4, num_workers=0)
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert str(err.value).count("\n") == 0
    assert f"Class folders without images in {imagenet_folder / 'val'}: n003" in str(err.value)
