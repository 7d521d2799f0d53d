"""The LightningDataModule for COCO-format detection and instance segmentation.

Data: the standard layout ``root/annotations/instances_{train,val}2017.json`` with images in
``root/{train,val}2017/``, or any json/folder pairs given explicitly (they override ``root``).
The test split is the validation split; predict is too unless ``predict_annotations`` /
``predict_images`` name another set.

Knows ``num_classes`` (K + 1 with the background, torchvision's convention), ``class_names`` and
``label_to_category`` right after ``__init__`` (the CLI links them into the model): they come from
the ``categories`` of the validation json (COCO val: ~1 s to parse, train: ~20 s) or of the train
json when there is no validation set; every split must have the same categories. :meth:`CocoDataModule.labels`
hands them (names and category ids by label) to the checkpoints, which match them by name.

Batches are torchvision's detection format ``(list[image float32 [3, H, W]], list[target dict])``
(:func:`collate_detection`; skipped unreadable images are left out, so a batch may be empty).

- Training: :class:`AspectRatioBatchSampler` (images grouped by orientation, as Detectron2's
  ``AspectRatioGroupedDataset``), the same batch list on every rank from ``(seed, epoch)``, sharded
  and resumable mid-epoch (:mod:`rescale_tasks.common.data.batch_sampling`); augmentation runs under a
  per-sample seed (:class:`~rescale_tasks.common.data.PerSampleSeed`), so it depends on
  neither the workers nor restarts. Images without boxes are dropped (``keep_empty_train``).
- Evaluation: :class:`SequentialBatchSampler`, natural order in chunks of ``eval_batch_size``; the
  padding that evens out the ranks repeats batches, which the evaluation merges away by image id.

A split left without images (its json's ``images`` list empty, or every image dropped by
``keep_empty_*``) is refused in one line when it is set up: a validation of no image would end with
no metric.

Images whose EXIF orientation was left unapplied because only their stored pixels have the json's
size (:mod:`.coco`) are counted in every split and logged in one warning line per split when a
stage ends (:meth:`CocoDataModule.teardown`; each process its own under DDP).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from rescale_tasks.common.data import (BatchListLoader, BatchListSampler, Labels, PerSampleSeed, TaskDataModule,
                                       sample_seed, sigterm_safe_worker_init)
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.system import loader_workers

from .coco import CocoDetection, category_labels, load_coco_json
from .evaluation import load_ground_truth
from .transforms import MAX_SIZE, TRAIN_SIZES, eval_transforms, train_transforms

__all__ = ["CocoDataModule", "AspectRatioBatchSampler", "SequentialBatchSampler", "BatchOfSamples",
           "collate_detection"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- batching


class AspectRatioBatchSampler(BatchListSampler):
    """Batches of ``batch_size`` images of one orientation (``w >= h`` or ``w < h``).

    Each epoch walks a permutation of the images drawn from ``(seed, epoch)`` and fills a batch per
    orientation group in that order, emitting a batch whenever its group has ``batch_size`` images
    (Detectron2's ``AspectRatioGroupedDataset``); the two groups' leftovers are pooled, in the same
    order, into mixed batches at the end of the epoch (Detectron2 carries them over instead), so
    every image is seen once and there are the same number of batches every epoch. Keys are lists
    of ``(index, per-sample seed)`` for :class:`BatchOfSamples` over a ``PerSampleSeed`` data set.

    Args:
        dataset: the data set (its ``aspect_ratios``, width / height per index, unless given).
        batch_size: images per batch (per rank).
        seed: the same on every rank.
        num_replicas, rank: default from ``torch.distributed`` when initialised, else 1, 0.
        aspect_ratios: width / height per index (default ``dataset.aspect_ratios``).
    """

    def __init__(self, dataset: Dataset, batch_size: int, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None, aspect_ratios: Sequence[float] | None = None) -> None:
        super().__init__(dataset, shuffle=True, seed=seed, num_replicas=num_replicas, rank=rank)
        if batch_size < 1:
            raise ConfigError(f"data.batch_size must be at least 1, got {batch_size}.")
        ratios = np.asarray(dataset.aspect_ratios if aspect_ratios is None else aspect_ratios, dtype=np.float64)
        if len(ratios) != len(dataset):
            raise ValueError(f"{len(ratios)} aspect ratios for {len(dataset)} samples")
        self.batch_size = int(batch_size)
        self.portrait = ratios < 1  # group 1: w < h; group 0: w >= h
        groups = np.bincount(self.portrait.astype(np.int64), minlength=2)
        leftover = int((groups % self.batch_size).sum())
        self._num_batches = int((groups // self.batch_size).sum()) + -(-leftover // self.batch_size)

    def num_batches(self) -> int:
        return self._num_batches

    def epoch_batches(self) -> list[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.portrait))
        batches: list[list[int]] = []
        filling: tuple[list[int], list[int]] = ([], [])
        for index in order.tolist():
            group = filling[int(self.portrait[index])]
            group.append(index)
            if len(group) == self.batch_size:
                batches.append(group.copy())
                group.clear()
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        rest = sorted(filling[0] + filling[1], key=position.__getitem__)  # in permutation order
        batches += [rest[i:i + self.batch_size] for i in range(0, len(rest), self.batch_size)]
        return batches

    def as_key(self, batch: Sequence[int]) -> list[tuple[int, int]]:
        return [(i, sample_seed(self.seed, self.epoch, i)) for i in batch]

    def layout(self) -> dict[str, int]:
        return {**super().layout(), "batch_size": self.batch_size}


class SequentialBatchSampler(BatchListSampler):
    """Evaluation: indices in natural order in chunks of ``batch_size``, sharded over ranks; the
    padding repeats the first batches (duplicates that the evaluation merges by image id)."""

    def __init__(self, dataset: Dataset, batch_size: int = 1, num_replicas: int | None = None,
                 rank: int | None = None) -> None:
        super().__init__(dataset, shuffle=False, num_replicas=num_replicas, rank=rank)
        if batch_size < 1:
            raise ConfigError(f"data.eval_batch_size must be at least 1, got {batch_size}.")
        self.batch_size = int(batch_size)

    def num_batches(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def epoch_batches(self) -> list[list[int]]:
        n = len(self.dataset)
        return [list(range(i, min(i + self.batch_size, n))) for i in range(0, n, self.batch_size)]

    def layout(self) -> dict[str, int]:
        return {**super().layout(), "batch_size": self.batch_size}


class BatchOfSamples(Dataset):
    """``dataset[key]`` for a whole batch key (a list of indices or ``(index, seed)`` pairs): the
    list of samples, for a DataLoader with ``batch_size=None`` and :func:`collate_detection`."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Sequence) -> list:
        many = getattr(self.dataset, "__getitems__", None)  # PerSampleSeed's: the random state saved once a batch
        return many(list(key)) if many is not None else [self.dataset[k] for k in key]


def collate_detection(samples: list) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """``(images, targets)`` lists from ``(image, target)`` samples; ``None`` (skipped unreadable
    images) left out, so an all-skipped batch is ``([], [])``."""
    kept = [s for s in samples if s is not None]
    return [s[0] for s in kept], [s[1] for s in kept]


# ----------------------------------------------------------------------------- the data module

_STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}


class CocoDataModule(TaskDataModule):
    """COCO-format data for the detection task; see the module docstring.

    Args:
        root: folder with ``annotations/instances_{train,val}2017.json`` and ``{train,val}2017/``.
        train_annotations, train_images, val_annotations, val_images: explicit json / image folder
            pairs (override ``root``'s).
        predict_annotations, predict_images: the predict set (default: the validation set); an
            image-info json without annotations (COCO test-dev's) will do.
        batch_size: training images per batch and process; eval_batch_size: evaluation.
        train_sizes, max_size: multi-scale training resize (shortest side, longest-side cap).
        keep_empty_train, keep_empty_eval: keep images without boxes.
        group_aspect_ratio: orientation-grouped training batches (else mixed batches in a
            seeded random order).
        masks: decode instance masks (Mask R-CNN); off for box-only detectors.
        skip_corrupt: skip (and count) unreadable images instead of stopping.
        num_workers, pin_memory, persistent_workers: DataLoader options.
        seed: training order and augmentation (the same on every rank).
    """

    def __init__(self, root: str | None = None, train_annotations: str | None = None,
                 train_images: str | None = None, val_annotations: str | None = None,
                 val_images: str | None = None, predict_annotations: str | None = None,
                 predict_images: str | None = None, batch_size: int = 2, eval_batch_size: int = 1,
                 num_workers: int = 4, train_sizes: Sequence[int] = TRAIN_SIZES, max_size: int = MAX_SIZE,
                 keep_empty_train: bool = False, keep_empty_eval: bool = True, group_aspect_ratio: bool = True,
                 masks: bool = True, skip_corrupt: bool = False, pin_memory: bool = True,
                 persistent_workers: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        for key, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                           ("max_size", max_size)):
            if value < 1:
                raise ConfigError(f"data.{key} must be at least 1, got {value}.")
        if num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}.")
        if not train_sizes or min(train_sizes) < 1:
            raise ConfigError(f"data.train_sizes must be a non-empty list of positive sizes, got {train_sizes}.")
        if (predict_annotations is None) != (predict_images is None):
            raise ConfigError("data.predict_annotations and data.predict_images go together: set both "
                              "(or neither, to predict on the validation set).")
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.train_sizes, self.max_size = tuple(int(s) for s in train_sizes), max_size
        self.keep_empty_train, self.keep_empty_eval = keep_empty_train, keep_empty_eval
        self.group_aspect_ratio, self.masks, self.skip_corrupt = group_aspect_ratio, masks, skip_corrupt
        self.pin_memory, self.persistent_workers, self.seed = pin_memory, persistent_workers, seed
        self.paths = self._resolve(root, train_annotations, train_images, val_annotations, val_images,
                                   predict_annotations, predict_images)
        self.datasets: dict[str, CocoDetection] = {}
        self._reported_as_stored: dict[str, int] = {}  # per split, the images kept as stored already logged
        self._ground_truths: dict[Path, Any] = {}  # COCO per annotation file, for the evaluation
        self._read_categories()

    # --- paths and categories ---------------------------------------------------------------
    @staticmethod
    def _resolve(root, train_annotations, train_images, val_annotations, val_images, predict_annotations,
                 predict_images) -> dict[str, tuple[tuple[Path, str], tuple[Path, str]] | None]:
        """Per split ``((json, its data.* key), (image folder, its key))`` or None (not given)."""
        if root is None and not (train_annotations or val_annotations or predict_annotations):
            raise ConfigError("no COCO data given: set --data.root (a folder with annotations/"
                              "instances_{train,val}2017.json) or --data.train_annotations/--data.train_images "
                              "and --data.val_annotations/--data.val_images (to predict only: --data.predict_annotations/"
                              "--data.predict_images).")
        if root is not None:
            root_path = Path(os.path.expanduser(root))
            if not root_path.is_dir():
                raise DataError(f"COCO folder not found: {root_path} (data.root). Point --data.root at the "
                                "folder holding annotations/ and train2017/, val2017/ (or set the explicit "
                                "--data.*_annotations / --data.*_images paths).")

        def pair(split: str, annotations: str | None, images: str | None, year_split: str):
            ann = (Path(os.path.expanduser(annotations)), f"data.{split}_annotations") if annotations else (
                (Path(os.path.expanduser(root)) / "annotations" / f"instances_{year_split}.json", "data.root")
                if root is not None else None)
            img = (Path(os.path.expanduser(images)), f"data.{split}_images") if images else (
                (Path(os.path.expanduser(root)) / year_split, "data.root") if root is not None else None)
            if ann is None and img is None:
                return None
            if ann is None or img is None:
                given, other = (f"data.{split}_annotations", f"data.{split}_images") if ann else (
                    f"data.{split}_images", f"data.{split}_annotations")
                raise ConfigError(f"--{given} is set but --{other} is not (and no --data.root): set both.")
            return ann, img

        paths = {"train": pair("train", train_annotations, train_images, "train2017"),
                 "val": pair("val", val_annotations, val_images, "val2017")}
        paths["predict"] = (((Path(os.path.expanduser(predict_annotations)), "data.predict_annotations"),
                             (Path(os.path.expanduser(predict_images)), "data.predict_images"))
                            if predict_annotations else None)
        return paths

    def _split_paths(self, split: str) -> tuple[tuple[Path, str], tuple[Path, str]]:
        """The json and folder of ``split`` (``train``, ``val``, ``predict``), which must exist
        (DataError naming the expected path)."""
        given = self.paths[split]
        if given is None:
            raise ConfigError(f"no {split} data: set --data.root or --data.{split}_annotations and "
                              f"--data.{split}_images.")
        (ann, ann_key), (folder, folder_key) = given
        if not ann.is_file():
            how = (f"set --data.{split}_annotations" if ann_key == "data.root" else f"fix --{ann_key}")
            raise DataError(f"COCO annotation file not found: {ann} ({ann_key}). Put the {split} json there "
                            f"or {how}.")
        if not folder.is_dir():
            how = (f"set --data.{split}_images" if folder_key == "data.root" else f"fix --{folder_key}")
            raise DataError(f"COCO image folder not found: {folder} ({folder_key}). Put the {split} images "
                            f"there or {how}.")
        return given

    def _read_categories(self) -> None:
        """Labels from the validation json's categories (the small one), else the train json's, else (a
        machine that only predicts, on COCO test-dev's image info) the predict json's."""
        given = [s for s in ("val", "train", "predict") if self.paths[s] is not None]
        split = next((s for s in given if self.paths[s][0][0].is_file()), given[0])
        (ann, ann_key), _ = self._split_paths(split)
        self._categories_source, self._categories_key = (split, ann), ann_key
        categories = load_coco_json(ann, ann_key, image_info=split == "predict")["categories"]
        self.category_to_label, self.class_names = category_labels(categories, f"{ann} ({ann_key})")
        self.label_to_category = {label: cid for cid, label in self.category_to_label.items()}
        self.num_classes = len(self.class_names)

    def labels(self) -> Labels:
        """The category names by label (``__background__`` first) and their category ids: what a
        detector's labels stand for (:mod:`rescale_tasks.common.data.labels`)."""
        ids = [None] + [self.label_to_category[label] for label in range(1, self.num_classes)]
        return Labels(self.class_names, ids, source=f"the categories of {self._categories_source[1]}",
                      key=self._categories_key)

    # --- data sets --------------------------------------------------------------------------
    def _set_name(self, split: str) -> str:
        """The key in :attr:`datasets` of ``split``'s set: ``test`` reads the validation set, and so
        does ``predict`` unless it has a json of its own, where the validation set keeps every image
        (``keep_empty_eval``; ``predict`` predicts on every image, boxes or not)."""
        if split == "test" or (split == "predict" and self.paths["predict"] is None and self.keep_empty_eval):
            return "val"
        return split

    def dataset(self, split: str) -> CocoDetection:
        """The :class:`CocoDetection` of ``train``, ``val``, ``test`` (= val) or ``predict``
        (the validation json unless given; every image of it, ``keep_empty_eval`` or not), built on first use."""
        name = self._set_name(split)
        if name not in self.datasets:
            read = "val" if name == "predict" and self.paths["predict"] is None else name
            (ann, ann_key), (folder, folder_key) = self._split_paths(read)
            train = name == "train"
            transforms = (train_transforms(self.train_sizes, self.max_size) if train else eval_transforms())
            keep_empty = self.keep_empty_train if train else (self.keep_empty_eval or name == "predict")
            dataset = CocoDetection(ann, folder, transforms, keep_empty=keep_empty, skip_corrupt=self.skip_corrupt,
                                    masks=self.masks, keys=(ann_key, folder_key), evaluation=read == "val",
                                    image_info=read == "predict")
            if dataset.category_to_label != self.category_to_label or dataset.class_names != self.class_names:
                source_split, source = self._categories_source
                raise DataError(f"the categories of {ann} ({ann_key}) differ from those of {source} "
                                f"(the {source_split} json): the splits need the same 'categories' list.")
            if len(dataset) == 0:
                self._refuse_empty(name, ann, ann_key, images=len(dataset.coco.imgs), dataset=dataset)
            self.datasets[name] = dataset
        return self.datasets[name]

    @staticmethod
    def _refuse_empty(split: str, ann: Path, ann_key: str, images: int, dataset: CocoDetection | None = None) -> None:
        """The DataError for a ``split`` (``train``, ``val``, ``predict``) whose json ``ann`` left no
        image: it lists ``images`` images, all without boxes (dropped by ``keep_empty_*``), or none.
        Where boxes were there but their annotations were dropped (``dataset``'s counts), it says why:
        keeping the images without them would train on no object."""
        keep, use = ("train", "training") if split == "train" else ("eval", split)
        masks = dataset.dropped_unusable_masks if dataset is not None else 0
        degenerate = dataset.dropped_degenerate if dataset is not None else 0
        if images and masks and masks >= degenerate:  # the larger cause of the two
            aid, problem = dataset.first_unusable_mask
            raise DataError(f"no {use} images with boxes in {ann} ({ann_key}): the {masks} annotation(s) whose "
                            f"segmentation cannot form a mask were dropped, e.g. annotation id {aid}: {problem}. Fix "
                            "the segmentations, or set --data.masks false for a box-only detector.")
        if images and degenerate:
            aid, bbox = dataset.first_degenerate
            raise DataError(f"no {use} images with boxes in {ann} ({ann_key}): its {degenerate} box(es) were dropped as "
                            f"under 1 px wide or high once clipped to their image, e.g. annotation id {aid}: bbox "
                            f"{str(bbox)[:60]}. COCO boxes are [x, y, width, height] in pixels of the image's width x "
                            "height: convert boxes given as fractions of the image to pixels.")
        if images:
            raise DataError(f"no {use} images with boxes in {ann} ({ann_key}). Check the json, or set "
                            f"--data.keep_empty_{keep} true.")
        use = {"train": "train on", "val": "validate and test on", "predict": "predict on"}[split]
        raise DataError(f"no images in {ann} ({ann_key}): its 'images' list is empty, so the {split} split has "
                        f"nothing to {use}. Add the images to it or point --data.{split}_annotations at a json "
                        "with images.")

    @property
    def train_set(self) -> CocoDetection | None:
        return self.datasets.get("train")

    def ground_truth(self, split: str):
        """``COCO(annotation_file)`` of the ``split`` set's own json, read once: what its COCO AP is
        scored against (:class:`~.evaluation.CocoEvaluator`). A copy of its own, not the data set's
        index: ``COCOeval`` writes into the ground truth it scores (polygons become RLEs)."""
        dataset = self.dataset(split)
        if dataset.annotation_file not in self._ground_truths:
            self._ground_truths[dataset.annotation_file] = load_ground_truth(dataset.annotation_file)
        return self._ground_truths[dataset.annotation_file]

    @property
    def val_set(self) -> CocoDetection | None:
        """The validation (and test) set; its ``coco`` is the evaluation's ground truth."""
        return self.datasets.get("val")

    def setup(self, stage: str | None = None) -> None:
        for split in _STAGE_SPLITS.get(stage or "", ()):
            self.dataset(split)

    # --- the data fingerprint (run_summary.json's ``data``) ---------------------------------
    def fingerprint_root(self) -> Any:
        return self.hparams.get("root")

    def fingerprint_files(self, split: str, dataset: Any) -> list | None:
        """A split's annotation file: it lists the images (stating every image of COCO would cost
        a walk of its folders); the count says how many of them the split kept."""
        annotations = getattr(dataset, "annotation_file", None)
        return [annotations] if annotations is not None else None

    # --- loaders ----------------------------------------------------------------------------
    def _loader_options(self) -> dict[str, Any]:
        workers = loader_workers(self.num_workers)  # at most the usable cores
        return dict(num_workers=workers, collate_fn=collate_detection,
                    pin_memory=self.pin_memory and torch.accelerator.is_available(),
                    persistent_workers=self.persistent_workers and workers > 0,
                    worker_init_fn=sigterm_safe_worker_init() if workers > 0 else None,
                    # a private generator: creating an iterator never draws from the global RNG
                    generator=torch.Generator().manual_seed(self.seed))

    def train_loader(self, num_replicas: int | None = None, rank: int | None = None) -> BatchListLoader:
        """Training batches for rank ``rank`` of ``num_replicas`` (default: from ``torch.distributed``)."""
        dataset = self.dataset("train")
        ratios = dataset.aspect_ratios if self.group_aspect_ratio else np.ones(len(dataset))  # one group
        sampler = AspectRatioBatchSampler(dataset, self.batch_size, seed=self.seed, num_replicas=num_replicas,
                                          rank=rank, aspect_ratios=ratios)
        return BatchListLoader(BatchOfSamples(PerSampleSeed(dataset)), sampler, **self._loader_options())

    def eval_loader(self, split: str, num_replicas: int | None = None, rank: int | None = None) -> DataLoader:
        """Batches of ``val``, ``test`` or ``predict`` in natural order for rank ``rank``."""
        dataset = self.dataset(split)
        sampler = SequentialBatchSampler(dataset, self.eval_batch_size, num_replicas=num_replicas, rank=rank)
        return DataLoader(BatchOfSamples(dataset), sampler=sampler, batch_size=None, **self._loader_options())

    def train_dataloader(self) -> BatchListLoader:
        return self.train_loader()

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.eval_loader("predict")

    @property
    def skipped_corrupt(self) -> int:
        """Distinct unreadable images skipped so far in any split, counted in all worker processes."""
        return sum(ds.skipped for ds in self.datasets.values())

    def skipped_image_ids(self, split: str) -> list[int]:
        """The json ids of the unreadable images the ``split`` set skipped so far, in this process and
        its workers (:attr:`~.coco.CocoDetection.skipped_ids`); none before the set is built."""
        dataset = self.datasets.get(self._set_name(split))
        return dataset.skipped_ids if dataset is not None else []

    def teardown(self, stage: str | None = None) -> None:
        """Logs, per split, the images kept without their EXIF orientation (:mod:`.coco`) once their
        count has grown since the last stage: one line with the count and an example file."""
        for split, dataset in self.datasets.items():
            count = dataset.kept_as_stored
            if count > self._reported_as_stored.get(split, 0):
                self._reported_as_stored[split] = count
                log.warning(dataset.orientation_report())
