"""`rescale predict` on video classification writes a CSV row per video of the predicted split (its
index, file, true class, view count and the top classes the checkpoint names, with their softmax
averaged over all the video's views as the test averages it) where `test` writes (beside the
checkpoint's run, or `--output_dir`), and its closing line names the file. Real clips, with an
unreadable video whose batch holds nothing: skipped, the file whole."""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
import yaml

from rescale_tasks.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory, kinetics_clips) -> tuple[Path, Path, Path]:
    """(video folder, config, checkpoint): one training step of a tiny R3D-18 on the clips; to
    predict, their 3 validation videos and a corrupt file, 3 clips x 3 crops each, one video a batch."""
    folder = tmp_path_factory.mktemp("video_predict")
    root = Path(shutil.copytree(kinetics_clips.root, folder / "videos"))
    shutil.copy(kinetics_clips.bad["corrupt"], root / "val" / kinetics_clips.classes[0] / "zz_corrupt.mp4")
    tiny = kinetics_clips.tiny
    config = folder / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"class_path": "rescale_tasks.video.module.VideoClassificationModule", "init_args": {
            "network": "r3d_18", "scheme": "rescale", "network_options": {"base_width": 4}}},
        "data": {"class_path": "rescale_tasks.video.data.KineticsDataModule", "init_args": {
            "root": str(root), "preset": None, "frames": tiny["frames"], "stride": tiny["stride"],
            "train_short_side": list(tiny["train_short_side"]), "crop": tiny["crop"],
            "test_short_side": tiny["test_short_side"], "num_clips": 3, "num_crops": 3, "batch_size": 2,
            "eval_batch_size": 3, "num_workers": 0, "pin_memory": False, "persistent_workers": False}},
        "trainer": {"max_steps": 1, "limit_val_batches": 0, "accelerator": "cpu", "devices": 1,
                    "enable_progress_bar": False, "enable_model_summary": False, "logger": False,
                    "default_root_dir": str(folder)}}))
    assert main(["fit", "--config", str(config)]) == 0
    [ckpt] = sorted(folder.rglob("last.ckpt"))
    return root, config, ckpt


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_predict_writes_a_row_per_video_with_its_views_averaged(trained, kinetics_clips, capsys):
    root, config, ckpt = trained
    assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt)]) == 0
    written = ckpt.parent.parent / "results" / "last" / "predictions.test.csv"
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(f"; 3 predictions in {written}")
    with open(written, newline="") as f:
        rows = list(csv.DictReader(f))
    videos = [root / "val" / cls / name for name, cls in kinetics_clips.val]
    assert [Path(row["path"]) for row in rows] == videos  # the corrupt video has no row
    for row in rows:
        assert row["label"] == Path(row["path"]).parent.name and row["views"] == "9"  # 3 clips x 3 crops
        names, probs = [row[f"top{i}"] for i in (1, 2, 3)], [float(row[f"top{i}_prob"]) for i in (1, 2, 3)]
        assert sorted(names) == kinetics_clips.classes and sum(probs) == pytest.approx(1.0, abs=1e-5)

    # the same ranking as the test's video-level accuracy; --output_dir puts the file where it says
    assert main(["test", "--config", str(config), "--ckpt_path", str(ckpt)]) == 0
    top1 = float(re.search(r"video top-1 ([0-9.]+)", capsys.readouterr().out).group(1))
    assert top1 == pytest.approx(sum(row["top1"] == row["label"] for row in rows) / len(rows), abs=1e-4)
    assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt), "--output_dir", "out"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("; 3 predictions in out/predictions.test.csv")
    assert Path("out/predictions.test.csv").read_text() == written.read_text()
