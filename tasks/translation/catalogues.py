"""Real parallel text from gettext catalogues: English UI strings with their human translations.

A compiled message catalogue (``.mo``) holds English strings (msgid) with their translations
(msgstr). Debian installs them per language (``/usr/share/locale/de/LC_MESSAGES/*.mo``: tens of
thousands of distinct German pairs on a desktop machine, ~39.6k plain ones on these machines);
:func:`catalogue_pairs` turns such a folder into pairs and :func:`write_parallel_files` into a
corpus ``rescale prepare-translation`` reads (the English-French example of
``docs/tasks/translation.md``; the benchmark's default corpus). The suite's own corpus
(``tests/data/translation``) was extracted from the catalogues of permissively licensed Python
packages with :func:`parse_mo`.

:func:`parse_mo` reads the GNU ``.mo`` format directly (magic, count, two tables of (length,
offset) entries); plural entries (NUL inside), entries with a context (EOT inside), the header
(empty msgid), untranslated or identical strings and anything spanning several lines or holding a
tab are skipped.
"""
from __future__ import annotations

import functools
import random
import struct
from pathlib import Path
from typing import Iterable

__all__ = ["MO_DIR", "MO_MAGIC", "parse_mo", "read_mo", "distinct_pairs", "catalogue_pairs", "write_parallel_files"]

MO_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
MO_MAGIC = 0x950412DE


def read_mo(path: str | Path) -> list[tuple[str, str]]:
    """Plain single-line (msgid, msgstr) pairs of one compiled catalogue file ([] if not a catalogue)."""
    return parse_mo(Path(path).read_bytes())


def parse_mo(data: bytes) -> list[tuple[str, str]]:
    """Plain single-line (msgid, msgstr) pairs of a compiled catalogue's bytes ([] if not a catalogue)."""
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
            english, translated = (r.decode("utf-8").strip() for r in raw)
        except UnicodeDecodeError:
            continue
        if not translated or english == translated or any(c in english + translated for c in "\n\r\t\x0b\x0c"):
            continue
        if any(c.isalpha() for c in english):
            pairs.append((english, translated))
    return pairs


def distinct_pairs(catalogues: Iterable[Iterable[tuple[str, str]]]) -> list[tuple[str, str]]:
    """The first translation of each English string over ``catalogues`` (in their order), sorted."""
    seen: dict[str, str] = {}
    for pairs in catalogues:
        for english, translated in pairs:
            seen.setdefault(english, translated)
    return sorted(seen.items())


@functools.lru_cache(maxsize=2)
def catalogue_pairs(mo_dir: str | Path = MO_DIR) -> tuple[tuple[str, str], ...]:
    """Distinct pairs of every catalogue in ``mo_dir`` (:func:`distinct_pairs`), in a fixed
    shuffled order."""
    pairs = distinct_pairs(read_mo(path) for path in sorted(Path(mo_dir).glob("*.mo")))
    random.Random(0).shuffle(pairs)
    return tuple(pairs)


def write_parallel_files(root: str | Path, splits: dict[str, list[tuple[str, str]]],
                         src: str = "en", tgt: str = "de") -> Path:
    """``<split>.<src>`` / ``<split>.<tgt>`` line-aligned files under ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        (root / f"{split}.{src}").write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
        (root / f"{split}.{tgt}").write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    return root
