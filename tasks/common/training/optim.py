"""Optimizer construction from an injected ``OptimizerCallable`` plus the core's parameter groups,
and the learning-rate schedule over it.

The callable (from the config's ``optimizer: class_path/init_args``) fixes the base ``lr`` and
``weight_decay``; :func:`rescale_core.param_groups` decides, per group, whether weight decay
applies and which learning-rate factor the scheme asks for (Fixup's scalars at lr/10).
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterable, Optional

import torch
from torch import nn

from rescale_core import param_groups

__all__ = ["build_optimizer", "build_scheduler", "accepts", "default_sgd"]


def default_sgd(params: Iterable) -> torch.optim.Optimizer:
    """The optimizer of a task module whose config names none: SGD with momentum 0.9, lr 0.1 and
    weight decay 1e-4 (He et al. 2016's ImageNet recipe at batch 256)."""
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)


def build_optimizer(model: nn.Module, optimizer: Callable[[Iterable], torch.optim.Optimizer],
                    norm_weight_decay: float | None = None) -> torch.optim.Optimizer:
    # Unit lr / weight decay: the groups then carry factors, scaled by the optimizer's defaults.
    groups = param_groups(model, weight_decay=1.0, lr=1.0,
                          norm_weight_decay=None if norm_weight_decay is None else 1.0)
    opt = optimizer([{"params": g["params"], "name": g["name"]} for g in groups])
    base_lr = opt.defaults["lr"]
    base_wd = opt.defaults.get("weight_decay", 0.0)
    for pg, g in zip(opt.param_groups, groups):
        pg["lr"] = base_lr * g["lr_factor"]
        pg["lr_factor"] = g["lr_factor"]
        wd = base_wd
        if g["name"] == "norm" and norm_weight_decay is not None:
            wd = norm_weight_decay
        pg["weight_decay"] = wd * g["weight_decay"]
    return opt


def accepts(factory: Callable, name: str) -> bool:
    """Whether ``factory`` (a class, function or jsonargparse partial) takes argument ``name``."""
    target = getattr(factory, "func", factory)  # functools.partial from jsonargparse
    try:
        target = target.__init__ if inspect.isclass(target) else target
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def build_scheduler(factory: Callable, optimizer: torch.optim.Optimizer, steps_per_epoch: int,
                    max_epochs: Optional[int]) -> tuple[torch.optim.lr_scheduler.LRScheduler, str]:
    """The schedule and its Lightning ``interval``: the schedules of :mod:`.schedules` (any factory
    taking ``steps_per_epoch``) get the run's length and step every optimizer step; a plain torch
    scheduler steps every epoch."""
    if accepts(factory, "steps_per_epoch"):
        return factory(optimizer, steps_per_epoch=steps_per_epoch, max_epochs=max_epochs), "step"
    return factory(optimizer), "epoch"
