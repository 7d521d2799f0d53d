"""FPN backbones from the suite's ResNets: torchvision's ``BackboneWithFPN`` around a
``rescale_core`` network (``create_network``), under any scheme (bn, gn, rescale, fixup, skipinit, none).

References: torchvision ``models.detection.backbone_utils`` (``BackboneWithFPN``,
``_resnet_fpn_extractor``, ``trainable_layers``); Lin et al. 2017 (FPN); Detectron2's R50-FPN
recipes (FrozenBN from an ImageNet checkpoint; GN in the FPN for the GN baseline, Wu & He 2018).

What differs from ``torchvision.models.detection.backbone_utils.resnet_fpn_backbone``:

* ``_resnet_fpn_extractor`` is not used: it reads ``inplanes`` for the channel widths and freezes
  parameters by name prefix. The widths come from the model's ``out_channels_per_stage`` and
  freezing goes by module (:func:`freeze_stages`).
* The features: ``IntermediateLayerGetter`` calls the model's direct children one by one (stem
  modules, then ``layer1..4``) and never calls ``ResNet.forward``. That is the model's own function:
  every block's ``forward`` applies its own skip multiplier (RescaleNet's ``alpha``), and the stem's
  mean-shift/scalar bias runs as a module, so the FPN sees the stage outputs ``forward`` computes
  on either path (the fast path only carries the multipliers across blocks and folds the stem
  bias; equal up to rounding, tested in ``tests/tasks/detection``). The head after ``layer4``
  (``pool_shift``, pooling, classifier) is dropped by ``IntermediateLayerGetter``.
* BatchNorm: trainable ``BatchNorm2d`` from scratch, ``FrozenBatchNorm2d`` when starting from a
  checkpoint (``frozen_bn`` overrides), instead of torchvision's ``norm_layer`` argument.
"""
from __future__ import annotations

import itertools
from functools import partial
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool, LastLevelP6P7
from torchvision.ops.misc import FrozenBatchNorm2d

from rescale_tasks.common.checkpoints import network_weights, safe_load, state_dict_differences
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.training import create_network

__all__ = ["resnet_fpn_backbone", "freeze_stages", "convert_frozen_batchnorm", "load_backbone_checkpoint",
           "STEM_MODULES", "FPN_NORMS", "EXTRA_BLOCKS", "GN"]

#: The stem's modules, in forward order (torchvision's names, as ``rescale_core``'s ResNet).
STEM_MODULES = ("conv1", "bn1", "relu", "maxpool")
FPN_NORMS = (None, "gn")
EXTRA_BLOCKS = ("maxpool", "p6p7")


#: Detectron2's GN: 32 groups (``GroupNorm(32, C)``).
GN = partial(nn.GroupNorm, 32)


def resnet_fpn_backbone(network: str, scheme: str | None = None, scheme_options: dict | None = None,
                        network_options: dict | None = None, trainable_layers: int | None = None,
                        fpn_norm: str | None = None, out_channels: int = 256,
                        returned_layers: Sequence[int] = (1, 2, 3, 4), frozen_bn: bool | None = None,
                        checkpoint: str | None = None, extra_blocks: str = "maxpool",
                        in_channels: int = 3) -> BackboneWithFPN:
    """A ``BackboneWithFPN`` around ``create_network(network, scheme=...)`` without its classifier.

    Args:
        network: a registered 2D ResNet/ResNeXt name (``resnet50``, ``rescale50``, ``resnext50_32x4d`` ...).
        scheme: the residual scheme (None: the network's own, ``bn`` for plain names).
        scheme_options, network_options: as for ``rescale_core.create_model`` (e.g. ``{"base_width": 8}``).
        trainable_layers: torchvision's convention, 0..5 trainable from the top: ``layer4``,
            ``layer3``, ``layer2``, ``layer1``, then the stem. None: 3 from a ``checkpoint`` (Detectron2
            / torchvision from ImageNet weights), 5 from scratch (torchvision forces 5 without weights:
            frozen random weights would never train).
        fpn_norm: None or ``"gn"`` (``GroupNorm(32, C)`` in the FPN's lateral and output convs).
        out_channels: FPN width.
        returned_layers: stages (1..4) fed to the FPN; feature names ``"0"``, ``"1"``, ... in order.
        frozen_bn: BatchNorm2d -> ``FrozenBatchNorm2d`` (None: True with a ``checkpoint``, else False).
        checkpoint: a ``rescale fit`` checkpoint to initialise the network from (:func:`load_backbone_checkpoint`).
        extra_blocks: ``"maxpool"`` (Mask/Faster R-CNN: P6 by max-pooling P5) or ``"p6p7"``
            (RetinaNet: P6, P7 by strided convs on P5, torchvision's ``LastLevelP6P7(C, C)``).
        in_channels: image channels.
    """
    if trainable_layers is None:
        trainable_layers = 3 if checkpoint is not None else 5
    if not 0 <= int(trainable_layers) <= 5:
        raise ConfigError(f"trainable_layers must be between 0 and 5, got {trainable_layers}")
    if fpn_norm not in FPN_NORMS:
        raise ConfigError(f"fpn_norm must be one of {FPN_NORMS}, got {fpn_norm!r}")
    if extra_blocks not in EXTRA_BLOCKS:
        raise ConfigError(f"extra_blocks must be one of {EXTRA_BLOCKS}, got {extra_blocks!r}")
    returned_layers = [int(i) for i in returned_layers]
    if not returned_layers or sorted(set(returned_layers)) != returned_layers or \
            not all(1 <= i <= 4 for i in returned_layers):
        raise ConfigError(f"returned_layers must be increasing stage numbers in 1..4, got {returned_layers}")

    kwargs: dict[str, Any] = dict(network_options or {})
    if scheme is not None:
        kwargs["scheme"] = scheme
    if scheme_options:
        kwargs["scheme_options"] = scheme_options
    body = create_network(network, num_classes=0, in_channels=in_channels, **kwargs)
    names = list(getattr(body, "stage_names", ()))
    config = getattr(body, "config", None)
    if len(names) != 4 or getattr(config, "spatial_dims", 2) != 2 or \
            [n for n, _ in body.named_children()][:4] != list(STEM_MODULES):
        raise ConfigError(f"network {network!r} is not a 2D ImageNet-style ResNet with a stem and "
                          f"layer1..layer4; detection needs one (e.g. resnet50, rescale50, resnext50_32x4d)")

    if checkpoint is not None:
        load_backbone_checkpoint(body, checkpoint)
    if frozen_bn is None:
        frozen_bn = checkpoint is not None
    if frozen_bn:
        convert_frozen_batchnorm(body)
    freeze_stages(body, trainable_layers)

    widths = body.out_channels_per_stage
    return_layers = {f"layer{i}": str(k) for k, i in enumerate(returned_layers)}
    in_channels_list = [widths[i - 1] for i in returned_layers]
    extra = LastLevelMaxPool() if extra_blocks == "maxpool" else LastLevelP6P7(out_channels, out_channels)
    backbone = BackboneWithFPN(body, return_layers, in_channels_list, out_channels, extra_blocks=extra,
                               norm_layer=GN if fpn_norm == "gn" else None)
    backbone.scheme = body.scheme  # IntermediateLayerGetter keeps the modules, not the attributes
    return backbone


def freeze_stages(model: nn.Module, trainable_layers: int) -> list[str]:
    """``requires_grad=False`` on every parameter of the stages that are not trainable, by module:
    ``layer4``, ``layer3``, ``layer2``, ``layer1``, stem (``conv1``, ``bn1``) stay trainable in that
    order (torchvision's ``trainable_layers``). Buffers are untouched: a mean-shift layer in a frozen
    stage still measures its ``mu0`` on the first training batches when it has not finished.
    Returns the names of the frozen modules."""
    order = ["layer4", "layer3", "layer2", "layer1", "stem"]
    trainable = set(order[:trainable_layers])
    frozen = []
    for name in ("layer1", "layer2", "layer3", "layer4", "stem"):
        if name in trainable:
            continue
        modules = [getattr(model, n) for n in STEM_MODULES] if name == "stem" else [getattr(model, name)]
        for module in modules:
            for p in module.parameters():
                p.requires_grad_(False)
        frozen.append(name)
    return frozen


def convert_frozen_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every ``BatchNorm2d`` below ``module`` by torchvision's ``FrozenBatchNorm2d`` with the
    same statistics and affine parameters (in place; returns ``module``)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            device = next(itertools.chain(child.parameters(), child.buffers()), torch.empty(0)).device
            frozen = FrozenBatchNorm2d(child.num_features, eps=child.eps).to(device)
            with torch.no_grad():
                if child.affine:
                    frozen.weight.copy_(child.weight)
                    frozen.bias.copy_(child.bias)
                if child.track_running_stats and child.running_mean is not None:
                    frozen.running_mean.copy_(child.running_mean)
                    frozen.running_var.copy_(child.running_var)
            setattr(module, name, frozen)
        else:
            convert_frozen_batchnorm(child)
    return module


def load_backbone_checkpoint(model: nn.Module, path: str) -> nn.Module:
    """Load a classification checkpoint written by ``rescale fit`` (Lightning: ``state_dict`` with
    keys ``net.*``) into ``model`` (built with ``num_classes=0``), strictly except the classifier
    ``fc.*``. Buffers come along: RescaleNet's measured ``mu0``/``count`` (a finished measurement
    stays finished) and the learned gains and biases. A mismatch raises one-line ``ConfigError``."""
    path = str(path)
    saved = network_weights(safe_load(path), f"checkpoint {path}", "model.backbone_checkpoint")
    saved = {k: v for k, v in saved.items() if not k.startswith("fc.")}
    current = {k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}
    problems = state_dict_differences(saved, current, strict=True, limit=2)
    if problems:
        scheme = getattr(getattr(model, "scheme", None), "name", "?")
        raise ConfigError(f"checkpoint {path} does not fit this backbone (scheme {scheme}): "
                          f"{'; '.join(problems)}. Build the backbone with the network, scheme and "
                          "network_options the checkpoint was trained with")
    model.load_state_dict(saved, strict=True)
    return model
