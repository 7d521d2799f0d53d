"""The ``detection`` section: Mask R-CNN R50-FPN train step and inference speed with
three backbones, as ratios to the FrozenBN one.

The contenders (:func:`detection_contenders`), each ``rescale_tasks.detection.models.build_detector
("maskrcnn", resnet_fpn_backbone(...))``, i.e. the detection task's own builders:

- ``FrozenBN``: ``resnet50`` (scheme ``bn``) with ``FrozenBatchNorm2d`` and the stem and ``layer1``
  frozen (``trainable_layers=3``): Detectron2's and torchvision's R50-FPN fine-tuned from an
  ImageNet checkpoint; torchvision's v1 heads (2-fc box head, 4-conv mask head), no norm. The
  baseline.
- ``GN``: scheme ``gn`` in the backbone, ``GroupNorm(32)`` in the FPN and in the heads (Detectron2's
  GN recipe, Wu & He 2018: a 4conv1fc box head with GN, GN in the 4-conv mask head).
- ``rescale50``: the normalization-free RescaleNet backbone (scheme ``rescale``), the FPN and heads
  without norm, as FrozenBN's.

All three freeze the same stages (``trainable_layers``, 3 by default) so the ratios isolate what
the normalization costs, and all start as from a checkpoint: RescaleNet's mean-shift biases have
finished measuring (a trained checkpoint brings its measured ``mu0``), so no measuring step is
timed. Weights are random: the arithmetic does not depend on them, but the RoI heads' workload
does (next paragraph).

Inputs are synthetic: ``batch`` images of ``image_size`` (h, w) with smooth random content and a
few random boxes per image, each with a filled elliptical mask. ``min_size``/``max_size`` of the
model's transform are set so the images are not rescaled much (the CPU default: 320 x 416 px images,
min 320, max 512; the GPU: 800 x 1216, torchvision's 800/1333). The inference forward keeps every
detection (``box_score_thresh=0``, up to ``box_detections_per_img`` per image): an untrained
model's scores sit below the usual 0.05, which would leave the mask head with nothing to do,
whereas a trained model on COCO fills most of its 100 detections.

The same holds in training: the mask head trains on the positive RoIs only (IoU >= 0.5 with an
object), and with torchvision's ``box_positive_fraction=0.25`` (up to 128 of 512 per image) their
number is whatever a random-weight RPN happens to propose near the objects: at the CPU sizes 20 per
step for FrozenBN and 57 for rescale50, which made the ratio measure the mask head's workload
(rescale50's backbone forward + backward is as fast as FrozenBN's) and not the backbone. So the
positive quota is set to the objects per image (:func:`detector_options`): every image's own
objects are proposals too (torchvision adds the ground-truth boxes), so every contender trains its
mask head on exactly ``batch * boxes`` RoIs and its box head on ``box_batch_size_per_image`` per
image; 8 objects per image, about COCO's mean (7.3). Likewise the RPN's NMS: how many of its
``rpn_post_nms_top_n_test`` proposals survive it (and reach the box head at inference) depends on
the random weights (at the CPU sizes 1798 of 2000 for FrozenBN, 2000 for rescale50), so
``rpn_nms_thresh`` is 1.0 (NMS suppresses nothing): the box head sees the full quota, as a trained
RPN's proposals on COCO fill it. What still varies with the weights is the post-processing NMS
over the box head's (score-thresholded at 0) detections.

A train step: forward in train mode (RPN and RoI losses, mask loss), the sum of the losses,
backward, SGD at learning rate 0 (the harness's step, :mod:`benchmarks.steps`). Inference:
``model.eval()`` under ``torch.inference_mode``, images/s. Paired, interleaved repeats as in
every section; ratios are medians of per-repeat ratios.
"""
from __future__ import annotations

import inspect
from dataclasses import replace

import torch
from torchvision.models.detection import FasterRCNN

import rescale_core

from .models import Contender, Suite
from .toolkit import SectionResult, Settings, Table, ms_text, prepare_all, ratio_text, release
from .timing import paired_repeats, timer_measure

__all__ = ["DETECTION_DEFAULTS", "DETECTION_SIZES", "detection_contenders", "detector_options",
           "detection_suite", "synthetic_batch", "section_detection"]

DETECTION_DEFAULTS = {
    "batch": 2,
    "image_size": (320, 416),   # (height, width) of the synthetic images
    "min_size": 320, "max_size": 512,
    "boxes": 8,                 # objects per image (COCO: 7.3 on average), = positive RoIs per image
    "num_classes": 81,          # COCO, contiguous ids + background
    "trainable_layers": 3,
    "out_channels": 256, "head_channels": 256, "fc_dim": 1024,  # the papers' widths
    "network_options": {},      # e.g. {"base_width": 16} (tests)
    "detector_options": {},     # torchvision's MaskRCNN kwargs (RoIs per image, proposals ...);
    #                             defaults: box_positive_fraction boxes / box_batch_size_per_image, rpn_nms_thresh 1
    "warmup": 3,                # train steps before timing (at least 2)
    "eval_warmup": 1,
}

# --quick / cpu / cuda sizes (merged over DETECTION_DEFAULTS by benchmarks.__main__)
DETECTION_SIZES = {
    "quick": {"batch": 1, "image_size": (128, 160), "min_size": 128, "max_size": 160, "boxes": 2,
              "out_channels": 64, "head_channels": 64, "fc_dim": 128, "warmup": 2,
              "detector_options": {"rpn_pre_nms_top_n_train": 200, "rpn_post_nms_top_n_train": 100,
                                   "rpn_pre_nms_top_n_test": 100, "rpn_post_nms_top_n_test": 50,
                                   "box_batch_size_per_image": 64, "box_detections_per_img": 20}},
    "cpu": {},
    "cuda": {"batch": 4, "image_size": (800, 1216), "min_size": 800, "max_size": 1333, "warmup": 10,
             "eval_warmup": 3},
}


def detector_options(o: dict) -> dict:
    """The MaskRCNN kwargs: ``o["detector_options"]``, with ``box_positive_fraction`` (unless given)
    such that the RoI sampler keeps exactly ``o["boxes"]`` positives per image, the image's objects
    (always positives: torchvision adds the ground-truth boxes to the proposals), and
    ``rpn_nms_thresh=1.0`` (unless given: the RPN keeps its top ``rpn_post_nms_top_n_*``), so the
    RoI heads' workload does not depend on what a random-weight RPN proposes (module docstring)."""
    out = dict(o["detector_options"])
    out.setdefault("rpn_nms_thresh", 1.0)
    per_image = out.get("box_batch_size_per_image",
                        inspect.signature(FasterRCNN).parameters["box_batch_size_per_image"].default)
    # the sampler keeps int(per_image * fraction) positives: the half keeps float rounding off k - 1
    out.setdefault("box_positive_fraction", min(1.0, (int(o["boxes"]) + 0.5) / per_image))
    return out


def detection_contenders(o: dict) -> tuple[Contender, ...]:
    """FrozenBN, GN and rescale50 Mask R-CNNs built from the options ``o`` (see the docstring)."""
    # the task package only when the section runs: ``__main__`` imports this module for its sizes
    from rescale_tasks.detection.backbones import resnet_fpn_backbone
    from rescale_tasks.detection.models import build_detector  # likewise

    def build(network: str, scheme: str, frozen_bn: bool, norm: str | None):
        def make() -> torch.nn.Module:
            backbone = resnet_fpn_backbone(network, scheme=scheme, frozen_bn=frozen_bn, fpn_norm=norm,
                                           trainable_layers=o["trainable_layers"],
                                           network_options=dict(o["network_options"]),
                                           out_channels=o["out_channels"])
            rescale_core.finish_measuring(backbone)  # as from a trained checkpoint
            return build_detector("maskrcnn", backbone, o["num_classes"], heads_norm=norm,
                                  min_size=o["min_size"], max_size=o["max_size"],
                                  head_channels=o["head_channels"], fc_dim=o["fc_dim"],
                                  box_score_thresh=0.0, **options)
        return make

    t = o["trainable_layers"]
    options = detector_options(o)
    return (
        Contender("FrozenBN", build("resnet50", "bn", True, None),
                  f"resnet50, FrozenBatchNorm2d, trainable_layers={t}, heads without norm"),
        Contender("GN", build("resnet50", "gn", False, "gn"),
                  f"resnet50 scheme=gn, GN in FPN and heads (4conv1fc box head), trainable_layers={t}"),
        Contender("rescale50", build("rescale50", "rescale", False, None),
                  f"rescale50, no norm in backbone, FPN or heads, trainable_layers={t}"),
    )


def _smooth(h: int, w: int, g: torch.Generator) -> torch.Tensor:
    coarse = torch.rand(1, 3, max(2, h // 32), max(2, w // 32), generator=g)
    image = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)[0]
    return (image + 0.05 * torch.randn(3, h, w, generator=g)).clamp(0, 1)


def synthetic_batch(batch: int, image_size: tuple[int, int], boxes: int, num_classes: int,
                    seed: int = 0) -> tuple[list[torch.Tensor], list[dict]]:
    """``batch`` images [3, H, W] in [0, 1] and their targets: ``boxes`` random boxes (10-60% of
    the image side) with labels in 1..num_classes-1 and filled elliptical uint8 masks [N, H, W]."""
    g = torch.Generator().manual_seed(seed)
    h, w = image_size
    images, targets = [], []
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    for _ in range(batch):
        images.append(_smooth(h, w, g))
        size = torch.rand(boxes, 2, generator=g) * 0.5 + 0.1  # (h, w) fractions
        corner = torch.rand(boxes, 2, generator=g) * (1 - size)
        y0, x0 = corner[:, 0] * h, corner[:, 1] * w
        y1, x1 = y0 + size[:, 0] * h, x0 + size[:, 1] * w
        box = torch.stack([x0, y0, x1, y1], dim=1)
        cy, cx, ry, rx = (y0 + y1) / 2, (x0 + x1) / 2, (y1 - y0) / 2, (x1 - x0) / 2
        masks = (((ys[None] - cy[:, None, None]) / ry[:, None, None]) ** 2
                 + ((xs[None] - cx[:, None, None]) / rx[:, None, None]) ** 2 <= 1).to(torch.uint8)
        labels = torch.randint(1, num_classes, (boxes,), generator=g)
        targets.append({"boxes": box, "labels": labels, "masks": masks})
    return images, targets


def _sum_losses(losses: dict, _unused) -> torch.Tensor:
    return sum(losses.values())


def detection_suite(o: dict, train: bool = True) -> Suite:
    """The contenders with the synthetic batch: ``(images, targets)`` in training, ``(images,)``
    for inference (the harness's ``prepare`` calls the model with these inputs)."""
    def make(batch: int, device: torch.device):
        images, targets = synthetic_batch(batch, tuple(o["image_size"]), o["boxes"], o["num_classes"])
        images = [x.to(device) for x in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        return ((images, targets) if train else (images,)), torch.zeros((), device=device)

    h, w = o["image_size"]
    return Suite("detection", "Mask R-CNN R50-FPN", detection_contenders(o), baseline="FrozenBN",
                 floor=None, target="rescale50", make_batch=make, loss=_sum_losses,
                 shape=f"{h}x{w} images, {o['boxes']} objects each, min_size {o['min_size']}, "
                       f"max_size {o['max_size']}",
                 image_like=False)


def section_detection(settings: Settings) -> SectionResult:
    o = {**DETECTION_DEFAULTS, **settings.detection}
    repeats = settings.repeats.get("detection", 3)
    batch = o["batch"]
    # torchvision's transform batches the images into a new contiguous tensor: no channels_last
    cfg = replace(settings.run_config, channels_last=False)
    result = SectionResult("detection")

    # train steps
    suite = detection_suite(o, train=True)
    names, base = [c.name for c in suite.contenders], suite.baseline
    quiet = replace(settings, warmup=max(2, int(o["warmup"])))
    prepared = prepare_all(suite, names, quiet, batch, configs=dict.fromkeys(names, cfg))
    measures = {n: timer_measure(p.train_step, min_run_time=settings.min_run_time, label="detection",
                                 description=n) for n, p in prepared.items()}
    paired = paired_repeats(measures, base, repeats, progress=settings.progress("detection"))
    params = {n: (sum(q.numel() for q in p.model.parameters()),
                  sum(q.numel() for q in p.model.parameters() if q.requires_grad)) for n, p in prepared.items()}
    bad = [n for n, p in prepared.items() if not all(bool(torch.isfinite(q).all()) for q in p.model.parameters())]
    release(prepared)
    rows = []
    for c in suite.contenders:
        n = c.name
        sec = paired.seconds(n).median
        vs_base, vs_gn = paired.ratio(n), paired.ratio(n, "GN")
        result.metrics[f"detection.train.vs_baseline.{n}"] = vs_base
        result.metrics[f"detection.train.vs_gn.{n}"] = vs_gn
        result.metrics[f"detection.train.per_second.{n}"] = batch / sec
        total, trainable = params[n]
        rows.append([n, ms_text(sec), f"{batch / sec:.2f}", ratio_text(vs_base), ratio_text(vs_gn),
                     f"{total / 1e6:.1f}M ({trainable / 1e6:.1f}M)", c.note])
    notes = [f"{suite.title} train step (losses summed, backward, SGD lr 0), batch {batch} x {suite.shape}, "
             f"{o['num_classes']} classes, FPN {o['out_channels']} channels, heads {o['head_channels']}/"
             f"{o['fc_dim']}; {cfg.label()}; {paired.repeats} paired repeats after >= {quiet.warmup} "
             "warm-up steps each; vs X: time / time of X (below 1: faster), median [q1, q3] of "
             "per-repeat ratios; params: all (trainable)",
             "RoI sampling is random per step (as in training); the targets are synthetic (random boxes, "
             "elliptical masks), weights random, RescaleNet's mean-shift biases already measured"]
    if "box_positive_fraction" not in o["detector_options"]:
        notes.append(f"the mask head trains on {batch * o['boxes']} positive RoIs per step in every contender "
                     f"(box_positive_fraction: {o['boxes']} per image, the objects)")
    notes.append(f"MaskRCNN options: {detector_options(o)} (rpn_nms_thresh 1: the RPN keeps its top proposals)")
    if bad:
        notes.append(f"non-finite parameters after timing: {bad}")
    result.tables.append(Table(f"{suite.title}: train step",
                               ["backbone", "ms/step", "img/s", f"time vs {base}", "time vs GN", "params",
                                "note"], rows, notes))

    # inference
    suite = detection_suite(o, train=False)
    quiet = replace(settings, eval_warmup=max(1, int(o["eval_warmup"])))
    prepared = prepare_all(suite, names, quiet, batch, configs=dict.fromkeys(names, cfg), train=False)
    measures = {n: timer_measure(p.eval_step, min_run_time=settings.min_run_time, label="detection",
                                 description=f"{n} eval") for n, p in prepared.items()}
    paired = paired_repeats(measures, base, repeats, progress=settings.progress("detection"))
    with torch.inference_mode():  # how many detections the mask head saw
        first = next(iter(prepared.values()))
        detections = [len(d["boxes"]) for d in first.model(*first.inputs)]
    release(prepared)
    rows = []
    for c in suite.contenders:
        n = c.name
        sec = paired.seconds(n).median
        ips_vs = paired.ratio(base, n)  # time(base) / time(n): images/s relative to FrozenBN
        result.metrics[f"detection.eval.per_second.{n}"] = batch / sec
        result.metrics[f"detection.eval.vs_baseline.{n}"] = paired.ratio(n)
        result.metrics[f"detection.eval.vs_gn.{n}"] = paired.ratio(n, "GN")
        rows.append([n, ms_text(sec), f"{batch / sec:.2f}", ratio_text(ips_vs), ratio_text(paired.ratio(n)),
                     ratio_text(paired.ratio(n, "GN"))])
    notes = [f"{suite.title} inference (model.eval(), torch.inference_mode, transform + backbone + RPN + "
             f"RoI heads + mask head + postprocessing), batch {batch} x {suite.shape}; {cfg.label()}; "
             f"{paired.repeats} paired repeats; box_score_thresh 0: {detections} detections per image "
             "reach the mask head (FrozenBN)",
             f"img/s vs {base}: time({base}) / time (above 1: more images/s); time vs X: time / time of X"]
    result.tables.append(Table(f"{suite.title}: inference",
                               ["backbone", "ms/batch", "img/s", f"img/s vs {base}", f"time vs {base}",
                                "time vs GN"], rows, notes))
    return result

