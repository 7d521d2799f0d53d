"""Real English-German parallel text for the translation tests, from the system's gettext catalogues.

Debian installs compiled German message catalogues (``/usr/share/locale/de/LC_MESSAGES/*.mo``):
English UI strings (msgid) with their human German translations (msgstr), tens of thousands of
distinct pairs. :func:`read_mo` parses the GNU ``.mo`` format directly (magic, count, two tables
of (length, offset) entries); plural entries (NUL inside), entries with a context (EOT inside),
the header (empty msgid), untranslated or identical strings and anything spanning several lines
or holding a tab are skipped. The extraction is cached for the session.
"""
from __future__ import annotations

import functools
import random
import struct
from pathlib import Path

import pytest

MO_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
MO_MAGIC = 0x950412DE
SPLIT_SIZES = {"train": 2000, "valid": 200, "test": 200}


def read_mo(path: Path) -> list[tuple[str, str]]:
    """Plain single-line (msgid, msgstr) pairs of one compiled catalogue."""
    data = path.read_bytes()
    for order in "<>":
        if len(data) >= 20 and struct.unpack(order + "I", data[:4])[0] == MO_MAGIC:
            break
    else:
        return []
    count, originals, translations = struct.unpack(order + "3I", data[8:20])
    pairs = []
    for i in range(count):
        entries = [struct.unpack(order + "2I", data[table + 8 * i:table + 8 * i + 8])
                   for table in (originals, translations)]
        raw = [data[offset:offset + length] for length, offset in entries]
        if not raw[0] or any(b"\x00" in r or b"\x04" in r for r in raw):
            continue
        try:
            english, german = (r.decode("utf-8").strip() for r in raw)
        except UnicodeDecodeError:
            continue
        if not german or english == german or any(c in english + german for c in "\n\r\t\x0b\x0c"):
            continue
        if any(c.isalpha() for c in english):
            pairs.append((english, german))
    return pairs


@functools.lru_cache(maxsize=1)
def catalogue_pairs() -> tuple[tuple[str, str], ...]:
    """Distinct pairs of every catalogue (first translation of each English string), in a
    fixed shuffled order."""
    seen: dict[str, str] = {}
    for path in sorted(MO_DIR.glob("*.mo")):
        for english, german in read_mo(path):
            seen.setdefault(english, german)
    pairs = sorted(seen.items())
    random.Random(0).shuffle(pairs)
    return tuple(pairs)


def write_files(root: Path, splits: dict[str, list[tuple[str, str]]], src: str = "en", tgt: str = "de") -> Path:
    """``<split>.<src>`` / ``<split>.<tgt>`` line-aligned files under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        (root / f"{split}.{src}").write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
        (root / f"{split}.{tgt}").write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    return root


def write_tsv(root: Path, splits: dict[str, list[tuple[str, str]]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        (root / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def gettext_splits() -> dict[str, list[tuple[str, str]]]:
    """2000 train / 200 valid / 200 test real English-German pairs."""
    pairs = catalogue_pairs()
    needed = sum(SPLIT_SIZES.values())
    if len(pairs) < needed:
        pytest.skip(f"only {len(pairs)} plain message pairs in {MO_DIR}/*.mo; the tests need {needed} "
                    "(install Debian's German locale catalogues)")
    splits, start = {}, 0
    for split, size in SPLIT_SIZES.items():
        splits[split] = list(pairs[start:start + size])
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
def handful_root(tmp_path_factory) -> Path:
    """32 short real pairs (2-4 English words) as train, valid and test alike: a Transformer
    overfits them in a few hundred steps, which proves the whole task learns."""
    pairs = [p for p in catalogue_pairs() if 2 <= len(p[0].split()) <= 4][:32]
    if len(pairs) < 32:
        pytest.skip(f"too few short message pairs in {MO_DIR}/*.mo")
    return write_files(tmp_path_factory.mktemp("handful_en_de"), {"train": pairs, "valid": pairs, "test": pairs})


@pytest.fixture(scope="session")
def few_hundred_root(tmp_path_factory) -> Path:
    """200 short real pairs (2-4 English words) as train, valid and test alike: the end-to-end
    test trains a small Transformer until it has learned them by heart."""
    pairs = [p for p in catalogue_pairs() if 2 <= len(p[0].split()) <= 4][:200]
    if len(pairs) < 200:
        pytest.skip(f"too few short message pairs in {MO_DIR}/*.mo")
    return write_files(tmp_path_factory.mktemp("few_hundred_en_de"), {"train": pairs, "valid": pairs, "test": pairs})
