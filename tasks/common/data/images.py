"""Any image Pillow opens, as the 8-bit RGB image the networks read, its tones kept.

``Image.convert("RGB")`` is right for the 8-bit modes but not for every mode Pillow opens:

- high bit depth (``I;16*`` from 16-bit PNG, TIFF and PGM files, ``I`` 32-bit integers, ``F``
  floats) is clipped at 255, so a 16-bit picture ends up black and white; here it is scaled to 8
  bits over its full range (:func:`full_scale`);
- transparency (``RGBA``, ``LA``, ``PA``, premultiplied ``RGBa``, or a ``P``/``L``/``RGB`` image
  with a transparent colour, and a 16-bit grey PNG with a transparent grey value) is dropped, and the
  colour stored under transparent pixels (often black, or anything) shows; here the image is composited
  over white, as a viewer shows it.

Every other mode (``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV`` ...) goes through
Pillow's own conversion.

An EXIF orientation (cameras and phones store the sensor's pixels and a tag saying how to turn
them, 2..8) is applied before anything else (:func:`open_rgb`, Pillow's ``ImageOps.exif_transpose``,
as every viewer does), so a portrait photo reaches the network upright; a file without the tag only
pays for reading its header. A caller whose annotations may refer to the stored pixels instead
(COCO records, :mod:`rescale_tasks.detection.coco`) decides per file (``orient``).

A file Pillow cannot decode raises one of :data:`DECODE_ERRORS`; the data sets of every task turn it
into :class:`CorruptImageError` (one line naming the file, :func:`unreadable_image`) or skip the file.
Pillow's guard against decompression bombs stays as Pillow sets it: an image over twice
``PIL.Image.MAX_IMAGE_PIXELS`` (about 179 million pixels) is refused, and that line says so rather
than "cannot decode"; one over the limit itself (about 89 million) is read, and said once per file
through logging (:func:`say_large_image`), not Pillow's ``DecompressionBombWarning``, which names no
file and shows once per process.
"""
from __future__ import annotations

import logging
import os
import re
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import ExifTags, Image, ImageOps

from ..errors import WorkerDataError

__all__ = ["HIGH_DEPTH_MODES", "DECODE_ERRORS", "IMAGE_DECODING", "CorruptImageError", "full_scale", "open_rgb",
           "orientation", "oriented_size", "say_large_image", "to_rgb", "unreadable_image"]

log = logging.getLogger(__name__)

#: modes holding more than 8 bits per sample
HIGH_DEPTH_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
_TIFF_BITS_PER_SAMPLE = 258
_WHITE = (255, 255, 255, 255)
#: what :func:`open_rgb` does to a file before the transforms, as ``rescale export``'s sidecar tells a runtime
#: (``preprocessing.decode``): a runtime that reads a phone photo or a transparent PNG otherwise feeds the
#: network other pixels than ``rescale predict`` does
IMAGE_DECODING = {"exif_orientation": "applied", "transparency": "composited over white",
                  "high_bit_depth": "scaled to 8 bits over the full range"}
#: what Pillow raises for a file it cannot decode: missing or unreadable (OSError), truncated or
#: malformed data, a decompression bomb
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, zlib.error, Image.DecompressionBombError)


#: Pillow's text for an image over its decompression-bomb limits: its pixels and the limit
_BOMB = re.compile(r"\((\d+) pixels\) exceeds limit of (\d+) pixels")


def unreadable_image(path: str | os.PathLike, exc: BaseException) -> tuple[str, str]:
    """Why the image file at ``path`` was not read (``exc``: one of :data:`DECODE_ERRORS`), for an
    error or a skip line, and what to do with the file: ``("Cannot decode image <path> (<error>)",
    "Replace or delete")``; for an image over Pillow's decompression-bomb limit, that limit (twice
    ``PIL.Image.MAX_IMAGE_PIXELS``, which the suite leaves as Pillow sets it: decoding such an image
    takes gigabytes in every loader worker) and ``"Downscale or delete"``."""
    if not isinstance(exc, Image.DecompressionBombError):
        return f"Cannot decode image {path} ({type(exc).__name__}: {exc})", "Replace or delete"
    found = _BOMB.search(str(exc))
    size = f"{int(found[1]):,} pixels, over the limit of {int(found[2]):,}" if found else str(exc)
    return (f"Image {path} is too large to decode ({size}: Pillow's guard against decompression bombs, twice "
            "PIL.Image.MAX_IMAGE_PIXELS)", "Downscale (the network reads it resized) or delete")


def say_large_image(path: str | os.PathLike, image: Image.Image, said: Any, index: int) -> None:
    """Log, once per file, that ``image`` (read from ``path``, the data set's sample ``index``) is over
    Pillow's decompression-bomb warning limit (``PIL.Image.MAX_IMAGE_PIXELS``, about 89 million
    pixels) and was read anyway. ``said``: a flag per sample, set here (a shared-memory tensor: once
    across the loader's worker processes)."""
    limit = Image.MAX_IMAGE_PIXELS
    if bool(said[index]) or not limit or image.size[0] * image.size[1] <= limit:
        return
    said[index] = True
    log.warning(f"warning: image {path} has {image.size[0] * image.size[1]:,} pixels, over Pillow's "
                f"decompression-bomb warning limit of {limit:,} (PIL.Image.MAX_IMAGE_PIXELS): read anyway, taking "
                "the memory such an image takes; twice the limit is refused")


def _quiet_bomb_warning() -> None:
    """Pillow's ``DecompressionBombWarning`` left out: :func:`say_large_image` says it through logging,
    naming the file. Set before each file is opened (filtering is cheap next to decoding): a filter
    set once would be dropped by the first ``warnings.catch_warnings`` block it was set inside."""
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


class CorruptImageError(WorkerDataError):
    """An image file that PIL cannot decode.

    Raised in a DataLoader worker, it still reaches the user as one line (:class:`WorkerDataError`).
    """


def full_scale(image: Image.Image, values: np.ndarray) -> float:
    """The value that stands for white in a high-bit-depth ``image`` holding ``values``.

    ``I;16*``: 65535. ``I``: ``2**bits - 1`` for the bits per sample a TIFF file states, else 65535
    (Pillow decodes 16-bit PNG and PGM files into ``I`` at that scale). ``F``: 1.0 when the values
    lie within [0, 1] (the usual float image), else 255 (Pillow's own float scale: ``convert("F")``
    of an 8-bit image keeps 0..255).
    """
    if image.mode == "F":
        return 1.0 if values.size == 0 or (values.min() >= 0 and values.max() <= 1) else 255.0
    if image.mode == "I":
        bits = getattr(image, "tag_v2", {}).get(_TIFF_BITS_PER_SAMPLE)
        bits = bits[0] if isinstance(bits, tuple) else bits
        return float(2 ** min(int(bits), 31) - 1) if bits else 65535.0
    return 65535.0


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` in mode ``RGB`` (8 bits per channel); see the module docstring."""
    if image.mode in HIGH_DEPTH_MODES:
        values = np.asarray(image).astype(np.float64)
        scaled = np.clip(np.rint(values * (255.0 / full_scale(image, values))), 0, 255)
        key = image.info.get("transparency")  # a 16-bit grey PNG's tRNS: the grey value that is transparent
        if isinstance(key, int):
            scaled[values == key] = 255
        return Image.fromarray(scaled.astype(np.uint8)).convert("RGB")
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
    return image.convert("RGB")


def orientation(image: Image.Image) -> int:
    """The EXIF orientation of ``image``: 2..8, or 1 when it has none (or a value outside 1..8)."""
    value = image.getexif().get(ExifTags.Base.Orientation, 1)
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def oriented_size(image: Image.Image) -> tuple[int, int]:
    """``(width, height)`` of ``image`` once its EXIF orientation is applied (5..8 turn it a quarter)."""
    width, height = image.size
    return (height, width) if orientation(image) >= 5 else (width, height)


def open_rgb(path: str | os.PathLike,
             orient: bool | Callable[[Image.Image], bool] = True) -> Image.Image:
    """The image file at ``path`` turned by its EXIF orientation, then decoded to 8-bit RGB
    (:func:`to_rgb`); Pillow's errors pass through.

    ``orient``: apply the orientation (True), keep the stored pixels (False), or ask a function of
    the opened file (its header read, its pixels as stored) whether to apply it. An image over
    Pillow's decompression-bomb warning limit is read without Pillow's warning (:func:`say_large_image`).
    """
    _quiet_bomb_warning()
    with Image.open(path) as image:
        if orientation(image) != 1 and (orient(image) if callable(orient) else orient):
            ImageOps.exif_transpose(image, in_place=True)
        return to_rgb(image)
