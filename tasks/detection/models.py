"""Detectors around an FPN backbone: torchvision's ``MaskRCNN``, ``FasterRCNN`` and ``RetinaNet``
(``torchvision.models.detection``), the backbone passed unchanged.

Heads: ``heads_norm=None`` gives torchvision's v1 heads (2-fc ``TwoMLPHead`` box head, 4-conv mask
head, RetinaNet head) without normalization; ``heads_norm="gn"`` gives Detectron2's GN recipe
(Wu & He 2018; Detectron2 ``mask_rcnn_R_50_FPN_*_gn``): a 4conv1fc box head
(``FastRCNNConvFCHead(conv_layers=[C]*4, fc_layers=[fc_dim], norm_layer=GN)``), the 4-conv mask head
with GN, and the RetinaNet head with GN (torchvision's v2 RetinaNet head). The RPN head has no
normalization in either recipe.

Deviations from torchvision's builders: anchors and RoI pooling follow the backbone's levels (the
returned stages plus its extra blocks) instead of assuming P2-P6: anchor sizes 32, 64, ... per
level from the finest (torchvision's defaults for 5 levels), RoIAlign over the stage levels only.
``head_channels``/``fc_dim`` narrow the heads (256/1024 in the papers) for tiny test models.
RetinaNet keeps at most 100 detections per image (``detections_per_img``, Detectron2's
``TEST.DETECTIONS_PER_IMAGE`` and COCO's limit for results; torchvision's default is 300), as the
R-CNNs do (``box_detections_per_img``): ``COCOeval``'s ``maxDets`` 100 caps each image's detections
per category, not per image, so the 200 more would be scored.

Evaluation under autocast (``--trainer.precision bf16-mixed``): the layers run in the low precision,
the box arithmetic in float32 (:func:`float32_box_arithmetic`). torchvision makes anchors in the
features' dtype and decodes boxes in the dtype of the predicted deltas, so under bf16 (8 significant
bits) every predicted box landed on a grid of 4 px at the test size's 512-1023 px and 8 px beyond
(an 800 x 1333 COCO image), a few pixels off for the small objects whose AP75 it costs, in every
logged and written result; the FPN's features and the predictors' outputs are therefore handed on
in float32 when evaluating. Training makes its anchors in float32 too, and decodes the RPN's
proposals in float32: the regression targets are offsets from the anchors and proposals, so a
network trained from anchors on bf16's grid would be evaluated from anchors off it (the other
outputs go to the losses, which take the targets' float32).
"""
from __future__ import annotations

from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torchvision.models.detection import FasterRCNN, MaskRCNN, RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.retinanet import RetinaNetHead
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelP6P7

from rescale_tasks.common.errors import ConfigError

from .backbones import GN

__all__ = ["build_detector", "float32_box_arithmetic", "DETECTORS", "HEADS_NORMS"]

DETECTORS = ("maskrcnn", "fasterrcnn", "retinanet")
HEADS_NORMS = (None, "gn")
#: detections kept per image at evaluation: COCO's limit for a results file (its ``maxDets`` 100)
RESULTS_PER_IMAGE = 100


def _levels(backbone: nn.Module) -> tuple[list[str], int]:
    """The FPN's stage-level feature names and the number of extra levels (pool / p6, p7)."""
    names = list(backbone.body.return_layers.values())
    extra = backbone.fpn.extra_blocks
    return names, (0 if extra is None else 2 if isinstance(extra, LastLevelP6P7) else 1)


def _float32_when_evaluating(module: nn.Module, args: Any, output: Any) -> Any:
    """The output's half-precision tensors (in any nesting) as float32, when evaluating."""
    return None if module.training else _float32(module, args, output)


def _float32(module: nn.Module, args: Any, output: Any) -> Any:
    """The output's half-precision tensors (in any nesting) as float32."""
    return apply_to_collection(output, torch.Tensor,
                               lambda t: t.float() if t.dtype in (torch.bfloat16, torch.float16) else t)


def _float32_anchors(module: nn.Module, args: tuple) -> tuple:
    """The anchor generator's feature maps as float32 stand-ins: it reads only their sizes, dtype
    and device, and makes the anchors in their dtype (no copy of the features: a broadcast zero)."""
    images, features = args
    return images, [f if f.dtype == torch.float32 else
                    torch.zeros((), dtype=torch.float32, device=f.device).expand(f.shape) for f in features]


def float32_box_arithmetic(detector: nn.Module) -> nn.Module:
    """``detector`` (built here) with its anchors made in float32 and its RPN's proposals decoded
    in float32, and, when it evaluates under autocast, the outputs of its backbone and of its box,
    mask and RetinaNet predictors (the decoded boxes take their dtype) in float32 (see the module
    docstring); hooks, nothing else changes."""
    parts = [detector.backbone]
    if isinstance(detector, RetinaNet):
        parts.append(detector.head)
        anchors = detector.anchor_generator
    else:
        parts += [detector.roi_heads.box_predictor]
        if getattr(detector.roi_heads, "mask_predictor", None) is not None:
            parts.append(detector.roi_heads.mask_predictor)
        detector.rpn.head.register_forward_hook(_float32)
        anchors = detector.rpn.anchor_generator
    anchors.register_forward_pre_hook(_float32_anchors)
    for part in parts:
        part.register_forward_hook(_float32_when_evaluating)
    return detector


def build_detector(kind: str, backbone: nn.Module, num_classes: int, heads_norm: str | None = None,
                   min_size: int | tuple[int, ...] = 800, max_size: int = 1333, head_channels: int = 256,
                   fc_dim: int = 1024, **kwargs: Any) -> nn.Module:
    """``kind`` (``maskrcnn``, ``fasterrcnn``, ``retinanet``) around ``backbone`` (a
    ``BackboneWithFPN``, e.g. from :func:`~rescale_tasks.detection.backbones.resnet_fpn_backbone`).

    ``num_classes`` counts the background for the R-CNNs (torchvision's convention: COCO is 91 with
    the original ids, 81 contiguous), not for RetinaNet. ``kwargs`` go to the torchvision class
    (``rpn_batch_size_per_image``, ``box_batch_size_per_image``, ``box_detections_per_img`` ...).
    """
    if kind not in DETECTORS:
        raise ConfigError(f"detector must be one of {', '.join(DETECTORS)}, got {kind!r}")
    if heads_norm not in HEADS_NORMS:
        raise ConfigError(f"heads_norm must be one of {HEADS_NORMS}, got {heads_norm!r}")
    norm = GN if heads_norm == "gn" else None
    c = backbone.out_channels
    names, extra = _levels(backbone)
    n_levels = len(names) + extra
    base = [32 * 2 ** i for i in range(n_levels)]
    common = dict(min_size=min_size, max_size=max_size, **kwargs)

    if kind == "retinanet":
        # COCO's results rule and Detectron2's TEST.DETECTIONS_PER_IMAGE: at most 100 per image, as the
        # R-CNNs' box_detections_per_img (torchvision's RetinaNet keeps 300, which COCOeval's maxDets=100,
        # a limit per image and category, would score)
        common.setdefault("detections_per_img", RESULTS_PER_IMAGE)
        sizes = tuple((x, int(x * 2 ** (1 / 3)), int(x * 2 ** (2 / 3))) for x in base)
        anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * n_levels)
        head = RetinaNetHead(c, anchors.num_anchors_per_location()[0], num_classes, norm_layer=norm)
        return float32_box_arithmetic(RetinaNet(backbone, num_classes, anchor_generator=anchors, head=head,
                                                **common))

    anchors = AnchorGenerator(tuple((x,) for x in base), ((0.5, 1.0, 2.0),) * n_levels)
    box_pool = MultiScaleRoIAlign(names, output_size=7, sampling_ratio=2)
    if norm is None:
        box_head = TwoMLPHead(c * 7 * 7, fc_dim)
    else:
        box_head = FastRCNNConvFCHead((c, 7, 7), [head_channels] * 4, [fc_dim], norm_layer=norm)
    parts = dict(rpn_anchor_generator=anchors, box_roi_pool=box_pool, box_head=box_head,
                 box_predictor=FastRCNNPredictor(fc_dim, num_classes))
    if kind == "fasterrcnn":
        return float32_box_arithmetic(FasterRCNN(backbone, None, **parts, **common))
    mask_pool = MultiScaleRoIAlign(names, output_size=14, sampling_ratio=2)
    mask_head = MaskRCNNHeads(c, [head_channels] * 4, 1, norm_layer=norm)
    return float32_box_arithmetic(MaskRCNN(backbone, None, **parts, mask_roi_pool=mask_pool, mask_head=mask_head,
                                           mask_predictor=MaskRCNNPredictor(head_channels, head_channels,
                                                                            num_classes), **common))
