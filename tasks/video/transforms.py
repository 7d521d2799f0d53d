"""Spatial transforms of uint8 video clips (torchvision ``transforms.v2`` on ``tv_tensors.Video``).

Input: a ``uint8`` ``Video`` ``(T, C, H, W)`` as the decoder's frames come (RGB). Output:
``float32`` ``(C, T, H, W)`` (the layout the core's 3D ResNets take as ``(N, C, T, H, W)``),
normalised with SlowFast's Kinetics statistics (mean 0.45, std 0.225 for every channel).

* Training (SlowFast ``random_short_side_scale_jitter`` + ``random_crop`` + ``horizontal_flip``):
  the short side is scaled to an integer drawn uniformly from ``train_short_side`` = [256, 320],
  then a random ``crop`` x ``crop`` window and a horizontal flip with probability 0.5. All random
  draws come from torch's CPU generator, which
  :class:`~rescale_tasks.common.data.PerSampleSeed` seeds per sample.
* Testing (SlowFast ``uniform_crop``): the short side is scaled to ``test_short_side`` (256), then
  ``num_crops`` windows of ``crop`` x ``crop``: 3 = the start, centre and end of the long side
  (left/centre/right for landscape frames, top/centre/bottom for portrait), centred on the short
  side; 1 = the centre. They come stacked ``(num_crops, C, T, H, W)``. Deviation: SlowFast's
  3-crop testing usually uses a crop as large as the short side (256); here the crop size is
  one setting, ``crop``, for training and testing alike.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from rescale_tasks.common.data import describe_transforms

__all__ = ["KINETICS_MEAN", "KINETICS_STD", "AsVideo", "MultiViewCrops", "ToCTHW", "crop_boxes", "eval_transform",
           "train_transform", "describe_eval_transform"]

KINETICS_MEAN = (0.45, 0.45, 0.45)
KINETICS_STD = (0.225, 0.225, 0.225)


class ToCTHW(v2.Transform):
    """``(T, C, H, W)`` -> a plain ``(C, T, H, W)`` tensor (contiguous, for the 3D convolutions)."""

    def forward(self, video: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return video.as_subclass(torch.Tensor).permute(1, 0, 2, 3).contiguous()


def _to_float(mean: Sequence[float], std: Sequence[float]) -> list:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]


class AsVideo(v2.Transform):
    """A ``(T, C, H, W)`` clip as a ``tv_tensors.Video`` (what the v2 transforms after it resize as one)."""

    def forward(self, clip: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return clip if isinstance(clip, tv_tensors.Video) else tv_tensors.Video(clip)


def train_transform(train_short_side: Sequence[int] = (256, 320), crop: int = 224,
                    mean: Sequence[float] = KINETICS_MEAN, std: Sequence[float] = KINETICS_STD) -> v2.Compose:
    """Random short-side scale in ``train_short_side`` (inclusive), random crop, flip, normalise."""
    low, high = int(train_short_side[0]), int(train_short_side[-1])
    if not 0 < low <= high:
        raise ValueError(f"train_short_side must be (low, high) with 0 < low <= high, got {tuple(train_short_side)}")
    return v2.Compose([
        AsVideo(),
        v2.RandomShortestSize(min_size=list(range(low, high + 1)), antialias=True),
        v2.RandomCrop(crop, pad_if_needed=True),  # pads only when a short side is below the crop
        v2.RandomHorizontalFlip(),
        *_to_float(mean, std),
        ToCTHW(),
    ])


def crop_boxes(height: int, width: int, crop: int, num_crops: int) -> list[tuple[int, int]]:
    """``(top, left)`` of each test crop: 1 = the centre; 3 = start, centre, end of the long side."""
    if num_crops not in (1, 3):
        raise ValueError(f"num_crops must be 1 or 3, got {num_crops}")
    top, left = max(height - crop, 0) // 2, max(width - crop, 0) // 2
    if num_crops == 1:
        return [(top, left)]
    if width >= height:  # landscape: slide along the width
        return [(top, x) for x in (0, left, max(width - crop, 0))]
    return [(y, left) for y in (0, top, max(height - crop, 0))]


class MultiViewCrops(v2.Transform):
    """``num_crops`` spatial crops of a ``(T, C, H, W)`` video (see :func:`crop_boxes`), normalised
    and stacked as ``(num_crops, C, T, crop, crop)``."""

    def __init__(self, crop: int, num_crops: int, mean: Sequence[float] = KINETICS_MEAN,
                 std: Sequence[float] = KINETICS_STD) -> None:
        super().__init__()
        crop_boxes(crop, crop, crop, num_crops)  # checks num_crops
        self.crop, self.num_crops = int(crop), int(num_crops)
        self.finish = v2.Compose([*_to_float(mean, std), ToCTHW()])

    def forward(self, video: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        height, width = video.shape[-2:]
        if min(height, width) < self.crop:  # tiny inputs: pad like the training crop does
            video = F.center_crop(video, [max(height, self.crop), max(width, self.crop)])
            height, width = video.shape[-2:]
        views = [self.finish(F.crop(video, top, left, self.crop, self.crop))
                 for top, left in crop_boxes(height, width, self.crop, self.num_crops)]
        return torch.stack(views)


def eval_transform(test_short_side: int = 256, crop: int = 224, num_crops: int = 3,
                   mean: Sequence[float] = KINETICS_MEAN, std: Sequence[float] = KINETICS_STD) -> v2.Compose:
    """Short side to ``test_short_side``, then :class:`MultiViewCrops` -> ``(num_crops, C, T, crop, crop)``."""
    return v2.Compose([
        AsVideo(),
        v2.Resize(int(test_short_side), antialias=True),
        MultiViewCrops(crop, num_crops, mean, std),
    ])


def describe_eval_transform(transform: v2.Compose) -> dict:
    """What an :func:`eval_transform` does, read off its transforms for ``rescale export``'s sidecar
    (:func:`~rescale_tasks.common.data.describe_transforms`): ``pixel_scale``, ``resize``, ``mean`` and
    ``std``, and of its :class:`MultiViewCrops` the crop's side (``center_crop``) and ``crops``."""
    views = [t for t in transform.transforms if isinstance(t, MultiViewCrops)]
    if len(views) != 1:
        raise TypeError(f"an evaluation transform of clips with {len(views)} MultiViewCrops, not one")
    others = [t for t in transform.transforms if t is not views[0]]
    described = describe_transforms([*others, views[0].finish], layout_only=(AsVideo, ToCTHW))
    return {**described, "center_crop": views[0].crop, "crops": views[0].num_crops}
