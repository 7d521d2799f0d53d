"""`rescale validate|test|predict --ckpt_path X --model.init_args.<arg> V` on the detection task
runs with what was typed: the test-time resize and predict's drawings, which
Lightning's CLI would replace with the checkpoint's saved hyper-parameters; the FPN's width,
which shapes the weights, is refused in one line."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_detection_cli import tiny_config

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory, coco_canvases, fit_checkpoint) -> tuple[Path, Path, Path]:
    """(folder, config, checkpoint) of a 1-step tiny Mask R-CNN run."""
    folder = tmp_path_factory.mktemp("detection_ckpt")
    config = tiny_config(folder / "tiny.yaml", coco_canvases.root)
    ckpt = fit_checkpoint(folder, ["--config", str(config), "--trainer.max_steps", "1", "--trainer.limit_val_batches",
                                  "0", "--trainer.logger.init_args.save_dir", str(folder / "runs")])
    return folder, config, ckpt


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _module_config(folder: str = "runs") -> dict:
    """The hyper-parameters the command's module was built with, as Lightning logged them to W&B."""
    [run] = [read_offline_run(d) for d in find_offline_runs(folder)]
    return run.config


def test_predict_and_validate_run_with_the_arguments_typed(trained, tmp_path):
    _, config, ckpt = trained
    assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt), "--output_dir", "predicted",
                 "--model.init_args.draw_predictions", "2", "--model.init_args.draw_score_threshold", "0.0",
                 "--model.init_args.min_size", "56", "--trainer.logger.init_args.save_dir", "predict_runs"]) == 0
    assert len(list(Path("predicted/predictions").glob("*.png"))) == 2
    built = _module_config("predict_runs")
    assert built["min_size"] == 56 and built["draw_predictions"] == 2 and built["draw_score_threshold"] == 0.0
    assert main(["validate", "--config", str(config), "--ckpt_path", str(ckpt), "--model.init_args.min_size", "52",
                 "--trainer.logger.init_args.save_dir", "validate_runs"]) == 0
    assert _module_config("validate_runs")["min_size"] == 52


def test_the_fpn_width_cannot_change_with_a_checkpoint(trained, error_line):
    _, config, ckpt = trained
    assert main(["test", "--config", str(config), "--ckpt_path", str(ckpt), "--model.init_args.fpn_channels", "32"]) == 2
    line = error_line()
    assert line.startswith(f"--model.init_args.fpn_channels 32 cannot change with --ckpt_path {ckpt}")
    assert "it was saved with fpn_channels=16" in line and "drop --ckpt_path" in line
