"""Padding-aware mean-shift measurement: ``MeanShiftBias.measure_mask`` on its own, and through a
real (tiny) RescaleNet Faster R-CNN whose batch pads two images of different sizes."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from rescale_core.layers import MeanShiftBias
from rescale_tasks.detection.backbones import resnet_fpn_backbone
from rescale_tasks.detection.measurement import install_padding_aware_measurement, padding_mask
from rescale_tasks.detection.models import build_detector


def _measured(layer: MeanShiftBias, x: torch.Tensor, mask=None) -> torch.Tensor:
    layer.measure_mask = mask
    layer.train()
    layer(x)
    layer.measure_mask = None
    return layer.mu0.flatten().clone()


def test_mask_none_or_all_ones_measures_the_plain_mean_and_zeros_are_left_out():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 8) + torch.arange(4.0).view(1, 4, 1, 1)
    plain = x.mean((0, 2, 3))
    torch.testing.assert_close(_measured(MeanShiftBias(4), x), plain, rtol=0, atol=0)
    torch.testing.assert_close(_measured(MeanShiftBias(4), x, torch.ones(2, 1, 6, 8, dtype=torch.bool)), plain)
    # image 0 valid on its top-left 4x5, image 1 on 6x3; the mask given at twice the resolution
    mask = padding_mask([(4, 5), (6, 3)], (2, 3, 6, 8))
    fine = padding_mask([(8, 10), (12, 6)], (2, 3, 12, 16))
    expected = (x[0, :, :4, :5].sum((1, 2)) + x[1, :, :6, :3].sum((1, 2))) / (20 + 18)
    torch.testing.assert_close(_measured(MeanShiftBias(4), x, mask), expected)
    torch.testing.assert_close(_measured(MeanShiftBias(4), x, fine), expected)
    # an odd size at a coarser layer: ceil(h / s) rows, as a stride-s convolution keeps
    coarse = x[:, :, :3, :4]
    expected = (coarse[0, :, :2, :3].sum((1, 2)) + coarse[1, :, :3, :2].sum((1, 2))) / (6 + 6)
    torch.testing.assert_close(_measured(MeanShiftBias(4), coarse, mask), expected)
    with pytest.raises(ValueError, match="measure_mask"):
        _measured(MeanShiftBias(4), x, mask[:1])


def test_the_mask_is_ignored_outside_measuring_and_forward_is_unchanged():
    x = torch.randn(2, 4, 6, 8)
    layer = MeanShiftBias(4, measure_batches=1)
    layer.measure_mask = torch.zeros(1, 1, 1, 1)  # would not even fit: never read
    with torch.no_grad():
        layer(x)
    assert layer.count.item() == 0
    layer.measure_mask = None
    layer.train()(x)
    layer.measure_mask = torch.zeros(1, 1, 1, 1)
    torch.testing.assert_close(layer(x), x + layer.bias - layer.mu0)  # finished: the mask is never read


# ------------------------------------------------------------------ through a detector
def _detector() -> nn.Module:
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone("resnet18", "rescale", network_options={"base_width": 8}, out_channels=8)
    return build_detector("fasterrcnn", backbone, num_classes=3, min_size=48, max_size=96, fc_dim=16,
                          rpn_batch_size_per_image=16, box_batch_size_per_image=16,
                          rpn_pre_nms_top_n_train=50, rpn_post_nms_top_n_train=20)


def _batch():
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 48, 60, generator=g), torch.rand(3, 80, 64, generator=g)]
    targets = [{"boxes": torch.tensor([[5.0, 5, 30, 40]]), "labels": torch.tensor([1])},
               {"boxes": torch.tensor([[10.0, 20, 50, 70]]), "labels": torch.tensor([2])}]
    return images, targets


def test_padding_aware_measurement_matches_the_unpadded_images():
    detector = _detector()
    plain = copy.deepcopy(detector)  # measures without the hooks
    probe = copy.deepcopy(detector)  # with the hooks, and every mean shift's input recorded
    body = detector.backbone.body
    images, targets = _batch()
    with torch.no_grad():  # the transform's own output: resized, normalised, padded
        image_list, _ = detector.transform(images, copy.deepcopy(targets))
    sizes, padded = image_list.image_sizes, image_list.tensors
    assert len(set(sizes)) == 2 and all(s != tuple(padded.shape[2:]) for s in sizes)  # both are padded

    inputs = {}
    for name, m in probe.backbone.body.named_modules():
        if isinstance(m, MeanShiftBias):  # a hook below a block also sends it down the reference path
            m.register_forward_pre_hook(lambda m, args, name=name: inputs.__setitem__(name, args[0].detach().clone()))
    handles = install_padding_aware_measurement(detector)
    assert len(handles) == 3 and len(install_padding_aware_measurement(probe)) == 3
    for model in (detector, plain, probe):
        model.train()
        model(images, copy.deepcopy(targets))
    layers = {n: m for n, m in body.named_modules() if isinstance(m, MeanShiftBias)}
    assert len(layers) > 10 and set(inputs) == set(layers)
    assert all(m.count.item() == 1 and m.measure_mask is None for m in layers.values())

    # the stem: the mean of conv1 over each image run alone, unpadded (exact: the padding is zeros
    # after normalization, as conv1's own zero padding)
    with torch.no_grad():
        outs = [body.conv1(padded[i:i + 1, :, :h, :w]) for i, (h, w) in enumerate(sizes)]
    reference = sum(o.sum((0, 2, 3)) for o in outs) / sum(o.shape[2] * o.shape[3] for o in outs)
    torch.testing.assert_close(body.bn1.mu0.flatten(), reference, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(plain.backbone.body.bn1.mu0.flatten(), reference, rtol=1e-3, atol=1e-4)

    # every layer (the stem's, and the blocks' on the reference path): the mean of its input over the
    # positions on image pixels, ceil(h / s) x ceil(w / s) at stride s; the fast path measures the same
    probe_layers = dict((n, m) for n, m in probe.backbone.body.named_modules() if isinstance(m, MeanShiftBias))
    for name, x in inputs.items():
        stride = padded.shape[-1] // x.shape[-1]
        valid = [(math.ceil(h / stride), math.ceil(w / stride)) for h, w in sizes]
        expected = sum(x[i, :, :h, :w].sum((1, 2)) for i, (h, w) in enumerate(valid)) / sum(h * w for h, w in valid)
        torch.testing.assert_close(probe_layers[name].mu0.flatten(), expected, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(layers[name].mu0.flatten(), expected, rtol=1e-4, atol=1e-5, msg=name)
        if any((h, w) != tuple(x.shape[2:]) for h, w in valid):  # padding left at this resolution
            assert not torch.allclose(x.mean((0, 2, 3)), expected, rtol=1e-3, atol=1e-4), name

    for handle in handles:
        handle.remove()
    detector.eval()
    with torch.no_grad():
        detector(images)  # evaluation never measures
    assert body.bn1.count.item() == 1
