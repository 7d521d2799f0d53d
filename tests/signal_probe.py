"""Test probe (a callback named by the runs' configs, imported by in-process runs and, with
``tests/`` on PYTHONPATH, by ``rescale`` subprocesses): a run sends a signal at a chosen point,
once, to itself or to another process, as a scheduler or a terminal would from outside; runs
going at once can first meet there, to prove they are at once."""
from __future__ import annotations

import os
import signal
import time
from typing import Optional

import lightning.pytorch as L


class SignalAt(L.Callback):
    """Sends ``signum`` to ``pid`` (default: this process) at optimizer step ``step``: after that
    training step (``where="train"``), after the first batch of the step that follows it, with
    gradient accumulation the middle of a window (``where="accumulating"``: after a batch that
    ends no optimizer step), or as validation batch ``val_batch`` of the validation at that step
    starts (``where="val"``). Once: the file ``marker`` records that it was sent, so a
    resumed run does not send it again. ``rank``: the one process that sends it (the others get
    it forwarded, as Lightning's launcher forwards a signal to the processes it started).

    ``parties`` > 0: that many runs meet there first. Each leaves a mark ``at-<pid>`` beside
    ``marker`` (holding the ``CUDA_VISIBLE_DEVICES`` it was given, ``-`` for none) and waits, at
    most ``timeout`` s, for the others' marks; the first to see them all sends the signal. Every
    run then waits ``linger`` s for what the signal brings (from another process it comes late)."""

    def __init__(self, step: int, marker: str, where: str = "train", val_batch: int = 1,
                 signum: int = int(signal.SIGTERM), rank: int = 0, pid: Optional[int] = None,
                 parties: int = 0, timeout: float = 120.0, linger: float = 0.0) -> None:
        self.step, self.marker, self.where, self.val_batch = step, marker, where, val_batch
        self.signum, self.rank, self.pid = signum, rank, pid
        self.parties, self.timeout, self.linger = parties, timeout, linger
        self._step_before_batch: Optional[int] = None

    def _meet(self) -> None:
        folder = os.path.dirname(self.marker)
        with open(os.path.join(folder, f"at-{os.getpid()}"), "w") as mark:
            mark.write(os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
        deadline = time.monotonic() + self.timeout
        while sum(name.startswith("at-") for name in os.listdir(folder)) < self.parties:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SignalAt: {self.parties} runs never met at step {self.step}")
            time.sleep(0.02)

    def _send(self, trainer: L.Trainer) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank or os.path.exists(self.marker):
            return
        if self.parties:
            self._meet()
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass  # another party sent it
        else:
            os.kill(os.getpid() if self.pid is None else self.pid, self.signum)
        time.sleep(self.linger)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_before_batch = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stepped = trainer.global_step != self._step_before_batch
        if self.where == "train" or (self.where == "accumulating" and not stepped):
            self._send(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.where == "val" and not trainer.sanity_checking and batch_idx == self.val_batch:
            self._send(trainer)
