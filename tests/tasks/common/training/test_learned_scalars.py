"""LearnedScalarsLogger and AnalysisPlotsLogger log once per optimizer step they are due at, under
gradient accumulation too: a real depth-8 RescaleNet trained 4 steps of 2 accumulated batches, logged
to Lightning's CSV logger and an offline W&B run (the learning rate too, once per step). Before, the learned scalars were logged through
``self.log``, which Lightning logs again (the same, stale values) at every later logged step, and
the plots were drawn once more before the first step (a window's first batches end at step 0)."""
from __future__ import annotations

import csv

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.cli.lightning_commands import LoggedLearningRate
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.reporting import AnalysisPlotsLogger, SuiteWandbLogger
from rescale_tasks.common.training import LearnedScalarsLogger
from wandb_runs import find_offline_runs, read_offline_run


def test_scalars_and_plots_once_per_due_optimizer_step(tmp_path, offline_in_tmp):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g))
    L.seed_everything(0)
    module = ClassificationModule("cifar_resnet", "rescale", network_options={"depth": 8, "base_width": 4},
                                  num_classes=3, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    scalars = LearnedScalarsLogger(every_n_steps=3)  # due after steps 1 and 4 (the last)
    plots = AnalysisPlotsLogger(every_n_steps=1, samples=2)  # due after every step
    wandb_logger = SuiteWandbLogger(project="scalars", save_dir=str(tmp_path / "runs"))
    trainer = L.Trainer(max_steps=4, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                        logger=[CSVLogger(tmp_path / "csv"), wandb_logger],
                        callbacks=[scalars, plots, LoggedLearningRate(logging_interval="step")],
                        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    try:
        trainer.fit(module, DataLoader(data, batch_size=2))
    finally:
        import wandb

        wandb.finish()
    assert trainer.global_step == 4
    rows = list(csv.DictReader(open(trainer.loggers[0].log_dir + "/metrics.csv")))
    logged = [(int(row["step"]), float(row["scalars/layer1.0"])) for row in rows if row.get("scalars/layer1.0")]
    # optimizer steps 1 and 4, each at the step of its own logged loss (Lightning's k - 1), once
    assert [step for step, _ in logged] == [0, 3], logged
    assert logged[0][1] != logged[1][1]
    assert any(row.get("train/loss_step") and int(row["step"]) == 3 for row in rows)
    # the run summary's final values are the trained ones (callback_metrics)
    assert trainer.callback_metrics["scalars/layer1.0"].item() == pytest.approx(logged[1][1])
    assert len(plots.seconds) == 4  # once per optimizer step, none before the first
    # at the step of each optimizer step's own loss in W&B, as the scalars: never past the run's last step
    (run,) = [read_offline_run(r) for r in find_offline_runs(str(tmp_path / "runs"))]
    plotted = [row["trainer/global_step"] for row in run.history if "analysis/seconds" in row]
    assert plotted == [0, 1, 2, 3] == [row["trainer/global_step"] for row in run.history if "train/loss_step" in row]
    # the learning rate once per optimizer step (Lightning's monitor wrote it at every batch)
    lr_steps = [int(row["step"]) for row in rows if any(v and k.startswith("lr-") for k, v in row.items())]
    assert lr_steps == sorted(set(lr_steps)) and len(lr_steps) == 4, lr_steps


def test_every_n_steps_below_one_is_one_error_line():
    with pytest.raises(ConfigError, match="every_n_steps"):
        LearnedScalarsLogger(every_n_steps=0)


def test_a_resumed_run_logs_no_step_twice(tmp_path, offline_in_tmp):
    """A run resumed from its step-2 checkpoint (mid-epoch), 2 batches accumulated a step: its
    window's first batch ends at the restored step 2, which the first run logged (and plotted)
    already; before, both callbacks took it for step 2 and logged it again, before any step of the
    resumed run."""
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g))

    def fit(max_steps, version, ckpt_path=None):
        L.seed_everything(0)
        module = ClassificationModule("cifar_resnet", "rescale", network_options={"depth": 8, "base_width": 4},
                                      num_classes=3, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        plots = AnalysisPlotsLogger(every_n_steps=1, samples=2)
        wandb_logger = SuiteWandbLogger(project="resume", save_dir=str(tmp_path / "runs"), version=f"v{version}")
        trainer = L.Trainer(max_steps=max_steps, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                            logger=[CSVLogger(tmp_path / "csv", version=version), wandb_logger],
                            callbacks=[LearnedScalarsLogger(every_n_steps=1), plots,
                                       ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
                            log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False)
        try:
            trainer.fit(module, DataLoader(data, batch_size=2), ckpt_path=ckpt_path)
        finally:
            import wandb

            wandb.finish()
        rows = list(csv.DictReader(open(trainer.loggers[0].log_dir + "/metrics.csv")))
        return [int(row["step"]) for row in rows if row.get("scalars/layer1.0")], len(plots.seconds)

    assert fit(2, 0) == ([0, 1], 2)
    assert fit(4, 1, str(tmp_path / "ckpt" / "last.ckpt")) == ([2, 3], 2)  # optimizer steps 3 and 4, once each
