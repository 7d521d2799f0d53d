"""An exponential moving average (EMA) of the weights, as a training option of every task.

:class:`WeightEMA` is Lightning's :class:`~lightning.pytorch.callbacks.WeightAveraging` (the
averaged copy of the module, its update once per optimizer step under gradient accumulation too,
the swap of the averaged weights in for validation, the averaged weights in the checkpoint's
``state_dict`` with the trained ones in ``current_model_state``) with the average of the official
NF-ResNet/NFNet code (deepmind-research ``nfnets``, ``utils.tf1_ema``), which Lightning's
``EMAWeightAveraging`` does not compute: after optimizer step ``t`` (0 for the first)

    ema <- d_t * ema + (1 - d_t) * weights,   d_t = min(decay, (1 + t) / (10 + t))

(``warmup: false``: ``d_t = decay``), every parameter and floating-point buffer averaged, the
average starting from the initial weights (Lightning's would start from the weights after the
first step). Off unless ``decay`` is given (the run config's ``ema`` section, ``--ema.decay``).

What uses which weights:

- validation during ``fit`` evaluates the averaged weights (the training weights are swapped
  back after it); when ``fit`` ends the module holds the averaged weights;
- every checkpoint's ``state_dict`` holds the averaged weights, so ``validate``/``test``/
  ``predict`` of a checkpoint, ``rescale export`` and ``average-checkpoints`` (which read
  ``state_dict``) take the averaged weights; the training weights are the checkpoint's
  ``current_model_state``;
- a resume (``--ckpt_path .../last.ckpt``) restores both, and the step ``t``: it continues the
  average exactly as an uninterrupted run does. Resuming such a checkpoint with the average
  off is refused in one line (its ``state_dict`` is not the training weights).
"""
from __future__ import annotations

import itertools
import logging
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from torch.optim.swa_utils import get_ema_multi_avg_fn

from rescale_core.plans import drop_kept

from ..errors import ConfigError
from ..system import rank_zero_log

__all__ = ["WeightEMA", "ema_decay_at"]

log = logging.getLogger(__name__)

# the strategies whose module holds shards of the parameters (Lightning's WeightAveraging does not
# support them: the copy it makes at setup would not match the wrapped module's parameters)
_SHARDED = (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)

# the keys Lightning's WeightAveraging adds to a checkpoint it writes
_TRAINING_WEIGHTS = "current_model_state"


def ema_decay_at(step: int, decay: float, warmup: bool = True) -> float:
    """The decay applied after optimizer step ``step`` (0 for the first): ``decay``, or with the
    official code's warm-up ``min(decay, (1 + step) / (10 + step))``."""
    return min(decay, (1.0 + step) / (10.0 + step)) if warmup else decay


class WeightEMA(WeightAveraging):
    """An exponential moving average of the weights, off unless ema.decay is given.

    Validation evaluates it and every checkpoint's state_dict holds it (docs/nf_resnets.md,
    "Weight EMA").

    Args:
        decay: the average's decay per optimizer step; null: no average (the official NF code's 0.99999)
        warmup: the official code's warm-up, min(decay, (1 + t) / (10 + t)) after step t
        device: where the averaged copy lives: the module's device by default, cpu to spare accelerator memory
    """

    def __init__(self, decay: Optional[float] = None, warmup: bool = True, device: Optional[str] = None) -> None:
        if decay is not None and not 0.0 < decay < 1.0:
            raise ConfigError(f"ema.decay must be between 0 and 1 (0.99999 in the official NF-ResNet code), "
                              f"got {decay}; leave it out (null) to train without an average of the weights")
        try:
            where = None if device is None else torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise ConfigError(f"ema.device {device!r} is not a device: give cpu (the average off the accelerator) or "
                              f"leave it out (the average beside the module)") from None
        super().__init__(device=where, use_buffers=True, multi_avg_fn=self._average)
        self.where = where
        self.decay = decay
        self.warmup = warmup
        self._step = 0  # the optimizer step being averaged in (0-based)
        self._swapped = False  # the module holds the averaged weights (a validation inside fit)

    @property
    def on(self) -> bool:
        return self.decay is not None

    def decay_at(self, step: int) -> float:
        return ema_decay_at(step, self.decay, self.warmup)

    def _average(self, averaged: list, current: list, n_averaged: torch.Tensor) -> None:
        """One group of tensors (AveragedModel groups the average's by device and dtype): a floating
        group is lerped by torch's EMA in one multi-tensor kernel, integer buffers (a batch norm's
        batch count) take the current value."""
        with torch.no_grad():
            if not averaged[0].is_floating_point():
                for a, c in zip(averaged, current):
                    a.copy_(c)
                return
            dtype = averaged[0].dtype  # a half-precision module's (bf16-true) average is kept in float32
            current = [c if c.dtype == dtype else c.to(dtype) for c in current]
            get_ema_multi_avg_fn(self.decay_at(self._step))(averaged, current, n_averaged)

    # --- the average, off unless decay is given -----------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.on:
            return
        if stage == "fit" and isinstance(trainer.strategy, _SHARDED):
            raise ConfigError(f"ema.decay: an average of the weights is kept as a whole copy of the module, which a "
                              f"sharded strategy ({type(trainer.strategy).__name__}) does not hold; train with "
                              f"trainer.strategy ddp (or one device), or drop ema.decay")
        root = trainer.strategy.root_device
        if stage == "fit" and self.where is not None and self.where.type not in ("cpu", root.type):
            raise ConfigError(f"ema.device {self.where}: this run trains on {root}; the average lives on cpu "
                              f"(ema.device cpu) or beside the module (leave ema.device out)")
        with _callables_aside(pl_module):
            super().setup(trainer, pl_module, stage)
        if self._average_model is not None:
            # the copy already holds the initial weights: the first step is averaged into them
            # (AveragedModel copies the weights at its first update while it counts none)
            self._average_model.n_averaged.fill_(1)
            # in float32 at least: a half-precision average would not move (1 - decay is below bf16's
            # and fp16's resolution)
            module = self._average_model.module
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                if tensor.is_floating_point() and tensor.element_size() < 4:
                    tensor.data = tensor.data.float()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.on:
            self._step = trainer.global_step - 1
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on:
            super().on_train_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on and self._average_model is not None:
            super().on_train_end(trainer, pl_module)
            drop_kept(pl_module)  # weights written through .data: no version counter moved

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on and self._average_model is not None and not self._swapped:
            super().on_validation_epoch_start(trainer, pl_module)
            self._swapped = True
            drop_kept(pl_module)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on and self._average_model is not None and self._swapped:
            super().on_validation_epoch_end(trainer, pl_module)
            self._swapped = False
            drop_kept(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._swap_back(pl_module)

    def _swap_back(self, pl_module: L.LightningModule) -> None:
        if self._swapped:
            self.on_validation_epoch_end(pl_module.trainer, pl_module)

    # --- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if not self.on:
            return {}
        return {**super().state_dict(), "decay": self.decay, "warmup": self.warmup}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.on or "latest_update_step" not in state_dict:
            return
        super().load_state_dict(state_dict)
        saved = (state_dict.get("decay"), state_dict.get("warmup"))
        if saved != (self.decay, self.warmup):
            rank_zero_log(log, logging.WARNING, f"the checkpoint's average of the weights was taken with ema.decay "
                          f"{saved[0]}, ema.warmup {saved[1]}; it goes on with ema.decay {self.decay}, "
                          f"ema.warmup {self.warmup}")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if not self.on or self._average_model is None:
            return  # outside fit the module's weights are what the checkpoint it came from held
        if not self._swapped:
            super().on_save_checkpoint(trainer, pl_module, checkpoint)
            return
        # saved inside a validation (a stop signal there): the module holds the average, the averaged
        # copy the training weights, and the checkpoint's tensors share their storage until written
        averaged = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self._swap_back(pl_module)
        checkpoint["state_dict"] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        checkpoint["state_dict"] = averaged
        self.on_validation_epoch_start(trainer, pl_module)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if not self.on:
            if _TRAINING_WEIGHTS in checkpoint and trainer.state.fn == "fit":
                raise ConfigError("this checkpoint was trained with an average of the weights (ema.decay "
                                  f"{_saved_decay(checkpoint)}): its state_dict holds the averaged weights, not "
                                  "the training ones; resume it with the same --ema.decay")
            return
        if self._average_model is None:
            return  # validate/test/predict: the checkpoint's state_dict is the average already
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        drop_kept(pl_module)


@contextmanager
def _callables_aside(pl_module: L.LightningModule) -> Iterator[None]:
    """The module's own callables (the optimizer and scheduler factories) out of it while the average
    copies it: the CLI's factories reach its parser and through it the Trainer, whose copy would be
    a copy of the whole run (its data, its loggers) and, under DDP started by Lightning's launcher,
    cannot be made (the handles of the processes it started). The copy holds weights only."""
    state = vars(pl_module)
    aside = {k: v for k, v in state.items() if callable(v) and not isinstance(v, torch.nn.Module)}
    for key in aside:
        del state[key]
    try:
        yield
    finally:
        state.update(aside)


def _saved_decay(checkpoint: dict) -> Any:
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if key == WeightEMA.__qualname__ and isinstance(state, dict) and "decay" in state:
            return state["decay"]
    return "unknown"
