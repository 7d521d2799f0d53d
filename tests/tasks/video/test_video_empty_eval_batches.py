"""A validation or predict batch made only of bad videos (a zero-byte mp4 and a text file renamed
``.avi``) is skipped, its files counted, and the scores are those of the videos that were read: the
same as on the folder without the bad files (rescale_tasks.common.data.empty_batches), where an empty
batch reaching the metrics would end ``rescale predict`` in ``cannot reshape tensor of 0
elements``."""
from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.common.run import SkippedDataReport
from rescale_tasks.video.data import KineticsDataModule
from rescale_tasks.video.module import VideoClassificationModule


def _data(root: Path, clips) -> KineticsDataModule:
    tiny = clips.tiny
    return KineticsDataModule(root=str(root), preset=None, frames=tiny["frames"], stride=tiny["stride"],
                              train_short_side=tiny["train_short_side"], crop=tiny["crop"],
                              test_short_side=tiny["test_short_side"], num_clips=1, num_crops=1,
                              eval_batch_size=2, num_workers=0, pin_memory=False, persistent_workers=False)


def _trainer(folder: Path) -> L.Trainer:
    """A trainer without a logger writes its data report (data_problems.tsv) to ``folder``."""
    return L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[SkippedDataReport()],
                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                     default_root_dir=folder)


def test_a_batch_of_bad_videos_is_skipped_at_validation_and_prediction(kinetics_clips, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(kinetics_clips.root, root)
    folder = root / "val" / kinetics_clips.classes[0]  # sorted first there: the first batch of two
    (folder / "aa_empty.mp4").write_bytes(b"")
    (folder / "aa_notes.avi").write_text("these are notes, not a video\n")
    L.seed_everything(0)
    module = VideoClassificationModule("r3d_18", "skipinit", network_options={"base_width": 4},
                                       num_classes=len(kinetics_clips.classes))

    [expected] = _trainer(tmp_path).validate(module, datamodule=_data(kinetics_clips.root, kinetics_clips))
    data = _data(root, kinetics_clips)
    with pytest.warns(UserWarning, match=r"data problems: 2 file\(s\) \("):
        [metrics] = _trainer(tmp_path).validate(module, datamodule=data)
    assert data.skipped_corrupt == 2
    assert metrics["val/videos"] == len(kinetics_clips.val)  # the good ones, each once
    assert metrics == pytest.approx(expected, rel=1e-5)

    with pytest.warns(UserWarning, match=r"data problems: 2 file\(s\) \("):
        predictions = _trainer(tmp_path).predict(module, datamodule=_data(root, kinetics_clips))
    assert predictions[0] is None  # the bad batch: no prediction
    clean = _trainer(tmp_path).predict(module, datamodule=_data(kinetics_clips.root, kinetics_clips))
    assert torch.allclose(torch.cat([p["probs"] for p in predictions[1:]]),
                          torch.cat([p["probs"] for p in clean]), atol=1e-6)
