"""`run_summary.json`: written by every `rescale fit`, read by `rescale compare` and the studies."""
from __future__ import annotations

import json
import math

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.run_summary import find_summaries, read_summary
from rescale_tasks.common.wandb_offline import find_offline_runs


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_fit_writes_its_summary_next_to_its_config(tmp_path, run_config, suite_wandb_logger):
    config = run_config(tmp_path / "run.yaml", trainer={
        "limit_train_batches": 3, "log_every_n_steps": 1, "max_epochs": 2,
        "logger": suite_wandb_logger("rescale-test", "summary", group="digits-tiny")})
    assert main(["fit", "--config", config, "--seed_everything", "7"]) == 0
    (path,) = find_summaries("runs")
    (run_dir,) = find_offline_runs("runs")
    assert path.startswith(str(tmp_path / run_dir)) and (tmp_path / run_dir / "files/rescale_config.yaml").is_file()
    s = read_summary(path)
    assert (s["name"], s["project"], s["group"]) == ("summary", "rescale-test", "digits-tiny")
    assert (s["network"], s["scheme"], s["seed"], s["lr"], s["global_batch"]) == ("cifar_resnet", "rescale", 7, 0.1, 64)
    assert s["status"] == "finished" and s["steps"] == 6 and s["epochs"] == 2 and s["diverged_step"] is None
    assert [step for step, _ in s["curves"]["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [epoch for epoch, _ in s["curves"]["val/acc1"]] == [0, 1]
    assert s["best"]["val/acc1"] == max(v for _, v in s["curves"]["val/acc1"])
    assert s["final"]["val/acc1"] == s["curves"]["val/acc1"][-1][1]
    assert s["samples_per_second"] > 0 and s["checkpoint"].endswith("last.ckpt")


def test_a_diverged_run_says_so(tmp_path, run_config):
    config = run_config(tmp_path / "run.yaml", model={"init_args": {
        "scheme": "none", "network_options": {"depth": 20, "base_width": 8},
        "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 1.0e6}}}},
        trainer={"limit_train_batches": 4, "logger": None})
    summary = str(tmp_path / "elsewhere/run_summary.json")
    assert main(["fit", "--config", config, "--divergence.raise_error", "false", "--run_summary.path", summary]) == 0
    s = read_summary(summary)
    assert s["status"] == "diverged" and s["diverged_step"] is not None
    assert math.isnan(s["final"]["train/loss_step"]) or not math.isfinite(s["curves"]["train/loss"][-1][1])
    json.loads(open(summary).read())  # strict JSON (NaN written as a string)


def test_a_run_without_a_logger_trains_and_still_writes_its_summary(tmp_path, run_config):
    """``trainer.logger: false``: the suite's learning-rate monitor stays quiet (Lightning's own
    refuses to start without a logger) and the summary goes to the root folder."""
    config = run_config(tmp_path / "run.yaml", trainer={"default_root_dir": str(tmp_path / "root")})
    assert main(["fit", "--config", config]) == 0  # TINY_RUN has logger: false
    s = read_summary(str(tmp_path / "root"))
    assert s["status"] == "finished" and s["steps"] == 2 and s["num_classes"] == 10
