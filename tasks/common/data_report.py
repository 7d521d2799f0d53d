"""Reporting what the data pipeline had to skip (corrupt images, undecodable videos).

Any DataModule exposing a ``skipped_corrupt`` count (files it dropped because they could not be
decoded, with ``skip_corrupt`` on) gets the count logged as ``data/skipped_corrupt`` (summed over
ranks) after every epoch and validation, and one warning line at the end of the run.
"""
from __future__ import annotations

import lightning.pytorch as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

__all__ = ["SkippedDataReport"]


class SkippedDataReport(L.Callback):
    """Logs and reports the data module's ``skipped_corrupt`` count (no-op for other modules)."""

    def __init__(self) -> None:
        self.total = 0

    def _count(self, trainer: L.Trainer) -> int | None:
        count = getattr(trainer.datamodule, "skipped_corrupt", None)
        if count is None:
            return None
        total = trainer.strategy.reduce(torch.tensor(float(count)), reduce_op="sum")
        self.total = int(total)
        return self.total

    def _log(self, trainer: L.Trainer) -> None:
        if trainer.sanity_checking:
            return
        count = self._count(trainer)
        if count is not None:
            for logger in trainer.loggers:
                logger.log_metrics({"data/skipped_corrupt": float(count)}, step=trainer.global_step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.total:
            rank_zero_warn(f"skipped {self.total} corrupt input file(s) (data.skip_corrupt is on); "
                           "each was named in a warning when first met")
