"""Real English-German parallel text for the translation tests: the gettext catalogue pairs that
come with the suite (``en_de_pairs``, from ``tests/data/translation``), written as corpora.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.translation.catalogues import write_parallel_files as write_files

SPLIT_SIZES = {"train": 2000, "valid": 200, "test": 200}


def write_tsv(root: Path, splits: dict[str, list[tuple[str, str]]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        (root / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def gettext_splits(en_de_pairs) -> dict[str, list[tuple[str, str]]]:
    """2000 train / 200 valid / 200 test real English-German pairs."""
    splits, start = {}, 0
    for split, size in SPLIT_SIZES.items():
        splits[split] = list(en_de_pairs[start:start + size])
        start += size
    return splits


@pytest.fixture(scope="session")
def parallel_root(tmp_path_factory, gettext_splits) -> Path:
    """The splits written as ``train.en``/``train.de`` ... (shared: tests must not modify it)."""
    return write_files(tmp_path_factory.mktemp("gettext_en_de"), gettext_splits)


@pytest.fixture
def writers():
    """The writers, for tests that plant bad input in a corpus of their own."""
    return type("Writers", (), {"files": staticmethod(write_files), "tsv": staticmethod(write_tsv)})


@pytest.fixture(scope="session")
def handful_root(tmp_path_factory, en_de_pairs, short_pairs) -> Path:
    """32 short real pairs (2-4 English words) as train, valid and test alike: a Transformer
    overfits them in a few hundred steps, which proves the whole task learns."""
    pairs = short_pairs(en_de_pairs, 32)
    return write_files(tmp_path_factory.mktemp("handful_en_de"), {"train": pairs, "valid": pairs, "test": pairs})


@pytest.fixture(scope="session")
def few_hundred_root(tmp_path_factory, en_de_pairs, short_pairs) -> Path:
    """200 short real pairs (2-4 English words) as train, valid and test alike: the end-to-end
    test trains a small Transformer until it has learned them by heart."""
    pairs = short_pairs(en_de_pairs, 200)
    return write_files(tmp_path_factory.mktemp("few_hundred_en_de"), {"train": pairs, "valid": pairs, "test": pairs})
