"""Optimizer construction from an injected ``OptimizerCallable`` plus the core's parameter groups,
and the learning-rate schedule over it.

The callable (from the config's ``optimizer: class_path/init_args``) fixes the base ``lr`` and
``weight_decay``; :func:`rescale_core.param_groups` decides, per group, whether weight decay
applies and which learning-rate factor the scheme asks for (Fixup's scalars at lr/10).
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from rescale_core import param_groups

__all__ = ["build_optimizer", "build_scheduler", "accepts", "default_sgd", "training_state_differences"]


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
    target = getattr(factory, "func", factory)  # functools.partial
    if not inspect.isclass(target):
        # jsonargparse's factory of a class given on the command line or in a config:
        # partial(call_without_instantiate_context, instantiator, the class, **its arguments)
        target = next((a for a in getattr(factory, "args", ()) if inspect.isclass(a)), target)
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


#: Entries of an optimizer's param group that are no setting of the run: the parameters, the lr a
#: schedule has moved on (``initial_lr`` is its configured value), the kernels torch picks.
_GROUP_STATE = ("params", "foreach", "fused", "differentiable", "capturable")
#: Entries of a scheduler's state that say where the schedule is, not how it was configured
#: (``base_lrs`` repeats the groups' ``initial_lr``; ``steps_per_epoch`` follows the data; a plateau
#: schedule's ``best`` and counters).
_SCHEDULE_POSITION = ("last_epoch", "_step_count", "_last_lr", "_is_initial", "_get_lr_called_within_step",
                      "base_lrs", "steps_per_epoch", "verbose", "best", "num_bad_epochs", "cooldown_counter")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


_LABELS = {"initial_lr": "lr", "max_epochs": "max_epochs (trainer.max_epochs)"}


def _group_differences(saved: dict, current: dict, name: str) -> list[str]:
    keys = [k for k in current if k not in _GROUP_STATE and k in saved]
    if "initial_lr" in current or "initial_lr" in saved:  # a schedule moves lr; its base is the setting
        keys = [k for k in keys if k != "lr"]
    return [f"{name}{_LABELS.get(k, k)} {saved[k]} -> {current[k]}" for k in keys if not _same(saved[k], current[k])]


def training_state_differences(saved_optimizers: Sequence[dict], saved_schedulers: Sequence[dict],
                               optimizers: Sequence[torch.optim.Optimizer], schedulers: Sequence[Any]) -> list[str]:
    """What a checkpoint's optimizer and schedule (``optimizer_states``, ``lr_schedulers``) were
    configured with that this run configures otherwise (``lr 0.05 -> 0.5``, ``max_epochs 2 -> 3``):
    resuming restores the checkpoint's, so the run's own would be silently dropped. Positions
    (the step a schedule is at, the lr it has reached) are not compared; ``max_epochs`` only for a
    schedule whose shape depends on it (``uses_max_epochs``, the cosine)."""
    if len(saved_optimizers) != len(optimizers) or len(saved_schedulers) != len(schedulers):
        return [f"{len(saved_optimizers)} optimizer(s) and {len(saved_schedulers)} schedule(s) -> "
                f"{len(optimizers)} and {len(schedulers)}"]
    problems: list[str] = []
    for saved, optimizer in zip(saved_optimizers, optimizers):
        saved_groups, groups = saved.get("param_groups", []), optimizer.state_dict()["param_groups"]
        if len(saved_groups) != len(groups):
            problems.append(f"{len(saved_groups)} parameter groups -> {len(groups)}")
            continue
        plain = [_group_differences(s, g, "") for s, g in zip(saved_groups, groups)]
        if all(found == plain[0] for found in plain):  # the same change in every group: said once
            problems += plain[0]
            continue
        for saved_group, group in zip(saved_groups, groups):
            name = f"{group['name']} " if "name" in group else ""
            problems += _group_differences(saved_group, group, name)
    for saved, scheduler in zip(saved_schedulers, schedulers):
        current = scheduler.state_dict()
        skipped = _SCHEDULE_POSITION + (() if getattr(scheduler, "uses_max_epochs", False) else ("max_epochs",))
        keys = sorted(k for k in (set(saved) | set(current)) - set(skipped) if not k.startswith("_"))  # torch's own
        for key in keys:
            if key not in saved or key not in current:
                kind = type(scheduler).__name__
                problems.append(f"schedule {kind} has no {key} in the checkpoint" if key in current
                                else f"the checkpoint's schedule has {key}, {kind} not")
            elif not _same(saved[key], current[key]):
                problems.append(f"{_LABELS.get(key, key)} {saved[key]} -> {current[key]}")
    return problems
