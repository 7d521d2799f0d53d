"""Callbacks every task uses: divergence detection and learned-scalar logging."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Optional

import lightning.pytorch as L
import torch

from rescale_core.analysis import learned_scalars

from ..data import is_skipped
from ..errors import ConfigError
from ..system import rank_zero_log

__all__ = ["DivergenceMonitor", "LearnedScalarsLogger", "TrainingDiverged", "inside_accumulation_window",
           "optimizer_step_due"]

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """Raised (and reported on one line) when the loss or the gradients stop being finite."""


class DivergenceMonitor(L.Callback):
    """Stops the run at the first non-finite loss (or gradient norm), with one clear line naming
    the step, the scheme and the likely cause, and records ``diverged`` in the logger summary.

    No host-device synchronisation per step on accelerators: whether a step's loss or gradient
    norm is finite is folded, on the device, into the first bad step seen so far (``torch.where``,
    no ``.item()``), and that is read only every ``check_every_n_steps`` steps (None: 1 on CPU,
    where a read costs nothing, 25 on accelerators), before validation and when an epoch or
    training ends. The step reported is still the exact first bad one (the value of
    ``trainer.global_step`` while that batch ran); the run stops at the next read.

    ``raise_error=False`` (the demo and the depth/batch-size studies) stops the run gracefully
    instead of failing it, so a sweep carries on and the diverged run is reported as such; the
    diverged model is not validated (no metric of it is reported as the run's).
    """

    ACCELERATOR_CHECK_EVERY = 25
    _LOSS, _GRAD = 1, 2  # bits of what went non-finite first

    def __init__(self, check_gradients: bool = True, raise_error: bool = True,
                 check_every_n_steps: Optional[int] = None) -> None:
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ConfigError(f"DivergenceMonitor check_every_n_steps must be at least 1, got {check_every_n_steps}.")
        self.check_gradients = check_gradients
        self.raise_error = raise_error
        self.check_every_n_steps = check_every_n_steps
        self.diverged_at: int | None = None
        self.message: str | None = None
        self.reads = 0  # device reads so far (tests count them)
        self._every = 1
        self._step = 0  # trainer.global_step while the current batch runs
        self._batches = 0
        self._bad_step: Optional[torch.Tensor] = None  # first non-finite step, -1 while none (on device)
        self._bad_what: Optional[torch.Tensor] = None

    # --- device-side bookkeeping ------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        every = self.check_every_n_steps
        on_cpu = trainer.strategy.root_device.type == "cpu"
        self._every = every if every is not None else (1 if on_cpu else self.ACCELERATOR_CHECK_EVERY)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        device = trainer.strategy.root_device
        self._bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self._bad_what = torch.zeros((), dtype=torch.long, device=device)
        self._batches = 0

    def _record(self, not_finite: torch.Tensor, what: int) -> None:
        """Fold one check into (first bad step, what) without leaving the device."""
        if self._bad_step is None:
            return
        take = not_finite & ((self._bad_step < 0) | (self._bad_step == self._step))
        self._bad_step = torch.where(take, self._step, self._bad_step)
        self._bad_what = torch.where(take, self._bad_what | what, self._bad_what)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # fp16 with a GradScaler: inf gradients are expected, the scaler skips those steps
        if not self.check_gradients or getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if grads:  # one fused norm pass
            self._record(~torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum()), self._GRAD)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not is_skipped(outputs):  # a batch of bad files has no loss (common.data.empty_batches)
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            if isinstance(loss, torch.Tensor):
                self._record(~torch.isfinite(loss.detach()), self._LOSS)
        self._batches += 1
        if self._batches % self._every == 0:
            self._check(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:  # never validate a diverged model
            self._check(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)

    # --- reading and reporting --------------------------------------------------------------
    def healthy(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """Read the device-side record now (e.g. before a checkpoint is written): False, or
        ``TrainingDiverged`` with ``raise_error``, when a non-finite value has been seen."""
        self._check(trainer, pl_module)
        return self.diverged_at is None

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The one host read: stop if any rank has seen a non-finite value."""
        if self._bad_step is None or self.diverged_at is not None:
            return
        step, what = self._bad_step, self._bad_what
        if trainer.world_size > 1:  # every rank stops at the same step (no rank left waiting)
            none = torch.iinfo(torch.long).max
            step = trainer.strategy.reduce(torch.where(step < 0, none, step), reduce_op="min")
            what = trainer.strategy.reduce(torch.where(self._bad_step == step, what, 0), reduce_op="max")
            step = torch.where(step == none, -1, step)
        self.reads += 1
        first, bits = (int(v) for v in torch.stack([step, what]).tolist())
        if first >= 0:
            what_text = {self._LOSS: "the loss", self._GRAD: "the gradient norm"}.get(bits, "the loss")
            self._stop(trainer, pl_module, what_text, first)

    def _stop(self, trainer: L.Trainer, pl_module: L.LightningModule, what: str, step: int) -> None:
        scheme = getattr(pl_module, "scheme_name", "?")
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan")
        self.diverged_at = step
        self.message = (f"training diverged at step {step} (epoch {trainer.current_epoch}): "
                        f"{what} is not finite; scheme={scheme}, lr={lr:.4g}. Likely cause: learning rate too "
                        f"high for this scheme/depth, or a scheme without normalisation at a depth it cannot train "
                        f"(see the scheme's init); lower --model.init_args.optimizer.init_args.lr or add warm-up.")
        # rank 0's loggers only: on the other ranks a logger's experiment is Lightning's stand-in,
        # whose summary is no mapping (every rank gets here, at the same step)
        for logger in trainer.loggers if trainer.is_global_zero else ():
            # at the row of the last step trained (Lightning logs optimizer step k's values at k - 1)
            logger.log_metrics({"diverged": 1.0}, step=max(trainer.global_step - 1, 0))
            experiment = getattr(logger, "experiment", None)
            summary = getattr(experiment, "summary", None)
            if summary is not None:  # after the log, which would overwrite it with 1.0
                summary["diverged"] = True
                summary["diverged_step"] = step
        trainer.should_stop = True
        # no validation of a diverged model: Lightning runs one when a run stops early (a read at
        # a validation's start, on accelerators, comes too late for that one)
        trainer.limit_val_batches = 0
        if self.raise_error:
            raise TrainingDiverged(self.message)
        rank_zero_log(log, logging.WARNING, self.message)  # every process diverged at the same step: one line

    def state_dict(self) -> dict:
        return {"diverged_at": self.diverged_at}

    def load_state_dict(self, state_dict: dict) -> None:
        self.diverged_at = state_dict.get("diverged_at")


def inside_accumulation_window(trainer: L.Trainer) -> bool:
    """Whether the training batch begun last (running, or done) ends no optimizer step: a
    gradient-accumulation window is open, to be closed by a later batch of the epoch (Lightning's
    own rule, ``_should_accumulate``)."""
    return trainer.fit_loop.epoch_loop._should_accumulate()


def optimizer_step_due(trainer: L.Trainer, every_n_steps: int, started_at: Optional[int]) -> bool:
    """Whether ``on_train_batch_end`` runs right after an optimizer step due every ``every_n_steps``
    (the first step, then every n): ``started_at`` is ``trainer.global_step`` at that batch's
    ``on_train_batch_start`` (None: not seen). Under gradient accumulation every batch of a window
    ends at the same ``global_step``: only the batch that stepped is due, none before the first
    step, and none of a resumed run's window before its first step (its ``global_step`` is the
    restored one, the step the run before already handled)."""
    step = trainer.global_step
    return step >= 1 and started_at is not None and step != started_at and not (step - 1) % every_n_steps


class LearnedScalarsLogger(L.Callback):
    """Logs every residual block's learned branch multiplier (``scalars/<block>``) after the
    first step, every ``every_n_steps`` steps and after the last: the RescaleNet rebuttal's
    per-block scalars, as they train (a run summary's final values are the trained ones).

    Once per optimizer step it is due at, under gradient accumulation too, at the step of that
    optimizer step's own logged metrics; between two such steps nothing is logged (Lightning's
    ``self.log`` would log the last values again at every logged step in between)."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ConfigError(f"learned_scalars.every_n_steps ({every_n_steps}) must be at least 1")
        self.every_n_steps = every_n_steps
        self._started_at: Optional[int] = None  # trainer.global_step at the current batch's start

    @staticmethod
    def _last_step(trainer: L.Trainer) -> bool:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return True
        epochs = trainer.max_epochs
        return trainer.is_last_batch and epochs is not None and epochs > 0 and trainer.current_epoch + 1 >= epochs

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._started_at = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        stepped = self._started_at is not None and step != self._started_at  # this batch ran an optimizer step
        if not (optimizer_step_due(trainer, self.every_n_steps, self._started_at)
                or (self._last_step(trainer) and stepped)):
            return
        net = getattr(pl_module, "net", pl_module)
        values = {f"scalars/{k}": v for k, v in learned_scalars(net).items()}
        if not values:
            return
        # the trained values for the run summary (callback_metrics), not to the loggers: Lightning
        # would log them again at every later logged step
        pl_module.log_dict(values, on_step=True, on_epoch=False, logger=False)
        for logger in trainer.loggers:  # rank zero writes (Lightning's loggers log on rank zero only)
            logger.log_metrics(values, step=step - 1)  # Lightning logs optimizer step k's metrics at k - 1
