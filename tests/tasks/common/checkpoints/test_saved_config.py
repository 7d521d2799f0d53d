"""Where the config a checkpoint was trained with is (``common/checkpoints/architecture_match.py``): the fix of
a checkpoint-mismatch line names the file, wherever the run's logger put it."""
from __future__ import annotations

import os
from pathlib import Path

from rescale_tasks.common.checkpoints import saved_config, trained_config_fix


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    return path


def test_the_config_of_a_wandb_run_a_study_point_and_a_csv_run_is_found(tmp_path):
    ckpt = _touch(tmp_path / "runs/rescale-digits/k3x9a0qz/checkpoints/last.ckpt")
    first = _touch(tmp_path / "runs/wandb/offline-run-20260101_120000-k3x9a0qz/files/rescale_config.yaml")
    resumed = _touch(tmp_path / "runs/wandb/offline-run-20260102_090000-k3x9a0qz/files/rescale_config.yaml")
    os.utime(first, (1, 1))
    _touch(tmp_path / "runs/wandb/offline-run-20260103_090000-other/files/rescale_config.yaml")
    assert saved_config(str(ckpt)) == str(resumed)  # the newest start of that run id

    point = _touch(tmp_path / "study/points/d8-bn/checkpoints/p1d2/last.ckpt")
    config = _touch(tmp_path / "study/points/d8-bn/wandb/run-20260101_120000-p1d2/files/rescale_config.yaml")
    assert saved_config(str(point)) == str(config)

    csv = _touch(tmp_path / "logs/lightning_logs/version_3/checkpoints/epoch000.ckpt")
    beside = _touch(tmp_path / "logs/lightning_logs/version_3/rescale_config.yaml")
    assert saved_config(str(csv)) == str(beside)


def test_a_checkpoint_whose_config_is_not_found_gets_where_fit_saves_it(tmp_path):
    ckpt = _touch(tmp_path / "averaged.ckpt")
    assert saved_config(str(ckpt)) is None and saved_config("s3://bucket/last.ckpt") is None
    line = trained_config_fix("Give the --config it was trained with ({config}).", str(ckpt))
    assert "rescale_config.yaml in the run's folder: <save_dir>/wandb/*-<run id>/files/" in line
    assert "{config}" not in line


def test_a_csv_run_with_its_checkpoints_sent_elsewhere_records_where_its_config_is(tmp_path, run_config,
                                                                                   fit_checkpoint):
    """``--last_checkpoint.dirpath p3/ck`` with a CSV logger saving in ``p3``: the config went to the
    logger's version folder, ``p3/.../version_0/``, which nothing beside ``p3/ck`` names, and
    ``saved_config`` found none. The checkpoint records where its run saved the config (``run_config``)."""
    from rescale_tasks.common.checkpoints import peek_checkpoint

    config = run_config(tmp_path / "run.yaml", trainer={"max_steps": 1, "limit_val_batches": 0, "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "p3"}}})
    ckpt = fit_checkpoint(tmp_path, ["--config", config, "--last_checkpoint.dirpath", "p3/ck"])
    assert ckpt == tmp_path / "p3" / "ck" / "last.ckpt"
    [expected] = (tmp_path / "p3").rglob("rescale_config.yaml")  # the logger's version folder
    assert expected.parent.name == "version_0"
    assert peek_checkpoint(str(ckpt)).run_config == str(expected)
    assert saved_config(str(ckpt)) == str(expected) and "max_steps: 1" in expected.read_text()
