"""DivergenceMonitor: the exact first non-finite step, read from the device only every n steps;
and end to end through `rescale fit`: one `error: training diverged at step N ...` line, exit 1,
`diverged` and the step in the W&B run summary."""
from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import forked
from rescale_tasks.cli import main
from rescale_tasks.common.errors import ConfigError
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.training import DivergenceMonitor, TrainingDiverged


class BreaksAt(L.LightningModule):
    """A linear regression whose loss (or only its gradient) turns non-finite from ``bad_step`` on."""

    def __init__(self, bad_step: int, gradient_only: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.bad_step, self.gradient_only = bad_step, gradient_only
        self.scheme_name = "toy"

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.layer(x)
        if self.global_step >= self.bad_step:
            if self.gradient_only:  # finite loss, infinite gradient
                out.register_hook(lambda g: g * math.inf)
            else:
                out = out * math.nan
        return nn.functional.mse_loss(out, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)


def fit(module: L.LightningModule, monitor: DivergenceMonitor, max_steps: int = 16, accelerator: str = "cpu",
        samples: int = 64):
    trainer = L.Trainer(max_steps=max_steps, accelerator=accelerator, devices=1, callbacks=[monitor], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(module, loader(samples))
    return trainer


def test_cpu_default_reads_every_step_and_stops_at_the_bad_one():
    monitor = DivergenceMonitor()
    with pytest.raises(TrainingDiverged, match=r"^training diverged at step 5 \(epoch 0\): the loss is not finite"):
        fit(BreaksAt(5), monitor)
    assert monitor.diverged_at == 5 and monitor.reads == 6  # one read per step, stopped at once


@pytest.mark.parametrize("bad_step", [5, 7])
def test_checking_every_n_steps_still_reports_the_first_bad_step(bad_step):
    monitor = DivergenceMonitor(check_every_n_steps=4)
    with pytest.raises(TrainingDiverged) as err:
        fit(BreaksAt(bad_step), monitor)
    assert str(err.value).startswith(f"training diverged at step {bad_step} ")  # not 7 or 8: the first one
    assert monitor.diverged_at == bad_step and monitor.reads == 2  # read after steps 4 and 8 only


def test_divergence_in_the_last_unchecked_steps_is_read_when_training_ends():
    monitor = DivergenceMonitor(check_every_n_steps=4, raise_error=False)
    trainer = fit(BreaksAt(5), monitor, max_steps=7)  # reads after step 4 and at the end
    assert monitor.diverged_at == 5 and trainer.global_step == 7
    assert "training diverged at step 5" in monitor.message


def test_a_non_finite_gradient_with_a_finite_loss():
    monitor = DivergenceMonitor(check_every_n_steps=3)
    with pytest.raises(TrainingDiverged, match="at step 2 .*: the gradient norm is not finite; scheme=toy"):
        fit(BreaksAt(2, gradient_only=True), monitor)


def test_bad_check_interval_is_a_config_error():
    with pytest.raises(ConfigError, match="check_every_n_steps must be at least 1, got 0"):
        DivergenceMonitor(check_every_n_steps=0)


class _NoSyncMonitor(DivergenceMonitor):
    """Fails on any host-device synchronisation in the per-step hooks (only reads may sync)."""

    @staticmethod
    @contextlib.contextmanager
    def _sync_mode(mode: str):
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(mode)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)

    def on_before_optimizer_step(self, *args):
        with self._sync_mode("error"):
            super().on_before_optimizer_step(*args)

    def on_train_batch_end(self, *args):
        with self._sync_mode("error"):
            super().on_train_batch_end(*args)

    def _check(self, *args):
        with self._sync_mode("default"):
            super()._check(*args)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_host_sync_per_step_on_cuda():
    monitor = _NoSyncMonitor()  # default interval on an accelerator: 25
    with pytest.raises(TrainingDiverged, match="at step 30 "):
        fit(BreaksAt(30), monitor, max_steps=64, accelerator="gpu", samples=4 * 64)  # one epoch: no epoch-end read
    assert monitor.reads == 2 and monitor.diverged_at == 30  # after steps 25 and 50 only


# --- end to end through the CLI -------------------------------------------------------------------



def test_cli_run_that_diverges(tmp_path, monkeypatch, capsys, run_config, suite_wandb_logger):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_config(Path("diverges.yaml"),  # no normalisation and lr 1000: diverges within a few steps
               model={"init_args": {"scheme": "none", "optimizer": {
                   "class_path": "torch.optim.SGD", "init_args": {"lr": 1000.0, "momentum": 0.9}}}},
               data={"init_args": {"batch_size": 128}},
               trainer={"limit_train_batches": 8, "log_every_n_steps": 1,
                        "logger": suite_wandb_logger("rescale-test", "diverges")})
    code = main(["fit", "--config", "diverges.yaml"])
    err = capsys.readouterr().err
    # W&B's own start-up notices ("wandb: WARNING ...") are not part of the error report
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("wandb: ")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: training diverged at step ")
    step = int(lines[0].split("at step ")[1].split()[0])
    assert "scheme=none, lr=1000" in lines[0] and "Likely cause: learning rate too high" in lines[0]

    (run_dir,) = find_offline_runs("runs")
    run = read_offline_run(run_dir)
    assert run.summary["diverged"] is True and run.summary["diverged_step"] == step
    assert step < 8 and run.metric("diverged") == [1]
    # every loss logged before the reported step is finite: it really is the first bad one
    losses = [(row["trainer/global_step"], row["train/loss_step"]) for row in run.history if "train/loss_step" in row]
    assert losses and all(math.isfinite(loss) for s, loss in losses if s < step)
    # the flag at the row of the last step trained (checked every step on a CPU: the bad one, whose loss
    # the stop leaves unlogged), never past it (rescale compare --wandb_project counts steps from the rows)
    assert [row["trainer/global_step"] for row in run.history if "diverged" in row] == [step]
    assert max(row["trainer/global_step"] for row in run.history) == step


# no normalisation and lr 1000: diverges within a few steps
_DIVERGING = {"scheme": "none", "optimizer": {"class_path": "torch.optim.SGD",
                                             "init_args": {"lr": 1000.0, "momentum": 0.9}}}


@pytest.mark.ddp
def test_a_run_that_diverges_under_ddp_stops_on_every_rank_and_writes_its_summary(tmp_path, run_config,
                                                                                 rescale_processes):
    """Two processes (gloo) with a logger, ``divergence.raise_error false`` (the studies'): both ranks
    read the divergence at the same step and stop; rank 1 wrote the W&B/CSV summary of Lightning's
    stand-in for a logger there (no mapping), crashed with a traceback, and the run left no
    ``run_summary.json``. Now the run ends as one that finished, its summary saying ``diverged``."""
    config = run_config(tmp_path / "diverges.yaml",
                        model={"init_args": _DIVERGING},
                        trainer={"limit_train_batches": 4, "limit_val_batches": 0, "log_every_n_steps": 1,
                                 "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                            "init_args": {"save_dir": str(tmp_path / "csv"), "version": "v"}}})
    summary = tmp_path / "run_summary.json"
    done = rescale_processes(["fit", "--config", config, "--divergence.raise_error", "false",
                              "--run_summary.path", str(summary)], 2)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["status"] == "diverged" and s["world_size"] == 2 and 1 <= s["diverged_step"] < 4, s
    (rows,) = (tmp_path / "csv").rglob("metrics.csv")
    assert "diverged" in rows.read_text().splitlines()[0]  # rank 0's logger got the flag


@pytest.mark.ddp
def test_a_run_that_diverges_under_ddp_says_so_in_one_line(tmp_path, run_config):
    """``divergence.raise_error`` (the default) with two processes: both stop at the same step with
    ``TrainingDiverged``, and the run's stderr (the ranks' together, as a job's log has them) holds
    its line once, not once per process."""
    config = run_config(tmp_path / "diverges.yaml", model={"init_args": _DIVERGING},
                        trainer={"limit_train_batches": 4, "limit_val_batches": 0,
                                 "default_root_dir": str(tmp_path / "run")})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = forked.ddp_run("rescale_tasks.cli", ["fit", "--config", config, "--trainer.devices", "2",
                                                "--trainer.strategy", "ddp"], 2, env=env, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("error: training diverged at step ")
