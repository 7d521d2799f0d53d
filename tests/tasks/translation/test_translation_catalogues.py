"""The gettext catalogue reader (the corpora of the translation guide's example and of the
benchmark), and the catalogue pairs that come with the suite, which every translation test reads."""
from __future__ import annotations

import struct
from pathlib import Path

from rescale_tasks.translation.catalogues import MO_MAGIC, catalogue_pairs, read_mo

SUITE_DATA = Path(__file__).resolve().parents[2] / "data" / "translation"


def write_mo(path: Path, entries: list[tuple[bytes, bytes]]) -> Path:
    """A little-endian compiled catalogue of ``entries`` (msgid, msgstr)."""
    n, header = len(entries), 28
    originals, translations = header, header + 8 * len(entries)
    blob, offset, tables = b"", header + 16 * n, ([], [])
    for pair in entries:
        for side, text in enumerate(pair):
            tables[side].append((len(text), offset + len(blob)))
            blob += text + b"\x00"
    data = struct.pack("<7I", MO_MAGIC, 0, n, originals, translations, 0, 0)
    path.write_bytes(data + b"".join(struct.pack("<2I", *e) for e in tables[0] + tables[1]) + blob)
    return path


def test_read_mo_reads_plain_pairs(tmp_path):
    """Only the plain single-line translated pair is kept."""
    entries = [(b"", b"Content-Type: text/plain; charset=UTF-8\n"), (b"Open file", "Datei \u00f6ffnen".encode()),
               (b"one\x00many", b"eins\x00viele"), (b"Same", b"Same"), (b"Two\nlines", b"Zwei\nZeilen")]
    assert read_mo(write_mo(tmp_path / "x.mo", entries)) == [("Open file", "Datei \u00f6ffnen")]
    assert catalogue_pairs(tmp_path) == (("Open file", "Datei \u00f6ffnen"),)


def test_the_suite_brings_its_own_parallel_text(en_de_pairs, en_fr_pairs, short_pairs, tmp_path):
    """The pairs the translation tests train and score on are files of the suite, as many as its
    README says and enough for every test, and each is a pair the catalogue reader keeps: no test
    depends on the catalogues a machine happens to have."""
    readme = (SUITE_DATA / "README.md").read_text(encoding="utf-8")
    for name, pairs in (("en-de", en_de_pairs), ("en-fr", en_fr_pairs)):
        assert f"| `{name}.tsv.xz` | {len(pairs)} |" in readme
        assert len({english for english, _ in pairs}) == len(pairs)
        entries = [(english.encode(), translated.encode()) for english, translated in pairs]
        assert sorted(read_mo(write_mo(tmp_path / f"{name}.mo", entries))) == sorted(pairs)
        assert len(short_pairs(pairs, 200)) == 200  # the end-to-end runs' corpora
    assert len(en_de_pairs) >= 2000 + 200 + 200  # the data tests' train, valid and test splits
