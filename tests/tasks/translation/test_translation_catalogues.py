"""The gettext catalogue reader the tests and the benchmark build their corpora with."""
from __future__ import annotations

import struct

from rescale_tasks.translation.catalogues import MO_MAGIC, catalogue_pairs, read_mo


def test_read_mo_reads_plain_pairs(tmp_path):
    """A little-endian catalogue written here: only the plain single-line translated pair is kept."""
    entries = [(b"", b"Content-Type: text/plain; charset=UTF-8\n"), (b"Open file", "Datei \u00f6ffnen".encode()),
               (b"one\x00many", b"eins\x00viele"), (b"Same", b"Same"), (b"Two\nlines", b"Zwei\nZeilen")]
    n, header = len(entries), 28
    originals, translations = header, header + 8 * len(entries)
    blob, offset, tables = b"", header + 16 * n, ([], [])
    for i, pair in enumerate(entries):
        for side, text in enumerate(pair):
            tables[side].append((len(text), offset + len(blob)))
            blob += text + b"\x00"
    data = struct.pack("<7I", MO_MAGIC, 0, n, originals, translations, 0, 0)
    data += b"".join(struct.pack("<2I", *e) for e in tables[0] + tables[1]) + blob
    (tmp_path / "x.mo").write_bytes(data)
    assert read_mo(tmp_path / "x.mo") == [("Open file", "Datei \u00f6ffnen")]
    assert catalogue_pairs(tmp_path) == (("Open file", "Datei \u00f6ffnen"),)
