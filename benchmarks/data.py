"""DataLoader throughput of the task pipelines (images/s, tokens/s), on generated and real data.

Classification: :class:`rescale_tasks.classification.data.ImageFolderDataModule` (the ImageNet
pipeline: PIL decode, RandomResizedCrop, flip, normalise, collate) over a temporary folder of
generated JPEGs in the ImageNet layout (``train/<class>/*.JPEG``, ``val/<class>/*.JPEG``; ImageNet's
typical 500x375 size by default). The images are smooth random fields plus noise, so they
compress to realistic JPEG sizes instead of the tiny files of flat colours.

One measurement = one full pass (epoch) over the training loader, timed with
``torch.utils.benchmark.Timer``; the loader keeps its workers between passes
(``persistent_workers``), so worker start-up is excluded and the first, untimed pass of every
measurement warms the page cache. num_workers 0 and 2 are interleaved as paired repeats.

Translation: :class:`rescale_tasks.translation.data.TranslationDataModule`'s training loader
(token-budget batches, collation of padded source/target tensors) over real English-German
pairs: the German gettext catalogues Debian installs (``/usr/share/locale/de/LC_MESSAGES/*.mo``,
English UI strings with their human translations; read by
:mod:`rescale_tasks.translation.catalogues`), or the pairs given (the harness test gives the
suite's own, ``tests/data/translation``). :func:`translation_corpus` writes them
once as ``train/valid/test.{en,de}`` into a folder under the system's temp directory; the data
module trains its SentencePiece model and encodes the splits into its own content-keyed cache
there, so only the first run pays for them. Measured by the ``translation`` section
(:func:`translation_throughput`: target tokens/s, and the batches' padding efficiency).

Video: measured by the ``video_loader`` section (:mod:`benchmarks.video_loader`), which
:data:`PIPELINES` points to.
"""
from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from rescale_tasks.classification.data import ImageFolderDataModule
from rescale_tasks.translation.batching import padding_efficiency
from rescale_tasks.translation.catalogues import MO_DIR, catalogue_pairs
from rescale_tasks.translation.data import TranslationDataModule

from .timing import PairedTimes, paired_repeats, timer_measure

__all__ = ["make_image_folder", "classification_loader", "LoaderThroughput",
           "classification_throughput", "translation_corpus",
           "translation_datamodule", "TokenLoaderThroughput", "translation_throughput",
           "PIPELINES", "pending_pipelines"]


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


@contextmanager
def _released(*collections: dict):
    """Empty the loaders (and the measures holding them) afterwards and collect: their iterators
    stop their persistent workers when collected."""
    try:
        yield
    finally:
        for collection in collections:
            collection.clear()
        gc.collect()


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
        measures: dict = {}
        with _released(measures, loaders):
            counts = {name: _consume(loader)() for name, loader in loaders.items()}  # warm-up pass
            images = next(iter(counts.values()))
            measures.update({name: timer_measure(_consume(loader), min_run_time=min_run_time,
                                                 label="dataloader", description=name)
                             for name, loader in loaders.items()})
            if 0 in workers and torch.get_num_threads() > 1:
                # the main process decodes with num_workers=0: also time it at 1 torch thread,
                # the setting of worker processes (oversubscribed OpenMP threads can be 10x slower)
                measures["workers=0, 1 thread"] = timer_measure(
                    _consume(loaders["workers=0"]), min_run_time=min_run_time, label="dataloader",
                    description="workers=0, 1 thread", num_threads=1)
            paired = paired_repeats(measures, baseline=f"workers={workers[0]}", repeats=repeats,
                                    progress=progress)
    return LoaderThroughput(images, paired, image_size, source_size, batch_size)


# --- translation: real English-German pairs from the gettext catalogues ------------------------
# (the reader lives in the package, rescale_tasks.translation.catalogues, which the tests use too)


def translation_corpus(root: str | Path | None = None, num_pairs: int | None = None,
                       valid: int = 500, test: int = 500, mo_dir: str | Path = MO_DIR,
                       pairs: tuple[tuple[str, str], ...] | None = None) -> Path:
    """``train``/``valid``/``test`` ``.en``/``.de`` files of ``pairs`` (None: the catalogue pairs
    of ``mo_dir``) under ``root``
    (default: ``<tmp>/rescale_bench_translation/gettext_en_de_<n>``); the first ``valid`` +
    ``test`` pairs are held out, up to ``num_pairs`` pairs in all (None: every pair). A file is
    rewritten only when its text differs, so the data module's caches (SentencePiece model,
    encoded arrays, under ``root/rescale_cache``) stay valid from run to run. Without the
    catalogues, a ``root`` that already holds the six files is used as it is (a corpus copied
    from a machine that has them)."""
    pairs = catalogue_pairs(mo_dir) if pairs is None else pairs
    n = len(pairs) if num_pairs is None else min(int(num_pairs), len(pairs))
    if n < valid + test + 200:
        files = [Path(root) / f"{split}.{lang}" for split in ("train", "valid", "test") for lang in ("en", "de")] \
            if root is not None else []
        if files and all(f.is_file() for f in files):
            return Path(root)
        raise RuntimeError(f"only {len(pairs)} plain message pairs in {mo_dir}/*.mo; the translation "
                           f"benchmark needs {valid + test + 200} (install Debian's German locale "
                           "catalogues, e.g. the gettext/coreutils/... packages' de translations)")
    if root is None:
        root = Path(tempfile.gettempdir()) / "rescale_bench_translation" / f"gettext_en_de_{n}"
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    splits = {"valid": pairs[:valid], "test": pairs[valid:valid + test], "train": pairs[valid + test:n]}
    for split, rows in splits.items():
        for lang, side in (("en", 0), ("de", 1)):
            path = root / f"{split}.{lang}"
            text = "".join(f"{row[side]}\n" for row in rows)
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
    return root


def translation_datamodule(root: str | Path, vocab_size: int, max_tokens: int = 4096,
                           num_workers: int = 0, seed: int = 0):
    """The task's data module over ``root``, set up for fitting (trains/finds the SentencePiece
    model and the encoded splits in its cache); persistent workers, no pinned memory."""
    dm = TranslationDataModule(root=str(root), vocab_size=vocab_size, max_tokens=max_tokens,
                               num_workers=num_workers, pin_memory=False, persistent_workers=True,
                               seed=seed)
    dm.setup("fit")
    return dm


@dataclass
class TokenLoaderThroughput:
    """One epoch of the translation training loader: what it holds and how fast it is read."""

    paired: PairedTimes       # seconds per epoch, one entry per setting ("workers=0", ...)
    batches: int
    sentences: int
    target_tokens: int        # real (non-pad) target tokens, the unit of tokens/s
    real_tokens: int          # real source + target tokens (eos included)
    padded_positions: int     # source + target tensor elements
    padding_efficiency: float  # rescale_tasks.translation.batching.padding_efficiency of the batches
    max_tokens: int

    def tokens_per_second(self, name: str) -> float:
        return self.target_tokens / self.paired.seconds(name).median

    @property
    def tensor_efficiency(self) -> float:
        """Real tokens / padded positions counted on the collated tensors themselves."""
        return self.real_tokens / self.padded_positions


def _token_epoch(loader) -> Callable[[], tuple[int, int, int, int, int]]:
    def epoch() -> tuple[int, int, int, int, int]:
        batches = sentences = target = real = padded = 0
        for batch in loader:
            batches += 1
            sentences += int(batch["nsentences"])
            target += int(batch["ntokens"])
            real += int(batch["src_lengths"].sum()) + int(batch["ntokens"])
            padded += batch["src_tokens"].numel() + batch["target"].numel()
        return batches, sentences, target, real, padded
    return epoch


def translation_throughput(root: str | Path, vocab_size: int, workers: tuple[int, ...] = (0, 2), *,
                           max_tokens: int = 4096, repeats: int = 3, min_run_time: float = 0.2,
                           progress=None) -> TokenLoaderThroughput:
    """Paired target tokens/s of the translation training loader for each ``num_workers`` in
    ``workers`` (one measurement = one epoch, persistent workers), and the padding efficiency of
    its token-budget batches at ``max_tokens``."""
    loaders = {f"workers={w}": translation_datamodule(root, vocab_size, max_tokens, w).train_dataloader()
               for w in workers}
    measures: dict = {}
    with _released(measures, loaders):
        counts = {name: _token_epoch(loader)() for name, loader in loaders.items()}  # warm-up pass
        if len(set(counts.values())) != 1:
            raise RuntimeError(f"the loaders disagree on the epoch's contents: {counts}")
        batches, sentences, target, real, padded = next(iter(counts.values()))
        loader = next(iter(loaders.values()))
        dataset, sampler = loader.dataset, loader.sampler
        efficiency = padding_efficiency(sampler.batches, dataset.src_sizes, dataset.tgt_sizes)
        measures.update({name: timer_measure(_token_epoch(loader), min_run_time=min_run_time,
                                             label="translation loader", description=name)
                         for name, loader in loaders.items()})
        paired = paired_repeats(measures, baseline=f"workers={workers[0]}", repeats=repeats,
                                progress=progress)
    return TokenLoaderThroughput(paired, batches, sentences, target, real, padded, efficiency, max_tokens)


# The pipelines of the suite's tasks: name -> (their rescale_tasks module, unit, the section
# measuring them).
PIPELINES = {
    "classification (ImageFolder)": ("rescale_tasks.classification", "img", "data"),
    "video": ("rescale_tasks.video", "clip", "video_loader"),
    "translation": ("rescale_tasks.translation", "tok", "translation"),
}


def pending_pipelines() -> list[tuple[str, str]]:
    """(pipeline, reason) for the pipelines the data section does not measure."""
    return [(name, f"measured by the {section} section (--only {section})")
            for name, (_module, _unit, section) in PIPELINES.items() if section != "data"]
