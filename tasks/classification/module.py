"""Image classification over any ``rescale_core`` network.

SGD with momentum through :func:`rescale_core.param_groups` (no decay on scalars and biases,
per-scheme lr factors), per-step warm-up + multi-step/cosine schedules, label smoothing, mixup
(Zhang et al. 2018), top-1/top-5 accuracy (torchmetrics), learned branch scalars logged as they
train (RescaleNet rebuttal [R2]). Network, optimizer, schedule, speed switches, checkpoint
checks and the class names every checkpoint carries (matched to the data's by name: targets of
data listing them in another order are mapped to the network's) are the shared ones of
:class:`~rescale_tasks.common.module.RescaleTaskModule`. ``predict`` writes ``predictions.test.csv``
where ``test`` writes: per image of the split its index, file, true class and the top-5 classes the
checkpoint names, with their probabilities (:mod:`rescale_tasks.common.predictions`).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from ..common.distributed import gather_by_key
from ..common.empty_batches import (data_may_skip_files, must_skip, nothing_to_evaluate,
                                    skipped_prediction, skipped_step)
from ..common.module import OptimizerFactory, RescaleTaskModule, SchedulerFactory
from ..common.predictions import (PredictedSamples, class_predictions_csv, class_rows, kept_samples,
                                  output_names, predict_dataset)

__all__ = ["ClassificationModule"]


def _default_sgd(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)


class ClassificationModule(RescaleTaskModule):
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

    throughput_unit = "images"  # training throughput in images/s (common.throughput)

    def __init__(self, network: str = "resnet50", scheme: Optional[str] = None,
                 scheme_options: Optional[dict[str, Any]] = None,
                 network_options: Optional[dict[str, Any]] = None,
                 num_classes: int = 1000, in_channels: int = 3,
                 optimizer: OptimizerFactory = _default_sgd,
                 lr_scheduler: Optional[SchedulerFactory] = None,
                 label_smoothing: float = 0.0, mixup_alpha: float = 0.0,
                 norm_weight_decay: Optional[float] = None, channels_last: bool = False,
                 compile: bool = False, compile_mode: Optional[str] = None,
                 plan: str = "auto", compile_options: Optional[dict[str, Any]] = None) -> None:
        super().__init__(network, scheme, scheme_options, network_options, optimizer, lr_scheduler,
                         norm_weight_decay, channels_last, compile,
                         network_kwargs={"num_classes": num_classes, "in_channels": in_channels},
                         compile_mode=compile_mode, plan=plan, compile_options=compile_options)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.label_smoothing = label_smoothing
        self.mixup_alpha = mixup_alpha
        self._may_skip_batches = True  # until setup knows the data module
        self._predicted: dict[int, dict] = {}  # this rank's rows of predict, by index in the split
        top5 = min(5, num_classes)
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.test_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.as_input(x))

    def setup(self, stage: str) -> None:
        # the same on every rank (one config): every rank votes in training_step, or none does
        self._may_skip_batches = data_may_skip_files(getattr(self.trainer, "datamodule", None))

    # --- steps ----------------------------------------------------------------------------
    def _mixup(self, x: torch.Tensor, y: torch.Tensor):
        lam = float(torch.distributions.Beta(self.mixup_alpha, self.mixup_alpha).sample())
        perm = torch.randperm(x.shape[0], device=x.device)
        return lam * x + (1 - lam) * x[perm], y, y[perm], lam

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        # every file of a batch corrupt and skipped: no step, on all ranks (common.empty_batches)
        if must_skip(y.numel(), self._may_skip_batches):
            return skipped_step(self)
        y = self.network_labels(y)
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

    def _eval_step(self, batch, prefix: str, acc1, acc5) -> torch.Tensor | None:
        if nothing_to_evaluate(batch):  # every file of it corrupt and skipped (common.empty_batches)
            return None
        x, y = batch
        y = self.network_labels(y)
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc1(logits, y)
        acc5(logits, y)
        self.log(f"{prefix}/loss", loss, prog_bar=True, on_epoch=True, sync_dist=True)
        self.log(f"{prefix}/acc1", acc1, prog_bar=True, on_epoch=True)
        self.log(f"{prefix}/acc5", acc5, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        return self._eval_step(batch, "val", self.val_acc1, self.val_acc5)

    def test_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        return self._eval_step(batch, "test", self.test_acc1, self.test_acc5)

    # --- prediction -----------------------------------------------------------------------
    def configure_callbacks(self) -> list:
        return [PredictedSamples()]  # which images each predict batch holds: on_predicted

    def on_predict_epoch_start(self) -> None:
        self._predicted = {}

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if nothing_to_evaluate(batch):
            return skipped_prediction()
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(dim=-1)

    def on_predicted(self, probs: torch.Tensor, batch, indices: list[int]) -> None:
        """The rows of a predict batch (:class:`~rescale_tasks.common.predictions.PredictedSamples`):
        ``indices`` the split indices its sampler drew, the unreadable files among them left out."""
        dataset = predict_dataset(self.trainer)
        samples = kept_samples(dataset, indices, len(probs))
        labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None  # None: unlabelled
        if labels is not None:
            labels = self.network_labels(labels).tolist()
        names = output_names(self.trained_labels, probs.shape[-1])
        self._predicted.update(class_rows(probs, names, samples, labels, dataset))

    def on_predict_epoch_end(self) -> None:
        rows = gather_by_key(self._predicted)  # a collective: by index, padding repeats once, in order
        if self.trainer.is_global_zero:
            self.write_predictions("csv", class_predictions_csv(rows.values()), len(rows))
