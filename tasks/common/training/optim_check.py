"""The configured optimizer and learning-rate schedule, checked before any data work.

torch (and :mod:`.schedules`) check their own values when an optimizer or a schedule is built,
which a task module does only once training starts, after the data is set up. Building both
here on a throw-away parameter runs those same checks at once, with the other argument checks;
a value they refuse becomes one :class:`~..errors.ConfigError` line naming its config key.
"""
from __future__ import annotations

import copy
import functools
import inspect
import logging
from typing import Any, Callable, Optional

import torch

from rescale_core.agc import DEFAULT_EPS

from ..errors import ConfigError
from .class_paths import class_of
from .clipping import check_agc_is_on, check_agc_options
from .optim import build_scheduler

log = logging.getLogger(__name__)

__all__ = ["check_lr_batch", "check_optimization", "warn_unscaled_lr"]

OPTIMIZER_KEY = "model.init_args.optimizer"
SCHEDULER_KEY = "model.init_args.lr_scheduler"
# given by the task module when it builds the schedule, whatever the config says
_RUN_LENGTH = ("steps_per_epoch", "max_epochs")


def _as_dict(value: Any) -> dict:
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        return value.as_dict()
    return dict(value) if isinstance(value, dict) else {}


def _defaults(target: Callable) -> dict:
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _refusal(build: Callable[[dict], Any], args: dict) -> Optional[ValueError]:
    """The ValueError ``build(args)`` raises, if any. Other errors are left to the real build: a
    setting that needs the run's device (a fused optimizer, say) is no bad value."""
    try:
        build(args)
    except ValueError as err:
        return err
    except Exception:  # noqa: BLE001 - not a refused value; the task module's build decides
        return None
    return None


def _check(section: Any, key: str, build: Callable[[Callable, dict], Any], fixed: tuple = ()) -> Any:
    """Build the ``class_path``/``init_args`` section with ``build(target, init_args)``; on a
    refused value, the key whose value, set back to its default, is accepted is named."""
    section = _as_dict(section)
    name = section.get("class_path")
    target = class_of(name)
    if target is None:
        return None
    args = {k: v for k, v in _as_dict(section.get("init_args")).items() if k not in fixed}
    error = _refusal(lambda a: build(target, a), args)
    if error is None:
        return build(target, args)
    message = " ".join(str(error).split())
    what = message if message.startswith(target.__qualname__) else f"{name}: {message}"
    defaults = _defaults(target)
    for arg, value in args.items():
        if arg in defaults and value != defaults[arg] and _refusal(lambda a: build(target, a),
                                                                   {**args, arg: defaults[arg]}) is None:
            full = f"{key}.init_args.{arg}"
            raise ConfigError(f"bad value for {full}: {value!r} ({what}); set it with --{full} or in the "
                              "model: section of the config")
    how = "" if "set " in message else f"; check its init_args (--{key}.init_args.* or the config's model: section)"
    raise ConfigError(f"bad {key} ({name}): {message}{how}")


def _max_epochs(trainer: dict) -> Optional[int]:
    """``trainer.max_epochs`` as the Trainer will resolve it (None: no epoch limit), the way the
    task module hands it to the schedule."""
    if trainer.get("fast_dev_run"):
        return 1
    epochs = trainer.get("max_epochs")
    if epochs is None:  # Lightning's default: 1000 epochs unless the run is bounded otherwise
        bounded = trainer.get("max_steps") not in (None, -1) or trainer.get("max_time")
        epochs = -1 if bounded else 1000
    return epochs if epochs > 0 else None


def check_optimization(init_args: Any, trainer: Any) -> None:
    """Refuse, in one line, an optimizer or schedule value torch or the schedule would refuse,
    a negative ``norm_weight_decay``, an ``agc_clip`` or ``agc_eps`` that is not a positive
    number, and an ``agc_eps`` or ``agc_clip_classifier`` set while ``agc_clip`` is null (AGC
    off). ``init_args``: the model's parsed ``init_args``; ``trainer``: the parsed ``trainer``
    section."""
    init = _as_dict(init_args)
    norm_weight_decay = init.get("norm_weight_decay")
    if norm_weight_decay is not None and norm_weight_decay < 0:
        raise ConfigError(f"bad value for model.init_args.norm_weight_decay: {norm_weight_decay!r} (weight decay "
                          "must be >= 0); set it with --model.init_args.norm_weight_decay or null for the "
                          "optimizer's")
    check_agc_options(init.get("agc_clip"), init.get("agc_eps", DEFAULT_EPS))
    check_agc_is_on(init.get("agc_clip"), init.get("agc_eps", DEFAULT_EPS), init.get("agc_clip_classifier", False))
    optimizer = _check(init.get("optimizer"), OPTIMIZER_KEY,
                       lambda target, args: target([torch.nn.Parameter(torch.zeros(1))], **args))
    if not isinstance(optimizer, torch.optim.Optimizer):
        return
    max_epochs = _max_epochs(_as_dict(trainer))
    _check(init.get("lr_scheduler"), SCHEDULER_KEY,
           lambda target, args: build_scheduler(functools.partial(target, **args), copy.deepcopy(optimizer), 1,
                                                 max_epochs),
           fixed=_RUN_LENGTH)


def check_lr_batch(lr_batch: Optional[int]) -> Optional[int]:
    """``model.init_args.lr_batch`` (the global batch a recipe's lr is set for), checked: None or at
    least 1, else one :class:`~..errors.ConfigError` line."""
    if lr_batch is not None and lr_batch < 1:
        raise ConfigError(f"model.init_args.lr_batch must be at least 1 (the global batch the lr is set for), "
                          f"got {lr_batch}")
    return lr_batch


def warn_unscaled_lr(trainer: Any, lr_batch: Optional[int], more: str = "") -> None:
    """Log the warning line for a fit whose global batch (processes x ``data.batch_size`` x
    ``accumulate_grad_batches``) is not ``lr_batch``, the one its lr is set for: it names the lr the
    linear scaling rule (Goyal et al. 2017) gives, and ``more`` (what else the recipe scales, with
    ``{factor}``: ``lr_batch`` / this run's batch, what a schedule in iterations is multiplied by). Nothing
    when the batches agree, without ``lr_batch`` or a data module's ``batch_size``, and off rank 0.
    The lr stays as configured."""
    per_device = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    if lr_batch is None or not per_device or not trainer.is_global_zero:
        return
    accumulate = trainer.accumulate_grad_batches
    batch = per_device * trainer.world_size * accumulate
    if batch == lr_batch:
        return
    lr = trainer.optimizers[0].defaults["lr"]
    scaled = lr * batch / lr_batch
    log.warning(f"lr {lr:g} is set for a global batch of {lr_batch} (model.init_args.lr_batch); this run's is {batch} "
                f"({trainer.world_size} process(es) x data.batch_size {per_device} x accumulate_grad_batches "
                f"{accumulate}): the linear scaling rule gives lr {scaled:g} (--model.init_args.optimizer.init_args.lr "
                f"{scaled:g}){more.format(factor=f'{lr_batch / batch:g}')}; training on at lr {lr:g}")
