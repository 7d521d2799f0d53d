"""Video task foundation (issue #11): decoding behind one small interface, and clip sampling.

* :mod:`rescale_tasks.video.decoding`: :class:`VideoDecoder`, :class:`PyAVDecoder` (default,
  FFmpeg bundled in the ``av`` wheel), :class:`TorchCodecDecoder` (optional), :func:`make_decoder`.
* :mod:`rescale_tasks.video.sampling`: :func:`clip_indices` (SlowFast-style temporal sampling),
  the 8x8 / 16x4 / 32x2 presets and the short-video policies.
"""
from __future__ import annotations

from rescale_tasks.video.decoding import (
    BackendUnavailable,
    PyAVDecoder,
    TorchCodecDecoder,
    VideoDataError,
    VideoDecoder,
    make_decoder,
)
from rescale_tasks.video.sampling import PRESETS, SHORT_POLICIES, ShortVideo, clip_indices, preset

__all__ = [
    "BackendUnavailable", "PRESETS", "PyAVDecoder", "SHORT_POLICIES", "ShortVideo", "TorchCodecDecoder",
    "VideoDataError", "VideoDecoder", "clip_indices", "make_decoder", "preset",
]
