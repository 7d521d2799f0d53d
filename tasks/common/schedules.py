"""Learning-rate schedules stepped every optimizer step: linear warm-up, then multi-step or
cosine decay (Goyal et al. 2017 warm-up; the RescaleNet recipe: 5 warm-up epochs when the
batch exceeds 256, then x0.1 at epochs 30/60/90, or cosine).

Milestones and warm-up are given in epochs (fractions allowed); the task module passes
``steps_per_epoch`` and ``max_epochs`` when it builds the scheduler, so one config works for
any batch size and data set size.
"""
from __future__ import annotations

import bisect
import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["WarmupMultiStepLR", "WarmupCosineLR", "ConstantLR", "InverseSqrtLR"]


class _EpochScheduleLR(LambdaLR):
    """LambdaLR over steps, whose factor is defined on (fractional) epochs."""

    def __init__(self, optimizer: Optimizer, warmup_epochs: float = 0.0, steps_per_epoch: int = 1,
                 max_epochs: int | None = None, last_epoch: int = -1) -> None:
        self.warmup_epochs = float(warmup_epochs)
        self.steps_per_epoch = max(int(steps_per_epoch), 1)
        self.max_epochs = max_epochs
        super().__init__(optimizer, self._factor, last_epoch=last_epoch)

    def _factor(self, step: int) -> float:
        epoch = step / self.steps_per_epoch
        if self.warmup_epochs > 0 and epoch < self.warmup_epochs:
            return (step + 1) / (self.warmup_epochs * self.steps_per_epoch)
        return self.decay(epoch)

    def decay(self, epoch: float) -> float:  # pragma: no cover - overridden
        return 1.0

    def state_dict(self) -> dict:  # the lambda is a bound method: keep it out of the state
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)


class WarmupMultiStepLR(_EpochScheduleLR):
    def __init__(self, optimizer: Optimizer, milestones: list[float] = (30, 60, 90), gamma: float = 0.1,
                 warmup_epochs: float = 0.0, steps_per_epoch: int = 1, max_epochs: int | None = None,
                 last_epoch: int = -1) -> None:
        self.milestones = sorted(float(m) for m in milestones)
        self.gamma = gamma
        super().__init__(optimizer, warmup_epochs, steps_per_epoch, max_epochs, last_epoch)

    def decay(self, epoch: float) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, epoch)


class WarmupCosineLR(_EpochScheduleLR):
    def __init__(self, optimizer: Optimizer, warmup_epochs: float = 0.0, min_factor: float = 0.0,
                 steps_per_epoch: int = 1, max_epochs: int | None = None, last_epoch: int = -1) -> None:
        if not max_epochs:
            raise ValueError("WarmupCosineLR needs max_epochs (the length of the cosine); set trainer.max_epochs")
        self.min_factor = min_factor
        super().__init__(optimizer, warmup_epochs, steps_per_epoch, max_epochs, last_epoch)

    def decay(self, epoch: float) -> float:
        total = self.max_epochs - self.warmup_epochs
        t = min(max((epoch - self.warmup_epochs) / max(total, 1e-8), 0.0), 1.0)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * t))


class ConstantLR(_EpochScheduleLR):
    """Warm-up (optional) then a constant learning rate."""


class InverseSqrtLR(LambdaLR):
    """The Transformer schedule (Vaswani et al. 2017; fairseq's ``inverse_sqrt``), in updates:
    linear warm-up from ``warmup_init_factor * lr`` to ``lr`` over ``warmup_updates``, then
    ``lr * sqrt(warmup_updates / update)``. Update ``u`` (1-based) is the one being taken.
    ``steps_per_epoch``/``max_epochs`` are accepted (the task module passes them) and unused."""

    def __init__(self, optimizer: Optimizer, warmup_updates: int = 4000, warmup_init_factor: float = 0.0,
                 steps_per_epoch: int = 1, max_epochs: int | None = None, last_epoch: int = -1) -> None:
        if warmup_updates < 0 or not 0.0 <= warmup_init_factor <= 1.0:
            raise ValueError(f"InverseSqrtLR: warmup_updates ({warmup_updates}) must be >= 0 and "
                             f"warmup_init_factor ({warmup_init_factor}) in [0, 1]")
        self.warmup_updates = int(warmup_updates)
        self.warmup_init_factor = float(warmup_init_factor)
        super().__init__(optimizer, self._factor, last_epoch=last_epoch)

    def _factor(self, step: int) -> float:
        update = step + 1
        if update < self.warmup_updates:
            return self.warmup_init_factor + update * (1.0 - self.warmup_init_factor) / self.warmup_updates
        return math.sqrt(max(self.warmup_updates, 1) / update)

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
