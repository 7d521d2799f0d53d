"""When a run writes its checkpoints, and how it resumes from them exactly.

- :class:`ResumeState`: stores the random-number streams of every library and the W&B run id in
  the checkpoint and restores the streams when training restarts, so a resumed run draws the
  same dropout masks and mixup coefficients as an uninterrupted one.
- :class:`LastCheckpoint`: the one writer of ``last.ckpt``: at epoch ends, every n steps or
  minutes, and on SIGTERM (cluster preemption, ``scancel``, ``kill``) or Ctrl-C (SIGINT), where
  Lightning finishes the current step and raises. Together with the resumable training loader
  (:mod:`rescale_tasks.common.sampling`) the run resumes at the next batch of the same epoch.
- :class:`EpochCheckpoint`: ``epoch<NNN>.ckpt`` for every completed epoch, never for one cut short.

The files themselves (atomic writes, safe loading): :mod:`.checkpointing`.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any, Optional

import lightning.pytorch as L
import numpy as np
import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import DummyLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .callbacks import DivergenceMonitor
from .errors import UserError

__all__ = ["ResumeState", "LastCheckpoint", "EpochCheckpoint", "preempted_message", "stop_signal",
           "checkpoint_folder", "logger_folder", "LAST_NAME"]

LAST_NAME = ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION  # last.ckpt


def _rng_states() -> dict[str, Any]:
    states = {"torch": torch.get_rng_state(), "numpy": _numpy_state(), "python": _python_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _numpy_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _python_state() -> dict:
    version, internal, gauss = random.getstate()
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = states["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["internal"].tolist()), p["gauss"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class ResumeState(L.Callback):
    """Random streams and the W&B run id, saved with every checkpoint and restored on resume.

    The streams are restored when training starts (after Lightning has set up the data and run
    any sanity check), i.e. exactly where the uninterrupted run stood after the saved step.
    Only tensors and plain values are stored, so ``weights_only`` loading accepts them.
    """

    def __init__(self) -> None:
        self._pending: Optional[dict[str, Any]] = None
        self.run_id: Optional[str] = None

    @property
    def state_key(self) -> str:
        return "ResumeState"

    def state_dict(self) -> dict[str, Any]:
        return {"rng": _rng_states(), "run_id": self.run_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("rng")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for logger in trainer.loggers:
            version = getattr(logger, "version", None)
            if version is not None and isinstance(logger, WandbLogger):
                self.run_id = str(version)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _load_train_loader_state(trainer)
        if self._pending is not None:
            _set_rng_states(self._pending)
            self._pending = None


def _load_train_loader_state(trainer: L.Trainer) -> None:
    """Hand the saved training-loader position to the loader in use.

    Lightning (2.6) applies saved loader states only when it builds the training loader after
    restoring the loops; a module that reads ``trainer.estimated_stepping_batches`` in
    ``configure_optimizers`` (per-step schedules) builds it before, and the saved position is
    silently dropped. Our loaders iterate lazily, so loading here, before the first batch, is
    still in time.
    """
    loop = trainer.fit_loop
    states = getattr(loop, "_combined_loader_states_to_load", None)
    if states and loop._combined_loader is not None:
        loop._combined_loader._load_state_dicts(states)
        loop._combined_loader_states_to_load = []


class LastCheckpoint(L.Callback):
    """The one writer of ``last.ckpt``: at every epoch end, every ``every_n_train_steps`` steps
    and every ``every_minutes`` minutes of training (mid-epoch resume points for long epochs),
    and when the run is preempted or stopped with Ctrl-C.

    Lightning turns SIGTERM into ``SIGTERMException`` at the end of the current training step;
    this callback saves then, so nothing already trained is lost, and ``--ckpt_path <file>`` (or
    ``--ckpt_path last`` with a fixed run id) resumes at the next batch. While training, the first
    Ctrl-C (SIGINT) is handed to Lightning's SIGTERM handler, so it stops the run the same way
    (Lightning's own reaction, a ``KeyboardInterrupt`` wherever the step happens to be, saves
    nothing); a second Ctrl-C stops at once. Other exceptions are left alone: a diverged or
    crashed run must not overwrite its last good checkpoint.
    The file goes beside the run's other checkpoints (the ModelCheckpoint folder), where
    Lightning's ``ckpt_path="last"`` looks for it.

    Args:
        every_n_train_steps: also save every n optimizer steps (0: off).
        every_minutes: also save after this many minutes of training since the last save (0: off).
        on_preemption: save on SIGTERM and the first Ctrl-C.
        dirpath: where the run's checkpoints go (``last.ckpt`` and the epoch checkpoints of the
            suite's ModelCheckpoint): a local folder or an fsspec URL (``s3://bucket/ckpts``), in a
            subfolder named by the run id (the logger's version) so runs never share one.
            None: the run's own folder.
    """

    def __init__(self, every_n_train_steps: int = 0, every_minutes: float = 0.0, on_preemption: bool = True,
                 dirpath: Optional[str] = None) -> None:
        if every_n_train_steps < 0 or every_minutes < 0:
            raise UserError(f"last_checkpoint.every_n_train_steps ({every_n_train_steps}) and "
                            f"last_checkpoint.every_minutes ({every_minutes}) must be 0 (off) or positive")
        self.dirpath = dirpath
        self.every_n_train_steps = every_n_train_steps
        self.every_minutes = every_minutes
        self.on_preemption = on_preemption
        self.saved_path: Optional[str] = None
        self.stopped_by: Optional[signal.Signals] = None  # SIGINT when Ctrl-C stopped the run
        self._last_save = time.monotonic()

    def folder(self, trainer: L.Trainer) -> Optional[str]:
        """``dirpath/<run id>`` (None without a ``dirpath``)."""
        if not self.dirpath:
            return None
        version = getattr(trainer.logger, "version", None) if trainer.logger is not None else None
        return self.dirpath.rstrip("/") + (f"/{version}" if version else "")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Point the ModelCheckpoints without a folder of their own at ``dirpath`` (before their
        own setup: Lightning runs checkpoint callbacks last)."""
        folder = self.folder(trainer)
        if folder is None:
            return
        for checkpoint in trainer.checkpoint_callbacks:
            if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath is None:
                checkpoint.dirpath = folder
                checkpoint._fs = get_filesystem(folder)  # chosen in its __init__ from its dirpath then

    def path(self, trainer: L.Trainer) -> str:
        return os.path.join(checkpoint_folder(trainer), LAST_NAME)

    def save(self, trainer: L.Trainer) -> None:
        # never overwrite the last good checkpoint with a diverged model (divergence monitors
        # read their device-side record only every few steps: make them read it now)
        monitors = [cb for cb in trainer.callbacks if isinstance(cb, DivergenceMonitor)]
        if not all([m.healthy(trainer, trainer.lightning_module) for m in monitors]):
            return
        self.saved_path = self.path(trainer)
        trainer.save_checkpoint(self.saved_path, weights_only=False)  # the full state: a resume point
        self._last_save = time.monotonic()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        self.stopped_by = None
        if self.on_preemption:
            self._stop_on_ctrl_c(say=trainer.is_global_zero)

    def _stop_on_ctrl_c(self, say: bool) -> None:
        """Make the first SIGINT do what SIGTERM does: Lightning registered its SIGTERM handler
        (which finishes the step, then raises ``SIGTERMException``) just before training, and
        puts every handler back as it found it when the run ends. A SIGINT handler of the
        user's own, or SIGINT ignored (a background job), is left alone."""
        sigterm = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is not threading.main_thread() or not callable(sigterm) \
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        pid = os.getpid()

        def stop_after_this_step(signum, frame) -> None:
            if os.getpid() != pid:  # a data worker forked with this handler: the main process stops
                return
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once
            self.stopped_by = signal.SIGINT
            if say:  # os.write: a print could re-enter a write the signal interrupted
                os.write(2, b"\nCtrl-C: stopping after this step and saving last.ckpt (Ctrl-C again: stop now, "
                            b"without saving)\n")
            sigterm(signum, frame)

        signal.signal(signal.SIGINT, stop_after_this_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.sanity_checking or trainer.fit_loop.epoch_loop._should_accumulate():
            return
        due = bool(self.every_n_train_steps) and trainer.global_step % self.every_n_train_steps == 0
        if self.every_minutes:
            # rank 0's clock decides for everyone, so all ranks enter the collective save together
            late = time.monotonic() - self._last_save >= 60 * self.every_minutes
            due = due or bool(trainer.strategy.broadcast(late))
        if due:
            self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not self.on_preemption or not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        self.save(trainer)
        # for the exit line and status
        exception.checkpoint_path, exception.step = self.saved_path, trainer.global_step
        exception.signal = self.stopped_by or signal.SIGTERM


def stop_signal(exception: BaseException) -> signal.Signals:
    """The signal that stopped a run (``SIGTERMException``): SIGINT for Ctrl-C, else SIGTERM."""
    return getattr(exception, "signal", signal.SIGTERM)


def preempted_message(exception: BaseException) -> str:
    """The one line a preempted (or Ctrl-C'd) run ends with: where it stopped and how to resume it."""
    by = "Ctrl-C (SIGINT)" if stop_signal(exception) == signal.SIGINT else "SIGTERM"
    path = getattr(exception, "checkpoint_path", None)
    if path is None:
        return f"stopped by {by} before a checkpoint could be written; resume from the last checkpoint"
    return (f"stopped by {by} at step {exception.step}; saved {path}. Resume with the same command "
            f"plus --ckpt_path {path}")


def checkpoint_folder(trainer: L.Trainer) -> str:
    """The folder of the run's checkpoints (``last.ckpt``, the epoch checkpoints), known before
    the run starts: the first ModelCheckpoint's ``dirpath`` once set, ``last_checkpoint.dirpath/<run
    id>``, or where that ModelCheckpoint will put them, as Lightning resolves it:
    ``<save_dir>/<logger name>/<version>/checkpoints`` (W&B: ``runs/<project>/<run id>/checkpoints``)."""
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
        return checkpoint.dirpath
    last = next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
    if last is not None and last.folder(trainer):
        return last.folder(trainer)
    folder = logger_folder(trainer)
    if isinstance(checkpoint, ModelCheckpoint) and folder is not None:
        return os.path.join(folder, "checkpoints")
    return os.path.join(trainer.default_root_dir, "checkpoints")


def logger_folder(trainer: L.Trainer) -> Optional[str]:
    """``<save_dir>/<logger name>/<version>`` of the first logger, the folder Lightning gives a
    run's checkpoints (W&B: ``runs/<project>/<run id>``); None without a logger (or with
    ``fast_dev_run``'s stand-in, which has no folder)."""
    logger = trainer.loggers[0] if trainer.loggers else None
    if logger is None or isinstance(logger, DummyLogger) or logger.version in (None, ""):
        return None
    version = logger.version
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name),
                        version if isinstance(version, str) else f"version_{version}")


class EpochCheckpoint(ModelCheckpoint):
    """``epoch<NNN>.ckpt`` (Lightning's ModelCheckpoint, keeping the newest) at the end of every
    epoch the run completed. An epoch cut short (``max_steps`` reached mid-epoch, a mid-epoch
    validation) writes none: the file would carry the name of an epoch it does not hold;
    ``last.ckpt`` is the resume point there."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("filename", "epoch{epoch:03d}")
        kwargs.setdefault("auto_insert_metric_name", False)
        super().__init__(**kwargs)

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key, so checkpoints written before this class existed resume into it
        return ModelCheckpoint.__qualname__ + super().state_key[len(type(self).__qualname__):]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _epoch_complete(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _epoch_complete(trainer):
            super().on_validation_end(trainer, pl_module)


def _epoch_complete(trainer: L.Trainer) -> bool:
    """Whether every batch of the current training epoch has run (as Lightning's epoch loop
    decides it: the loader is exhausted, or the epoch's batch count reached)."""
    if trainer.state.fn != "fit" or trainer.sanity_checking:
        return False
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return progress.is_last_batch or progress.current.ready >= trainer.num_training_batches
