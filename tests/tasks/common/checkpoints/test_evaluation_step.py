"""``rescale test|validate --ckpt_path``: the metrics are logged at the step and epoch the
checkpoint was trained to, not at step 0 / epoch 0."""
from __future__ import annotations

import csv

import torch


def _rows(folder):
    (path,) = folder.rglob("metrics.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def test_evaluating_a_checkpoint_logs_at_its_step_and_epoch(tmp_path, monkeypatch, run_config):
    from rescale_tasks.cli import main

    monkeypatch.chdir(tmp_path)
    csv_logger = lambda name: {"class_path": "lightning.pytorch.loggers.CSVLogger",  # noqa: E731
                               "init_args": {"save_dir": str(tmp_path / "csv"), "name": name}}
    config = run_config(tmp_path / "run.yaml", trainer={"logger": csv_logger("fit"), "max_epochs": 2,
                                                        "log_every_n_steps": 1,
                                                        "default_root_dir": str(tmp_path / "root")})
    assert main(["fit", "--config", config]) == 0
    (ckpt,) = (tmp_path / "csv").rglob("last.ckpt")
    saved = torch.load(ckpt, weights_only=False)
    assert saved["global_step"] == 4 and saved["epoch"] == 1
    fit_val = [r for r in _rows(tmp_path / "csv" / "fit") if r.get("val/loss")]
    assert [(r["step"], r["epoch"]) for r in fit_val] == [("1", "0"), ("3", "1")]  # fit's own history

    # where fit's own validation of the checkpoint's weights sits: its last step, counted from 0
    for command in ("test", "validate"):
        argv = [command, "--config", config, "--trainer.logger.init_args.name", command, "--ckpt_path", str(ckpt)]
        assert main(argv) == 0
        (row,) = [r for r in _rows(tmp_path / "csv" / command) if r.get(f"{'val' if command == 'validate' else 'test'}/loss")]
        assert (row["step"], row["epoch"]) == ("3", "1"), row
