"""RescaleNet's mean-shift measurement on padded detection batches.

RescaleNet (Shao et al., NeurIPS 2020, Sec. 4.4) sets every mean-shift bias ``mu0`` to the
per-channel mean of the layer's input over the first training batches
(:class:`rescale_core.layers.MeanShiftBias`). A detector's ``GeneralizedRCNNTransform``
(torchvision) normalises the images of a batch, then pads them with zeros to a common size, a
multiple of 32 (``ImageList.tensors``; the real sizes are ``ImageList.image_sizes``). The padded
positions are not image content: a plain mean counts them, and ``mu0`` then depends on how the
sizes in a batch happened to differ.

:func:`install_padding_aware_measurement` measures over the valid positions only. A forward hook
on ``detector.transform`` records the image sizes and the padded tensor's shape; a forward
pre-hook on ``detector.backbone.body`` sets ``measure_mask`` (N, 1, H, W; True on each image's
``h x w`` top-left region) on every ``MeanShiftBias`` of the body while any of them still measures
in a training forward, and a forward hook (run on errors too) clears it. Each layer resizes the
mask to its own resolution by nearest interpolation: at stride ``s`` an image of ``h`` rows keeps
``ceil(h / s)`` rows, the size its own unpadded feature map has (the padded size is a multiple of
32, so every stride of the ResNet divides it).

What is measured: per channel, the mean of the layer's input over the positions of the batch that
lie on real image pixels (all images pooled, each position weighted once). For the stem (the
mean shift right after ``conv1``) this is exactly the mean an unpadded run of each image gives,
since the padding is zeros after normalization, as a convolution's own zero padding. Deeper
layers see the padded batch's features: positions within a receptive field of an image's right
or bottom edge read activations computed on the padding (not zeros after the stem's shift and
ReLU), as the detector itself does at training and test time; only their weight in ``mu0`` is
corrected, not their value. A batch of equally sized images whose size is a multiple of 32 has no
padding and measures as before. Under DDP every rank's masked mean is averaged with equal weight,
as the unmasked measurement averages the ranks' batch means.

Outside measuring the hooks cost a few Python attribute reads per step and nothing on the device.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from rescale_core.layers import MeanShiftBias

__all__ = ["install_padding_aware_measurement", "padding_mask"]


def padding_mask(image_sizes: list[tuple[int, int]], shape: torch.Size | tuple[int, ...],
                 device: torch.device | str | None = None) -> torch.Tensor:
    """An (N, 1, H, W) bool mask, True on the top-left ``h x w`` of each image of a padded batch of
    ``shape`` (N, C, H, W) (torchvision's ``ImageList``: ``image_sizes`` are (h, w))."""
    n, _, height, width = shape
    mask = torch.zeros((n, 1, height, width), dtype=torch.bool, device=device)
    for i, (h, w) in enumerate(image_sizes):
        mask[i, :, :h, :w] = True
    return mask


def install_padding_aware_measurement(detector: nn.Module) -> list[RemovableHandle]:
    """Make the mean-shift layers of ``detector.backbone.body`` measure over real pixels only (see
    the module docstring). ``detector``: a torchvision detector (``MaskRCNN``, ``FasterRCNN``,
    ``RetinaNet``) with a ``transform`` and a ``backbone.body``. Returns the hook handles
    (``handle.remove()`` undoes it); an empty list when the body has no mean-shift layer."""
    body = detector.backbone.body
    layers = tuple(m for m in body.modules() if isinstance(m, MeanShiftBias))
    if not layers:
        return []
    batch: dict = {}

    def record_batch(module, args, output) -> None:
        images = output[0]  # (ImageList, targets)
        batch["sizes"] = [(int(h), int(w)) for h, w in images.image_sizes]
        batch["shape"] = tuple(images.tensors.shape)

    def set_mask(module, args) -> None:
        sizes, shape = batch.pop("sizes", None), batch.pop("shape", None)
        if not any(m.updating for m in layers):  # host flags only: no device work once measured
            return
        x = args[0]
        if sizes is None or tuple(x.shape) != shape:  # the body called on something else
            return
        if all((h, w) == tuple(shape[2:]) for h, w in sizes):  # no padding: the plain mean is it
            return
        mask = padding_mask(sizes, shape, device=x.device)
        for m in layers:
            m.measure_mask = mask

    def clear_mask(module, args, output) -> None:
        for m in layers:
            m.measure_mask = None

    return [detector.transform.register_forward_hook(record_batch),
            body.register_forward_pre_hook(set_mask),
            body.register_forward_hook(clear_mask, always_call=True)]
