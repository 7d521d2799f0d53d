"""Kinetics video classification with 3D ResNets under any residual scheme.

* :mod:`rescale_tasks.video.decoding`: :class:`VideoDecoder`, :class:`PyAVDecoder` (default,
  FFmpeg bundled in the ``av`` wheel), :class:`TorchCodecDecoder` (optional), :func:`make_decoder`.
* :mod:`rescale_tasks.video.sampling`: :func:`clip_indices` (SlowFast-style temporal sampling),
  the 8x8 / 16x4 / 32x2 presets and the short-video policies.
* :mod:`.layouts`, :mod:`.transforms`, :mod:`.dataset`, :mod:`.data`: class folders, CVDF CSVs and
  list files; SlowFast's spatial transforms and 10x3 views; bad videos skipped or repaired and
  counted by kind; :class:`~rescale_tasks.video.data.KineticsDataModule`.
* :mod:`.inflation`: a 2D ``rescale fit`` checkpoint inflated into a 3D network (I3D).
* :mod:`.prepare`: ``rescale prepare-video`` (re-encode to short side 256 and short GOPs).
* :mod:`.module`: :class:`~rescale_tasks.video.module.VideoClassificationModule` with the
  multi-view evaluation (``experiments/kinetics/``).
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
