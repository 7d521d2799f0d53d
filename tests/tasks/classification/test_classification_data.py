"""Classification DataModules on small real data written in the real on-disk formats."""
from __future__ import annotations

import gzip
import logging
import pickle
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

from rescale_tasks.classification.data import (
    CIFARDataModule, ClassificationDataModule, DigitsDataModule, ImageFolderDataModule,
    MNISTDataModule,
)
from rescale_tasks.common.data import PaddedEvalSampler, UnrepeatedSampler
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.errors import ConfigError, DataError


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


def all_batches(loader):
    it = iter(loader)
    try:
        xs, ys = zip(*it)
    finally:  # else torch waits 5 s for a worker when a raised error's traceback is collected
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
    return torch.cat(xs), torch.cat(ys)


def check_batch(batch, channels: int, size: int, num_classes: int) -> None:
    x, y = batch
    assert type(x) is torch.Tensor and x.dtype == torch.float32
    assert x.ndim == 4 and x.shape[1:] == (channels, size, size)
    assert y.dtype == torch.int64 and y.shape == (x.shape[0],)
    assert 0 <= int(y.min()) and int(y.max()) < num_classes
    assert torch.isfinite(x).all() and -4 < x.min() < 0 < x.max() < 4  # normalised, not [0, 255]


# ----------------------------------------------------------------------------- attributes


@pytest.mark.parametrize("make, expected", [
    (lambda: ImageFolderDataModule("/nonexistent", num_classes=7, image_size=96, eval_resize=110), (7, 3, 96)),
    (lambda: ImageFolderDataModule("/nonexistent"), (1000, 3, 224)),
    (lambda: CIFARDataModule("/nonexistent"), (10, 3, 32)),
    (lambda: CIFARDataModule("/nonexistent", variant="cifar100"), (100, 3, 32)),
    (lambda: MNISTDataModule("/nonexistent", variant="fashion_mnist"), (10, 1, 28)),
    (lambda: DigitsDataModule(image_size=16), (10, 1, 16)),
])
def test_shape_attributes_known_without_disk(make, expected):
    dm = make()
    assert isinstance(dm, ClassificationDataModule)
    assert (dm.num_classes, dm.in_channels, dm.image_size) == expected
    assert dm.hparams["seed"] == 0 and "batch_size" in dm.hparams


def test_bad_config_values_raise_config_error():
    with pytest.raises(ConfigError, match="data.batch_size"):
        DigitsDataModule(batch_size=0)
    with pytest.raises(ConfigError, match="data.val_fraction"):
        DigitsDataModule(val_fraction=0.6, test_fraction=0.5)
    with pytest.raises(ConfigError, match="data.eval_resize"):
        ImageFolderDataModule("/x", image_size=224, eval_resize=200)
    with pytest.raises(ConfigError, match="data.variant"):
        CIFARDataModule("/x", variant="cifar1000")


# ----------------------------------------------------------------------------- digits


def test_digits_batches_and_standardisation():
    dm = DigitsDataModule(batch_size=32)
    dm.setup("fit")
    sizes = {k: len(v) for k, v in dm.split_indices.items()}
    assert sum(sizes.values()) == 1797 and sizes["test"] == 270 and sizes["val"] == 270
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        check_batch(next(iter(loader)), 1, 8, 10)
    train_x = dm.train_set.tensors[0]
    assert abs(float(train_x.mean())) < 1e-4 and abs(float(train_x.std()) - 1) < 1e-3
    loader = dm.train_dataloader()
    assert loader.drop_last and len(loader) == sizes["train"] // 32


def test_digits_split_deterministic_stratified_and_seeded():
    a, b, c = DigitsDataModule(seed=1), DigitsDataModule(seed=1), DigitsDataModule(seed=2)
    for dm in (a, b, c):
        dm.setup()
    for split in ("train", "val", "test"):
        assert torch.equal(a.split_indices[split], b.split_indices[split])
    assert not torch.equal(a.split_indices["test"], c.split_indices["test"])
    ids = torch.cat(list(a.split_indices.values()))
    assert len(ids.unique()) == 1797  # disjoint and complete
    overall = Counter(a.train_set.tensors[1].tolist() + a.val_set.tensors[1].tolist()
                      + a.test_set.tensors[1].tolist())
    for ds in (a.train_set, a.val_set, a.test_set):
        counts, n = Counter(ds.tensors[1].tolist()), len(ds)
        for cls in range(10):  # stratified: each class share within one image of the overall share
            assert abs(counts[cls] - overall[cls] * n / 1797) <= 1.0


def test_digits_resize_and_seeded_shuffle():
    dm = DigitsDataModule(batch_size=16, image_size=16, seed=3)
    dm.setup()
    check_batch(next(iter(dm.val_dataloader())), 1, 16, 10)
    first = next(iter(dm.train_dataloader()))[1]
    assert torch.equal(first, next(iter(dm.train_dataloader()))[1])  # same seed, same order
    other = DigitsDataModule(batch_size=16, image_size=16, seed=4)
    other.train_set = dm.train_set  # same data, only the shuffle seed differs
    assert not torch.equal(first, next(iter(other.train_dataloader()))[1])


def test_no_drop_last_when_dataset_smaller_than_batch():
    dm = DigitsDataModule(batch_size=4096)
    loader = dm.train_dataloader()  # set up on demand
    assert not loader.drop_last and len(next(iter(loader))[1]) == len(dm.train_set)


def test_digits_trains_with_lightning_trainer():
    import lightning.pytorch as L

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))

        def training_step(self, batch, _):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, _):
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(fast_dev_run=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(), datamodule=DigitsDataModule(batch_size=32))
    assert torch.isfinite(trainer.callback_metrics["val_loss"])


# ----------------------------------------------------------------------------- CIFAR


def test_cifar10_round_trip(cifar10_written):
    w = cifar10_written
    dm = CIFARDataModule(str(w.root), batch_size=8, num_workers=0, augment=False)
    dm.setup("fit")
    assert torch.equal(dm.train_set.images, torch.from_numpy(w.train_images))
    assert dm.train_set.labels.tolist() == w.train_labels.tolist()
    assert dm.test_set.labels.tolist() == w.test_labels.tolist() and dm.val_set is dm.test_set
    x, y = all_batches(dm.test_dataloader())
    assert y.tolist() == w.test_labels.tolist()
    check_batch((x, y), 3, 32, 10)
    mean, std = torch.tensor([0.4914, 0.4822, 0.4465]), torch.tensor([0.2470, 0.2435, 0.2616])
    expected = (torch.from_numpy(w.test_images).float() / 255 - mean[:, None, None]) / std[:, None, None]
    torch.testing.assert_close(x, expected)
    check_batch(next(iter(CIFARDataModule(str(w.root), batch_size=8, num_workers=0).train_dataloader())),
                3, 32, 10)


def test_cifar_root_may_be_the_batches_folder_and_val_split(cifar10_written):
    w = cifar10_written
    dm = CIFARDataModule(str(w.root / "cifar-10-batches-py"), val_split=5, num_workers=0, seed=1)
    dm.setup()
    assert len(dm.val_set) == 5 and len(dm.train_set) == 15
    assert sorted(dm.train_set.labels.tolist() + dm.val_set.labels.tolist()) == sorted(w.train_labels.tolist())
    again = CIFARDataModule(str(w.root), val_split=5, num_workers=0, seed=1)
    again.setup()
    assert torch.equal(again.val_set.images, dm.val_set.images)
    with pytest.raises(ConfigError, match="data.val_split"):
        CIFARDataModule(str(w.root), val_split=20).setup()


def test_cifar100_fine_labels_round_trip(cifar100_written):
    w = cifar100_written
    dm = CIFARDataModule(str(w.root), variant="cifar100", batch_size=4, num_workers=0)
    dm.setup()
    assert dm.train_set.labels.tolist() == w.train_labels.tolist() and max(w.train_labels) > 10
    assert dm.test_set.labels.tolist() == w.test_labels.tolist()
    check_batch(next(iter(dm.train_dataloader())), 3, 32, 100)


def test_cifar_class_names_come_from_the_meta_file_and_are_matched_by_name(data_writers, tmp_path: Path):
    """CIFAR-100's meta file names its 100 classes: a CIFAR-100 checkpoint records them and is matched
    by name against other data (the same classes in another order mapped, other classes refused)."""
    from rescale_tasks.common.data import Labels, data_labels, match_labels

    CIFAR_NAMES = data_writers.cifar_names
    root = data_writers.cifar(tmp_path / "c100", "cifar100", n_per_file=4, n_test=2).root
    dm = CIFARDataModule(str(root), variant="cifar100", num_workers=0)
    dm.setup("test")
    trained = data_labels(dm)
    assert trained is not None and list(trained.names) == CIFAR_NAMES["cifar100"]
    assert "cifar-100-python" in trained.source and trained.key == "data.root"
    order, _ = match_labels(trained, Labels(trained.names[::-1]))
    assert list(order) == list(range(99, -1, -1))
    with pytest.raises(DataError, match="not in the data: 'apple'"):
        match_labels(trained, Labels(["cat", *trained.names[1:]]))
    ten = CIFARDataModule(str(data_writers.cifar(tmp_path / "c10", "cifar10", n_per_file=1, n_test=2).root),
                          num_workers=0)
    ten.setup("test")
    assert data_labels(ten).names == tuple(CIFAR_NAMES["cifar10"])
    without = data_writers.cifar(tmp_path / "bare", "cifar100", n_per_file=1, n_test=2, meta=False).root
    bare = CIFARDataModule(str(without), variant="cifar100", num_workers=0)
    bare.setup("test")
    assert bare.labels() is None  # no meta file: no names to record (as before)
    (root / "cifar-100-python" / "meta").write_bytes(pickle.dumps({b"fine_label_names": [b"apple"]}, protocol=2))
    with pytest.raises(DataError) as e:
        CIFARDataModule(str(root), variant="cifar100").setup()
    assert "does not hold the 100 class names as b'fine_label_names'" in one_line(e)


def test_cifar_missing_and_bad_files(cifar10_root: Path, tmp_path: Path):
    with pytest.raises(DataError) as e:
        CIFARDataModule(str(tmp_path / "nope")).setup()
    assert str(tmp_path / "nope") in one_line(e) and "data.root" in str(e.value)
    with pytest.raises(DataError) as e:
        CIFARDataModule(str(cifar10_root), variant="cifar100").setup()
    assert "cifar-100-python" in one_line(e)

    batches = cifar10_root / "cifar-10-batches-py"
    (batches / "data_batch_3").unlink()
    with pytest.raises(DataError) as e:
        CIFARDataModule(str(cifar10_root)).setup()
    assert str(batches / "data_batch_3") in one_line(e) and "not found" in str(e.value)

    (batches / "data_batch_3").write_bytes(b"\x80\x02 not a pickle")
    with pytest.raises(DataError) as e:
        CIFARDataModule(str(cifar10_root)).setup()
    assert str(batches / "data_batch_3") in one_line(e)

    (batches / "data_batch_3").write_bytes(pickle.dumps(shutil.rmtree, protocol=2))  # no code runs
    with pytest.raises(DataError, match="refusing to load shutil.rmtree"):
        CIFARDataModule(str(cifar10_root)).setup()

    (batches / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8),
                                                         b"labels": [0, 1]}))
    with pytest.raises(DataError) as e:
        CIFARDataModule(str(cifar10_root)).setup()
    assert str(batches / "data_batch_3") in one_line(e) and "3072" in str(e.value)


# ----------------------------------------------------------------------------- MNIST

MNIST_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def test_mnist_round_trip_with_gz_in_torchvision_layout(mnist_written):
    w = mnist_written
    assert (w.root / "MNIST/raw/t10k-labels-idx1-ubyte.gz").is_file()
    dm = MNISTDataModule(str(w.root), batch_size=6, num_workers=0)
    dm.setup()
    assert torch.equal(dm.train_set.images, torch.from_numpy(w.train_images))
    assert dm.train_set.labels.tolist() == w.train_labels.tolist()
    assert dm.test_set.labels.tolist() == w.test_labels.tolist()
    x, y = all_batches(dm.val_dataloader())
    assert y.tolist() == w.test_labels.tolist()
    check_batch((x, y), 1, 28, 10)
    torch.testing.assert_close(x, (torch.from_numpy(w.test_images).float() / 255 - 0.1307) / 0.3081)
    check_batch(next(iter(dm.train_dataloader())), 1, 28, 10)


def test_fashion_mnist_reads_root_and_not_mnist_folder(data_writers, tmp_path: Path):
    w = data_writers.mnist(tmp_path, subdir="", gz=MNIST_NAMES)
    dm = MNISTDataModule(str(tmp_path), variant="fashion_mnist", num_workers=0)
    dm.setup()
    assert dm.train_set.labels.tolist() == w.train_labels.tolist()
    other = tmp_path / "other"
    data_writers.mnist(other, subdir="MNIST/raw")
    with pytest.raises(DataError) as e:
        MNISTDataModule(str(other), variant="fashion_mnist").setup()
    assert "train-images-idx3-ubyte" in one_line(e) and str(other / "FashionMNIST/raw") in str(e.value)


def test_the_variants_own_folder_comes_first_and_the_other_sets_pixels_are_named(data_writers, tmp_path: Path,
                                                                                caplog):
    # loose files in root (another set's) beside torchvision's FashionMNIST/raw: the variant's folder wins
    data_writers.mnist(tmp_path, n_train=30, subdir="")
    fashion = data_writers.mnist(tmp_path, n_train=20, subdir="FashionMNIST/raw")
    dm = MNISTDataModule(str(tmp_path), variant="fashion_mnist", num_workers=0)
    dm.setup()
    assert dm.train_set.labels.tolist() == fashion.train_labels.tolist()
    # Fashion-MNIST's pixels (mean 0.286) read as MNIST: named in one warning line
    clothes = tmp_path / "clothes"
    data_writers.mnist(clothes, subdir="")
    data_writers.idx(clothes / "train-images-idx3-ubyte", np.full((20, 28, 28), 73, np.uint8))
    with caplog.at_level(logging.WARNING):
        MNISTDataModule(str(clothes), num_workers=0).setup()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "fashion_mnist's (0.286)" in warned[0] and "--data.variant fashion_mnist" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        MNISTDataModule(str(clothes), variant="fashion_mnist", num_workers=0).setup()
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_mnist_bad_files(mnist_root: Path, data_writers, tmp_path: Path):
    raw = mnist_root / "MNIST/raw"
    with pytest.raises(DataError) as e:
        MNISTDataModule(str(tmp_path / "nope")).setup()
    assert str(tmp_path / "nope") in one_line(e)

    labels = raw / "train-labels-idx1-ubyte"
    data_writers.idx(labels, np.zeros(20, np.uint8), magic=2051)
    with pytest.raises(DataError) as e:
        MNISTDataModule(str(mnist_root)).setup()
    assert str(labels) in one_line(e) and "2051" in str(e.value) and "2049" in str(e.value)

    data_writers.idx(labels, np.zeros(19, np.uint8))
    with pytest.raises(DataError, match="20 images but .* has 19 labels"):
        MNISTDataModule(str(mnist_root)).setup()

    labels.write_bytes(labels.read_bytes()[:-3])  # header says 19, fewer bytes follow
    with pytest.raises(DataError) as e:
        MNISTDataModule(str(mnist_root)).setup()
    assert str(labels) in one_line(e) and "bytes" in str(e.value)

    gz = raw / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gzip.compress(b"x" * 100)[:20])  # truncated gzip stream
    labels.unlink()
    data_writers.idx(labels, np.zeros(20, np.uint8))
    with pytest.raises(DataError) as e:
        MNISTDataModule(str(mnist_root)).setup()
    assert str(gz) in one_line(e)

    gz.unlink()
    with pytest.raises(DataError) as e:
        MNISTDataModule(str(mnist_root)).setup()
    assert "t10k-labels-idx1-ubyte[.gz] not found" in one_line(e) and str(raw) in str(e.value)


# ----------------------------------------------------------------------------- ImageFolder


def folder_dm(root: Path, **kw) -> ImageFolderDataModule:
    kw = {"num_classes": 3, "image_size": 32, "eval_resize": 36, "batch_size": 4, "num_workers": 0,
          "persistent_workers": False, **kw}
    return ImageFolderDataModule(str(root), **kw)


def test_imagefolder_batches(imagenet_folder: Path):
    dm = folder_dm(imagenet_folder)
    dm.setup("fit")
    assert dm.class_names == ["n001", "n002", "n003"]
    assert len(dm.train_set) == 12 and len(dm.val_set) == 6 and dm.test_set is dm.val_set
    x, y = all_batches(dm.train_dataloader())
    assert x.shape[0] == 12 and sorted(y.tolist()) == [0] * 4 + [1] * 4 + [2] * 4
    check_batch((x, y), 3, 32, 3)
    x, y = all_batches(dm.test_dataloader())
    assert y.tolist() == [0, 0, 1, 1, 2, 2]  # labels follow the sorted class folders
    check_batch((x, y), 3, 32, 3)
    assert dm.skipped_corrupt == 0


def test_imagefolder_layout_errors(imagenet_folder: Path, tmp_path: Path):
    missing = tmp_path / "missing"
    with pytest.raises(DataError) as e:
        folder_dm(missing).setup()
    assert one_line(e).startswith(f"ImageNet folder not found: {missing} (data.root).")

    with pytest.raises(DataError) as e:
        folder_dm(imagenet_folder, num_classes=1000).setup()
    assert str(imagenet_folder / "train") in one_line(e) and "--data.num_classes 3" in str(e.value)

    (imagenet_folder / "train/n004").mkdir()
    with pytest.raises(DataError) as e:
        folder_dm(imagenet_folder).setup()
    assert str(imagenet_folder / "train") in one_line(e) and "n004" in str(e.value)

    (imagenet_folder / "train/n004/a.JPEG").write_bytes((imagenet_folder / "val/n001/n001_0.JPEG").read_bytes())
    with pytest.raises(DataError) as e:
        folder_dm(imagenet_folder, num_classes=4).setup()
    assert str(imagenet_folder / "val") in one_line(e) and "missing from val/: n004" in str(e.value)

    shutil.rmtree(imagenet_folder / "val")
    with pytest.raises(DataError) as e:
        folder_dm(imagenet_folder, num_classes=4).setup()
    assert "no val/" in one_line(e) and str(imagenet_folder) in str(e.value)


def test_imagefolder_no_class_folders(tmp_path: Path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError) as e:
        folder_dm(tmp_path).setup()
    assert f"No class folders in {tmp_path / 'train'}" in one_line(e)


@pytest.fixture
def corrupt_folder(imagenet_folder: Path) -> tuple[Path, Path]:
    good = imagenet_folder / "train/n002/n002_0.JPEG"
    bad = imagenet_folder / "train/n002/broken.JPEG"
    bad.write_bytes(good.read_bytes()[:200])  # truncated JPEG
    (imagenet_folder / "val/n003/garbage.jpg").write_bytes(b"this is not an image")
    return imagenet_folder, bad


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_image_raises_one_line(corrupt_folder, workers):
    root, bad = corrupt_folder
    with pytest.raises(DataError) as e:
        all_batches(folder_dm(root, num_workers=workers, batch_size=16).train_dataloader())
    assert str(bad) in one_line(e) and "--data.skip_corrupt true" in str(e.value)


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_images_skipped_and_counted(corrupt_folder, workers):
    root, _ = corrupt_folder
    dm = folder_dm(root, num_workers=workers, batch_size=16, skip_corrupt=True)  # no drop_last
    for _ in range(2):  # a second epoch does not count the same file twice
        x, y = all_batches(dm.train_dataloader())
    assert len(dm.train_set) == 13 and x.shape[0] == 12
    assert dm.skipped_corrupt == 1  # counted in the worker, visible here
    x, y = all_batches(dm.val_dataloader())
    assert x.shape[0] == 6 and dm.skipped_corrupt == 2
    check_batch((x, y), 3, 32, 3)


def test_evaluation_shards_images_without_repeats_or_marks_the_padding_where_every_forward_is_a_collective(
        imagenet_folder):
    """Validation, test and predict give each image to one process (no padding counted twice in the
    metrics); under a strategy that shards the parameters (FSDP: a forward is a collective, which
    a rank with one batch more than the others would wait in forever) the split is padded and each
    batch ends with the mask of its real images (common.data.eval_sampler)."""
    data = ImageFolderDataModule(str(imagenet_folder), num_classes=3, image_size=32,
                                 eval_resize=36, batch_size=2, num_workers=0)
    data.trainer = SimpleNamespace(strategy=DDPStrategy())
    for loader in (data.val_dataloader(), data.test_dataloader(), data.predict_dataloader()):
        assert isinstance(loader.sampler, UnrepeatedSampler)
    data.trainer = SimpleNamespace(strategy=FSDPStrategy())
    for loader in (data.val_dataloader(), data.test_dataloader(), data.predict_dataloader()):
        assert isinstance(loader.sampler, PaddedEvalSampler)
        x, y, real = next(iter(loader))
        assert real.tolist() == [True, True]  # one process: nothing padded


def test_classification_evaluation_leaves_the_padded_images_out(tmp_path):
    """Under a sharded strategy the padded images are run but counted nowhere: val/acc1, val/acc5
    and val/loss of a batch with its mask are those of its real images alone."""
    torch.manual_seed(0)
    module = ClassificationModule("cifar_resnet", scheme="rescale", num_classes=3,
                                  network_options={"depth": 8, "base_width": 4}).eval()
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    real = torch.tensor([True, True, True, False])
    with torch.no_grad():
        module.evaluate_batch((x, y, real), "val")
        module.evaluate_batch((x[:3], y[:3]), "test")
    for name in ("acc1", "acc5", "loss"):
        assert float(getattr(module, f"val_{name}").compute()) == pytest.approx(
            float(getattr(module, f"test_{name}").compute()), rel=1e-6)


# --- the export sidecar's preprocessing, followed outside the suite ---------------------------------------

def apply_sidecar(pre: dict, image: np.ndarray) -> np.ndarray:
    """What a runtime does with the sidecar's ``preprocessing`` and numpy and PIL alone: a stored uint8
    ``[H, W, C]`` (or ``[H, W]``) image -> the ``[C, H, W]`` network input."""
    from PIL import Image

    picture = Image.fromarray(image)
    resize = pre["resize"]
    if resize is not None:
        assert resize["interpolation"] == "bilinear" and resize["antialias"], resize  # what PIL's resize does
        width, height = picture.size
        short = resize["size"]
        assert resize["to"] == "shorter side", resize
        picture = picture.resize((short, height * short // width) if width <= height else
                                 (width * short // height, short), Image.BILINEAR)
    x = np.asarray(picture, np.float32).reshape(picture.size[1], picture.size[0], -1)
    if pre["center_crop"] is not None:
        side = pre["center_crop"]
        top, left = (x.shape[0] - side) // 2, (x.shape[1] - side) // 2
        x = x[top:top + side, left:left + side]
    x = (x * pre["pixel_scale"] - np.asarray(pre["mean"], np.float32)) / np.asarray(pre["std"], np.float32)
    assert pre["layout"] == "NCHW" and x.shape[-1] == pre["channels"]
    return x.transpose(2, 0, 1)


@pytest.mark.parametrize("family", ["imagefolder", "cifar", "mnist"])
def test_the_sidecar_preprocessing_turns_a_stored_image_into_the_evaluation_input(family, data_writers, tmp_path):
    """The ``preprocessing`` is read off the evaluation transform (so it cannot drift from it):
    followed with numpy and PIL on the stored image, it gives the tensor the data module evaluates."""
    from PIL import Image

    if family == "imagefolder":
        module = ImageFolderDataModule(str(data_writers.imagefolder(tmp_path / "in")), num_classes=3, image_size=32,
                                       eval_resize=36, num_workers=0)
        module.setup("fit")
        image = np.asarray(Image.open(module.val_set.samples[0][0]).convert("RGB"))
        tolerance = 2 / 255 / min(module.export_preprocessing()["std"])  # two levels: PIL's and torch's resize
    else:
        written = data_writers.cifar(tmp_path / "c") if family == "cifar" else data_writers.mnist(tmp_path / "m")
        module = (CIFARDataModule if family == "cifar" else MNISTDataModule)(str(written.root), num_workers=0)
        module.setup("fit")
        image = written.test_images[0].reshape(-1, *written.test_images.shape[-2:]).transpose(1, 2, 0)
        image = image[..., 0] if image.shape[-1] == 1 else image  # [H, W]: a gray picture
        tolerance = 1e-5
    expected = module.val_set[0][0].numpy()
    got = apply_sidecar(module.export_preprocessing(), image)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= tolerance
