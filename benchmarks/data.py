"""DataLoader throughput of the task pipelines (images/s), on generated data.

Classification: :class:`rescale_tasks.classification.data.ImageFolderDataModule` (the ImageNet
pipeline: PIL decode, RandomResizedCrop, flip, normalise, collate) over a temporary folder of
generated JPEGs in the ImageNet layout (``train/<class>/*.JPEG``, ``val/<class>/*.JPEG``; ImageNet's
typical 500x375 size by default). The images are smooth random fields plus noise, so they
compress to realistic JPEG sizes instead of the tiny files of flat colours.

One measurement = one full pass (epoch) over the training loader, timed with
``torch.utils.benchmark.Timer``; the loader keeps its workers between passes
(``persistent_workers``), so worker start-up is excluded and the first, untimed pass of every
measurement warms the page cache. num_workers 0 and 2 are interleaved as paired repeats.

Video and translation pipelines join through :data:`PIPELINES` once their tasks exist in
``rescale_tasks`` (each entry builds a loader over generated data and names its unit).
"""
from __future__ import annotations

import gc
import importlib.util
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .timing import PairedTimes, paired_repeats, timer_measure

__all__ = ["make_image_folder", "classification_loader", "LoaderThroughput",
           "classification_throughput", "PIPELINES", "pending_pipelines"]


def make_image_folder(root: str | Path, num_classes: int = 4, train_per_class: int = 64,
                      val_per_class: int = 2, size: tuple[int, int] = (500, 375),
                      quality: int = 90, seed: int = 0) -> Path:
    """Write an ImageNet-layout folder of generated JPEGs under ``root``; returns ``root``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    w, h = size
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for c in range(num_classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                coarse = rng.integers(0, 256, (max(2, h // 48), max(2, w // 48), 3), dtype=np.uint8)
                image = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR), dtype=np.int16)
                image += rng.integers(-12, 13, image.shape, dtype=np.int16)
                Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(
                    folder / f"{split}_{c}_{i}.JPEG", quality=quality)
    return root


def classification_loader(root: str | Path, num_classes: int, batch_size: int, num_workers: int,
                          image_size: int = 224):
    from rescale_tasks.classification.data import ImageFolderDataModule

    dm = ImageFolderDataModule(root=str(root), num_classes=num_classes, image_size=image_size,
                               batch_size=batch_size, num_workers=num_workers, pin_memory=False,
                               persistent_workers=True)
    dm.setup("fit")
    return dm.train_dataloader()


def _consume(loader) -> Callable[[], int]:
    def epoch() -> int:
        n = 0
        for images, _labels in loader:
            n += images.shape[0]
        return n
    return epoch


@dataclass
class LoaderThroughput:
    images_per_epoch: int
    paired: PairedTimes       # seconds per epoch, one entry per setting ("workers=0", ...)
    image_size: int
    source_size: tuple[int, int]
    batch_size: int

    def images_per_second(self, name: str) -> float:
        return self.images_per_epoch / self.paired.seconds(name).median


def classification_throughput(workers: tuple[int, ...] = (0, 2), *, num_images: int = 256,
                              batch_size: int = 32, image_size: int = 224,
                              source_size: tuple[int, int] = (500, 375), repeats: int = 3,
                              min_run_time: float = 0.2, num_classes: int = 4,
                              progress=None) -> LoaderThroughput:
    """Paired images/s of the ImageNet training pipeline for each ``num_workers`` in ``workers``."""
    per_class = max(1, num_images // num_classes)
    with tempfile.TemporaryDirectory(prefix="bench_imagefolder_") as tmp:
        make_image_folder(tmp, num_classes, per_class, 1, source_size)
        loaders = {f"workers={w}": classification_loader(tmp, num_classes, batch_size, w, image_size)
                   for w in workers}
        measures = {}
        try:
            counts = {name: _consume(loader)() for name, loader in loaders.items()}  # warm-up pass
            images = next(iter(counts.values()))
            measures = {name: timer_measure(_consume(loader), min_run_time=min_run_time,
                                            label="dataloader", description=name)
                        for name, loader in loaders.items()}
            if 0 in workers and torch.get_num_threads() > 1:
                # the main process decodes with num_workers=0: also time it at 1 torch thread,
                # the setting of worker processes (oversubscribed OpenMP threads can be 10x slower)
                measures["workers=0, 1 thread"] = timer_measure(
                    _consume(loaders["workers=0"]), min_run_time=min_run_time, label="dataloader",
                    description="workers=0, 1 thread", num_threads=1)
            paired = paired_repeats(measures, baseline=f"workers={workers[0]}", repeats=repeats,
                                    progress=progress)
        finally:
            # the loaders' iterators stop their persistent workers when collected
            measures.clear()
            loaders.clear()
            gc.collect()
    return LoaderThroughput(images, paired, image_size, source_size, batch_size)


# The pipelines of the suite's tasks: name -> (rescale_tasks module that must exist, unit).
PIPELINES = {
    "classification (ImageFolder)": ("rescale_tasks.classification", "img"),
    "video": ("rescale_tasks.video", "clip"),
    "translation": ("rescale_tasks.translation", "sentence"),
}


def pending_pipelines() -> list[tuple[str, str]]:
    """(pipeline, reason) for the pipelines this harness does not measure yet."""
    out = []
    for name, (module, _unit) in PIPELINES.items():
        if name.startswith("classification"):
            continue
        present = importlib.util.find_spec(module.rsplit(".", 1)[0]) is not None and \
            importlib.util.find_spec(module) is not None
        out.append((name, f"{module} exists: add its loader to benchmarks/data.py" if present
                    else f"task not in the suite yet ({module})"))
    return out
