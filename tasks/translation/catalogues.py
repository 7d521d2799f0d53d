"""Real English-German parallel text every Debian machine has: its gettext catalogues.

Debian installs compiled German message catalogues (``/usr/share/locale/de/LC_MESSAGES/*.mo``):
English UI strings (msgid) with their human German translations (msgstr), tens of thousands of
distinct pairs (~39.6k plain ones on these machines). The tests and the benchmark build their
corpora from them (no download). :func:`read_mo` parses the GNU ``.mo`` format directly (magic,
count, two tables of (length, offset) entries); plural entries (NUL inside), entries with a
context (EOT inside), the header (empty msgid), untranslated or identical strings and anything
spanning several lines or holding a tab are skipped.
"""
from __future__ import annotations

import functools
import random
import struct
from pathlib import Path

__all__ = ["MO_DIR", "MO_MAGIC", "read_mo", "catalogue_pairs", "write_parallel_files"]

MO_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
MO_MAGIC = 0x950412DE


def read_mo(path: str | Path) -> list[tuple[str, str]]:
    """Plain single-line (msgid, msgstr) pairs of one compiled catalogue ([] if not a catalogue)."""
    data = Path(path).read_bytes()
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


@functools.lru_cache(maxsize=2)
def catalogue_pairs(mo_dir: str | Path = MO_DIR) -> tuple[tuple[str, str], ...]:
    """Distinct pairs of every catalogue in ``mo_dir`` (first translation of each English
    string), in a fixed shuffled order."""
    seen: dict[str, str] = {}
    for path in sorted(Path(mo_dir).glob("*.mo")):
        for english, german in read_mo(path):
            seen.setdefault(english, german)
    pairs = sorted(seen.items())
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
