"""The LightningDataModule for Kinetics-style video classification.

Reads one of three layouts (:mod:`.layouts`: class folders, the official CVDF CSVs with a flat
folder of videos, mmaction2/SlowFast list files) and serves clips (:mod:`.dataset`):

* fit: one random clip per video and training step, SlowFast's augmentation (:mod:`.transforms`),
  in a seeded order that resumes mid-epoch and is sharded over DDP ranks
  (:class:`~rescale_tasks.common.data.ResumableSampler`), each sample augmented under its own
  seed (:class:`~rescale_tasks.common.data.PerSampleSeed`): batches
  ``(clips [B, C, T, H, W], labels [B], video_index [B], clip_index [B])``.
* validate: ``val_clips`` x ``val_crops`` views per video (default one centre view, as SlowFast
  validates during training); test and predict: ``num_clips`` x ``num_crops`` (the standard
  10 x 3): batches ``(clips [B, crops, C, T, H, W], labels, video_index, clip_index)``, in order,
  each item to one process under DDP (:class:`~rescale_tasks.common.data.UnrepeatedSampler`:
  contiguous chunks, no padding repeats, so the module sums the views of each video and reduces
  the sums over ranks); under FSDP padded, each batch then ending with the mask of its real items
  (:func:`~rescale_tasks.common.data.eval_sampler`).

``num_classes`` and ``class_names`` are known right after ``__init__`` (a cheap read of the
training split's class list: folder names, CSV labels or list labels; the validation split's where a
machine that only evaluates has no training split: validate, test and predict then run without it) so a CLI can link
``data.num_classes`` to the model; videos are scanned in :meth:`setup`. The class list travels
in every checkpoint (:meth:`labels`, :mod:`rescale_tasks.common.data.labels`) and is matched to the
data's by name when a checkpoint is loaded. Bad videos are skipped and counted by kind (:meth:`data_problems`,
:meth:`problem_files`; reported by :class:`~rescale_tasks.common.run.SkippedDataReport`), and what the
class folders hold besides videos (other extensions, hidden files, sub-folders: :attr:`unread_files`)
is named in one warning line when the data is set up. Videos the ``cvdf`` or ``list`` annotations name
but the disk lacks (Kinetics downloads always miss some) are left out with one warning line per split
and reported as the problem kind ``missing`` (:attr:`missing_videos`: ``data/missing``, ``data_problems.tsv``).
"""
from __future__ import annotations

import functools
from typing import Callable, Literal

import torch
from torch.utils.data import DataLoader

from rescale_tasks.common.data import (Labels, PerSampleSeed, ResumableDataLoader, ResumableSampler, TaskDataModule,
                                       eval_sampler, sigterm_safe_worker_init)
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.system import loader_workers

from .dataset import DROPPED_KINDS, KINDS, VideoClipDataset, collate_drop_none
from .layouts import VIDEO_EXTENSIONS, class_list_key, class_names_of, integer_labels, label_samples, read_layout
from .sampling import preset as sampling_preset
from .transforms import describe_eval_transform, eval_transform, train_transform

__all__ = ["KineticsDataModule"]


class KineticsDataModule(TaskDataModule):
    """Kinetics (or any labelled video set) in one of three layouts.

    Args:
        layout: ``"folders"`` (``root/{train,val}/<class>/<video>``), ``"cvdf"`` (``train_csv``,
            ``val_csv`` and the flat ``video_dir``) or ``"list"`` (``train_list``, ``val_list``,
            paths relative to ``list_prefix``, default the list file's folder).
        preset: ``"8x8"``, ``"16x4"`` or ``"32x2"`` (frames x stride); ``frames``/``stride``,
            when given, override the preset's (with ``preset: null`` both are needed).
        train_short_side: training short side drawn from [low, high]; ``crop``: crop size.
        test_short_side: evaluation short side; ``num_clips`` x ``num_crops``: test views per
            video; ``val_clips`` x ``val_crops``: validation views during fit.
        short_policy: videos shorter than a clip: ``loop``, ``repeat_last`` or ``skip``.
        backend: ``pyav`` (default) or ``torchcodec``.
        skip_bad: skip (and count) unusable videos instead of stopping with an error.
        batch_size: training clips per process; eval_batch_size: evaluation items (each with all
            its crops) per process.
        seed: training order and augmentation seeds (the same on every rank).
        num_classes: the class count integer labels of list files number (None: the highest label of
            the list the classes are read from, plus one); ``rescale validate/test/predict
            --ckpt_path`` sets it to the checkpoint's, so a validation list alone, which need not name
            the highest class, numbers the classes the network learned. Class names (folders, CSVs,
            named lists) are their own count: another value is refused.
    """

    #: problem kinds whose videos are repaired and kept (short videos looped or padded), for the report
    kept_problem_kinds = tuple(kind for kind in KINDS if kind not in DROPPED_KINDS)
    read_extensions = VIDEO_EXTENSIONS  # what the class folders are read for (data report)

    def __init__(self, layout: Literal["folders", "cvdf", "list"] = "folders", root: str | None = None,
                 train_csv: str | None = None, val_csv: str | None = None, video_dir: str | None = None,
                 train_list: str | None = None, val_list: str | None = None, list_prefix: str | None = None,
                 preset: str | None = "8x8", frames: int | None = None, stride: int | None = None,
                 train_short_side: tuple[int, int] = (256, 320), crop: int = 224, test_short_side: int = 256,
                 num_clips: int = 10, num_crops: Literal[1, 3] = 3, val_clips: int = 1, val_crops: Literal[1, 3] = 1,
                 short_policy: Literal["loop", "repeat_last", "skip"] = "loop",
                 backend: Literal["pyav", "torchcodec"] = "pyav", skip_bad: bool = True,
                 batch_size: int = 8, eval_batch_size: int = 4, num_workers: int = 4, pin_memory: bool = True,
                 persistent_workers: bool = True, seed: int = 0,
                 num_classes: int | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.frames, self.stride = self._clip_sampling(preset, frames, stride)
        for key, value in (("crop", crop), ("test_short_side", test_short_side), ("num_clips", num_clips),
                           ("val_clips", val_clips), ("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value < 1:
                raise ConfigError(f"data.{key} must be at least 1, got {value}.")
        for key, value in (("num_crops", num_crops), ("val_crops", val_crops)):
            if value not in (1, 3):
                raise ConfigError(f"data.{key} must be 1 (centre) or 3 (start/centre/end), got {value}.")
        low, high = (int(v) for v in train_short_side)
        if not 0 < low <= high:
            raise ConfigError(f"data.train_short_side must be [low, high] with 0 < low <= high, got {list(train_short_side)}.")
        if crop > min(low, test_short_side):
            raise ConfigError(f"data.crop ({crop}) must be at most the short sides (data.train_short_side {low}, "
                              f"data.test_short_side {test_short_side}).")
        if num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}.")
        if num_classes is not None and num_classes < 1:
            raise ConfigError(f"data.num_classes must be at least 1 (or null: the labels' count), got {num_classes}.")
        self.layout_args = dict(root=root, train_csv=train_csv, val_csv=val_csv, video_dir=video_dir,
                                train_list=train_list, val_list=val_list, list_prefix=list_prefix,
                                num_classes=num_classes)
        self.layout = layout
        self.train_short_side, self.crop, self.test_short_side = (low, high), crop, test_short_side
        self.num_clips, self.num_crops, self.val_clips, self.val_crops = num_clips, num_crops, val_clips, val_crops
        self.short_policy, self.backend, self.skip_bad = short_policy, backend, skip_bad
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.pin_memory, self.persistent_workers, self.seed = pin_memory, persistent_workers, seed
        self.in_channels = 3
        # the class list, cheaply (no video is opened): the CLI links data.num_classes to the model
        self.class_names: list[str] = class_names_of(layout, **self.layout_args)
        self.num_classes = len(self.class_names)
        if num_classes is not None and num_classes != self.num_classes:  # class names are their own count
            key = class_list_key(layout, **self.layout_args)
            raise ConfigError(f"data.num_classes is {num_classes} but the {layout} layout names {self.num_classes} "
                              f"classes (read from data.{key}: {self.layout_args[key]}); set --data.num_classes "
                              f"{self.num_classes} or null (the classes found), or fix the data.")
        self.train_set: VideoClipDataset | None = None
        self.val_set: VideoClipDataset | None = None
        self.test_set: VideoClipDataset | None = None
        # what the class folders hold besides videos (layout folders), reported by common.run.data_report
        self.unread_files: list[str] = []
        # the videos the cvdf/list annotations name that are not on disk (left out), reported as ``missing``
        self.missing_videos: list[str] = []

    @staticmethod
    def counts_integer_labels(init_args: dict) -> bool:
        """Whether ``data.num_classes`` numbers these init arguments' classes (integer-labelled list
        files), so that an evaluation may set it to the checkpoint's; class names are their own count."""
        arguments = {key: value for key, value in init_args.items() if key != "layout"}
        try:
            return integer_labels(init_args.get("layout", "folders"), **arguments)
        except DataError:  # unreadable or unset: refused in one line when the data module is built
            return False

    @staticmethod
    def _clip_sampling(preset: str | None, frames: int | None, stride: int | None) -> tuple[int, int]:
        base = sampling_preset(preset) if preset is not None else (None, None)
        T = frames if frames is not None else base[0]
        tau = stride if stride is not None else base[1]
        if T is None or tau is None:
            raise ConfigError("data.preset is null: set both data.frames and data.stride (or a preset: 8x8, 16x4, 32x2).")
        if T < 1 or tau < 1:
            raise ConfigError(f"data.frames and data.stride must be at least 1, got {T} and {tau}.")
        return int(T), int(tau)

    def export_preprocessing(self) -> dict:
        """How a video becomes the network's input in the test's views, for ``rescale export``'s
        sidecar: ``clip.frames`` frames ``clip.stride`` apart (``views.clips`` clips spread over the
        video; ``clip.short``: what a video shorter than a clip gets, :mod:`.sampling`'s policy), the shorter side resized to ``resize.size``, ``views.crops`` square crops of
        ``center_crop`` (1: the centre; 3: start, centre and end of the long side), pixel values
        times ``pixel_scale``, ``(x - mean) / std`` per RGB channel, laid out ``NCTHW``; the
        video's prediction is the mean of its views' softmax. ``decode.display_rotation``: whether
        the frames are turned as the file's display matrix says (FFmpeg's ``autorotate``, what the
        ``pyav`` backend does; ``torchcodec`` gives the stored pixels)."""
        described = describe_eval_transform(self.eval_transform())
        crops = described.pop("crops")
        rotation = "applied" if self.backend == "pyav" else "not applied"
        return {"layout": "NCTHW", "channels": 3, "channel_order": "RGB", "decode": {"display_rotation": rotation},
                **described,
                "clip": {"frames": self.frames, "stride": self.stride, "short": self.short_policy},
                "views": {"clips": self.num_clips, "crops": crops, "combine": "mean of softmax"}}

    def eval_transform(self, crops: int | None = None) -> Callable:
        """The test's transform of a decoded clip (``crops``: the validation's, ``val_crops``, else ``num_crops``)."""
        return eval_transform(self.test_short_side, self.crop, self.num_crops if crops is None else crops)

    # --- data ----------------------------------------------------------------------------------
    def fingerprint_root(self) -> str | None:
        """The folder the videos are under (``root``, else ``video_dir``), for run_summary.json's ``data``."""
        return self.layout_args["root"] or self.layout_args["video_dir"] or self.layout_args["list_prefix"]

    def setup(self, stage: str | None = None) -> None:
        evaluation = stage in ("validate", "test", "predict")  # class folders may hold val/ alone
        if self.val_set is not None and (self.train_set is not None or evaluation):
            return
        splits = read_layout(self.layout, eval_only=evaluation, **self.layout_args)
        if splits.class_names != self.class_names:  # the data changed since __init__
            self._check_classes(self.class_names, splits.class_names, "the class list read at start-up")
        common = dict(frames=self.frames, stride=self.stride, backend=self.backend,
                      short_policy=self.short_policy, skip_bad=self.skip_bad)
        self.unread_files = splits.unread
        # an evaluation serves val alone: the training split's missing downloads are no part of it
        self.missing_videos = [path for split in (("val",) if evaluation else ("train", "val"))
                               for path in splits.missing.get(split, [])]
        train = label_samples(splits.train, self.class_names)
        val = label_samples(splits.val, self.class_names)
        self.train_set = VideoClipDataset(train, "train", transform=train_transform(self.train_short_side, self.crop),
                                          **common) if train else None
        self.val_set = VideoClipDataset(val, "val", num_clips=self.val_clips, num_crops=self.val_crops,
                                        transform=self.eval_transform(self.val_crops),
                                        **common)
        # the same videos: one record of their problems for both
        self.test_set = VideoClipDataset(val, "test", num_clips=self.num_clips, num_crops=self.num_crops,
                                         transform=self.eval_transform(),
                                         status=self.val_set.status, **common)

    def _clip_shape(self, crops: int | None) -> tuple[int, ...]:
        shape = (3, self.frames, self.crop, self.crop)
        return shape if crops is None else (crops, *shape)

    def _loader(self, split: str, crops: int | None) -> DataLoader:
        if getattr(self, split) is None:
            self.setup()
        dataset = getattr(self, split)
        workers = loader_workers(self.num_workers)  # at most the usable cores
        train = split == "train_set"
        kwargs = dict(batch_size=self.batch_size if train else self.eval_batch_size, num_workers=workers,
                      pin_memory=self.pin_memory and torch.accelerator.is_available(),
                      persistent_workers=self.persistent_workers and workers > 0,
                      # a plain function, so workers never pickle the DataModule
                      collate_fn=functools.partial(collate_drop_none, clip_shape=self._clip_shape(crops)),
                      worker_init_fn=sigterm_safe_worker_init() if workers > 0 else None,
                      # a private generator: making an iterator never draws from the global RNG
                      generator=torch.Generator().manual_seed(self.seed))
        if not train:  # each item counted once (common.data.eval_sampler decides how, by strategy)
            dataset, sampler = eval_sampler(dataset, getattr(self.trainer, "strategy", None))
            return DataLoader(dataset, sampler=sampler, **kwargs)
        sampler = ResumableSampler(dataset, shuffle=True, seed=self.seed, with_seeds=True)
        return ResumableDataLoader(PerSampleSeed(dataset), sampler, drop_last=len(sampler) > self.batch_size,
                                   **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train_set", None)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val_set", self.val_crops)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test_set", self.num_crops)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test_set", self.num_crops)

    # --- the class list ---------------------------------------------------------------------------
    def labels(self) -> Labels:
        """The class list a checkpoint's labels stand for (:mod:`rescale_tasks.common.data.labels`)."""
        key = class_list_key(self.layout, **self.layout_args)
        return Labels(self.class_names, source=f"the classes of {self.layout_args.get(key)}", key=f"data.{key}")

    def _check_classes(self, expected: list[str], found: list[str], source: str) -> None:
        if expected == found:
            return
        at = next((i for i, (a, b) in enumerate(zip(expected, found)) if a != b), min(len(expected), len(found)))
        first = (f"class {at} is {expected[at]!r} there but {found[at]!r} here" if at < min(len(expected), len(found))
                 else f"the lists agree up to class {at}")
        raise DataError(f"The class list of {source} ({len(expected)} classes) differs from the data's "
                        f"({len(found)} classes, data.layout={self.layout}): {first}. Point data at the "
                        "videos the model was trained on (same classes, same order).")

    # --- problems ---------------------------------------------------------------------------------
    def _records(self) -> list[VideoClipDataset]:
        """One dataset per distinct problem record (val and test share theirs)."""
        return [ds for ds in (self.train_set, self.val_set or self.test_set) if ds is not None]

    @property
    def skipped_corrupt(self) -> int:
        """Videos skipped so far (all kinds but the repaired short ones), counted in all workers."""
        return sum(ds.skipped for ds in self._records())

    def data_problems(self) -> dict[str, int]:
        """Videos with a problem so far, by kind (``short_loop``/``short_repeat_last``: kept, repaired;
        ``missing``: listed in the annotations, not on disk, left out)."""
        total: dict[str, int] = {"missing": len(self.missing_videos)} if self.missing_videos else {}
        for ds in self._records():
            for kind, count in ds.problems().items():
                total[kind] = total.get(kind, 0) + count
        return total

    def problem_files(self) -> list[tuple[str, str]]:
        """``(path, kind)`` of every video with a problem so far."""
        return ([(path, "missing") for path in self.missing_videos]
                + [item for ds in self._records() for item in ds.problem_files()])
