"""Raw readers and Dataset classes for the classification DataModules.

Everything here reads the standard on-disk formats directly (no torchvision dataset classes,
no checksums, no downloads) and turns every problem with the files into a one-line
:class:`~rescale_tasks.common.errors.DataError` naming the file and the fix.
"""
from __future__ import annotations

import gzip
import logging
import os
import pickle
import unicodedata
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from rescale_tasks.common.data import (DECODE_ERRORS, CorruptImageError, Labels, match_labels, nested_folders_hint,
                                       open_rgb, say_large_image, scan_class_folders, unreadable_image)
from rescale_tasks.common.errors import DataError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# ----------------------------------------------------------------------------- image folders


def _names(items: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


class ImageFolder(NamedTuple):
    """What :func:`scan_image_folder` found."""

    class_names: list[str]
    train: list[tuple[str, int]]  # (path, label)
    val: list[tuple[str, int]]
    unread: list[str]  # what the class folders hold besides images: other extensions, hidden, folders


#: Tiny ImageNet's validation split: ``val/images/<file>`` with ``val/val_annotations.txt`` naming each
#: file's class (``<file>\t<wnid>\t<box>``), instead of class folders
TINY_IMAGENET_VAL = ("images", "val_annotations.txt")

#: Tiny ImageNet's training split: ``train/<wnid>/images/<file>`` (beside ``<wnid>_boxes.txt``), read as
#: class ``<wnid>`` where every class folder not empty holds that one folder and no image of its own
TINY_IMAGENET_NESTED = "images"


def _annotated_split(split_dir: Path, unread: list[str]) -> dict[str, list[str]] | None:
    """Tiny ImageNet's validation layout (:data:`TINY_IMAGENET_VAL`) read as class -> files (sorted
    by class name, as class folders are); None where ``split_dir`` is not laid out so. Images of
    ``images/`` no line names, and the other entries of ``split_dir``, go to ``unread``."""
    folder, annotations = (split_dir / name for name in TINY_IMAGENET_VAL)
    if not (folder.is_dir() and annotations.is_file()):
        return None
    classes: dict[str, list[str]] = {}
    named: set[str] = set()
    for line, text in enumerate(annotations.read_text(encoding="utf-8-sig", errors="replace").splitlines(), start=1):
        fields = text.split("\t") if "\t" in text else text.split()
        if not text.strip():
            continue
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise DataError(f"{annotations}:{line} (data.root) is not '<file>\\t<class>[\\t<box>]': {text[:80]!r}. "
                            "Fix or delete that line (Tiny ImageNet's val_annotations.txt).")
        name, wnid = fields[0].strip(), fields[1].strip()
        path = folder / name
        if not path.is_file():
            raise DataError(f"{annotations}:{line} (data.root) names {name}, which is not in {folder}. "
                            "Re-extract the validation images, or delete that line.")
        classes.setdefault(wnid, []).append(str(path))
        named.add(str(path))
    if not classes:
        raise DataError(f"{annotations} (data.root) names no image; expected one '<file>\\t<class>' line per "
                        f"image of {folder}.")
    with os.scandir(split_dir) as entries:
        unread += [e.path for e in entries if e.name not in TINY_IMAGENET_VAL]
    with os.scandir(folder) as entries:
        unread += [e.path for e in entries if e.path not in named]
    return {wnid: sorted(classes[wnid]) for wnid in sorted(classes)}


def scan_image_folder(root: str | os.PathLike, num_classes: int, eval_only: bool = False,
                      trained: Labels | None = None) -> ImageFolder:
    """Index an ImageNet-style folder ``root/{train,val}/<class>/<image>``.

    Samples are ``(path, label)``. Unlike torchvision's ImageFolder, val/ must hold exactly the
    class folders of train/, the class count must equal ``num_classes``, and what the class folders
    hold besides images is listed (:attr:`ImageFolder.unread`) for the data report instead of
    vanishing. ``eval_only`` (validate, test, predict): a folder holding val/ alone will do (a machine
    that evaluates without the training images); its class folders are the classes, and ``train`` is
    empty; with train/, its class folders are the classes, and need not hold images. val/ may also be
    laid out as Tiny ImageNet's is: ``val/images/`` with ``val/val_annotations.txt`` naming each
    image's class (:data:`TINY_IMAGENET_VAL`); a split whose
    every class folder not empty holds one ``images/`` folder and no image of its own (Tiny ImageNet's train/,
    :data:`TINY_IMAGENET_NESTED`) is read from those folders. ``trained``: the labels of the
    checkpoint the run starts from; a class count other than ``num_classes`` then names the classes
    the folders lack or add, not the count.
    """
    root = Path(os.path.expanduser(str(root)))
    if not root.is_dir():
        raise DataError(
            f"ImageNet folder not found: {root} (data.root). "
            "Point --data.root at a folder holding train/ and val/ class folders."
        )
    splits: dict[str, dict[str, list[str]]] = {}
    unread: list[str] = []
    val_only = eval_only and not (root / "train").is_dir() and (root / "val").is_dir()
    for split in ("val",) if val_only else ("train", "val"):
        split_dir = root / split
        if not split_dir.is_dir():
            raise DataError(
                f"ImageNet folder {root} (data.root) has no {split}/ sub-folder: expected "
                f"{split_dir}/<class>/<image>. Point --data.root at a folder holding train/ and val/."
            )
        classes = _annotated_split(split_dir, unread) if split == "val" else None
        if classes is None:
            classes = scan_class_folders(split_dir, IMAGE_EXTENSIONS, unread, nested=TINY_IMAGENET_NESTED)
        if not classes:
            raise DataError(
                f"No class folders in {split_dir} (data.root). Expected one sub-folder per class, "
                f"e.g. {split_dir}/n01440764/*.JPEG."
            )
        empty = [name for name, files in classes.items() if not files]
        if empty and not (eval_only and split == "train"):  # (an evaluation reads train/ for its class names)
            raise DataError(
                f"Class folders without images in {split_dir}: {_names(empty)}."
                + (nested_folders_hint(split_dir, empty, unread) or
                   f" Add image files ({'/'.join(IMAGE_EXTENSIONS)}) or remove those folders.")
            )
        splits[split] = classes

    val_names = list(splits["val"])
    train_names = val_names if val_only else list(splits["train"])
    if train_names != val_names:
        missing = [n for n in train_names if n not in splits["val"]]
        extra = [n for n in val_names if n not in splits["train"]]
        parts = ([f"missing from val/: {_names(missing)}"] if missing else []) + (
            [f"not in train/: {_names(extra)}"] if extra else [])
        same = sorted({unicodedata.normalize("NFC", n) for n in missing}
                      & {unicodedata.normalize("NFC", n) for n in extra})
        hint = (f" {_names(same)} {'is' if len(same) == 1 else 'are'} written with other Unicode characters in "
                "each split (composed and decomposed accents: macOS writes decomposed names); rename the folders of "
                "one split to the other's spelling." if same else "")
        cased = {n.casefold(): n for n in extra}
        cases = [f"{n} / {cased[n.casefold()]}" for n in missing if n.casefold() in cased]
        if cases and not same:  # a copy through a case-insensitive disk, or a script that changed the case
            hint = (f" {_names(cases)} differ only in case (train/ / val/): folder names are compared as "
                    "written; rename the folders of one split to the other's spelling.")
        raise DataError(
            f"Class folders of {root / 'val'} differ from {root / 'train'} ({'; '.join(parts)}). "
            f"Both splits need the same class folder names.{hint}"
        )
    if len(train_names) != num_classes:
        if trained is not None:  # the checkpoint's classes: name those the folders lack or add
            split = root / ("val" if val_only else "train")
            match_labels(trained, Labels(train_names, source=f"the class folders of {split}", key="data.root"))
        n = len(train_names)
        raise DataError(
            f"{root / ('val' if val_only else 'train')} has {n} class folders but data.num_classes is {num_classes}. "
            f"Set --data.num_classes {n} (or --model.num_classes {n} where it is not linked)."
        )
    train = [] if val_only else [(f, label) for label, name in enumerate(train_names) for f in splits["train"][name]]
    val = [(f, label) for label, name in enumerate(val_names) for f in splits["val"][name]]
    return ImageFolder(train_names, train, val, sorted(unread))


class ImageFileDataset(Dataset):
    """``(path, label)`` samples turned upright by their EXIF orientation and decoded to 8-bit RGB
    whatever their mode (:func:`~rescale_tasks.common.data.open_rgb`), then ``transform``.

    With ``skip_corrupt`` an undecodable file yields ``None`` (drop it with
    :func:`collate_drop_none`), is logged once and is flagged in the shared-memory
    tensor ``corrupt`` so the count is visible from the main process across workers. A file over
    Pillow's decompression-bomb warning limit is read and logged once (``large``, shared the same way).
    """

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable,
                 skip_corrupt: bool = False):
        self.samples = list(samples)
        self.transform = transform
        self.skip_corrupt = skip_corrupt
        self.corrupt = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()
        self.large = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()  # said over Pillow's warning limit

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def skipped(self) -> int:
        """Distinct corrupt files met so far (in any process)."""
        return int(self.corrupt.sum())

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            image = open_rgb(path)
        except DECODE_ERRORS as exc:
            what, fix = unreadable_image(path, exc)
            if not self.skip_corrupt:
                raise CorruptImageError(f"{what}. {fix} the file, or set --data.skip_corrupt true to skip unreadable "
                                        "images.") from None
            if not bool(self.corrupt[index]):
                self.corrupt[index] = True
                log.warning("skipping: %s", what)
            return None
        say_large_image(path, image, self.large, index)
        return self.transform(image), label


def collate_drop_none(batch: list, image_shape: Sequence[int] = (3, 0, 0)):
    """``default_collate`` after dropping ``None`` samples (corrupt files).

    A batch made only of corrupt files collates to empty tensors ``[0, *image_shape]``
    and ``[0]``; bind ``image_shape`` with ``functools.partial``.
    """
    kept = [sample for sample in batch if sample is not None]
    if kept:
        return default_collate(kept)
    return torch.empty(0, *image_shape), torch.empty(0, dtype=torch.long)


# ----------------------------------------------------------------------------- in-memory arrays


class TensorImageDataset(Dataset):
    """uint8 images ``[N, C, H, W]`` and int64 labels ``[N]`` held in memory, ``transform`` per item."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(self.images[index]), self.labels[index]


# ----------------------------------------------------------------------------- CIFAR pickles

_NUMPY_GLOBALS = {
    (module, name)
    for module in ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                   "numpy._core.numeric", "numpy")
    for name in ("_reconstruct", "scalar", "ndarray", "dtype", "_frombuffer")
} | {("_codecs", "encode")}  # protocol-2 pickles written by Python 3 encode bytes this way


class _ArrayUnpickler(pickle.Unpickler):
    """Loads plain containers and numpy arrays only, never arbitrary objects."""

    def find_class(self, module: str, name: str):
        if (module, name) in _NUMPY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


_REEXTRACT = "Re-extract the python version of the data set into --data.root."


def _unpickle(path: Path):
    """A CIFAR pickle (batch or meta file), numpy arrays and plain containers only."""
    try:
        with open(path, "rb") as f:
            return _ArrayUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # any unpickling failure means a damaged / foreign file
        raise DataError(f"Cannot read CIFAR file {path} ({type(exc).__name__}: {exc}). {_REEXTRACT}") from None


def read_cifar_batch(path: Path, label_key: bytes, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR python batch file -> uint8 images ``[N, 3, 32, 32]``, int64 labels ``[N]``."""
    if not path.is_file():
        raise DataError(
            f"CIFAR file not found: {path} (data.root). Extract the python version of the data set "
            "(cifar-10-python.tar.gz / cifar-100-python.tar.gz) into --data.root."
        )
    batch = _unpickle(path)
    how = _REEXTRACT
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise DataError(f"CIFAR file {path} is not a batch dict with b'data' and {label_key!r}. {how}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"CIFAR file {path}: b'data' is {data.dtype} {data.shape}, expected uint8 N x 3072. {how}")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"CIFAR file {path}: {len(data)} images but labels of shape {labels.shape}. {how}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"CIFAR file {path}: labels outside 0..{num_classes - 1}. Check --data.variant.")
    images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return images, torch.from_numpy(labels.astype(np.int64))


def read_cifar_names(path: Path, names_key: bytes, num_classes: int) -> list[str] | None:
    """The class names in a CIFAR meta file (``batches.meta``'s ``label_names``, CIFAR-100's
    ``meta``'s ``fine_label_names``), by label; None when there is no such file."""
    if not path.is_file():
        return None
    meta = _unpickle(path)
    names = meta.get(names_key) if isinstance(meta, dict) else None
    if (not isinstance(names, (list, tuple)) or len(names) != num_classes
            or not all(isinstance(n, (bytes, str)) for n in names)):
        raise DataError(f"CIFAR file {path} does not hold the {num_classes} class names as {names_key!r}. "
                        f"Check --data.variant. {_REEXTRACT}")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]


# ----------------------------------------------------------------------------- MNIST IDX files

IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 2051, 2049


def read_idx(path: Path, magic: int) -> torch.Tensor:
    """An uncompressed or ``.gz`` IDX file of unsigned bytes -> uint8 tensor of its dims."""
    how = "Re-download the file (or point --data.root at a good copy)."
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"Cannot read IDX file {path} ({type(exc).__name__}: {exc}). {how}") from None
    if len(raw) < 8:
        raise DataError(f"IDX file {path} is too short ({len(raw)} bytes) to hold a header. {how}")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        kind = "images" if magic == IDX_IMAGES_MAGIC else "labels"
        raise DataError(f"IDX file {path} has magic number {found}, expected {magic} ({kind}). {how}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX file {path} is too short ({len(raw)} bytes) for its {ndim}-d header. {how}")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise DataError(
            f"IDX file {path} has {len(raw)} bytes but its header {dims} implies {expected}. {how}"
        )
    array = np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)
    return torch.from_numpy(array.copy())


def find_file(name: str, dirs: Sequence[Path], root: Path, what: str) -> Path:
    """First ``dir/name`` or ``dir/name.gz`` in ``dirs``; DataError listing the search otherwise."""
    for d in dirs:
        for candidate in (d / name, d / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DataError(
        f"{what} file {name}[.gz] not found under {root} (data.root); looked in "
        f"{', '.join(str(d) for d in dirs)}. Point --data.root at the folder holding the IDX files."
    )


def read_idx_split(images_path: Path, labels_path: Path, size: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[N, 1, size, size]`` uint8 and labels ``[N]`` int64 from an IDX image/label pair."""
    images = read_idx(images_path, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC)
    if tuple(images.shape[1:]) != (size, size):
        raise DataError(
            f"IDX file {images_path} holds {tuple(images.shape[1:])} images, expected {size}x{size}. "
            "Re-download the file."
        )
    if len(images) != len(labels):
        raise DataError(
            f"IDX files disagree: {images_path} has {len(images)} images but {labels_path} has "
            f"{len(labels)} labels. Re-download both files."
        )
    if len(labels) and int(labels.max()) > 9:
        raise DataError(f"IDX file {labels_path} has labels above 9. Re-download the file.")
    return images.unsqueeze(1), labels.long()


__all__ = [
    "IMAGE_EXTENSIONS", "ImageFileDataset", "ImageFolder", "TensorImageDataset",
    "collate_drop_none", "find_file", "read_cifar_batch", "read_cifar_names", "read_idx", "read_idx_split",
    "scan_image_folder", "TINY_IMAGENET_NESTED",
]
