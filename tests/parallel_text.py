"""Real parallel text that comes with the suite (``tests/data/translation``, its README says from
where): ``en_de_pairs`` and ``en_fr_pairs``, each a tuple of (English, translation) pairs in a
fixed shuffled order, so the first n of them are a sample of the whole; ``short_pairs(pairs, n)``
picks the first n of 2-4 English words."""
from __future__ import annotations

import lzma
import random
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "translation"


def shipped_pairs(tgt: str) -> tuple[tuple[str, str], ...]:
    with lzma.open(DATA / f"en-{tgt}.tsv.xz", "rt", encoding="utf-8", newline="\n") as f:
        pairs = [tuple(line.rstrip("\n").split("\t")) for line in f]
    random.Random(0).shuffle(pairs)
    return tuple(pairs)


@pytest.fixture(scope="session")
def en_de_pairs() -> tuple[tuple[str, str], ...]:
    """3168 English-German pairs."""
    return shipped_pairs("de")


@pytest.fixture(scope="session")
def en_fr_pairs() -> tuple[tuple[str, str], ...]:
    """5158 English-French pairs."""
    return shipped_pairs("fr")


def _short(pairs, count: int) -> list[tuple[str, str]]:
    short = [p for p in pairs if 2 <= len(p[0].split()) <= 4][:count]
    assert len(short) == count, f"the suite's corpus has only {len(short)} pairs of 2-4 English words"
    return short


@pytest.fixture(scope="session")
def short_pairs():
    """``short_pairs(pairs, n)``: the first ``n`` pairs of 2-4 English words."""
    return _short
