"""Text files people hand the suite (parallel corpora, annotation and list files) in encodings other
than UTF-8, named with the conversion that fixes them.

Windows PowerShell's ``>`` and Notepad's "Unicode" write UTF-16 with a byte-order mark: every
character then takes two bytes, half of them zeros, so the file neither decodes as UTF-8 nor splits
into the lines it shows (a line break is ``\\n\\0``). Converting it from Latin-1, the usual advice for
a file that is not UTF-8, would make a valid UTF-8 file of that garbage; :func:`to_utf8_advice` names
the conversion from UTF-16 instead.

A compressed file (``news.en.gz``, a corpus as WMT distributes it) is not text at all: converted from
Latin-1 it becomes a valid UTF-8 file of noise, read without a word; :func:`to_utf8_advice` says to
decompress it instead.
"""
from __future__ import annotations

import codecs

__all__ = ["is_utf16", "to_utf8_advice"]

_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # UTF-32 LE's opens as UTF-16 LE's does


def is_utf16(head: bytes) -> bool:
    """Whether a text opening with the bytes ``head`` is UTF-16 (it opens with a UTF-16 byte-order mark)."""
    return head.startswith(_UTF16_BOMS)


#: how compressed files open (their magic bytes; bzip2's is ``BZh`` and a block size), what to do with each
_COMPRESSED = {b"\x1f\x8b": "it is gzip-compressed, not text: decompress it first (e.g. gunzip -k FILE)",
               b"\xfd7zXZ\x00": "it is xz-compressed, not text: decompress it first (e.g. unxz -k FILE)",
               b"(\xb5/\xfd": "it is zstd-compressed, not text: decompress it first (e.g. unzstd FILE)",
               b"PK\x03\x04": "it is a zip archive, not text: extract the text file from it (e.g. unzip FILE)",
               **dict.fromkeys((b"BZh%d" % size for size in range(1, 10)),
                               "it is bzip2-compressed, not text: decompress it first (e.g. bunzip2 -k FILE)")}


def to_utf8_advice(head: bytes) -> str:
    """How to convert a text that opens with the bytes ``head`` and is not UTF-8 into UTF-8 (or, for a
    compressed file, to get the text out of it)."""
    for magic, advice in _COMPRESSED.items():
        if head.startswith(magic):
            return advice
    if is_utf16(head):
        return ("it is UTF-16 (it opens with a UTF-16 byte-order mark, as Windows PowerShell's > and Notepad's "
                "'Unicode' write): convert it to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)")
    return "convert the text to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)"
