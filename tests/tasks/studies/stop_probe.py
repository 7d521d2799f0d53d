"""Test probe (a callback named by a study's config, imported by in-process runs and, through
PYTHONPATH, by the points' ``rescale fit`` processes): the points of a study running at once meet
at one training step, and then one of them sends a signal to the study's process, as a scheduler
or a terminal would from outside."""
from __future__ import annotations

import os
import signal
import time

import lightning.pytorch as L


class StopTogether(L.Callback):
    """After training step ``step``, each run leaves a mark in ``folder`` (holding the
    ``CUDA_VISIBLE_DEVICES`` it was given, ``-`` for none) and waits (at most
    ``timeout`` s) until ``parties`` runs have; the first to see them all sends ``signum`` to
    ``pid``, and every run then waits ``linger`` s for what the signal brings. Once: a run that
    finds the signal sent (a resumed one) does nothing."""

    def __init__(self, step: int, folder: str, parties: int, pid: int, signum: int = int(signal.SIGTERM),
                 timeout: float = 120.0, linger: float = 2.0) -> None:
        self.step, self.folder, self.parties, self.pid = step, folder, parties, pid
        self.signum, self.timeout, self.linger = signum, timeout, linger

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        sent = os.path.join(self.folder, "sent")
        if trainer.global_step != self.step or os.path.exists(sent):
            return
        with open(os.path.join(self.folder, f"at-{os.getpid()}"), "w") as mark:
            mark.write(os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
        deadline = time.monotonic() + self.timeout
        while sum(name.startswith("at-") for name in os.listdir(self.folder)) < self.parties:
            if time.monotonic() > deadline:
                raise RuntimeError(f"StopTogether: {self.parties} runs never met at step {self.step}")
            time.sleep(0.02)
        try:
            os.close(os.open(sent, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            os.kill(self.pid, self.signum)
        time.sleep(self.linger)
