"""A ``fit --ckpt_path`` restores the optimizer and schedule the checkpoint was trained with: a run
that configures others (another lr, a cosine of another length) is refused in one line naming
what differs, before it trains a step or touches the checkpoint; a schedule that does not end with
``max_epochs`` trains on for more epochs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.checkpoints import saved_config

SCHEDULE = {"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.05, "momentum": 0.9}},
            "lr_scheduler": {"class_path": "rescale_tasks.common.training.WarmupCosineLR",
                             "init_args": {"warmup_epochs": 0}}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_config, fit_checkpoint):
    """One run trained once for the refusals, which must leave its checkpoint as it was (each checks)."""
    folder = tmp_path_factory.mktemp("trained")
    config = run_config(folder / "run.yaml", model={"init_args": SCHEDULE}, trainer={"max_epochs": 2})
    return config, fit_checkpoint(folder, ["--config", config])


@pytest.mark.parametrize("changed, said", [
    (["--model.init_args.optimizer.init_args.lr", "0.5"], "lr 0.05 -> 0.5"),
    (["--trainer.max_epochs", "3"], "max_epochs (trainer.max_epochs) 2 -> 3"),
])
def test_resume_with_other_training_settings_is_refused(monkeypatch, trained, error_line, changed, said):
    config, ckpt = trained
    before = ckpt.read_bytes()
    monkeypatch.chdir(Path(config).parent)  # where the run was trained
    assert main(["fit", "--config", config, "--trainer.max_epochs", "2", *changed, "--ckpt_path", str(ckpt)]) != 0
    message = error_line()
    assert said in message and str(ckpt) in message, message
    found = saved_config(str(ckpt))
    assert found is not None and os.path.relpath(found) in message, message
    assert ckpt.read_bytes() == before


def test_resume_of_a_schedule_that_does_not_end_with_max_epochs_trains_on(tmp_path, monkeypatch, run_config,
                                                                         fit_checkpoint):
    import torch

    steps = {**SCHEDULE, "lr_scheduler": {"class_path": "rescale_tasks.common.training.WarmupMultiStepLR",
                                          "init_args": {"milestones": [1]}}}
    config = run_config(tmp_path / "run.yaml", model={"init_args": steps})
    ckpt = fit_checkpoint(tmp_path, ["--config", config])
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", config, "--trainer.max_epochs", "2", "--ckpt_path", str(ckpt)]) == 0
    resumed = torch.load(ckpt, weights_only=True)
    assert resumed["global_step"] == 4
    assert [g["lr"] for g in resumed["optimizer_states"][0]["param_groups"]] == pytest.approx([0.005] * 3)


def test_a_refused_resume_leaves_no_wandb_segment_to_sync(tmp_path, offline_in_tmp, run_config, suite_wandb_logger,
                                                          error_line):
    """The refusal comes before the run's config is saved and its W&B run started: ``wandb sync``
    finds only the segment that trained, not one of the same id holding the refused config."""
    logger = suite_wandb_logger("resume", "refused", id="fixedid")
    config = run_config(tmp_path / "run.yaml", model={"init_args": SCHEDULE},
                        trainer={"max_epochs": 2, "logger": logger})
    assert main(["fit", "--config", config]) == 0
    segments = sorted((tmp_path / "runs" / "wandb").glob("offline-run-*"))
    assert len(segments) == 1
    assert main(["fit", "--config", config, "--model.init_args.optimizer.init_args.lr", "0.5",
                 "--ckpt_path", "last"]) != 0
    assert "lr 0.05 -> 0.5" in error_line()
    assert sorted((tmp_path / "runs" / "wandb").glob("offline-run-*")) == segments
