"""Optimizer construction from an injected ``OptimizerCallable`` plus the core's parameter groups.

The callable (from the config's ``optimizer: class_path/init_args``) fixes the base ``lr`` and
``weight_decay``; :func:`rescale_core.param_groups` decides, per group, whether weight decay
applies and which learning-rate factor the scheme asks for (Fixup's scalars at lr/10).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from rescale_core import param_groups

__all__ = ["build_optimizer"]


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
