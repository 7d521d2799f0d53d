"""Image classification over any ``rescale_core`` network.

SGD with momentum through :func:`rescale_core.param_groups` (no decay on scalars and biases,
per-scheme lr factors), per-step warm-up + multi-step/cosine schedules, label smoothing, mixup
(Zhang et al. 2018), top-1/top-5 accuracy (torchmetrics), learned branch scalars logged as they
train (RescaleNet rebuttal [R2]).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Optional

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from ..common.acceleration import as_memory_format, compile_in_place, use_channels_last
from ..common.checkpoint_compat import check_checkpoint_compatible
from ..common.distributed import every_rank_has_samples, world_size, zero_loss
from ..common.networks import create_network, resolved_architecture
from ..common.optim import build_optimizer

__all__ = ["ClassificationModule"]

OptimizerFactory = Callable[[Iterable], torch.optim.Optimizer]
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


def _default_sgd(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)


class ClassificationModule(L.LightningModule):
    """Args:
        network: a name from ``rescale_core.list_models()``.
        scheme: residual scheme (None: the network's own, e.g. ``rescale50`` fixes ``rescale``).
        scheme_options: overrides of scheme fields (``c``, ``gain``, ``conv_dropout``,
            ``classifier_dropout``, ``measure_batches``, ``mean_shift``, ...).
        network_options: family arguments (``depth``, ``width``, ``base_width`` ...).
        num_classes, in_channels: linked from the data module by the CLI.
        optimizer: optimizer factory (config: ``class_path``/``init_args``); its ``lr`` and
            ``weight_decay`` are the base values the parameter groups scale.
        lr_scheduler: scheduler factory; schedules of :mod:`rescale_tasks.common.schedules` get
            ``steps_per_epoch`` and ``max_epochs`` and step every optimizer step.
        label_smoothing, mixup_alpha: regularisers (mixup off when 0).
        norm_weight_decay: weight decay of norm-layer weights (None: the optimizer's).
        channels_last: weights and input batches in channels_last memory format (faster
            convolutions on GPUs with bf16 and on many CPUs).
        compile: ``torch.compile`` the network (in place: checkpoints keep their keys).
    """

    def __init__(self, network: str = "resnet50", scheme: Optional[str] = None,
                 scheme_options: Optional[dict[str, Any]] = None,
                 network_options: Optional[dict[str, Any]] = None,
                 num_classes: int = 1000, in_channels: int = 3,
                 optimizer: OptimizerFactory = _default_sgd,
                 lr_scheduler: Optional[SchedulerFactory] = None,
                 label_smoothing: float = 0.0, mixup_alpha: float = 0.0,
                 norm_weight_decay: Optional[float] = None, channels_last: bool = False,
                 compile: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        kwargs = dict(network_options or {}, num_classes=num_classes, in_channels=in_channels)
        if scheme is not None:
            kwargs["scheme"] = scheme
        if scheme_options:
            kwargs["scheme_options"] = dict(scheme_options)
        self.net = create_network(network, **kwargs)
        self.scheme_name = getattr(getattr(self.net, "scheme", None), "name", scheme or "unknown")
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.label_smoothing = label_smoothing
        self.mixup_alpha = mixup_alpha
        self.norm_weight_decay = norm_weight_decay
        self.memory_format = use_channels_last(self.net) if channels_last else None
        if compile:
            compile_in_place(self.net)
        top5 = min(5, num_classes)
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.test_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(as_memory_format(x, self.memory_format))

    # --- steps ----------------------------------------------------------------------------
    def _mixup(self, x: torch.Tensor, y: torch.Tensor):
        lam = float(torch.distributions.Beta(self.mixup_alpha, self.mixup_alpha).sample())
        perm = torch.randperm(x.shape[0], device=x.device)
        return lam * x + (1 - lam) * x[perm], y, y[perm], lam

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        # every file of a batch corrupt and skipped: all ranks skip it together (common.distributed)
        if not every_rank_has_samples(y.numel()):
            return zero_loss(self) if world_size() > 1 else None
        if self.mixup_alpha > 0:
            x, ya, yb, lam = self._mixup(x, y)
            logits = self(x)
            loss = lam * F.cross_entropy(logits, ya, label_smoothing=self.label_smoothing) + \
                (1 - lam) * F.cross_entropy(logits, yb, label_smoothing=self.label_smoothing)
        else:
            logits = self(x)
            loss = F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)
        self.train_acc(logits.detach(), y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        self.log("train/acc1", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, batch, prefix: str, acc1, acc5) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc1(logits, y)
        acc5(logits, y)
        self.log(f"{prefix}/loss", loss, prog_bar=True, on_epoch=True, sync_dist=True)
        self.log(f"{prefix}/acc1", acc1, prog_bar=True, on_epoch=True)
        self.log(f"{prefix}/acc5", acc5, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "val", self.val_acc1, self.val_acc5)

    def test_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "test", self.test_acc1, self.test_acc5)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(dim=-1)

    # --- checkpoints ----------------------------------------------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint of another network, scheme or class count (runs
        before the weights are loaded, which would fail with a page of key/shape mismatches)."""
        trainer = self._trainer
        path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        check_checkpoint_compatible(checkpoint, self.hparams, self.state_dict(),
                                    source=f"checkpoint {path}" if path else "the checkpoint",
                                    strict=self.strict_loading, normalize=resolved_architecture)

    # --- optimisation ---------------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = build_optimizer(self.net, self.optimizer_factory, self.norm_weight_decay)
        factory = self.scheduler_factory
        if factory is None:
            return optimizer
        max_epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else None
        total = self.trainer.estimated_stepping_batches
        steps_per_epoch = max(int(total // max_epochs), 1) if max_epochs and total != float("inf") else 1
        if _accepts(factory, "steps_per_epoch"):
            scheduler = factory(optimizer, steps_per_epoch=steps_per_epoch, max_epochs=max_epochs)
            interval = "step"
        else:  # a plain torch scheduler: stepped per epoch
            scheduler, interval = factory(optimizer), "epoch"
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}


def _accepts(factory: Callable, name: str) -> bool:
    target = getattr(factory, "func", factory)  # functools.partial from jsonargparse
    try:
        target = target.__init__ if inspect.isclass(target) else target
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
