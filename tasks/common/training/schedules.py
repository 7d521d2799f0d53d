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

__all__ = ["WarmupMultiStepLR", "WarmupCosineLR", "ConstantLR", "InverseSqrtLR", "IterationMultiStepLR"]


def _positive(schedule: object, name: str, value: float) -> float:
    if not value > 0:
        raise ValueError(f"{type(schedule).__name__}: {name} ({float(value)}) must be > 0")
    return float(value)


def _milestones(schedule: object, milestones: list) -> list:
    """The milestones as given: increasing and >= 0 (a list out of order is most likely a typo,
    e.g. 30, 6, 90 for 30, 60, 90, which sorting would hide)."""
    name = type(schedule).__name__
    if any(m < 0 for m in milestones):
        raise ValueError(f"{name}: milestones {milestones} must be >= 0")
    if any(a >= b for a, b in zip(milestones, milestones[1:])):
        raise ValueError(f"{name}: milestones {milestones} must increase (each later than the one before)")
    return milestones


class _MethodLambdaLR(LambdaLR):
    """A LambdaLR whose factor is a bound method: its state leaves the method out (it would pickle
    the optimizer with it) and keeps every setting."""

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)


class _EpochScheduleLR(_MethodLambdaLR):
    """LambdaLR over steps, whose factor is defined on (fractional) epochs."""

    #: whether the factor depends on ``max_epochs`` (a resume with another one changes the schedule)
    uses_max_epochs = False

    def load_state_dict(self, state_dict: dict) -> None:
        """The saved position, kept in epochs: a run resumed at an epoch's end with another batch
        size or process count (another ``steps_per_epoch``, which this schedule was built with)
        continues at the same epoch of the schedule, its steps counted at the new rate."""
        steps_per_epoch = self.steps_per_epoch
        saved = max(int(state_dict.get("steps_per_epoch") or steps_per_epoch), 1)
        super().load_state_dict(state_dict)
        if saved != steps_per_epoch:
            self.steps_per_epoch = steps_per_epoch
            self.last_epoch = round(self.last_epoch * steps_per_epoch / saved)

    def __init__(self, optimizer: Optimizer, warmup_epochs: float = 0.0, steps_per_epoch: int = 1,
                 max_epochs: int | None = None, last_epoch: int = -1) -> None:
        if warmup_epochs < 0:
            raise ValueError(f"{type(self).__name__}: warmup_epochs ({float(warmup_epochs)}) must be >= 0")
        self.warmup_epochs = float(warmup_epochs)
        self.steps_per_epoch = max(int(steps_per_epoch), 1)
        self.max_epochs = max_epochs
        super().__init__(optimizer, self._factor, last_epoch=last_epoch)

    def _factor(self, step: int) -> float:
        epoch = step / self.steps_per_epoch
        if self.warmup_epochs > 0 and epoch < self.warmup_epochs:
            # capped: a warm-up of a fractional number of steps would end above the base rate
            return min((step + 1) / (self.warmup_epochs * self.steps_per_epoch), 1.0)
        return self.decay(epoch)

    def decay(self, epoch: float) -> float:  # pragma: no cover - overridden
        return 1.0


class WarmupMultiStepLR(_EpochScheduleLR):
    def __init__(self, optimizer: Optimizer, milestones: list[float] = (30, 60, 90), gamma: float = 0.1,
                 warmup_epochs: float = 0.0, steps_per_epoch: int = 1, max_epochs: int | None = None,
                 last_epoch: int = -1) -> None:
        self.milestones = _milestones(self, [float(m) for m in milestones])
        self.gamma = _positive(self, "gamma", gamma)
        super().__init__(optimizer, warmup_epochs, steps_per_epoch, max_epochs, last_epoch)

    def decay(self, epoch: float) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, epoch)


class WarmupCosineLR(_EpochScheduleLR):
    """Linear warm-up, then a half-cosine down to ``min_factor`` x lr at ``max_epochs``.

    ``cosine_after_warmup`` (default True): the cosine spans the epochs after the warm-up, which
    climbs to the full lr. False: SlowFast's schedule (``SOLVER.COSINE_AFTER_WARMUP: False``,
    ``slowfast/utils/lr_policy.py``): the cosine spans the whole run from epoch 0, and the warm-up
    climbs linearly in epochs from ``warmup_start_factor`` x lr (SlowFast's ``WARMUP_START_LR`` /
    ``BASE_LR``) to the cosine's value at its end. Only a setting off its default is kept in the
    schedule's state (a checkpoint written before these options resumes unchanged)."""

    uses_max_epochs = True
    cosine_after_warmup = True
    warmup_start_factor = 0.0

    def __init__(self, optimizer: Optimizer, warmup_epochs: float = 0.0, min_factor: float = 0.0,
                 steps_per_epoch: int = 1, max_epochs: int | None = None, last_epoch: int = -1,
                 cosine_after_warmup: bool = True, warmup_start_factor: float = 0.0) -> None:
        if not max_epochs:
            raise ValueError("WarmupCosineLR needs max_epochs (the length of the cosine); set trainer.max_epochs")
        for name, value, what in (("min_factor", min_factor, "the floor of the cosine"),
                                  ("warmup_start_factor", warmup_start_factor, "where the warm-up starts")):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"WarmupCosineLR: {name} ({float(value)}) must be in [0, 1] ({what}, a fraction "
                                 "of the base learning rate)")
        self.min_factor = min_factor
        if not cosine_after_warmup:
            self.cosine_after_warmup = False
        if warmup_start_factor:
            self.warmup_start_factor = float(warmup_start_factor)
        super().__init__(optimizer, warmup_epochs, steps_per_epoch, max_epochs, last_epoch)

    def _factor(self, step: int) -> float:
        epoch = step / self.steps_per_epoch
        if not (self.warmup_epochs > 0 and epoch < self.warmup_epochs):
            return self.decay(epoch)
        if self.cosine_after_warmup:  # the shared warm-up, from its start factor
            return self.warmup_start_factor + (1 - self.warmup_start_factor) * super()._factor(step)
        start, end = self.warmup_start_factor, self.decay(self.warmup_epochs)
        return start + (end - start) * epoch / self.warmup_epochs

    def decay(self, epoch: float) -> float:
        offset = self.warmup_epochs if self.cosine_after_warmup else 0.0
        t = min(max((epoch - offset) / max(self.max_epochs - offset, 1e-8), 0.0), 1.0)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * t))


class ConstantLR(_EpochScheduleLR):
    """Warm-up (optional) then a constant learning rate."""


class InverseSqrtLR(_MethodLambdaLR):
    """The Transformer schedule (Vaswani et al. 2017), as fairseq's ``inverse_sqrt`` sets it: the
    rate of an update is a function of ``n``, the updates already taken (fairseq's
    ``num_updates``; 0 for the first update). For ``n < warmup_updates`` W, a linear warm-up
    ``lr * (f + n * (1 - f) / W)`` with ``f = warmup_init_factor`` (fairseq's ``--warmup-init-lr``
    over ``--lr``: the first update runs at ``f * lr``, 0 by default as fairseq's, whose WMT recipe
    gives 1e-7); from ``n = W`` (update W + 1, the peak at ``lr``) on, ``lr * sqrt(W / n)``.
    ``warmup_updates: 0`` alone: ``lr / sqrt(n + 1)`` from the first update at ``lr`` (fairseq
    has no such case). ``decay_period`` P (with ``warmup_updates: 0``): no warm-up,
    ``lr * sqrt(P / (P + n))`` from the first update at ``lr`` (T-Fixup's ``inverse_sqrt_nowarmup``,
    layer6ai-labs/T-Fixup). ``steps_per_epoch``/``max_epochs`` are accepted (the task module
    passes them) and unused."""

    def __init__(self, optimizer: Optimizer, warmup_updates: int = 4000, warmup_init_factor: float = 0.0,
                 decay_period: int | None = None, steps_per_epoch: int = 1, max_epochs: int | None = None,
                 last_epoch: int = -1) -> None:
        if warmup_updates < 0 or not 0.0 <= warmup_init_factor <= 1.0:
            raise ValueError(f"InverseSqrtLR: warmup_updates ({warmup_updates}) must be >= 0 and "
                             f"warmup_init_factor ({warmup_init_factor}) in [0, 1]")
        if decay_period is not None and (decay_period < 1 or warmup_updates != 0):
            raise ValueError(f"InverseSqrtLR: decay_period ({decay_period}) must be >= 1, with warmup_updates 0 "
                             f"(got {warmup_updates}): it replaces the warm-up")
        self.warmup_updates = int(warmup_updates)
        self.warmup_init_factor = float(warmup_init_factor)
        self.decay_period = None if decay_period is None else int(decay_period)
        super().__init__(optimizer, self._factor, last_epoch=last_epoch)

    def _factor(self, step: int) -> float:
        if self.decay_period is not None:
            return math.sqrt(self.decay_period / (self.decay_period + step))
        if self.warmup_updates == 0:
            return math.sqrt(1.0 / (step + 1))
        if step < self.warmup_updates:  # step: the updates already taken
            return self.warmup_init_factor + step * (1.0 - self.warmup_init_factor) / self.warmup_updates
        return math.sqrt(self.warmup_updates / step)


class IterationMultiStepLR(_MethodLambdaLR):
    """Detectron2's ``WarmupMultiStepLR``, in iterations (optimizer steps): linear warm-up over
    ``warmup_iters`` from ``warmup_factor * lr`` to ``lr``, then x``gamma`` at each milestone.
    The 1x COCO recipe: milestones (60000, 80000) of 90000, ``warmup_iters`` 1000, ``warmup_factor``
    0.001. ``steps_per_epoch``/``max_epochs`` are accepted (the task module passes them) and unused:
    the length of the run is ``trainer.max_steps``.

    Linear scaling (Goyal et al. 2017): with a total batch of B images instead of 16, use
    ``lr * B / 16`` and the milestones, warm-up and ``max_steps`` times ``16 / B``.
    """

    def __init__(self, optimizer: Optimizer, milestones: list[int] = (60000, 80000), gamma: float = 0.1,
                 warmup_iters: int = 1000, warmup_factor: float = 0.001, steps_per_epoch: int = 1,
                 max_epochs: int | None = None, last_epoch: int = -1) -> None:
        if warmup_iters < 0 or not 0.0 <= warmup_factor <= 1.0:
            raise ValueError(f"IterationMultiStepLR: warmup_iters ({warmup_iters}) must be >= 0 and "
                             f"warmup_factor ({warmup_factor}) in [0, 1]")
        self.milestones = _milestones(self, [int(m) for m in milestones])
        self.gamma = _positive(self, "gamma", gamma)
        self.warmup_iters = int(warmup_iters)
        self.warmup_factor = float(warmup_factor)
        super().__init__(optimizer, self._factor, last_epoch=last_epoch)

    def _factor(self, step: int) -> float:
        factor = self.gamma ** bisect.bisect_right(self.milestones, step)
        if step < self.warmup_iters:
            alpha = step / self.warmup_iters
            factor *= self.warmup_factor * (1 - alpha) + alpha
        return factor
