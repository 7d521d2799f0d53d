"""`rescale validate|test|predict --ckpt_path X --model.init_args.<arg> V` on the video task runs
with what was typed, not with the checkpoint's saved hyper-parameters, which
Lightning's CLI would put in its place."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_video_cli import tiny_config

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory, kinetics_clips, fit_checkpoint) -> tuple[Path, Path]:
    """(config, checkpoint) of a 1-step tiny R3D-18 run."""
    folder = tmp_path_factory.mktemp("video_ckpt")
    config = tiny_config(folder / "tiny.yaml", kinetics_clips)
    ckpt = fit_checkpoint(folder, ["--config", str(config), "--trainer.max_steps", "1", "--trainer.limit_val_batches",
                                  "0", "--trainer.logger.init_args.save_dir", str(folder / "runs")])
    return config, ckpt


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.parametrize("command", ["validate", "test"])
def test_evaluation_runs_with_the_arguments_typed(trained, command):
    config, ckpt = trained
    assert main([command, "--config", str(config), "--ckpt_path", str(ckpt), "--model.init_args.plan", "reference",
                 "--model.init_args.label_smoothing", "0.2", "--trainer.limit_val_batches", "1",
                 "--trainer.limit_test_batches", "1"]) == 0
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert run.config["plan"] == "reference" and run.config["label_smoothing"] == 0.2  # as the module was built


def test_the_network_cannot_change_with_a_checkpoint(trained, error_line):
    config, ckpt = trained
    assert main(["test", "--config", str(config), "--ckpt_path", str(ckpt),
                 "--model.init_args.network_options", "{base_width: 8}"]) == 2
    line = error_line()
    assert "differ in network_options" in line and "cannot change with a checkpoint" in line
