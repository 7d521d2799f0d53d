"""What an evaluation transform does to an image or a video, read off its torchvision ``v2``
transform objects, for the ``preprocessing`` of ``rescale export``'s sidecar: the description a
runtime follows is the transform the data module evaluates with, so the two cannot drift apart.

:func:`describe_transforms` reads ``ToDtype`` (``pixel_scale``), ``Resize`` (``resize``),
``CenterCrop`` (``center_crop``) and ``Normalize`` (``mean``, ``std``), in ``Compose`` at any
depth; the transforms that change only a tensor's type or layout are passed over; any other
transform (and a ``Resize`` without a ``size``, which bounds the longer side alone) is a ``TypeError``
naming it (a step the sidecar would leave out, caught by the tests of every data family rather than
by a runtime computing other inputs).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torchvision.transforms import v2

__all__ = ["LAYOUT_ONLY", "describe_transforms"]

#: transforms that change a tensor's type or layout only, nothing of its values
LAYOUT_ONLY: tuple[type, ...] = (v2.ToImage, v2.ToPureTensor)


def describe_transforms(transforms: Iterable[Any], layout_only: tuple[type, ...] = ()) -> dict[str, Any]:
    """``pixel_scale`` (what uint8 pixel values are multiplied by: ``1/255``, else None),
    ``resize`` (``size``, ``to`` the ``shorter side`` or an ``exact`` ``[height, width]``,
    ``interpolation``, ``antialias``, and ``max_size`` where set; None), ``center_crop`` (a square's
    side, or ``[height, width]``; None), ``mean`` and ``std`` (None) of ``transforms``; each at most
    once. ``layout_only``: further transform types to pass over (:data:`LAYOUT_ONLY` always are)."""
    found: dict[str, Any] = {"pixel_scale": None, "resize": None, "center_crop": None, "mean": None, "std": None}
    for t in _flat(transforms):
        if isinstance(t, (*LAYOUT_ONLY, *layout_only)):
            continue
        if isinstance(t, v2.ToDtype) and t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            _set(found, t, pixel_scale=1 / 255 if t.scale else 1.0)
        elif isinstance(t, v2.Resize) and t.size is None:  # the longer side to max_size
            raise _undescribed(f"{type(t).__name__}(size=None, max_size={t.max_size})",
                               "Resize with a size: the shorter side or [height, width]")
        elif isinstance(t, v2.Resize):
            size = list(t.size)
            resize = {"size": size[0] if len(size) == 1 else size, "to": "shorter side" if len(size) == 1 else "exact",
                      "interpolation": str(getattr(t.interpolation, "value", t.interpolation)),
                      "antialias": bool(t.antialias)}
            _set(found, t, resize={**resize, **({"max_size": t.max_size} if t.max_size is not None else {})})
        elif isinstance(t, v2.CenterCrop):
            height, width = t.size
            _set(found, t, center_crop=height if height == width else [height, width])
        elif isinstance(t, v2.Normalize):
            _set(found, t, mean=[float(m) for m in t.mean], std=[float(s) for s in t.std])
        else:
            raise _undescribed(type(t).__name__, "ToDtype, Resize, CenterCrop, Normalize")
    return found


def _undescribed(step: str, reads: str) -> TypeError:
    """The one-line refusal of an evaluation step the sidecar cannot describe, by name."""
    return TypeError(f"{step} in an evaluation transform: the export's preprocessing does not describe it "
                     f"(describe_transforms reads {reads})")


def _flat(transforms: Iterable[Any]) -> Iterable[Any]:
    for t in transforms:
        if isinstance(t, v2.Compose):
            yield from _flat(t.transforms)
        else:
            yield t


def _set(found: dict[str, Any], transform: Any, **values: Any) -> None:
    for key, value in values.items():
        if found[key] is not None:
            raise TypeError(f"{type(transform).__name__}: a second {key} in an evaluation transform, which the "
                            "export's preprocessing describes once")
        found[key] = value
