"""COCO detection and instance segmentation with torchvision's Mask R-CNN, Faster R-CNN and
RetinaNet around a ``rescale_core`` ResNet under any residual scheme (RescaleNet's COCO
comparison: the same detector with the backbone's normalization swapped for a residual scheme,
next to the FrozenBN and GN baselines).

- Network (:meth:`DetectionModule.build_network`): :func:`~.backbones.resnet_fpn_backbone`
  (torchvision's ``BackboneWithFPN`` around the core network; FrozenBN and ``trainable_layers``
  3 when starting from a ``rescale fit`` classification checkpoint, trainable BN from scratch —
  ``trainer.sync_batchnorm: true`` makes it SyncBN under DDP) and :func:`~.models.build_detector`.
  RescaleNet's mean-shift biases measure over the valid pixels of each padded batch
  (:mod:`.measurement`).
- Training: the sum of the detector's losses; crowd annotations (``iscrowd``) are left out of the
  loss. Images arrive already resized by the data pipeline (multi-scale short side, flips with
  their boxes and masks: :mod:`.transforms`), so the detector is built with torchvision's
  ``_skip_resize`` (it still normalises and pads); at evaluation it resizes to ``min_size`` and maps
  predictions back to the original image.
- Evaluation: COCO box (and mask) AP of the real COCO evaluation (:class:`~.evaluation.CocoEvaluator`),
  merged over ranks by image id, so 2 processes give what 1 gives; logged as ``val/bbox_AP`` ...
  at every validation. ``test`` and ``predict`` also write ``coco_results.<split>.json`` (original
  image and category ids, xywh boxes, RLE masks; for ``test`` the file that was scored), whole and
  once, to the results folder (:func:`~rescale_tasks.common.run.results_folder`: beside the run
  of ``--ckpt_path``, or ``--output_dir``), named in the command's closing line; ``predict``
  optionally draws the first ``draw_predictions`` images there.
- Labels: every checkpoint carries the category names and ids its labels stand for
  (:mod:`rescale_tasks.common.data.labels`); on data that numbers the same categories otherwise, the
  network's labels are mapped to the data's category ids by name (training targets, scored and
  written results), and drawings name the checkpoint's categories.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, Optional

import torch
from torchvision.ops import FrozenBatchNorm2d

from ..common.checkpoints import require_classification_checkpoint
from ..common.data import IMAGE_DECODING
from ..common.errors import ConfigError
from ..common.module import OptimizerFactory, RescaleTaskModule
from ..common.run import note_result_file, predict_dataset, results_folder, write_result
from ..common.system import gather_objects, rank_zero_log
from ..common.training import check_lr_batch, warn_unscaled_lr
from .backbones import resnet_fpn_backbone
from .evaluation import CocoEvaluator
from .export import detection_programs, detector_preprocessing
from .measurement import install_padding_aware_measurement
from .models import DETECTORS, build_detector
from .records import ImageRecord, image_record
from .results import coco_results, drawn_png

__all__ = ["DetectionModule", "RESULTS_FILE"]

log = logging.getLogger(__name__)

RESULTS_FILE = "coco_results.{split}.json"


def detectron_sgd(params: Iterable) -> torch.optim.Optimizer:
    """The detection default: SGD at lr 0.02, momentum 0.9, weight decay 1e-4 (Detectron's 1x
    schedule at 16 images a batch)."""
    return torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)


def _loss_targets(targets: list[dict], network_labels=lambda labels: labels) -> list[dict]:
    """The targets the detector learns from: crowd regions left out (COCO gives them no loss),
    labels as the network's (``network_labels``)."""
    kept = []
    for t in targets:
        keep = t["iscrowd"] == 0 if "iscrowd" in t else slice(None)
        kept.append({k: network_labels(t[k][keep]) if k == "labels" else t[k][keep]
                     for k in ("boxes", "labels", "masks") if k in t})
    return kept


class DetectionModule(RescaleTaskModule):
    """Object detection and instance segmentation on COCO; the arguments every task shares
    (``scheme_options``, ``network_options``, ``lr_scheduler``, ``plan`` ...) are
    :class:`~rescale_tasks.common.module.RescaleTaskModule`'s.

    Args:
        network: a registered 2D ResNet/ResNeXt (``resnet50``, ``rescale50``, ``resnext50_32x4d`` ...).
        scheme: the backbone's residual scheme.
        detector: ``maskrcnn``, ``fasterrcnn`` or ``retinanet``.
        num_classes: linked from the data module (categories + background).
        heads_norm: None (torchvision's v1 heads) or ``gn`` (Detectron2's GN heads, 4conv1fc).
        fpn_norm: None or ``gn``.
        fpn_channels: the FPN's width (256 in the papers).
        trainable_layers, frozen_bn: see :func:`~.backbones.resnet_fpn_backbone` (None: 3 and
            FrozenBN with ``backbone_checkpoint``, 5 and trainable BN without).
        backbone_checkpoint: a classification checkpoint written by ``rescale fit`` (same network,
            scheme and options) the backbone starts from.
        min_size, max_size: the test-time resize (short side, long side cap).
        detector_options: more arguments of the torchvision detector (``rpn_batch_size_per_image``,
            ``box_batch_size_per_image``, ``box_detections_per_img``, ``head_channels``, ``fc_dim`` ...).
        draw_predictions: ``predict`` draws this many images with their detections (score above
            ``draw_score_threshold``) into ``predictions/`` of the results folder.
        optimizer: as for every task; the default is :func:`detectron_sgd`.
        norm_weight_decay: as for every task; 0 by default (Detectron's recipe).
        lr_batch: the global batch (images per optimizer step over all processes) the optimizer's
            ``lr`` and the schedule's iterations are set for (Detectron2's recipes: 16); a fit at
            another global batch says, in one warning line, the lr the linear scaling rule gives
            for its batch and that the iterations scale the other way. None: no check.
    """

    throughput_unit = "images"  # training throughput in images/s (common.data.throughput)

    @staticmethod
    def throughput_items(batch) -> int:
        """The images of a batch (a list of images of several sizes, and their targets)."""
        return len(batch[0])

    #: the split predict reads: the data module's own ``predict`` set (the validation set unless
    #: ``data.predict_annotations`` names another)
    predict_split = "predict"

    #: besides the common ones (network, scheme, num_classes ...): what a checkpoint's weights
    #: are shaped by, refused with --ckpt_path (rescale_tasks.common.checkpoints.architecture_match)
    architecture_arguments = ("fpn_channels",)

    def __init__(self, network: str = "resnet50", scheme: Optional[str] = None, *, detector: str = "maskrcnn",
                 num_classes: int = 81, heads_norm: Optional[str] = None, fpn_norm: Optional[str] = None,
                 fpn_channels: int = 256, trainable_layers: Optional[int] = None, frozen_bn: Optional[bool] = None,
                 backbone_checkpoint: Optional[str] = None, min_size: int = 800, max_size: int = 1333,
                 detector_options: Optional[dict[str, Any]] = None, draw_predictions: int = 0,
                 draw_score_threshold: float = 0.5, optimizer: OptimizerFactory = detectron_sgd,
                 norm_weight_decay: Optional[float] = 0.0, lr_batch: Optional[int] = None,
                 **options: Any) -> None:
        if detector not in DETECTORS:
            raise ConfigError(f"model.detector must be one of {', '.join(DETECTORS)}, got {detector!r}")
        self.check_arguments({"backbone_checkpoint": backbone_checkpoint})
        detection = dict(detector=detector, num_classes=num_classes, heads_norm=heads_norm, fpn_norm=fpn_norm,
                         fpn_channels=fpn_channels, trainable_layers=trainable_layers, frozen_bn=frozen_bn,
                         checkpoint=backbone_checkpoint, min_size=min_size, max_size=max_size,
                         options=dict(detector_options or {}))
        super().__init__(network, scheme, optimizer=optimizer, norm_weight_decay=norm_weight_decay,
                         network_kwargs={"detection": detection}, **options)
        self.lr_batch = check_lr_batch(lr_batch)
        self.detector_kind = detector
        self.iou_types = ("bbox", "segm") if detector == "maskrcnn" else ("bbox",)
        self.draw_predictions, self.draw_score_threshold = draw_predictions, draw_score_threshold
        self.evaluator: Optional[CocoEvaluator] = None
        self._evaluated_split = "val"  # the split the evaluator scores (test: the val set)
        self._predicted: list[ImageRecord] = []

    @staticmethod
    def check_arguments(init_args) -> None:
        """The checks of ``init_args`` that the ``rescale`` CLI runs before it builds anything (the
        data module reads the annotations first): a missing backbone checkpoint stops at once."""
        require_classification_checkpoint(init_args.get("backbone_checkpoint"), "backbone_checkpoint",
                                          "backbone checkpoint", "the backbone")

    def build_network(self, network: str, detection: dict, scheme: Optional[str] = None,
                      scheme_options: Optional[dict] = None, **network_options: Any) -> torch.nn.Module:
        kind = detection["detector"]
        backbone = resnet_fpn_backbone(
            network, scheme=scheme, scheme_options=scheme_options, network_options=network_options,
            trainable_layers=detection["trainable_layers"], fpn_norm=detection["fpn_norm"],
            out_channels=detection["fpn_channels"],
            frozen_bn=detection["frozen_bn"], checkpoint=detection["checkpoint"],
            # RetinaNet: P3-P5 from the stages, P6/P7 by strided convs (torchvision, Detectron2)
            returned_layers=(2, 3, 4) if kind == "retinanet" else (1, 2, 3, 4),
            extra_blocks="p6p7" if kind == "retinanet" else "maxpool")
        try:
            net = build_detector(kind, backbone, detection["num_classes"], heads_norm=detection["heads_norm"],
                                 min_size=detection["min_size"], max_size=detection["max_size"],
                                 _skip_resize=True, **detection["options"])
        except TypeError as err:
            raise ConfigError(f"model.detector_options: {err}") from None
        if detection["checkpoint"] is None:
            self._say_frozen_from_scratch(backbone.body, detection["trainable_layers"])
        net.scheme = backbone.scheme  # parameter groups and run names read the scheme here
        install_padding_aware_measurement(net)
        return net

    @staticmethod
    def _say_frozen_from_scratch(body: torch.nn.Module, trainable_layers: Optional[int]) -> None:
        """One warning line each for what only fits a backbone from a checkpoint, asked for without
        one (``backbone_checkpoint: null``): FrozenBatchNorm2d, which keeps BN's initial statistics and
        affine parameters (the backbone trains without normalization), and frozen stages, which keep
        their random weights."""
        if any(isinstance(m, FrozenBatchNorm2d) for m in body.modules()):
            rank_zero_log(log, logging.WARNING,
                          "frozen_bn true without a backbone checkpoint: FrozenBatchNorm2d keeps the initial statistics "
                          "and affine parameters (mean 0, variance 1, scale 1, shift 0), so the backbone trains "
                          "without normalization; leave model.init_args.frozen_bn unset (null) or false to train its "
                          "BN from scratch")
        if any(not p.requires_grad for p in body.parameters()):
            rank_zero_log(log, logging.WARNING,
                          f"trainable_layers {trainable_layers} without a backbone checkpoint: the stages it freezes "
                          "keep their random initialization and never train; leave model.init_args.trainable_layers "
                          "unset (null: 5 from scratch, as torchvision) or set it to 5")

    #: the last part of the names of the layers whose outputs are a torchvision detector's predictions
    PREDICTORS = ("cls_logits", "bbox_pred", "cls_score", "mask_fcn_logits", "bbox_reg")

    def output_layers(self) -> list[torch.nn.Module]:
        """What adaptive gradient clipping leaves alone unless ``agc_clip_classifier``: the layers
        whose outputs are the detector's predictions, its counterpart of the classifier the paper
        does not clip (the RPN's objectness and box deltas, the box predictor's class scores and
        box deltas, the mask predictor's logits; RetinaNet's class logits and box regression)."""
        return [m for name, m in self.net.named_modules() if name.rsplit(".", 1)[-1] in self.PREDICTORS]

    def compiled_part(self) -> torch.nn.Module:
        """The backbone with its FPN. The rest of a detector changes shape with every image's
        objects (proposals, RoI sampling, NMS): compiled whole, it broke into graphs that
        recompiled step after step (3 CPU steps of a tiny Mask R-CNN took 272 s, against 29 s
        with the backbone alone compiled; docs/speed.md)."""
        return self.net.backbone

    def forward(self, images: list[torch.Tensor], targets: Optional[list[dict]] = None):
        return self.net([self.as_input(x) for x in images], targets)

    def as_input(self, x: torch.Tensor) -> torch.Tensor:
        return x  # torchvision batches (pads) the images itself

    def network_inputs(self, batch) -> tuple:
        images, _ = batch
        return (list(images),)

    def export_programs(self, batch) -> list:
        """What ``rescale export`` writes: the backbone with its FPN (:mod:`.export`)."""
        return detection_programs(self.net, batch[0])

    def export_metadata(self, datamodule: Any, folder: str, stem: str) -> dict[str, Any]:
        """The sidecar's classes (``__background__`` first, with the data set's category ids) and the
        detector's transform, which makes the backbone's input: the file decoded as ``decode`` says
        (:data:`~rescale_tasks.common.data.IMAGE_DECODING`), then the preprocessing read off the
        detector's transform and the data's evaluation transform (:func:`~.export.detector_preprocessing`)."""
        metadata = super().export_metadata(datamodule, folder, stem)
        metadata["preprocessing"] = {**detector_preprocessing(self.net.transform), "decode": dict(IMAGE_DECODING)}
        return metadata

    def _label_to_category(self) -> Optional[dict]:
        """The network's label -> the data's category id (the data's labels mapped by name)."""
        table = getattr(self._datamodule(), "label_to_category", None)
        if table is None:
            return None
        labels = self.network_labels(torch.tensor(list(table), dtype=torch.long)).tolist()
        return dict(zip(labels, table.values()))

    # --- training -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        # Mask R-CNN learns from the targets' masks (its evaluation scores against the json's own)
        if stage == "fit" and self.detector_kind == "maskrcnn" and getattr(self._datamodule(), "masks", True) is False:
            raise ConfigError("model.detector maskrcnn trains on instance masks but data.masks is false: set "
                              "--data.init_args.masks true (the json's segmentations), or train a box-only "
                              "detector (--model.init_args.detector fasterrcnn or retinanet)")

    def on_fit_start(self) -> None:
        super().on_fit_start()
        warn_unscaled_lr(self.trainer, self.lr_batch, more=(
            ", and max_steps, the schedule's milestones and warmup_iters and val_check_interval x {factor} "
            "for the recipe's epochs (experiments/coco/_defaults.yaml)"))

    def train_batch(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        losses = self(list(images), _loss_targets(targets, self.network_labels))
        loss = sum(losses.values())
        n = len(images)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True, batch_size=n)
        for name, value in losses.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False, sync_dist=True, batch_size=n)
        return loss

    # --- evaluation -----------------------------------------------------------------------
    def _start_evaluation(self, split: str) -> None:
        """A fresh evaluator scoring against the ``split`` set's own annotation json."""
        datamodule = getattr(self.trainer, "datamodule", None)
        ground_truth = getattr(datamodule, "ground_truth", None)
        if ground_truth is None:
            raise ConfigError(f"COCO AP is scored against the {split} set's annotation json: use "
                              "rescale_tasks.detection.data.CocoDataModule (or a data module whose "
                              "ground_truth(split) returns its pycocotools COCO)")
        self.evaluator = CocoEvaluator(ground_truth(split), iou_types=self.iou_types,
                                       label_to_category=self._label_to_category())
        self._evaluated_split = split

    def evaluate_batch(self, batch, stage: str) -> None:
        images, targets = batch
        # the records move to the CPU themselves, masks thresholded and RLE-encoded on the device first
        self.evaluator.update(self(list(images)), targets)

    def evaluate_nothing(self) -> None:
        """A batch whose every image was unreadable (skipped with ``data.skip_corrupt``) still runs
        the detector, on a black stand-in image whose detections are dropped: under a strategy that
        shards the parameters (FSDP) each forward gathers them from every rank, so a rank skipping
        its forward would leave the others waiting (the evaluation batch lists give every rank as
        many batches, not as many images). Nothing is scored, predicted or drawn."""
        self(torch.zeros(1, 3, 32, 32, device=self.device).unbind(0))

    def _finish_evaluation(self, prefix: str, write_results: bool) -> None:
        records = self.evaluator.gather()  # a collective: every rank's images, merged by image id
        results = self.evaluator.results(records)  # built once: what is scored is what is written
        metrics = self.evaluator.compute(records, results)
        for name, value in metrics.items():
            self.log(f"{prefix}/{name.replace('/', '_')}", float(value), sync_dist=False,
                     prog_bar=name in ("bbox/AP", "segm/AP"))
        self._report_skipped_images(prefix, len(records))
        if write_results and self.trainer.is_global_zero:
            path = self._write_results(prefix, results)
            log.info(f"{prefix}: {len(results)} detections written to {path} (COCO results format)")

    def _report_skipped_images(self, prefix: str, evaluated: int) -> None:
        """With unreadable images skipped (``--data.skip_corrupt true``) the COCO AP covers the
        images read only: ``<prefix>/images`` logged beside it (the printed and logged metrics say
        on how many it was computed) and one warning line naming the skipped ones. A collective."""
        datamodule = getattr(self.trainer, "datamodule", None)
        listed = getattr(datamodule, "skipped_image_ids", None)
        split = self._evaluated_split
        skipped = sorted(set(gather_objects(list(listed(split)) if callable(listed) else [])))
        if not skipped:
            return
        self.log(f"{prefix}/images", float(evaluated), sync_dist=False)
        if self.trainer.is_global_zero:
            shown = ", ".join(str(i) for i in skipped[:5]) + (f" (+{len(skipped) - 5} more)" if len(skipped) > 5 else "")
            log.warning(f"{prefix}: COCO AP computed on {evaluated} images: {len(skipped)} unreadable image(s) of "
                        f"the {split} set skipped (--data.skip_corrupt true), image id(s) {shown}; it is not "
                        "comparable with an AP over the whole set until they are restored")

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation("val")

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self._finish_evaluation("val", write_results=False)

    def on_test_epoch_start(self) -> None:
        self._start_evaluation("test")

    def on_test_epoch_end(self) -> None:
        self._finish_evaluation("test", write_results=True)

    # --- prediction -----------------------------------------------------------------------
    def on_predict_epoch_start(self) -> None:
        self._predicted = []
        self._drawings: list[tuple[int, bytes]] = []  # this rank's first draw_predictions images, as PNGs

    def predict_batch(self, batch) -> list[dict]:
        images, targets = batch
        predictions = [{k: v.detach().cpu() for k, v in p.items()} for p in self(list(images))]
        for image, target, prediction in zip(images, targets, predictions):
            # kept compact (RLE masks) until the epoch ends, as the evaluation keeps its records
            self._predicted.append(image_record(prediction, image_id=int(target["image_id"])))
            if len(self._drawings) < self.draw_predictions:
                self._drawings.append((self._predicted[-1].image_id, self._drawn(image, prediction)))
        return predictions

    def on_predict_epoch_end(self) -> None:
        # by image id: an image met twice (padded sampler) counts once
        records = {r.image_id: r for r in gather_objects(self._predicted)}
        # every rank drew its own first images: the first draw_predictions of the split are among them
        drawings = dict(gather_objects(self._drawings))
        if self.trainer.is_global_zero:
            self._write_results(self.predict_split, coco_results(records, self._label_to_category()))
            if drawings:
                position = {image_id: k for k, image_id in enumerate(self._split_image_ids())}
                first = sorted(drawings, key=lambda i: (position.get(i, len(position)), i))[:self.draw_predictions]
                for image_id in first:
                    write_result(self.trainer, os.path.join("predictions", f"{image_id}.png"), drawings[image_id],
                                 None, "", note=False)
                note_result_file(self.trainer, os.path.join(results_folder(self.trainer), "predictions"), len(first),
                                 "drawn images")

    def _split_image_ids(self) -> list[int]:
        """The image ids of the predicted split in its order (none where the loader's data set lists none)."""
        dataset = getattr(predict_dataset(self.trainer), "dataset", None)
        return list(getattr(dataset, "image_ids", None) or [])

    # --- outputs --------------------------------------------------------------------------
    def _write_results(self, split: str, results: list[dict]) -> str:
        """``coco_results.<split>.json`` in the results folder, named in the closing line; its path."""
        return write_result(self.trainer, RESULTS_FILE.format(split=split), json.dumps(results), len(results),
                            "detections")

    def _drawn(self, image: torch.Tensor, prediction: dict) -> bytes:
        """The PNG of ``image`` with ``prediction``'s detections drawn, named as the checkpoint names them."""
        names = self.trained_labels.names if self.trained_labels is not None else \
            getattr(self._datamodule(), "class_names", None)
        pixels = (image.detach().cpu().clamp(0, 1) * 255).to(torch.uint8)
        return drawn_png(pixels, prediction, names, self.draw_score_threshold)
