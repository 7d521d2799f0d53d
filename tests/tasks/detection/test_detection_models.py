"""torchvision detectors around the suite's FPN backbones: they build for normalized and
normalization-free backbones, train (finite losses, gradients reach the backbone) and predict."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchvision.models.detection import FasterRCNN, MaskRCNN, RetinaNet

from rescale_tasks.common.errors import ConfigError
from rescale_tasks.detection import build_detector, resnet_fpn_backbone

TINY_RCNN = dict(rpn_batch_size_per_image=32, box_batch_size_per_image=32, rpn_pre_nms_top_n_train=100,
                 rpn_post_nms_top_n_train=50, rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=25,
                 box_detections_per_img=10)
TINY_RETINA = dict(topk_candidates=50, detections_per_img=10)
CLASSES = {"maskrcnn": MaskRCNN, "fasterrcnn": FasterRCNN, "retinanet": RetinaNet}
LOSSES = {"maskrcnn": {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"},
          "fasterrcnn": {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"},
          "retinanet": {"classification", "bbox_regression"}}
OUTPUTS = {"maskrcnn": {"boxes", "labels", "scores", "masks"}, "fasterrcnn": {"boxes", "labels", "scores"},
           "retinanet": {"boxes", "labels", "scores"}}


def _detector(kind, scheme, norm):
    extra = dict(returned_layers=(2, 3, 4), extra_blocks="p6p7") if kind == "retinanet" else {}
    backbone = resnet_fpn_backbone("resnet18", scheme, network_options={"base_width": 8}, out_channels=32,
                                   trainable_layers=5, fpn_norm=norm, **extra)
    kwargs = TINY_RETINA if kind == "retinanet" else TINY_RCNN
    return build_detector(kind, backbone, num_classes=3, heads_norm=norm, min_size=96, max_size=128,
                          head_channels=32, fc_dim=64, **kwargs), backbone


def _sample():
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 96, 96, generator=g), torch.rand(3, 80, 96, generator=g)]
    masks = torch.zeros(1, 96, 96, dtype=torch.uint8)
    masks[0, 20:60, 10:50] = 1
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 50.0, 60.0]]), "labels": torch.tensor([1]), "masks": masks},
               {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64),
                "masks": torch.zeros(0, 80, 96, dtype=torch.uint8)}]  # an image without objects
    return images, targets


@pytest.mark.parametrize("kind", ["maskrcnn", "fasterrcnn", "retinanet"])
@pytest.mark.parametrize("scheme,norm", [("bn", None), ("rescale", None), ("rescale", "gn")])
def test_detector_trains_and_predicts(kind, scheme, norm):
    torch.manual_seed(0)
    model, backbone = _detector(kind, scheme, norm)
    assert type(model) is CLASSES[kind] and model.backbone is backbone
    has_gn = any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert has_gn == (norm == "gn")  # rescale/bn backbones: GN only where the recipe asks
    images, targets = _sample()
    model.train()
    losses = model(images, targets)
    assert set(losses) == LOSSES[kind] and all(math.isfinite(v.item()) for v in losses.values())
    sum(losses.values()).backward()
    assert backbone.body.layer4[-1].conv2.weight.grad is not None  # gradients reach the backbone
    model.eval()
    with torch.no_grad():
        out = model(images)
    assert len(out) == 2 and all(set(o) == OUTPUTS[kind] for o in out)
    if kind == "maskrcnn":
        assert out[0]["masks"].shape[-2:] == (96, 96)


def test_gn_recipe_heads():
    model, _ = _detector("maskrcnn", "gn", "gn")
    head = model.roi_heads.box_head
    convs = [m for m in head.modules() if isinstance(m, nn.Conv2d)]
    fcs = [m for m in head.modules() if isinstance(m, nn.Linear)]
    assert len(convs) == 4 and len(fcs) == 1  # 4conv1fc
    assert sum(isinstance(m, nn.GroupNorm) for m in model.roi_heads.mask_head.modules()) == 4
    assert any(isinstance(m, nn.GroupNorm) for m in model.backbone.fpn.modules())
    plain, _ = _detector("maskrcnn", "rescale", None)
    assert not any(isinstance(m, nn.GroupNorm) for m in plain.modules())


def test_bad_names():
    backbone = resnet_fpn_backbone("resnet18", "rescale", network_options={"base_width": 8}, out_channels=32)
    with pytest.raises(ConfigError, match="detector must be one of"):
        build_detector("yolo", backbone, 3)
    with pytest.raises(ConfigError, match="heads_norm"):
        build_detector("maskrcnn", backbone, 3, heads_norm="bn")


@pytest.mark.parametrize("kind", ["maskrcnn", "retinanet"])
def test_boxes_are_decoded_in_float32_when_evaluating_under_bf16(kind):
    """Evaluated under bf16 autocast (bf16-mixed) at COCO's test size, an image of 240 x 320 is seen
    at 800 x 1066: the boxes come out in float32, off the 4-px grid bf16 holds from 512 to 1023 px,
    which every box landed on when anchors and decoding took the layers' bf16."""
    backbone_options = dict(returned_layers=(2, 3, 4), extra_blocks="p6p7") if kind == "retinanet" else {}
    backbone = resnet_fpn_backbone("resnet18", "rescale", network_options={"base_width": 8}, out_channels=16,
                                   trainable_layers=5, **backbone_options)
    thresholds = dict(score_thresh=0.0) if kind == "retinanet" else dict(box_score_thresh=0.0)
    detector = build_detector(kind, backbone, num_classes=3, min_size=800, max_size=1333, head_channels=8,
                              fc_dim=32, **thresholds).eval()
    image = torch.rand(3, 240, 320, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        [prediction] = detector([image])
    assert prediction["boxes"].dtype == torch.float32 and prediction["scores"].dtype == torch.float32
    seen = prediction["boxes"] * (800 / 240)  # in the frame the detector decoded them in
    far = seen[(seen >= 512) & (seen < 1024)]
    assert len(far) >= 20 and float((far % 4 == 0).float().mean()) < 0.5
    if kind == "maskrcnn":
        assert prediction["masks"].dtype == torch.float32


@pytest.mark.parametrize("kind", ["fasterrcnn", "retinanet"])
def test_training_under_bf16_takes_the_anchors_evaluation_takes(kind):
    """Trained under bf16 autocast at COCO's test size: the anchors the regression targets are
    offsets from are the float32 anchors evaluation decodes from (not bf16's 4-px grid from 512 px
    on), and the RPN's proposals are decoded in float32."""
    backbone_options = dict(returned_layers=(2, 3, 4), extra_blocks="p6p7") if kind == "retinanet" else {}
    backbone = resnet_fpn_backbone("resnet18", "rescale", network_options={"base_width": 8}, out_channels=16,
                                   trainable_layers=5, **backbone_options)
    detector = build_detector(kind, backbone, num_classes=3, min_size=800, max_size=1333, head_channels=8,
                              fc_dim=32)
    generator = detector.anchor_generator if kind == "retinanet" else detector.rpn.anchor_generator
    seen: dict = {}
    generator.register_forward_hook(lambda module, args, out: seen.setdefault(module.training, out) and None)
    if kind == "fasterrcnn":
        detector.roi_heads.register_forward_pre_hook(lambda module, args: seen.setdefault("proposals", args[1]) and None)
    image = torch.rand(3, 240, 320, generator=torch.Generator().manual_seed(0))
    targets = [{"boxes": torch.tensor([[30.3, 40.7, 290.1, 230.9]]), "labels": torch.tensor([1])}]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = detector.train()([image], targets)
        with torch.no_grad():
            detector.eval()([image])
    assert all(math.isfinite(v.item()) for v in losses.values())
    trained, evaluated = seen[True][0], seen[False][0]
    assert trained.dtype == torch.float32 and torch.equal(trained, evaluated)
    if kind == "fasterrcnn":
        assert all(p.dtype == torch.float32 for p in seen["proposals"])


def test_retinanet_keeps_at_most_100_detections_per_image_as_coco_scores():
    """COCO's limit for results is 100 per image; COCOeval's maxDets=100 caps them per image and
    category, so torchvision's 300 would be scored: a detector confident everywhere keeps 100."""
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone("resnet18", "bn", network_options={"base_width": 8}, out_channels=32,
                                   trainable_layers=5, returned_layers=(2, 3, 4), extra_blocks="p6p7")
    model = build_detector("retinanet", backbone, num_classes=3, min_size=96, max_size=128, head_channels=32).eval()
    nn.init.constant_(model.head.classification_head.cls_logits.bias, 5.0)  # every anchor above score_thresh
    with torch.no_grad():
        scores = model([torch.rand(3, 96, 96, generator=torch.Generator().manual_seed(0))])[0]["scores"]
    assert len(scores) == 100 and bool((scores[:-1] >= scores[1:]).all())  # the 100 best
    wider = build_detector("retinanet", resnet_fpn_backbone("resnet18", "bn", network_options={"base_width": 8},
                                                            out_channels=32, returned_layers=(2, 3, 4),
                                                            extra_blocks="p6p7"),
                           num_classes=3, head_channels=32, detections_per_img=300)
    assert wider.detections_per_img == 300  # still the caller's to set
