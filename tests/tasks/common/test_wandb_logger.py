"""The suite's W&B logger against the installed wandb (a real offline run)."""
from __future__ import annotations

import wandb

from rescale_tasks.common.wandb_logger import SuiteWandbLogger


def test_a_run_starts_without_wandbs_deprecation_warnings(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = SuiteWandbLogger(name="quiet", save_dir=str(tmp_path / "runs"), project="rescale-test")
    try:
        run = logger.experiment
        assert run.offline and run.name == "quiet"
    finally:
        wandb.finish()
    out, err = capfd.readouterr()
    assert "anonymous" not in out + err and "will be removed" not in out + err, out + err
