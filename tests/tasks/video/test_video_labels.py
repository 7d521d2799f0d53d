"""A video checkpoint carries its class list; evaluation matches it to the data's by name: the
same classes in another order are mapped (the same scores), other classes are refused in one
line, and checkpoints that kept the list in the data module's state are matched the same way."""
from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.common.errors import DataError
from rescale_tasks.video.data import KineticsDataModule
from rescale_tasks.video.module import VideoClassificationModule


def _data(clips, root: Path) -> KineticsDataModule:
    return KineticsDataModule(root=str(root), preset=None, **clips.tiny, val_clips=1, val_crops=1, batch_size=3,
                              eval_batch_size=3, num_workers=0, pin_memory=False, persistent_workers=False)


def _module(num_classes: int) -> VideoClassificationModule:
    return VideoClassificationModule("r3d_18", "rescale", network_options={"base_width": 4}, num_classes=num_classes,
                                     optimizer=lambda p: torch.optim.SGD(p, lr=0.05))


@pytest.fixture(scope="module")
def trained(kinetics_clips, tmp_path_factory, cpu_trainer) -> Path:
    """A checkpoint of 2 training steps on the clips' class folders (bikes, bunny, carphone)."""
    data = _data(kinetics_clips, kinetics_clips.root)
    L.seed_everything(0)
    trainer = cpu_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(_module(data.num_classes), data)
    ckpt = tmp_path_factory.mktemp("video_labels") / "two_steps.ckpt"
    trainer.save_checkpoint(ckpt)
    return ckpt


def _validate(cpu_trainer, clips, root: Path, ckpt: Path) -> dict[str, float]:
    data = _data(clips, root)
    return cpu_trainer().validate(_module(data.num_classes), data, ckpt_path=str(ckpt), verbose=False)[0]


def test_a_checkpoint_carries_its_class_list(kinetics_clips, trained):
    labels = torch.load(trained, map_location="cpu", weights_only=True)["labels"]
    assert labels == {"class_names": kinetics_clips.classes}


@pytest.mark.parametrize("entry", ["labels", "KineticsDataModule"])  # the latter: older checkpoints
def test_the_same_classes_in_another_order_score_the_same(kinetics_clips, trained, tmp_path, capsys, entry,
                                                         reordered_checkpoint, cpu_trainer):
    original = _validate(cpu_trainer, kinetics_clips, kinetics_clips.root, trained)
    reordered = reordered_checkpoint(trained, tmp_path / "reordered.ckpt", kinetics_clips.classes, [1, 2, 0],
                                     entry=entry)
    capsys.readouterr()
    scores = _validate(cpu_trainer, kinetics_clips, kinetics_clips.root, reordered)
    assert scores["val/loss"] == pytest.approx(original["val/loss"], rel=1e-5)
    assert scores == pytest.approx(original, rel=1e-5)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("labels: ")]
    assert len(notes) == 1 and "in another order" in notes[0]


def test_a_renamed_class_is_refused_in_one_line(kinetics_clips, trained, tmp_path, cpu_trainer):
    renamed = Path(shutil.copytree(kinetics_clips.root, tmp_path / "renamed"))
    for split in ("train", "val"):
        (renamed / split / "bunny").rename(renamed / split / "zebra")
    with pytest.raises(DataError) as err:
        _validate(cpu_trainer, kinetics_clips, renamed, trained)
    message = str(err.value)
    assert "\n" not in message and "not in the data: 'bunny'; not in the checkpoint: 'zebra'" in message
    assert f"checkpoint {trained}" in message and "Point --data.root at the data" in message


def test_a_val_folder_lacking_a_class_names_the_class_not_the_class_count(kinetics_clips, trained, tmp_path,
                                                                          cpu_trainer):
    """An evaluation machine whose val/ (alone) lost the 'bunny' folder: the data names 2 classes,
    the model built from it 2, the checkpoint 3; the line named num_classes and said to run with
    the config the checkpoint was trained with. It names the class the data lacks."""
    lacking = Path(shutil.copytree(kinetics_clips.root / "val", tmp_path / "lacking" / "val")).parent
    shutil.rmtree(lacking / "val" / "bunny")
    with pytest.raises(DataError) as err:
        _validate(cpu_trainer, kinetics_clips, lacking, trained)
    message = str(err.value)
    assert "\n" not in message and "not in the data: 'bunny'" in message and "num_classes" not in message
