"""From text files to cached, encoded splits: the steps ``prepare-translation`` and the DataModule share.

1. find the splits under ``root`` (:mod:`.corpus`);
2. the SentencePiece model: ``spm_model`` when given (its special ids checked), else the cached
   model for the training text and options, trained now if missing (:mod:`.vocab`);
3. every split encoded into memory-mapped token arrays, cached by text and model (:mod:`.binarize`).

Every step is a no-op when its cache entry exists, so calling this on every DDP rank after rank 0
prepared the data costs the digests of the text files (remembered by size and mtime) and opening
the memory maps.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece as spm

from rescale_tasks.common.errors import DataError

from .binarize import EncodedSplit, encode_split
from .cache import resolve_cache_dir
from .corpus import Layout, SplitSource, find_splits, option_name
from .vocab import SpmOptions, load_spm, train_spm

__all__ = ["CorpusSettings", "PreparedCorpus", "prepare_corpus"]


@dataclass(frozen=True)
class CorpusSettings:
    """Where the text is and how it becomes tokens (see :class:`~.data.TranslationDataModule`)."""

    root: str
    src_lang: str = "en"
    tgt_lang: str = "de"
    layout: Layout = "auto"
    spm_model: str | None = None
    spm: SpmOptions = field(default_factory=SpmOptions)
    cache_dir: str | None = None


@dataclass
class PreparedCorpus:
    sources: dict[str, SplitSource]
    cache_dir: Path
    spm_model: Path
    processor: spm.SentencePieceProcessor
    encoded: dict[str, EncodedSplit]


def prepare_corpus(settings: CorpusSettings, flags: str = "--data.") -> PreparedCorpus:
    """Steps 1-3 for every split present; one-line :class:`DataError` on bad input. ``flags``: how
    the command at hand spells the options in its messages (``--`` for ``prepare-translation``)."""
    sources = find_splits(settings.root, settings.src_lang, settings.tgt_lang, settings.layout, flags=flags)
    root = Path(os.path.expanduser(str(settings.root)))
    cache_dir = resolve_cache_dir(root, settings.cache_dir, flags)
    if settings.spm_model:
        model_path = Path(os.path.expanduser(str(settings.spm_model)))
    elif "train" in sources:
        model_path = train_spm(sources["train"], settings.spm, cache_dir, flags=flags)
    else:
        raise DataError(f"no training text in {root} ({option_name('root', flags)}) to train the SentencePiece "
                        f"model on; add the train split, or pass {flags}spm_model PATH.")
    processor = load_spm(model_path, flags)
    encoded = {name: encode_split(source, processor, model_path, cache_dir) for name, source in sources.items()}
    return PreparedCorpus(sources, cache_dir, model_path, processor, encoded)
