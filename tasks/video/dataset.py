"""Clips of labelled videos for training and multi-view evaluation, robust to bad files.

:class:`VideoClipDataset` decodes in ``__getitem__`` (so in the DataLoader worker, never in the
parent: an FFmpeg context does not survive a fork, see ``docs/design.md``, "Video decoding"),
picks frames with :func:`~rescale_tasks.video.sampling.clip_indices` and transforms them
(:mod:`~rescale_tasks.video.transforms`).

* ``mode="train"``: one item per video at a random temporal position, drawn from torch's CPU
  generator (seeded per sample by :class:`~rescale_tasks.common.data.PerSampleSeed`):
  ``(clip (C, T, H, W), label, video_index, 0)``.
* ``mode="val"``/``"test"``: one item per (video, clip ``k``) for the ``num_clips`` uniformly
  spaced clips, each with all ``num_crops`` spatial crops:
  ``(clips (num_crops, C, T, H, W), label, video_index, k)``; ``len = videos * num_clips``.
  The ``(video_index, clip_index)`` keys let an evaluation merge views per video and count
  DDP's padded duplicates once.

Bad videos never end an epoch. Unreadable or truncated files, files without a video stream or
without frames (the decoder's ``kind``), and -- under ``short_policy="skip"`` -- videos shorter
than one clip become ``None`` with ``skip_bad`` (drop them with :func:`collate_drop_none`), are
logged once and recorded in a shared-memory ``int8`` tensor, one code per video, so the counts by
kind are visible from the main process whichever worker met them. Short videos repaired by the
``loop``/``repeat_last`` policies are kept but recorded too (kinds ``short_loop``,
``short_repeat_last``). Headers that claim more frames than the file holds are harmless: the
decoder counts frames itself. Without ``skip_bad`` a bad video raises :class:`BadVideoError`,
one line naming the file.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate
from torchvision import tv_tensors

from rescale_tasks.common.errors import ConfigError, WorkerDataError

from .decoding import VideoDataError, make_decoder
from .sampling import SHORT_POLICIES, clip_indices
from .transforms import eval_transform, train_transform

__all__ = ["BadVideoError", "DROPPED_KINDS", "KINDS", "MODES", "VideoClipDataset", "collate_drop_none"]

log = logging.getLogger(__name__)

MODES = ("train", "val", "test")
#: Problem kinds by code (code 0 = fine). The decoder's kinds, "short" (skipped under the skip
#: policy), and the two repairs of short videos (kept).
KINDS = ("unreadable", "no video stream", "empty", "short", "short_loop", "short_repeat_last")
DROPPED_KINDS = ("unreadable", "no video stream", "empty", "short")
_CODE = {kind: code for code, kind in enumerate(KINDS, start=1)}


class BadVideoError(WorkerDataError):
    """A video that cannot be used while ``skip_bad`` is off.

    Raised in a DataLoader worker, it still reaches the user as one line (:class:`WorkerDataError`).
    """


class VideoClipDataset(Dataset):
    """Clips of ``(path, label)`` videos (see the module docstring).

    Args:
        samples: ``(path, label index)`` per video.
        mode: ``"train"`` (one random clip per video) or ``"val"``/``"test"`` (``num_clips``
            uniformly spaced clips per video, each with ``num_crops`` crops).
        frames, stride: ``T`` frames per clip, ``tau`` frames apart.
        num_clips, num_crops: views per video in evaluation (ignored in training).
        transform: maps a uint8 ``Video`` ``(T, C, H, W)`` to ``(C, T, H, W)`` (train) or
            ``(num_crops, C, T, H, W)`` (eval); None = this module's defaults at full size.
        backend: decoder backend (``"pyav"`` or ``"torchcodec"``).
        short_policy: videos shorter than a clip: ``"loop"``, ``"repeat_last"`` or ``"skip"``.
        skip_bad: return None for bad videos (and record them) instead of raising.
        status: a shared ``int8`` tensor of one code per video to record problems in (lets the
            val and test sets of the same videos share one record); None makes a new one.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], mode: str, frames: int, stride: int,
                 num_clips: int = 1, num_crops: int = 1, transform: Callable | None = None,
                 backend: str = "pyav", short_policy: str = "loop", skip_bad: bool = True,
                 status: torch.Tensor | None = None) -> None:
        if mode not in MODES:
            raise ConfigError(f"dataset mode must be one of {', '.join(MODES)}, got {mode!r}")
        if short_policy not in SHORT_POLICIES:
            raise ConfigError(f"unknown short-video policy {short_policy!r} (data.short_policy); "
                              f"choose one of {', '.join(SHORT_POLICIES)}")
        if frames < 1 or stride < 1 or num_clips < 1 or num_crops < 1:
            raise ConfigError(f"frames, stride, num_clips and num_crops must be at least 1, got "
                              f"{frames}, {stride}, {num_clips}, {num_crops}")
        self.samples = [(str(p), int(label)) for p, label in samples]
        self.mode, self.frames, self.stride = mode, int(frames), int(stride)
        self.num_clips = 1 if mode == "train" else int(num_clips)
        self.num_crops = 1 if mode == "train" else int(num_crops)
        if transform is None:
            transform = train_transform() if mode == "train" else eval_transform(num_crops=self.num_crops)
        self.transform, self.backend = transform, backend
        self.short_policy, self.skip_bad = short_policy, skip_bad
        if status is None:
            status = torch.zeros(len(self.samples), dtype=torch.int8).share_memory_()
        elif len(status) != len(self.samples):
            raise ValueError(f"status has {len(status)} entries for {len(self.samples)} videos")
        self.status = status
        self._decoder = None  # the last video's decoder, reused by its next clips (same worker)

    def __len__(self) -> int:
        return len(self.samples) * self.num_clips

    # --- problems ------------------------------------------------------------------------------
    def problems(self) -> dict[str, int]:
        """Videos with a problem so far, by kind (met in any process)."""
        counts = Counter(int(c) for c in self.status.tolist() if c)
        return {kind: counts[code] for kind, code in _CODE.items() if counts[code]}

    def problem_files(self) -> list[tuple[str, str]]:
        """``(path, kind)`` for every video with a problem so far."""
        return [(self.samples[i][0], KINDS[int(c) - 1]) for i, c in enumerate(self.status.tolist()) if c]

    def dropped(self) -> torch.Tensor:
        """Whether each video was dropped so far (bool, one per video; met in any process of this
        rank), so that an evaluation leaves out the views of its clips that decoded before one failed."""
        return torch.isin(self.status, torch.tensor([_CODE[kind] for kind in DROPPED_KINDS], dtype=torch.int8))

    @property
    def skipped(self) -> int:
        """Videos dropped so far (repaired short videos are not counted)."""
        return sum(n for kind, n in self.problems().items() if kind in DROPPED_KINDS)

    def _record(self, video: int, kind: str, detail: str) -> None:
        kind = kind if kind in _CODE else "unreadable"  # a kind this module does not know yet
        current = int(self.status[video])
        if kind.startswith("short_") and current and KINDS[current - 1] in DROPPED_KINDS:
            return  # a short video dropped by an earlier clip stays dropped
        if current != _CODE[kind]:
            self.status[video] = _CODE[kind]
            log.warning("%s video %s (%s)", "repaired short" if kind.startswith("short_") else "skipping",
                        self.samples[video][0], detail)

    # --- items ---------------------------------------------------------------------------------
    def _open(self, path: str):
        if self._decoder is None or self._decoder.path != path:
            if self._decoder is not None:
                self._decoder.close()
            self._decoder = make_decoder(path, self.backend)
        return self._decoder

    def _frames(self, video: int, clip: int) -> torch.Tensor:
        """The clip's uint8 frames ``(T, H, W, C)``; raises :class:`VideoDataError` for bad videos."""
        path = self.samples[video][0]
        try:
            decoder = self._open(path)
            n = decoder.num_frames
            if self.mode == "train":
                rng = np.random.default_rng(int(torch.randint(2**62, ())))  # under the per-sample seed
                idx = clip_indices(n, self.frames, self.stride, "train", rng=rng, short=self.short_policy)
            else:
                idx = clip_indices(n, self.frames, self.stride, "test", clip_idx=clip,
                                   num_clips=self.num_clips, short=self.short_policy)
            span = (self.frames - 1) * self.stride + 1
            if n < span:  # repaired by the policy (a "skip" raised ShortVideo above)
                self._record(video, f"short_{self.short_policy}", f"{n} frames, a clip spans {span}")
            return decoder.get_frames(idx)
        except VideoDataError as exc:
            if exc.path != path:  # clip_indices does not know the file
                exc = VideoDataError(path, exc.kind, exc.detail)
            raise exc
        except Exception as exc:  # anything else FFmpeg throws while reading is a bad file too
            raise VideoDataError(path, "unreadable", f"{type(exc).__name__}: {exc}") from None

    def __getitem__(self, index: int):
        video, clip = divmod(int(index), self.num_clips)
        path, label = self.samples[video]
        try:
            frames = self._frames(video, clip)
        except VideoDataError as exc:
            if self._decoder is not None:
                self._decoder.close()
                self._decoder = None
            if not self.skip_bad:
                raise BadVideoError(f"{exc} -- replace or delete the file, or set --data.skip_bad true "
                                    "to skip bad videos") from None
            self._record(video, exc.kind, f"{exc.kind}: {exc.detail}" if exc.detail else exc.kind)
            return None
        clip_tensor = self.transform(tv_tensors.Video(frames.permute(0, 3, 1, 2)))
        return clip_tensor, label, video, clip


def collate_drop_none(batch: list, clip_shape: Sequence[int] = (3, 0, 0, 0)):
    """``default_collate`` after dropping ``None`` items (bad videos).

    A batch of only bad videos becomes empty tensors: clips ``[0, *clip_shape]`` and empty int64
    labels, video and clip indices; bind ``clip_shape`` with ``functools.partial``.
    """
    kept = [item for item in batch if item is not None]
    if kept:
        return default_collate(kept)
    empty = torch.empty(0, dtype=torch.long)
    return torch.empty(0, *clip_shape), empty, empty.clone(), empty.clone()
