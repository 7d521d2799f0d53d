"""COCO detection and instance segmentation: torchvision's Mask R-CNN, Faster R-CNN and
RetinaNet around the suite's ResNets under any residual scheme.

* :mod:`.backbones`: FPN backbones (torchvision's ``BackboneWithFPN``) from ``rescale_core`` ResNets;
  FrozenBN, ``trainable_layers``, classification checkpoints.
* :mod:`.models`: the detectors, with torchvision's or Detectron2's GN heads.
* :mod:`.coco`, :mod:`.transforms`, :mod:`.data`: the COCO data set (pycocotools), transforms.v2 with
  tv_tensors, :class:`~.data.CocoDataModule` with aspect-ratio grouped, resumable, sharded batches.
* :mod:`.records`, :mod:`.evaluation`, :mod:`.results`: compact per-image detections; COCO AP by the
  real COCO evaluation, merged over ranks by image id; the COCO results json and drawn detections.
* :mod:`.measurement`: RescaleNet's mean-shift statistics over the valid pixels of padded batches.
* :mod:`.module`: :class:`~.module.DetectionModule` for the ``rescale`` CLI (``experiments/coco/``).
"""
from .backbones import convert_frozen_batchnorm, freeze_stages, load_backbone_checkpoint, resnet_fpn_backbone
from .models import build_detector

__all__ = ["resnet_fpn_backbone", "freeze_stages", "convert_frozen_batchnorm", "load_backbone_checkpoint",
           "build_detector"]
