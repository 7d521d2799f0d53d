"""Temporal clip sampling: T frames at stride tau, as in SlowFast, with a documented short-video policy.

SlowFast (``slowfast/datasets/decoder.py``: ``get_start_end_idx``, ``temporal_sampling``; used by
``kinetics.py``) does this:

* the clip covers ``clip_size = T * tau`` frames at the target fps (``DATA.TARGET_FPS`` 30: ``T * tau
  * fps / 30`` of the video's own frames); ``delta = max(num_frames - clip_size, 0)``;
* training (``clip_idx == -1``): ``start = random.uniform(0, delta)``;
* testing, clip ``i`` of ``K``: ``start = delta * i / K`` (or, with ``USE_OFFSET_SAMPLING``,
  ``i * floor(delta / (K - 1))`` so the clips span the whole video);
* the T indices are ``linspace(start, start + clip_size - 1, T)`` truncated to int and clamped to
  ``[0, num_frames - 1]`` -- so a video shorter than the clip silently repeats its last frame,
  and a failed decode is retried on another (random, in training) video by ``kinetics.py``.

Ours, and where it deviates:

* The indices are exactly ``start + k * tau`` (k < T): the stride is tau, not
  ``(T * tau - 1) / (T - 1)`` as SlowFast's linspace gives. The clip then needs
  ``span = (T - 1) * tau + 1`` frames, and a video is *short* when it has fewer.
* tau counts the video's own decoded frames, whatever its frame rate: there is no resampling to
  a target fps, so a clip of a 25 fps video spans 6/5 of the time SlowFast's does (the same
  time for 30 fps videos, most of Kinetics). ``rescale prepare-video`` keeps the source rate.
* Training starts are integers drawn uniformly from ``[0, num_frames - span]`` with the given
  generator (reproducible with a seed; SlowFast uses the global ``random`` module).
* Test clip ``i`` of ``K`` starts at ``round(i * delta / (K - 1))`` (the centre for ``K == 1``):
  the first clip starts at frame 0 and the last ends at the last frame, like SlowFast's offset
  sampling but rounded rather than floored, so the spacing does not drift short of the end.
* Short videos follow an explicit policy (``short=``) instead of an implicit clamp:
  ``"loop"`` wraps around (indices modulo ``num_frames``; test clips start at uniformly spaced
  frames around the loop), ``"repeat_last"`` starts at 0 and pads with the last frame (SlowFast's
  behaviour), ``"skip"`` raises :class:`ShortVideo` for the dataset to count and skip.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

from rescale_tasks.common.errors import ConfigError
from rescale_tasks.video.decoding import VideoDataError

__all__ = ["PRESETS", "SHORT_POLICIES", "ShortVideo", "clip_indices", "preset"]

#: SlowFast model-zoo sampling names ``TxTAU`` -> (frames per clip, stride).
PRESETS: dict[str, tuple[int, int]] = {"8x8": (8, 8), "16x4": (16, 4), "32x2": (32, 2)}
SHORT_POLICIES = ("loop", "repeat_last", "skip")
MODES = ("train", "test")


class ShortVideo(VideoDataError):
    """A video with fewer frames than one clip spans, under the ``"skip"`` policy (kind ``"short"``)."""

    def __init__(self, num_frames: int, needed: int, path: str = "<video>") -> None:
        self.num_frames = int(num_frames)
        self.needed = int(needed)
        super().__init__(path, "short", f"{num_frames} frames, a clip needs {needed}")


def preset(name: str) -> tuple[int, int]:
    """``(T, tau)`` for ``"8x8"``, ``"16x4"`` or ``"32x2"``."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown clip sampling {name!r}; choose one of {', '.join(PRESETS)}") from None


def clip_indices(
    num_frames: int,
    T: int,
    tau: int,
    mode: str = "train",
    clip_idx: Optional[int] = None,
    num_clips: int = 10,
    rng: Union[np.random.Generator, int, None] = None,
    short: str = "loop",
) -> list[int]:
    """The ``T`` frame indices of one clip at stride ``tau`` in a video of ``num_frames`` frames.

    ``mode="train"``: a random temporal position drawn from ``rng`` (a ``numpy`` Generator, a
    seed, or None for fresh entropy). ``mode="test"``: clip ``clip_idx`` of ``num_clips`` uniformly
    spaced clips. ``short``: what to do when the video has fewer than ``(T - 1) * tau + 1``
    frames (``"loop"``, ``"repeat_last"``, ``"skip"``, see the module docstring); ``"skip"``
    raises :class:`ShortVideo`, as does any policy for a video with no frames.
    """
    if T < 1 or tau < 1:
        raise ValueError(f"T and tau must be >= 1, got T={T}, tau={tau}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if short not in SHORT_POLICIES:
        raise ValueError(f"short must be one of {SHORT_POLICIES}, got {short!r}")
    if mode == "test":
        if num_clips < 1:
            raise ValueError(f"num_clips must be >= 1, got {num_clips}")
        if clip_idx is None or not 0 <= clip_idx < num_clips:
            raise ValueError(f"test mode needs clip_idx in [0, {num_clips}), got {clip_idx}")
    span = (T - 1) * tau + 1
    offsets = np.arange(T) * tau
    if num_frames >= span:
        delta = num_frames - span
        start = _start(delta + 1, mode, clip_idx, num_clips, rng, inclusive_end=True)
        return [int(i) for i in start + offsets]
    if num_frames <= 0 or short == "skip":
        raise ShortVideo(num_frames, span)
    if short == "repeat_last":
        # SlowFast's clamp: every clip is the whole video, padded with its last frame.
        return [int(i) for i in np.minimum(offsets, num_frames - 1)]
    # loop: any start on the circle is a full clip; test clips are spread uniformly around it.
    start = _start(num_frames, mode, clip_idx, num_clips, rng, inclusive_end=False)
    return [int(i) for i in (start + offsets) % num_frames]


def _start(positions: int, mode: str, clip_idx: Optional[int], num_clips: int, rng, inclusive_end: bool) -> int:
    """A start among ``positions`` candidates (0 .. positions-1). ``inclusive_end``: the test
    clips reach the last candidate (a line); otherwise they split a circle into equal arcs."""
    if mode == "train":
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        return int(gen.integers(0, positions))
    if inclusive_end:
        if num_clips == 1:
            return (positions - 1) // 2
        return int(round(clip_idx * (positions - 1) / (num_clips - 1)))
    return int(clip_idx * positions // num_clips)
