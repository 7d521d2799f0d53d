"""When a run writes its checkpoints, and how it resumes from them exactly.

- :class:`ResumeState`: stores the random-number streams of every library and the W&B run id in
  the checkpoint and restores the streams when training restarts, so a resumed run draws the
  same dropout masks and mixup coefficients as an uninterrupted one; in a checkpoint written
  inside an epoch, also what the epoch's logged training values have accumulated so far, so the
  epoch's means (``train/loss_epoch``, ``train/acc1``) cover its batches from before the resume.
  ``validate``/``test`` of a checkpoint log their metrics at its step and epoch.
- :class:`LastCheckpoint`: the one writer of ``last.ckpt``: at epoch ends, every n steps or
  minutes, and on SIGTERM (cluster preemption, ``scancel``, ``kill``), Ctrl-C, a closed terminal
  and the other stop signals of :mod:`..system.stop_signals`, where Lightning finishes the current step and
  raises. Together with the resumable training loader (:mod:`rescale_tasks.common.data.sampling`) the
  run resumes at the next batch of the same epoch; a validation the signal cut is done again,
  whole, before training goes on (:func:`resume_point`).
- :class:`EpochCheckpoint`: ``epoch<NNN>.ckpt`` for every completed epoch, never for one cut short.

The files themselves (atomic writes, safe loading): :mod:`.files`.
"""
from __future__ import annotations

import contextlib
import logging
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

from ..errors import UserError
from ..system import POLITE_SIGNALS, drop_gone_terminal, max_over_ranks, signal_label
from ..training import DivergenceMonitor, inside_accumulation_window

__all__ = ["ResumeState", "LastCheckpoint", "EpochCheckpoint", "preempted_message", "stop_signal",
           "checkpoint_folder", "planned_checkpoint_folder", "logger_folder", "LAST_NAME"]

LAST_NAME = ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION  # last.ckpt

log = logging.getLogger(__name__)


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
    """Random streams and the W&B run id, saved with every checkpoint and restored on resume;
    with a checkpoint written inside an epoch, the epoch's training accumulators too.

    The streams are restored when training starts (after Lightning has set up the data and run
    any sanity check), i.e. exactly where the uninterrupted run stood after the saved step.
    Only tensors and plain values are stored, so ``weights_only`` loading accepts them.

    The epoch accumulators: what the values logged with ``on_epoch=True`` in ``training_step``
    have summed so far (Lightning's weighted sums and batch counts, and the states of the
    torchmetrics metrics logged there, such as ``train_acc``), one entry per process, with how
    each was logged. Lightning 2.6 saves neither (its loops' state holds counters only, its
    result collection is not in the checkpoint), so a run resumed mid-epoch would average only
    the batches after the resume, and one resumed at a validation that ends an epoch would log
    no training means for that epoch. When training starts they are put back: the metrics'
    states, and Lightning's entries as its own ``self.log`` makes them, holding the saved sums;
    the batches after the resume add to them as they did in the uninterrupted run. The states of
    metrics holding lists (``cat`` reductions) are kept with one process only.
    """

    def __init__(self) -> None:
        self._pending: Optional[dict[str, Any]] = None
        self._sums: Optional[dict[str, Any]] = None  # the epoch accumulators to restore
        self._trainer: Optional[L.Trainer] = None
        self.run_id: Optional[str] = None
        self._logged_at: Optional[tuple[int, int]] = None  # the fit loop's logging counters before an evaluation

    @property
    def state_key(self) -> str:
        return "ResumeState"

    def state_dict(self) -> dict[str, Any]:
        state = {"rng": _rng_states(), "run_id": self.run_id}
        sums = _epoch_sums(self._trainer) if self._trainer is not None else None
        if sums is not None:
            state["epoch_sums"] = sums
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("rng")
        self._sums = state_dict.get("epoch_sums")

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """``validate``/``test``/``predict`` of a checkpoint: the loggers' step and epoch are the
        checkpoint's (its last optimizer step, counted from 0 as fit's own validations there were
        logged, and its epoch), not 0: Lightning restores the loops' counters only to fit. Put
        back when the command ends (a later fit of the same Trainer goes on from its own)."""
        if trainer.state.fn == "fit" or self._logged_at is not None:
            return
        loop = trainer.fit_loop
        self._logged_at = (loop.epoch_loop._batches_that_stepped, loop.epoch_progress.current.completed)
        loop.epoch_loop._batches_that_stepped = max(int(checkpoint.get("global_step", 0)) - 1, 0)
        loop.epoch_progress.current.completed = int(checkpoint.get("epoch", 0))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._logged_at is not None:
            loop = trainer.fit_loop
            loop.epoch_loop._batches_that_stepped, loop.epoch_progress.current.completed = self._logged_at
            self._logged_at = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer
        for logger in trainer.loggers:
            version = getattr(logger, "version", None)
            if version is not None and isinstance(logger, WandbLogger):
                self.run_id = str(version)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _load_train_loader_state(trainer)
        if self._pending is not None:
            _set_rng_states(self._pending)
            self._pending = None
        if self._sums is not None:
            _restore_epoch_sums(trainer, self._sums)
            self._sums = None


# how a value was logged (the arguments of LightningModule.log that Lightning's entry keeps)
_LOG_ARGS = ("prog_bar", "logger", "on_step", "on_epoch", "enable_graph", "add_dataloader_idx", "metric_attribute")


def _epoch_open(trainer: L.Trainer) -> bool:
    """Whether a training epoch has begun and its end has not: its logged values are still summing."""
    if trainer.state.fn != "fit" or trainer.sanity_checking:
        return False
    progress = trainer.fit_loop.epoch_progress.current
    if progress.started > progress.processed:
        return True
    # the epoch-end hooks of an epoch that max_steps (or a stop request) cut short: its sums are
    # not reset yet, and a run resumed from LastCheckpoint's save there goes on inside it
    return progress.processed > progress.completed and not _epoch_complete(trainer)


def _by_rank(trainer: L.Trainer, tensor: torch.Tensor) -> torch.Tensor:
    """Every process's ``tensor``, stacked in rank order (a collective with several processes)."""
    tensor = tensor.detach()
    if trainer.world_size == 1:
        return tensor.unsqueeze(0).cpu()
    return trainer.strategy.all_gather(tensor).cpu()


def _epoch_sums(trainer: L.Trainer) -> Optional[dict[str, Any]]:
    """What the open training epoch's logged values have accumulated, per process (None outside one)."""
    if not _epoch_open(trainer):
        return None
    module = trainer.lightning_module
    entries: dict[str, dict] = {}
    metrics: dict[str, dict] = {}
    for key, result in trainer.fit_loop.epoch_loop._results.items():
        meta = result.meta
        if result.has_reset or not meta.on_epoch or meta.dataloader_idx is not None or meta.sync._group is not None:
            continue
        entry = {"fx": meta.fx, "name": meta.name, "reduce_fx": meta.reduce_fx.__name__,
                 "sync_dist": bool(meta.sync.should), "rank_zero_only": bool(meta.sync.rank_zero_only),
                 **{arg: getattr(meta, arg) for arg in _LOG_ARGS}}
        if result.is_tensor:
            entry["states"] = {name: _by_rank(trainer, getattr(result, name))
                               for name in ("value", "cumulated_batch_size") if hasattr(result, name)}
        elif meta.metric_attribute:
            if meta.metric_attribute not in metrics:
                states = _metric_states(trainer, module.get_submodule(meta.metric_attribute))
                if states is None:
                    continue
                metrics[meta.metric_attribute] = states
        else:
            continue
        entries[key] = entry
    return {"epoch": trainer.current_epoch, "world_size": trainer.world_size, "entries": entries, "metrics": metrics}


def _metric_states(trainer: L.Trainer, metric: Any) -> Optional[dict[str, Any]]:
    states = {name: getattr(metric, name) for name in metric._defaults}
    if any(isinstance(v, list) for v in states.values()):
        if trainer.world_size > 1:
            log.warning(f"warning: {type(metric).__name__} holds lists: a checkpoint written inside an epoch keeps "
                        "its state with one process only")
            return None
        states = {k: [t.detach().cpu() for t in v] if isinstance(v, list) else v.detach().cpu().unsqueeze(0)
                  for k, v in states.items()}
    else:
        states = {k: _by_rank(trainer, v) for k, v in states.items()}
    return {"states": states, "updates": int(metric._update_count)}


def _restore_epoch_sums(trainer: L.Trainer, sums: dict[str, Any]) -> None:
    """Put the saved accumulators of the epoch the run resumes in back where they were."""
    if sums.get("epoch") != trainer.current_epoch:
        return
    if sums.get("world_size") != trainer.world_size:
        log.warning(f"warning: the checkpoint's epoch sums were taken on {sums.get('world_size')} processes, this run "
                    f"has {trainer.world_size}: this epoch's training means cover only the batches after the resume")
        return
    module, rank = trainer.lightning_module, trainer.global_rank
    for name, saved in sums["metrics"].items():
        metric = module.get_submodule(name)
        for state, value in saved["states"].items():
            if isinstance(value, list):
                setattr(metric, state, [v.to(module.device) for v in value])
            else:
                current = getattr(metric, state)
                setattr(metric, state, value[rank].to(device=current.device, dtype=current.dtype))
        metric._update_count = saved["updates"]
        metric._computed = None
    results = trainer.fit_loop.epoch_loop._results
    for key, entry in sums["entries"].items():
        if key in results:
            continue
        states = entry.get("states")
        attribute = entry["metric_attribute"]
        value = module.get_submodule(attribute) if states is None else \
            torch.zeros((), dtype=states["value"].dtype, device=module.device)
        # the entry Lightning's self.log makes, so the batches after the resume log into it
        results.log(entry["fx"], entry["name"], value, reduce_fx=entry["reduce_fx"], batch_size=1,
                    sync_dist=entry["sync_dist"], sync_dist_fn=trainer.strategy.reduce,
                    rank_zero_only=entry["rank_zero_only"], **{arg: entry[arg] for arg in _LOG_ARGS})
        result = results[key]
        for name, saved in (states or {}).items():
            setattr(result, name, saved[rank].to(device=module.device, dtype=getattr(result, name).dtype))
        result._forward_cache = None if states is not None else result._forward_cache
        result._computed = None
    if sums["entries"] and trainer._logger_connector._first_loop_iter is None:
        # Lightning's self.log starts the sums afresh at a loop's first batch: the resumed run's
        # first batch is one in the middle of the epoch, as in the uninterrupted run
        trainer._logger_connector._first_loop_iter = True


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


class _SaveAfterStep(L.Callback):
    """The last of a run's callbacks: writes the ``last.ckpt`` that :class:`LastCheckpoint` found due
    at this step, after the other callbacks' ``on_train_batch_end`` (Lightning calls them in list
    order; the run summary, which comes after LastCheckpoint, records the step's loss and samples
    there)."""

    def __init__(self, owner: "LastCheckpoint") -> None:
        self.owner = owner

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.owner.save_if_due(trainer)


class LastCheckpoint(L.Callback):
    """The one writer of ``last.ckpt``: at every epoch end, every ``every_n_train_steps`` steps
    and every ``every_minutes`` minutes of training (mid-epoch resume points for long epochs),
    and when the run is stopped by a signal (preemption, Ctrl-C, a closed terminal).

    Lightning turns SIGTERM into ``SIGTERMException`` at the end of the current training step
    (or validation batch); this callback saves then, so nothing already trained is lost, and
    ``--ckpt_path <file>`` (or ``--ckpt_path last`` with a fixed run id) resumes at the next batch,
    after redoing a validation the signal cut. The other stop signals of :mod:`..system.stop_signals`
    (SIGHUP, SIGUSR1 ...) are handed to Lightning's SIGTERM handler, so they stop the run the same
    way, and so is the first Ctrl-C (SIGINT) while training (Lightning's own reaction, a
    ``KeyboardInterrupt`` wherever the step happens to be, saves nothing); the same signal again
    stops at once. Other exceptions are left alone: a diverged or crashed run must not overwrite
    its last good checkpoint.
    Any other checkpoint saved at the end of a step that a validation or the epoch's end follows
    (Lightning's ``ModelCheckpoint(every_n_train_steps=N)``, the WMT recipe's ``step<NNN>.ckpt``) is
    marked as ``last.ckpt`` is there (:func:`resume_point`): a resume from it runs that validation,
    or that epoch's end (once, no batch trained again) when no validation follows an epoch's last step.
    The file goes beside the run's other checkpoints (the ModelCheckpoint folder), where
    Lightning's ``ckpt_path="last"`` looks for it.

    Args:
        every_n_train_steps: also save every n optimizer steps (0: off).
        every_minutes: also save after this many minutes of training since the last save (0: off).
        on_preemption: save on SIGTERM, the first Ctrl-C and the other stop signals.
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
        self.stopped_by: Optional[signal.Signals] = None  # the signal taken over that stopped the run
        self._stopped_in: Optional[str] = None  # saving for a stop "validation", "after validation"
        self._cut_epoch = False  # saving at the end of an epoch that max_steps (or a stop request) cut short
        self._validated_at: Optional[int] = None  # the step of the training loop's last validation
        self._lightning_stop = None  # Lightning's SIGTERM handler
        self._handler = None  # ours, for every stop signal
        self._stop_due = False  # stop after this window's step: all processes agreed, or one's signal waits
        self._save_due = False  # a step save, for _SaveAfterStep
        self._step_ended = False  # between a training step's end and what follows it (a validation, the next batch)
        self._ending_epoch = False  # resumed from a "before epoch end" file: the epoch's end is under way
        self._last_save = time.monotonic()

    def folder(self, trainer: L.Trainer) -> Optional[str]:
        """``dirpath/<run id>`` (None without a ``dirpath``)."""
        return _run_subfolder(self.dirpath, trainer.logger)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Point the ModelCheckpoints without a folder of their own at ``dirpath`` (before their
        own setup: Lightning runs checkpoint callbacks last), and put :class:`_SaveAfterStep` after
        every callback."""
        if not any(isinstance(c, _SaveAfterStep) and c.owner is self for c in trainer.callbacks):
            trainer.callbacks.append(_SaveAfterStep(self))
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

    # --- stop signals -------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on_preemption:
            self._take_over_signals(trainer, training=False)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        self._ending_epoch = _resumed_before_epoch_end(trainer)
        if self.on_preemption:
            self._take_over_signals(trainer, training=True)

    def _take_over_signals(self, trainer: L.Trainer, training: bool) -> None:
        """Handle SIGTERM and the other stop signals of :mod:`..system.stop_signals` from the sanity check
        on, SIGINT once training runs (a Ctrl-C while the data is set up stops at once). Lightning
        registered its SIGTERM handler (which makes the loops stop after the current training step
        or validation batch and raise ``SIGTERMException``) just before, and puts every handler back
        as it found it when the run ends. A signal with a handler of the user's own, or one ignored
        (``nohup``, a background job), is left alone.

        One process: a signal goes to Lightning's handler at once, unless it comes inside a
        gradient-accumulation window: then as the window's last batch starts, so that the run
        stops after the optimizer step that closes it and no accumulated gradient is lost.
        Several: the handler only records it (Lightning's would run a collective inside the
        handler, which deadlocks when the other processes are in another collective), and all
        processes decide together, after each optimizer step, whether any of them got one
        (:meth:`_vote`)."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if callable(current) and current is not self._handler:
            self._lightning_stop = current
        if self._lightning_stop is None:
            return
        self._handler = self._handler or self._signal_handler(trainer)
        for signum in (signal.SIGTERM, *((signal.SIGINT,) if training else ()), *POLITE_SIGNALS):
            if signal.getsignal(signum) in (_untouched(signum), self._lightning_stop):
                signal.signal(signum, self._handler)

    def _signal_handler(self, trainer: L.Trainer):
        pid, say, distributed = os.getpid(), trainer.is_global_zero, trainer.world_size > 1
        launcher = trainer.strategy.launcher

        def stop_after_this_step(signum, frame) -> None:
            if os.getpid() != pid:  # a data worker forked with this handler: the main process stops
                return
            if signum == signal.SIGINT:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C again: stop at once
            drop_gone_terminal()
            first = self.stopped_by is None
            if first:
                self.stopped_by = signal.Signals(signum)
                if say:  # os.write: a print could re-enter a write the signal interrupted
                    again = " (Ctrl-C again: stop now, without saving)" if signum == signal.SIGINT else ""
                    with contextlib.suppress(OSError):
                        os.write(2, f"\n{signal_label(signum)}: stopping after this step and saving "
                                    f"last.ckpt{again}\n".encode())
            if distributed:
                if first and launcher is not None:
                    launcher.kill(signum)  # the processes Lightning started, if it started them
            elif inside_accumulation_window(trainer):
                self._stop_due = True  # on_train_batch_start of the window's last batch
            else:
                self._lightning_stop(signum, frame)

        return stop_after_this_step

    def _vote(self, trainer: L.Trainer) -> None:
        """Several processes: after each optimizer step and each validation, every process says
        whether it got a stop signal; if any did, all of them stop together where no collective is
        under way: at the end of this step's validation if it has one, else after the next step
        (:meth:`_stop_together`); a validation inside an accumulation window, after the step that
        closes it. A validation is never cut: a signal that comes during one takes
        effect when it ends."""
        if self._handler is None or trainer.world_size == 1 or self._stop_due:
            return
        self._stop_due = bool(max_over_ranks(int(self.stopped_by is not None)))

    def _stop_together(self, trainer: L.Trainer) -> None:
        """Every process calls Lightning's SIGTERM handler at the same point (its collective is
        then matched), so each stops after the same step and saves together."""
        self._stop_due = False
        signum = self.stopped_by or signal.SIGTERM
        self.stopped_by = signum
        self._lightning_stop(signum, None)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step_ended = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        self._validated_at = trainer.global_step
        self._vote(trainer)  # a signal that came during the validation stops the run right after it
        if self._stop_due and not inside_accumulation_window(trainer):  # inside a window: at its last batch
            self._stop_together(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_ended = False
        # the step's last batch, so that no accumulated gradient is lost
        if self._stop_due and not inside_accumulation_window(trainer):
            self._stop_together(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self._cut_epoch:
            reopen_epoch(checkpoint)
        if self._stopped_in is not None:
            resume_point(checkpoint, self._stopped_in)
        elif self._step_ended and (after := _after_this_step(trainer)) is not None:
            # another callback's step save (a ModelCheckpoint every n steps), a validation or the epoch's
            # end to come: the same file as a step save of last.ckpt there, so that a resume from it runs it
            resume_point(checkpoint, after)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.sanity_checking or inside_accumulation_window(trainer):
            return
        self._step_ended = True
        self._vote(trainer)
        due = bool(self.every_n_train_steps) and trainer.global_step % self.every_n_train_steps == 0
        if self.every_minutes:
            # rank 0's clock decides for everyone, so all ranks enter the collective save together
            late = time.monotonic() - self._last_save >= 60 * self.every_minutes
            due = due or bool(trainer.strategy.broadcast(late))
        # saved by _SaveAfterStep, the last callback: once every callback has recorded this step (the
        # run summary's loss point and sample count), so that a run killed outright (SIGKILL, an
        # out-of-memory kill) resumes from this file with them
        self._save_due = due

    def save_if_due(self, trainer: L.Trainer) -> None:
        if not self._save_due:
            return
        self._save_due = False
        # a validation (or the epoch's end) that follows this step is still to come: a resume from this file
        # runs it (Lightning would take the file for one saved once it was done, and skip it)
        self._stopped_in = _after_this_step(trainer)
        try:
            self.save(trainer)
        finally:
            self._stopped_in = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step_ended = False
        if self._ending_epoch:
            self._ending_epoch = False
            _end_resumed_epoch(trainer)
        if _epoch_complete(trainer):
            self.save(trainer)
            return
        # max_steps (or a stop request) ended training inside the epoch. Lightning has already
        # counted the epoch processed, so its checkpoint would resume at the next epoch's first batch
        # and the rest of this one would never be seen: save what a stop signal after this step saves
        # (on_exception), the epoch still open, so a resume goes on at its next batch
        self._cut_epoch = True
        if self._validated_at == trainer.global_step:
            self._stopped_in = "after validation"
        try:
            self.save(trainer)
        finally:
            self._cut_epoch, self._stopped_in = False, None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not self.on_preemption or not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        # where in its step the run stopped decides how the resumed run takes it up (resume_point)
        if trainer.validating and not trainer.sanity_checking:
            self._stopped_in = "validation"
        elif self._validated_at == trainer.global_step and not _epoch_complete(trainer):
            self._stopped_in = "after validation"
        try:
            self.save(trainer)
        finally:
            self._stopped_in = None
        # for the exit line and status
        exception.checkpoint_path, exception.step = self.saved_path, trainer.global_step
        exception.signal = self.stopped_by or signal.SIGTERM


# Lightning 2.6's keys in a checkpoint's loops.fit_loop
_VAL_PROGRESS, _EPOCH_STATE = "epoch_loop.val_loop.batch_progress", "epoch_loop.state_dict"
_BATCH_PROGRESS = "epoch_loop.batch_progress"
_EPOCH_PROGRESS = "epoch_progress"


def resume_point(checkpoint: dict, stopped_in: str) -> None:
    """Make a checkpoint saved when a signal stopped a training step resume exactly where an
    uninterrupted run goes on, as Lightning's restart logic reads its loops' counters.

    - ``"validation"``: stopped between two batches of a validation (one process stops after the
      current batch). Lightning would skip that validation on resume: its training batch is done,
      so the checkpoint looks like one saved once the validation ended. It reruns a validation only
      when the checkpoint holds one batch started and not processed: the validation loop's
      counters are set to exactly that, at its first batch (what the cut validation had
      accumulated lived in the metrics' state, which no checkpoint holds).
    - ``"before validation"``: saved at the end of a step that a validation follows (a step save
      of ``last.ckpt``, which a run killed outright during that validation resumes from): the
      file a stop signal would have saved as that validation began. The validation counters are
      set as for ``"validation"``, so that the resume runs it, and the training batch, which
      Lightning counts completed only after the step's callbacks, is counted completed: taken for
      one saved inside the batch, Lightning would take a checkpoint of the epoch's last batch for
      one of an epoch that ended, and skip the epoch's end on resume (its training means never
      logged, an epoch-wise schedule never stepped).
    - ``"before epoch end"``: saved at the end of an epoch's last step that no validation follows (a
      step save, which a run killed outright before the epoch's end resumes from). Lightning would
      take the file for one of an ended epoch and skip the epoch's end; the training batch is
      counted completed as for ``"before validation"``, and the count of stepped batches raised as
      the step's end raises it (Lightning raises it on resume only for a file saved inside the
      batch). Lightning's epoch loop, restarting with no batch left, would then wait for a
      validation that never comes and train one batch too many: :func:`_resumed_before_epoch_end`
      lets it end, and the epoch's end runs once, as in the uninterrupted run.
    - ``"after validation"``: stopped at the end of a step that ran its validation (several
      processes finish it before they stop together; one process when the signal came during
      the last validation batch). Lightning takes such a checkpoint for one saved at the
      validation's end, before the step's count of stepped batches (the loggers' step) is raised,
      and raises it on resume: the count is stored as it was then.

    ``tests/tasks/common/checkpoints/test_resume_life.py`` compares resumed runs with uninterrupted ones,
    eagerly and under DDP: it fails if a Lightning release changes these counters.
    """
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    progress, state, batches = loops.get(_VAL_PROGRESS), loops.get(_EPOCH_STATE), loops.get(_BATCH_PROGRESS)
    if any(not isinstance(p, dict) or not {"total", "current"} <= p.keys() for p in (progress, batches)) \
            or not isinstance(state, dict) or "_batches_that_stepped" not in state:
        raise RuntimeError(f"this Lightning version's checkpoints hold no {_VAL_PROGRESS}, {_BATCH_PROGRESS} or "
                           f"{_EPOCH_STATE}: the step the signal stopped cannot be taken up where an uninterrupted "
                           "run goes on")
    if stopped_in in ("before validation", "before epoch end"):
        for counts in (batches["total"], batches["current"]):
            counts["completed"] = counts["processed"]
    if stopped_in == "before epoch end":
        state["_batches_that_stepped"] += 1
    if stopped_in in ("validation", "before validation"):
        before = progress["total"]["completed"]  # earlier validations' batches
        if stopped_in == "validation":
            before -= progress["current"]["completed"]
        progress["total"].update(ready=before + 1, started=before + 1, processed=before, completed=before)
        progress["current"].update(ready=1, started=1, processed=0, completed=0)
        progress["is_last_batch"] = False
    if stopped_in == "after validation":
        state["_batches_that_stepped"] -= 1


def reopen_epoch(checkpoint: dict) -> None:
    """Make a checkpoint saved at the end of an epoch that max_steps (or a stop request) cut short
    resume inside that epoch, at its next batch, as one saved when a stop signal ended the same step.

    The epoch-end hooks run after Lightning counted the epoch processed (not yet completed); from
    such counters Lightning resumes at the next epoch. The epoch is counted started and not
    processed again, which is what the counters held after the step, before the epoch's end.
    """
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get(_EPOCH_PROGRESS)
    if not isinstance(progress, dict) or not {"total", "current"} <= progress.keys():
        raise RuntimeError(f"this Lightning version's checkpoints hold no {_EPOCH_PROGRESS}: an epoch that max_steps "
                           "cut short cannot be taken up where an uninterrupted run goes on")
    for counts in (progress["total"], progress["current"]):
        if counts["processed"] == counts["completed"] + 1:
            counts["processed"] = counts["completed"]


def _validates_after_this_step(trainer: L.Trainer) -> bool:
    """Whether the fit loop runs a validation once the training batch that just ended is done (its
    own rule: val_check_interval, the epoch's last batch, check_val_every_n_epoch)."""
    loop = trainer.fit_loop
    return bool(loop.epoch_loop._should_check_val_fx(loop._data_fetcher))


def _after_this_step(trainer: L.Trainer) -> Optional[str]:
    """What a file saved at the end of the training step that just ended must resume with
    (:func:`resume_point`): ``"before validation"``, ``"before epoch end"`` (the epoch's last step,
    no validation after it) or None (the next batch)."""
    if _validates_after_this_step(trainer):
        return "before validation"
    progress = trainer.fit_loop.epoch_progress.current
    if progress.started > progress.processed and _epoch_complete(trainer):
        return "before epoch end"
    return None


def _resumed_before_epoch_end(trainer: L.Trainer) -> bool:
    """Whether fit resumes from a file marked ``"before epoch end"``: the epoch loop restarts with
    every batch of its epoch done (counted completed) and no validation to run. Lightning's epoch
    loop ends on restart only once a validation has run: it is told one has (the validation loop's
    ``_has_run``, which nothing else reads before the epoch's end, put back there), so that it
    ends without training a batch and the fit loop runs the epoch's end."""
    loop = trainer.fit_loop
    epoch_loop = loop.epoch_loop
    if not (loop.restarting and epoch_loop.restarting and epoch_loop.restarted_on_last
            and _epoch_complete(trainer) and not _validates_after_this_step(trainer)):
        return False
    epoch_loop.val_loop._has_run = True
    return True


def _end_resumed_epoch(trainer: L.Trainer) -> None:
    """In the epoch's end after :func:`_resumed_before_epoch_end`: the epoch loop ran no batch, so
    Lightning never ended its restart, and the fit loop's, which would skip the step of the
    epoch-wise plateau schedules (``ReduceLROnPlateau``; the others stepped with the epoch's last
    batch, before the file was saved), lasts until the epoch's end is over: both end here, as in the
    uninterrupted run, and the validation loop is again one that has not run (ModelCheckpoint reads it)."""
    loop = trainer.fit_loop
    loop.epoch_loop.val_loop._has_run = False
    loop.epoch_loop.restarting = False
    loop._restarting = False


def _untouched(signum: int):
    """A signal's disposition before anyone took it over: Python's Ctrl-C handler, or the default."""
    return signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL


def stop_signal(exception: BaseException) -> signal.Signals:
    """The signal that stopped a run (``SIGTERMException``): the one :class:`LastCheckpoint` took
    over (SIGINT, SIGHUP ...), else SIGTERM."""
    return getattr(exception, "signal", signal.SIGTERM)


def preempted_message(exception: BaseException) -> str:
    """The one line a run stopped by a signal ends with: where it stopped and how to resume it."""
    by = signal_label(stop_signal(exception))
    path = getattr(exception, "checkpoint_path", None)
    if path is None:
        return f"stopped by {by} before a checkpoint could be written; resume from the last checkpoint"
    return (f"stopped by {by} at step {exception.step}; saved {path}. Resume with the same command "
            f"with --ckpt_path {path} (in place of its own, if any)")


def checkpoint_folder(trainer: L.Trainer) -> str:
    """The folder of the run's checkpoints (``last.ckpt``, the epoch checkpoints), known before
    the run starts: the first ModelCheckpoint's ``dirpath`` once set, ``last_checkpoint.dirpath/<run
    id>``, or where that ModelCheckpoint will put them, as Lightning resolves it:
    ``<save_dir>/<logger name>/<version>/checkpoints`` (W&B: ``runs/<project>/<run id>/checkpoints``)."""
    checkpoint = trainer.checkpoint_callback
    last = next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
    return planned_checkpoint_folder(trainer.loggers[0] if trainer.loggers else None, trainer.default_root_dir,
                                     checkpoint.dirpath if isinstance(checkpoint, ModelCheckpoint) else None,
                                     last.dirpath if last is not None else None,
                                     checkpointing=isinstance(checkpoint, ModelCheckpoint))


def planned_checkpoint_folder(logger: Optional[Any], default_root_dir: Optional[str],
                              checkpoint_dirpath: Optional[str] = None, last_dirpath: Optional[str] = None,
                              checkpointing: bool = True) -> str:
    """:func:`checkpoint_folder` from its parts, for a run whose Trainer is not built yet: its
    first logger, ``trainer.default_root_dir`` (None: the working directory), the first
    ModelCheckpoint's ``dirpath``, ``last_checkpoint.dirpath``; ``checkpointing``: whether the run
    has a ModelCheckpoint."""
    root = default_root_dir or os.getcwd()
    if checkpoint_dirpath:
        return checkpoint_dirpath
    last = _run_subfolder(last_dirpath, logger)
    if last is not None:
        return last
    folder = _logger_folder(logger, root)
    if checkpointing and folder is not None:
        return os.path.join(folder, "checkpoints")
    return os.path.join(root, "checkpoints")


def _run_subfolder(dirpath: Optional[str], logger: Optional[Any]) -> Optional[str]:
    """``dirpath/<run id>`` (None without a ``dirpath``)."""
    if not dirpath:
        return None
    version = getattr(logger, "version", None) if logger is not None else None
    return dirpath.rstrip("/") + (f"/{version}" if version else "")


def logger_folder(trainer: L.Trainer) -> Optional[str]:
    """``<save_dir>/<logger name>/<version>`` of the first logger, the folder Lightning gives a
    run's checkpoints (W&B: ``runs/<project>/<run id>``); None without a logger (or with
    ``fast_dev_run``'s stand-in, which has no folder)."""
    return _logger_folder(trainer.loggers[0] if trainer.loggers else None, trainer.default_root_dir)


def _logger_folder(logger: Optional[Any], default_root_dir: str) -> Optional[str]:
    if logger is None or isinstance(logger, DummyLogger) or logger.version in (None, ""):
        return None
    version = logger.version
    return os.path.join(logger.save_dir or default_root_dir, str(logger.name),
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
