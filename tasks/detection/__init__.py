"""Detection and instance segmentation (issue #10): torchvision's Mask R-CNN, Faster R-CNN and
RetinaNet around the suite's ResNets under any residual scheme."""
from .backbones import resnet_fpn_backbone, freeze_stages, convert_frozen_batchnorm, load_backbone_checkpoint
from .models import build_detector

__all__ = ["resnet_fpn_backbone", "freeze_stages", "convert_frozen_batchnorm", "load_backbone_checkpoint",
           "build_detector"]
