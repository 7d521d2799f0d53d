"""Corrupt images through the whole `rescale fit` run: a clear stop, or skipped, counted, reported."""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


def _fit(root: Path, *extra: str) -> int:
    return main(["fit", "--config", str(EXPERIMENTS / "imagenet/rescale50.yaml"),
                 "--model.init_args.network_options", "{base_width: 8}",
                 "--data.root", str(root), "--data.num_classes", "3", "--data.image_size", "32",
                 "--data.eval_resize", "36", "--data.batch_size", "4", "--data.num_workers", "0",
                 "--trainer.max_epochs", "1", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
                 "--trainer.enable_progress_bar", "false", *extra])


@pytest.fixture
def corrupt(imagenet_folder: Path) -> Path:
    good = imagenet_folder / "train/n002/n002_0.JPEG"
    (imagenet_folder / "train/n002/broken.JPEG").write_bytes(good.read_bytes()[:200])  # truncated
    (imagenet_folder / "val/n003/garbage.jpg").write_bytes(b"this is not an image")
    return imagenet_folder


def test_corrupt_image_stops_the_run_with_one_line(corrupt, capsys):
    assert _fit(corrupt) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "garbage.jpg" in lines[0] and "--data.skip_corrupt true" in lines[0]  # (sanity check first)


def test_corrupt_images_are_skipped_counted_and_reported(corrupt):
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt input file\(s\)"):
        assert _fit(corrupt, "--data.skip_corrupt", "true") == 0
    (run,) = [read_offline_run(r) for r in find_offline_runs("runs")]
    assert run.metric("data/skipped_corrupt")[-1] == 2  # the train and the val file


def test_the_counts_are_logged_once_a_step_at_the_epoch_s_own_step(corrupt):
    """The counts of a validation and of its epoch's end land at the step W&B records that epoch's
    metrics at (Lightning: optimizer step k at k - 1), once, never past the run's last step."""
    with pytest.warns(UserWarning, match=r"skipped 2 corrupt input file\(s\)"):
        assert _fit(corrupt, "--data.skip_corrupt", "true", "--trainer.max_epochs", "2",
                    "--model.init_args.network", "cifar_resnet",  # the smallest network will do
                    "--model.init_args.network_options", "{depth: 8, base_width: 4}") == 0
    (run,) = [read_offline_run(r) for r in find_offline_runs("runs")]
    steps = lambda key: [row["trainer/global_step"] for row in run.history if key in row]  # noqa: E731
    assert steps("data/skipped_corrupt") == steps("train/loss_epoch") == steps("val/loss") == [2, 5]
    assert steps("data/unread_files") == [2, 5]
    assert max(row["trainer/global_step"] for row in run.history) == 5
