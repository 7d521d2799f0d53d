"""Video classification (Kinetics) with the core's 3D ResNets (R3D-18/50, SlowOnly-R50) under any
residual scheme, with the standard multi-view evaluation.

- Training: cross entropy on one clip per video (random temporal position, random scale, crop and
  flip: :mod:`.transforms`); SGD with the core's parameter groups and the shared schedules.
  ``inflate_from`` starts the 3D network from a 2D ``rescale fit`` checkpoint (I3D inflation,
  :mod:`.inflation`).
- Evaluation: every item is one clip of a video with its spatial crops (``num_crops``).
  Video-level top-1/top-5 (``acc1``/``acc5``): the softmax averaged over all views of the video
  (10 clips x 3 crops at test, SlowFast's protocol). Clip-level (``clip_acc1``/``clip_acc5``): each
  view on its own. :class:`~.evaluation.MultiViewAccuracy` keeps one softmax sum per video (20k
  Kinetics test videos x 400 classes: ~32 MB) and reduces the sums onto rank 0 under DDP (no gather
  of every view onto every rank); the data module hands each item to one process, so 2 processes
  give what 1 gives.
- Prediction: ``predict`` averages the softmax over every view of a video as the test does and
  writes ``predictions.test.csv`` where ``test`` writes: per video its index, file, true class,
  view count and the top-5 classes the checkpoint names, with their probabilities
  (:mod:`rescale_tasks.common.run.predictions`).
- Labels: every checkpoint carries its class list (:mod:`rescale_tasks.common.data.labels`); data
  listing the same classes in another order has its labels mapped to the network's by name.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..common.data import keep_real, real_rows
from ..common.checkpoints import require_classification_checkpoint
from ..common.module import RescaleTaskModule
from ..common.run import class_predictions_csv, class_rows, output_names, predict_dataset, stage_dataset
from .evaluation import MultiViewAccuracy
from .inflation import inflate_checkpoint

__all__ = ["VideoClassificationModule"]

log = logging.getLogger(__name__)


class VideoClassificationModule(RescaleTaskModule):
    """Video classification; the arguments every task shares (``scheme_options``,
    ``network_options``, ``optimizer``, ``plan`` ...) are :class:`~rescale_tasks.common.module.RescaleTaskModule`'s.

    Args:
        network: a 3D ResNet from ``rescale_core`` (``r3d_18``, ``r3d_50``, ``slow_r50`` ...).
        scheme: as for every task (dropout before the classifier: ``scheme_options:
            {classifier_dropout: 0.5}``, SlowFast's recipe).
        num_classes, in_channels: linked from the data module (the training split's classes).
        inflate_from: a 2D classification checkpoint of ``rescale fit`` (same depth and scheme)
            inflated into the 3D network before training.
        label_smoothing: of the cross entropy.
    """

    throughput_unit = "clips"  # training throughput in clips/s (common.data.throughput)

    def __init__(self, network: str = "slow_r50", scheme: Optional[str] = None, *, num_classes: int = 400,
                 in_channels: int = 3, inflate_from: Optional[str] = None, label_smoothing: float = 0.0,
                 **options: Any) -> None:
        self.check_arguments({"inflate_from": inflate_from})
        super().__init__(network, scheme, network_kwargs={"num_classes": num_classes, "in_channels": in_channels},
                         **options)
        if inflate_from is not None:
            inflate_checkpoint(self.net, inflate_from)
        self.label_smoothing = label_smoothing
        self.evaluation = MultiViewAccuracy()

    @staticmethod
    def check_arguments(init_args) -> None:
        """The checks of ``init_args`` that the ``rescale`` CLI runs before it builds anything (the
        data module first): a missing 2D checkpoint stops at once."""
        require_classification_checkpoint(init_args.get("inflate_from"), "inflate_from", "2D checkpoint",
                                          "the 3D network")

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.net(self.as_input(clips))

    def network_inputs(self, batch) -> tuple:
        """The clips of a batch as the network takes them: an evaluation batch's views
        ``(n, crops, C, T, H, W)`` as ``n * crops`` clips (export's check batch, the probes)."""
        (clips,) = super().network_inputs(batch)
        return (clips.flatten(0, 1) if clips.dim() == 6 else clips,)

    def train_batch(self, batch, batch_idx: int) -> torch.Tensor:
        clips, labels = batch[0], batch[1]
        labels = self.network_labels(labels)
        logits = self(clips)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        acc = (logits.detach().argmax(-1) == labels).float().mean()
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True,
                 batch_size=labels.numel())
        self.log("train/acc1", acc, on_step=False, on_epoch=True, sync_dist=True, batch_size=labels.numel())
        return loss

    # --- multi-view evaluation ------------------------------------------------------------
    def _view_logits(self, clips: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, crops, classes)`` of items ``(n, [crops,] C, T, H, W)`` (one crop: no crop dim)."""
        if clips.dim() == 5:
            clips = clips.unsqueeze(1)
        n, crops = clips.shape[:2]
        return self(clips.flatten(0, 1)).float().view(n, crops, -1)

    def _start(self) -> None:
        self.evaluation.reset()

    def evaluate_batch(self, batch, stage: str) -> None:
        (clips, labels, videos, clip_ids), real = real_rows(batch, 4)
        labels = self.network_labels(labels)
        logits = self._view_logits(clips)  # every item: under a sharded strategy each rank runs the same forwards
        n, crops = logits.shape[:2]
        losses = F.cross_entropy(logits.flatten(0, 1), labels.repeat_interleave(crops),
                                 reduction="none").view(n, crops).sum(1)
        views, labels, videos, clip_ids, losses = keep_real(real, logits.softmax(-1), labels, videos, clip_ids,
                                                              losses)
        self.evaluation.update(views, labels, videos, clip_ids, losses)

    def _drop_skipped(self, stage: str) -> None:
        """Leave the videos the data set dropped out of the evaluation: a clip that failed after
        others of its video were counted must not leave the video scored on part of its views."""
        dropped = getattr(stage_dataset(self.trainer, stage), "dropped", None)
        if callable(dropped):
            self.evaluation.drop(dropped())

    def _finish(self, prefix: str) -> dict[str, float]:
        self._drop_skipped(prefix)
        metrics = self.evaluation.compute()  # a collective: the sums of all ranks, reduced onto rank 0
        for name, value in metrics.items():
            self.log(f"{prefix}/{name}", value, sync_dist=False, prog_bar=name == "acc1")
        return metrics

    def on_validation_epoch_start(self) -> None:
        self._start()

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self._finish("val")

    def on_test_epoch_start(self) -> None:
        self._start()

    def on_test_epoch_end(self) -> None:
        metrics = self._finish("test")
        if self.trainer.is_global_zero:
            log.info(f"test: {int(metrics['videos'])} videos, {int(metrics['views'])} views: video top-1 "
                     f"{metrics['acc1']:.4f}, top-5 {metrics['acc5']:.4f}; clip top-1 {metrics['clip_acc1']:.4f}")

    # --- prediction: the views of each video averaged, as the test does ---------------------
    def on_predict_epoch_start(self) -> None:
        self._start()

    def predict_batch(self, batch) -> dict:
        (clips, labels, videos, clip_ids), real = real_rows(batch, 4)
        views = self._view_logits(clips).softmax(-1)
        views, labels, videos, clip_ids = keep_real(real, views, self.network_labels(labels), videos, clip_ids)
        self.evaluation.update(views, labels, videos, clip_ids, torch.zeros(len(videos)))
        return {"video": videos, "clip": clip_ids, "probs": views.mean(1)}

    def on_predict_epoch_end(self) -> None:
        self._drop_skipped("predict")
        videos, probs, labels, views = self.evaluation.videos()  # a collective: the sums reduced onto rank 0
        if not self.trainer.is_global_zero:
            return
        rows = class_rows(probs, output_names(self.trained_labels, probs.shape[-1]), videos.tolist(),
                          labels.tolist(), predict_dataset(self.trainer), views=views.tolist())
        self.write_predictions("csv", class_predictions_csv(rows.values()), len(rows))

