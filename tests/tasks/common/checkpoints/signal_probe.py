"""Test probe (a callback named by the runs' configs, imported by in-process runs and, through
PYTHONPATH, by ``rescale`` subprocesses): the run sends a signal to its own process at a chosen
point, once, as a scheduler or a terminal would from outside."""
from __future__ import annotations

import os
import signal

import lightning.pytorch as L


class SignalAt(L.Callback):
    """Sends ``signum`` to this process at optimizer step ``step``: after that training step
    (``where="train"``) or as validation batch ``val_batch`` of the validation at that step starts
    (``where="val"``). Once: the file ``marker`` records that it was sent, so the resumed run does
    not send it again. ``rank``: the one process that sends it (the others get it forwarded, as
    Lightning's launcher forwards a signal to the processes it started)."""

    def __init__(self, step: int, marker: str, where: str = "train", val_batch: int = 1,
                 signum: int = int(signal.SIGTERM), rank: int = 0) -> None:
        self.step, self.marker, self.where, self.val_batch = step, marker, where, val_batch
        self.signum, self.rank = signum, rank

    def _send(self, trainer: L.Trainer) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank or os.path.exists(self.marker):
            return
        with open(self.marker, "w"):
            pass
        os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.where == "train":
            self._send(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.where == "val" and not trainer.sanity_checking and batch_idx == self.val_batch:
            self._send(trainer)
