"""What every task's LightningModule does the same way: build its ``rescale_core`` network by
name, scheme and options; the speed switches (channels_last, ``torch.compile``); the optimizer
over the core's parameter groups and a per-step or per-epoch schedule; and refusing, in one line,
a checkpoint of another architecture. A task module subclasses :class:`RescaleTaskModule` and
adds only its steps, losses and metrics.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Optional

import lightning.pytorch as L
import torch

import rescale_core

from .acceleration import as_memory_format, compile_in_place, use_channels_last
from .checkpoint_compat import check_checkpoint_compatible
from .errors import ConfigError
from .networks import create_network, resolved_architecture
from .optim import build_optimizer

__all__ = ["RescaleTaskModule", "OptimizerFactory", "SchedulerFactory", "accepts"]

OptimizerFactory = Callable[[Iterable], torch.optim.Optimizer]
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


class RescaleTaskModule(L.LightningModule):
    """Args (shared by every task):
        network: a name from ``rescale_core.list_models()``.
        scheme: residual scheme (None: the network's own, e.g. ``rescale50`` fixes ``rescale``).
        scheme_options: overrides of scheme fields (``c``, ``gain``, ``measure_batches`` ...).
        network_options: family arguments (``depth``, ``width``, ``base_width`` ...), plus the
            task's own (``num_classes``, ``vocab_size`` ...) passed as ``network_kwargs``.
        optimizer: optimizer factory (config: ``class_path``/``init_args``); its ``lr`` and
            ``weight_decay`` are the base values the parameter groups scale.
        lr_scheduler: scheduler factory; schedules of :mod:`rescale_tasks.common.schedules` get
            ``steps_per_epoch`` and ``max_epochs`` and step every optimizer step, plain torch
            schedulers step every epoch.
        norm_weight_decay: weight decay of norm-layer weights (None: the optimizer's).
        channels_last: weights and input batches in channels_last memory format (conv networks).
        compile: ``torch.compile`` the network (in place: checkpoints keep their keys, and load
            into an eager module and back). RescaleNet's measuring steps run eagerly; then one
            graph for training and one for evaluation, with no graph break.
        compile_mode: ``torch.compile``'s mode: None (default), ``reduce-overhead`` (CUDA graphs:
            no per-op launch cost in the steady state, on a GPU), ``max-autotune`` ...
        plan: the execution plan of the normalization-free blocks (:mod:`rescale_core.plans`):
            ``auto`` (lean on a GPU, folded on the CPU), ``lean`` (fewest ops per step, for an
            eager GPU step and for compiling), ``folded`` (fewest passes over the activations, for
            CPUs) or ``reference``; the same function and checkpoint under each.
        compile_options: further ``torch.compile`` arguments (``backend``, ``dynamic`` ...).
    """

    def __init__(self, network: str, scheme: Optional[str] = None,
                 scheme_options: Optional[dict[str, Any]] = None,
                 network_options: Optional[dict[str, Any]] = None,
                 optimizer: Optional[OptimizerFactory] = None,
                 lr_scheduler: Optional[SchedulerFactory] = None,
                 norm_weight_decay: Optional[float] = None, channels_last: bool = False,
                 compile: bool = False, network_kwargs: Optional[dict[str, Any]] = None,
                 compile_mode: Optional[str] = None, plan: str = "auto",
                 compile_options: Optional[dict[str, Any]] = None) -> None:
        super().__init__()
        if plan not in rescale_core.PLANS:
            raise ConfigError(f"model.init_args.plan={plan!r} is not an execution plan; use one of "
                              f"{', '.join(rescale_core.PLANS)} (auto: lean on a GPU, folded on the CPU)")
        kwargs = dict(network_options or {}, **(network_kwargs or {}))
        if scheme is not None:
            kwargs["scheme"] = scheme
        if scheme_options:
            kwargs["scheme_options"] = dict(scheme_options)
        self.net = self.build_network(network, **kwargs)
        self.scheme_name = getattr(getattr(self.net, "scheme", None), "name", scheme or "unknown")
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.norm_weight_decay = norm_weight_decay
        rescale_core.set_plan(self.net, plan)
        self.memory_format = use_channels_last(self.net) if channels_last else None
        if compile:
            compile_in_place(self.net, **{**({"mode": compile_mode} if compile_mode else {}),
                                          **(compile_options or {})})

    def build_network(self, network: str, **kwargs: Any) -> torch.nn.Module:
        """The task's network: ``create_network(network, **kwargs)``; a task whose network wraps
        the core model (a detector around a backbone) overrides this."""
        return create_network(network, **kwargs)

    def as_input(self, x: torch.Tensor) -> torch.Tensor:
        """An input batch in the network's memory format (channels_last when asked for)."""
        return as_memory_format(x, self.memory_format)

    def network_inputs(self, batch) -> tuple:
        """The network's positional inputs taken from a batch of this task (the analysis probes
        run the network on them); by default the batch's first element."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return (self.as_input(x),)

    # --- checkpoints ----------------------------------------------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint of another network, scheme or task size (runs
        before the weights are loaded, which would fail with a page of key/shape mismatches)."""
        trainer = self._trainer
        path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        check_checkpoint_compatible(checkpoint, self.hparams, self.state_dict(),
                                    source=f"checkpoint {path}" if path else "the checkpoint",
                                    strict=self.strict_loading, normalize=resolved_architecture)

    # --- optimisation ---------------------------------------------------------------------
    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ConfigError(f"{type(self).__name__} has no optimizer: set model.init_args.optimizer "
                              "(class_path/init_args, e.g. torch.optim.SGD)")
        optimizer = build_optimizer(self.net, self.optimizer_factory, self.norm_weight_decay)
        factory = self.scheduler_factory
        if factory is None:
            return optimizer
        max_epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else None
        total = self.trainer.estimated_stepping_batches
        steps_per_epoch = max(int(total // max_epochs), 1) if max_epochs and total != float("inf") else 1
        if accepts(factory, "steps_per_epoch"):
            scheduler = factory(optimizer, steps_per_epoch=steps_per_epoch, max_epochs=max_epochs)
            interval = "step"
        else:  # a plain torch scheduler: stepped per epoch
            scheduler, interval = factory(optimizer), "epoch"
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}


def accepts(factory: Callable, name: str) -> bool:
    """Whether ``factory`` (a class, function or jsonargparse partial) takes argument ``name``."""
    target = getattr(factory, "func", factory)  # functools.partial from jsonargparse
    try:
        target = target.__init__ if inspect.isclass(target) else target
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
