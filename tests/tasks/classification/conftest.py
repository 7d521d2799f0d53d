"""Fixtures that write small real data sets in the real on-disk formats.

All pictures are scikit-learn's embedded 8x8 handwritten digits, upscaled, so they are real
images. The ``write_*`` functions are plain and reusable; the fixtures wrap them, and
``data_writers`` hands them to test modules elsewhere without importing this conftest.
"""
from __future__ import annotations

import functools
import gzip
import pickle
import types
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import pytest
from PIL import Image

IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 2051, 2049
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


class WrittenSplits(NamedTuple):
    """What a writer put on disk: ``root`` to pass as ``data.root`` plus the exact arrays."""

    root: Path
    train_images: np.ndarray  # uint8 [N, C, H, W]
    train_labels: np.ndarray  # int64 [N]
    test_images: np.ndarray
    test_labels: np.ndarray


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images * (255.0 / 16.0)).round().astype(np.uint8), d.target


def digit_pictures(labels: Sequence[int], size: int, offset: int = 0) -> np.ndarray:
    """uint8 ``[N, size, size]`` real digit pictures; picture i shows digit ``labels[i] % 10``.

    ``offset`` picks other examples of the same digit (so train and test differ).
    """
    images, targets = _digits()
    by_digit = [np.flatnonzero(targets == d) for d in range(10)]
    out = np.empty((len(labels), size, size), dtype=np.uint8)
    seen = [offset] * 10
    for i, label in enumerate(labels):
        digit = int(label) % 10
        src = images[by_digit[digit][seen[digit] % len(by_digit[digit])]]
        seen[digit] += 1
        out[i] = np.asarray(Image.fromarray(src).resize((size, size), Image.BILINEAR))
    return out


def _rgb(gray: np.ndarray, label: int) -> np.ndarray:
    """``[H, W]`` gray -> ``[3, H, W]`` with a label-dependent tint."""
    tint = np.array([1.0, 0.5 + 0.05 * (label % 10), 1.0 - 0.07 * (label % 10)])
    return (gray[None].astype(np.float64) * tint[:, None, None]).round().astype(np.uint8)


def write_imagefolder(root: Path, classes: Sequence[str] = ("n001", "n002", "n003"),
                      train_per_class: int = 4, val_per_class: int = 2, size: int = 40,
                      ext: str = ".JPEG") -> Path:
    """ImageNet layout ``root/{train,val}/<class>/<i><ext>``; class i shows digit i (RGB JPEGs)."""
    for split, count, offset in (("train", train_per_class, 0), ("val", val_per_class, 50)):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i, gray in enumerate(digit_pictures([label] * count, size, offset)):
                Image.fromarray(_rgb(gray, label).transpose(1, 2, 0), "RGB").save(folder / f"{name}_{i}{ext}")
    return root


def _cifar_images(labels: np.ndarray, offset: int) -> np.ndarray:
    return np.stack([_rgb(g, int(y)) for g, y in zip(digit_pictures(labels, 32, offset), labels)])


#: the class names the CIFAR meta files hold, by label (``batches.meta``'s ``label_names``, ``meta``'s
#: ``fine_label_names``)
CIFAR_NAMES = {
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
    "cifar100": """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
        camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup
        dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard
        lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter
        palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket
        rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper
        table tank telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf
        woman worm""".split(),
}


def write_cifar(root: Path, variant: str = "cifar10", n_per_file: int = 4, n_test: int = 6,
                meta: bool = True) -> WrittenSplits:
    """Standard python-pickle CIFAR files under ``root``: 5 x ``n_per_file`` (cifar10) or
    ``n_per_file`` (cifar100) training images and ``n_test`` test images, and (``meta``) the meta
    file naming the classes (``batches.meta`` / ``meta``, the names as bytes, as the tarballs hold them)."""
    cifar10 = variant == "cifar10"
    folder = root / ("cifar-10-batches-py" if cifar10 else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] if cifar10 else ["train"]
    n_classes = 10 if cifar10 else 100
    n_train = n_per_file * len(names)
    train_labels = (np.arange(n_train) * 7 + 3) % n_classes
    test_labels = (np.arange(n_test) * 13 + 5) % n_classes
    train_images, test_images = _cifar_images(train_labels, 0), _cifar_images(test_labels, 50)
    files = [(name, slice(i * n_per_file, (i + 1) * n_per_file)) for i, name in enumerate(names)]
    for name, images, labels in [(n, train_images[s], train_labels[s]) for n, s in files] + [
            ("test_batch" if cifar10 else "test", test_images, test_labels)]:
        batch = {b"batch_label": name.encode(), b"data": images.reshape(len(images), 3072),
                 b"filenames": [f"{name}_{i}.png".encode() for i in range(len(images))]}
        if cifar10:
            batch[b"labels"] = [int(y) for y in labels]
        else:
            batch[b"fine_labels"] = [int(y) for y in labels]
            batch[b"coarse_labels"] = [int(y) // 5 for y in labels]
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    names = [n.encode() for n in CIFAR_NAMES[variant]]
    if meta:
        content = ({b"num_cases_per_batch": n_per_file, b"label_names": names, b"num_vis": 3072} if cifar10 else
                   {b"fine_label_names": names, b"coarse_label_names": [f"super_{i}".encode() for i in range(20)]})
        with open(folder / ("batches.meta" if cifar10 else "meta"), "wb") as f:
            pickle.dump(content, f, protocol=2)
    return WrittenSplits(root, train_images, train_labels.astype(np.int64), test_images,
                         test_labels.astype(np.int64))


def write_idx(path: Path, array: np.ndarray, magic: int | None = None) -> Path:
    """An IDX file of unsigned bytes (``.gz``-compressed when ``path`` ends in ``.gz``)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    magic = (0x0800 | array.ndim) if magic is None else magic
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open(path, "wb") if path.suffix == ".gz" else open(path, "wb")) as f:
        f.write(header + array.tobytes())
    return path


def write_mnist(root: Path, n_train: int = 20, n_test: int = 10, subdir: str = "MNIST/raw",
                gz: Sequence[str] = ("t10k-labels-idx1-ubyte",)) -> WrittenSplits:
    """The four MNIST IDX files in ``root/subdir``; the names in ``gz`` are written as ``.gz``."""
    folder = root / subdir if subdir else root
    train_labels = np.arange(n_train) % 10
    test_labels = (np.arange(n_test) * 3 + 1) % 10
    train_images, test_images = digit_pictures(train_labels, 28), digit_pictures(test_labels, 28, 50)
    for name, array in zip(MNIST_FILES, (train_images, train_labels, test_images, test_labels)):
        write_idx(folder / (f"{name}.gz" if name in gz else name), array)
    return WrittenSplits(root, train_images[:, None], train_labels.astype(np.int64),
                         test_images[:, None], test_labels.astype(np.int64))


@pytest.fixture(scope="session")
def data_writers() -> types.SimpleNamespace:
    """The writer functions, for test modules that cannot import this conftest."""
    return types.SimpleNamespace(imagefolder=write_imagefolder, cifar=write_cifar, mnist=write_mnist,
                                 idx=write_idx, digit_pictures=digit_pictures, cifar_names=CIFAR_NAMES)


@pytest.fixture
def imagenet_folder(tmp_path: Path) -> Path:
    """3 classes (n001..n003) x 4 train + 2 val real 40x40 RGB JPEGs."""
    return write_imagefolder(tmp_path / "imagenet")


@pytest.fixture
def cifar10_written(tmp_path: Path) -> WrittenSplits:
    return write_cifar(tmp_path / "cifar", "cifar10")


@pytest.fixture
def cifar10_root(cifar10_written: WrittenSplits) -> Path:
    return cifar10_written.root


@pytest.fixture
def cifar100_written(tmp_path: Path) -> WrittenSplits:
    return write_cifar(tmp_path / "cifar", "cifar100", n_per_file=12, n_test=8)


@pytest.fixture
def cifar100_root(cifar100_written: WrittenSplits) -> Path:
    return cifar100_written.root


@pytest.fixture
def mnist_written(tmp_path: Path) -> WrittenSplits:
    return write_mnist(tmp_path / "mnist")


@pytest.fixture
def mnist_root(mnist_written: WrittenSplits) -> Path:
    return mnist_written.root
