"""Image classification over any ``rescale_core`` network.

SGD with momentum through :func:`rescale_core.param_groups` (no decay on scalars and biases,
per-scheme lr factors), per-step warm-up + multi-step/cosine schedules, label smoothing, mixup
(Zhang et al. 2018), top-1/top-5 accuracy (torchmetrics), learned branch scalars logged as they
train (RescaleNet rebuttal [R2]). Network, optimizer, schedule, speed switches, checkpoint
checks and the class names every checkpoint carries (matched to the data's by name: targets of
data listing them in another order are mapped to the network's) are the shared ones of
:class:`~rescale_tasks.common.module.RescaleTaskModule`. ``predict`` writes ``predictions.test.csv``
where ``test`` writes: per image of the split its index, file, true class and the top-5 classes the
checkpoint names, with their probabilities (:mod:`rescale_tasks.common.run.predictions`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from ..common.data import keep_real, real_rows
from ..common.module import RescaleTaskModule
from ..common.run import (PredictedSamples, class_predictions_csv, class_rows, kept_samples, output_names,
                          predict_dataset)
from ..common.system import gather_by_key
from ..common.training import check_lr_batch, warn_unscaled_lr

__all__ = ["ClassificationModule"]


class ClassificationModule(RescaleTaskModule):
    """Image classification; the arguments every task shares (``scheme_options``,
    ``network_options``, ``optimizer``, ``lr_scheduler``, ``channels_last``, ``compile``, ``plan``
    ...) are :class:`~rescale_tasks.common.module.RescaleTaskModule`'s.

    Args:
        network: a name from ``rescale_core.list_models()``.
        scheme: residual scheme (None: the network's own, e.g. ``rescale50`` fixes ``rescale``).
        num_classes, in_channels: linked from the data module by the CLI.
        label_smoothing, mixup_alpha: regularisers (mixup off when 0).
        lr_batch: the global batch (images per optimizer step over all processes) the optimizer's
            ``lr`` is set for (the ImageNet recipe: 1024); a fit at another global batch says, in
            one warning line, the lr the linear scaling rule gives for its batch. None: no check.
    """

    throughput_unit = "images"  # training throughput in images/s (common.data.throughput)

    def __init__(self, network: str = "resnet50", scheme: Optional[str] = None, *, num_classes: int = 1000,
                 in_channels: int = 3, label_smoothing: float = 0.0, mixup_alpha: float = 0.0,
                 lr_batch: Optional[int] = None, **options: Any) -> None:
        super().__init__(network, scheme, network_kwargs={"num_classes": num_classes, "in_channels": in_channels},
                         **options)
        self.lr_batch = check_lr_batch(lr_batch)
        self.label_smoothing = label_smoothing
        self.mixup_alpha = mixup_alpha
        top5 = min(5, num_classes)
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.test_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        # per-image means synced as sums: Lightning's own weighted epoch mean averages its integer
        # image counts over ranks and truncates them (19 images on 2 processes: divided by 18); a
        # batch whose loss is not finite makes the mean NaN, as Lightning's own means do
        self.val_loss = MeanMetric(nan_strategy=float("nan"))
        self.test_loss = MeanMetric(nan_strategy=float("nan"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.as_input(x))

    def on_fit_start(self) -> None:
        super().on_fit_start()
        warn_unscaled_lr(self.trainer, self.lr_batch)

    # --- steps ----------------------------------------------------------------------------
    def _mixup(self, x: torch.Tensor, y: torch.Tensor):
        lam = float(torch.distributions.Beta(self.mixup_alpha, self.mixup_alpha).sample())
        perm = torch.randperm(x.shape[0], device=x.device)
        return lam * x + (1 - lam) * x[perm], y, y[perm], lam

    def train_batch(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
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

    def evaluate_batch(self, batch, stage: str) -> Optional[torch.Tensor]:
        (x, y), real = real_rows(batch, 2)
        y = self.network_labels(y)
        logits = self(x)  # every row: under a sharded strategy each rank runs the same forwards
        logits, y = keep_real(real, logits, y)  # the padding of a sharded strategy's sampler counts nowhere
        acc1, acc5 = getattr(self, f"{stage}_acc1"), getattr(self, f"{stage}_acc5")
        mean_loss = getattr(self, f"{stage}_loss")
        loss = None
        if len(y):
            loss = F.cross_entropy(logits, y)
            acc1(logits, y)
            acc5(logits, y)
            mean_loss.update(loss.detach(), weight=len(y))
        self.log(f"{stage}/loss", mean_loss, prog_bar=True, on_epoch=True)
        self.log(f"{stage}/acc1", acc1, prog_bar=True, on_epoch=True)
        self.log(f"{stage}/acc5", acc5, on_epoch=True)
        return loss

    # --- prediction -----------------------------------------------------------------------
    def configure_callbacks(self) -> list:
        return [PredictedSamples()]  # which images each predict batch holds: on_predicted

    def on_predict_epoch_start(self) -> None:
        self._predicted = {}

    def predict_batch(self, batch) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(dim=-1)

    def on_predicted(self, probs: torch.Tensor, batch, indices: list[int]) -> None:
        """The rows of a predict batch (:class:`~rescale_tasks.common.run.PredictedSamples`):
        ``indices`` the split indices its sampler drew, the unreadable files among them left out."""
        dataset = predict_dataset(self.trainer)
        samples = kept_samples(dataset, indices, len(probs))
        batch, real = real_rows(batch, len(batch) - 1) if isinstance(batch, (tuple, list)) else (batch, None)
        labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None  # None: unlabelled
        if labels is not None:
            labels = self.network_labels(labels).tolist()
        probs, samples = keep_real(real, probs, samples)  # a sharded strategy's padding: predicted, not written
        labels = None if labels is None else keep_real(real, labels)[0]
        names = output_names(self.trained_labels, probs.shape[-1])
        self._predicted.update(class_rows(probs, names, samples, labels, dataset))

    def on_predict_epoch_end(self) -> None:
        rows = gather_by_key(self._predicted)  # a collective: by index, padding repeats once, in order
        if self.trainer.is_global_zero:
            self.write_predictions("csv", class_predictions_csv(rows.values()), len(rows))
