"""The corpus encoded once into memory-mapped token arrays (fairseq-preprocess's binarized data).

Each side of each split becomes three files in ``<cache>/tokens/``, named ``<split>-<key>``:
``.bin``, every sentence's piece ids back to back (uint16 when the vocabulary fits, else int32;
no eos stored: the batches add bos/eos, so the same arrays serve either translation direction);
``.offsets.npy``, int64 start offsets (n + 1 of them; sentence i is
``tokens[offsets[i]:offsets[i + 1]]``); ``.json`` (dtype, counts, and ``unk_pieces``: how many
pieces the SentencePiece model could only encode as ``<unk>``), written last, which marks the
entry complete. ``key`` hashes the text file, the column (TSV) and the SentencePiece model, so
a changed model or text re-encodes and nothing else does; an entry written before ``unk_pieces``
was stored gets it counted from its token file when first loaded (one pass over the memory map,
no encoding) and written back. Loading maps the files
(``np.memmap``): a cached 1M-pair corpus opens in under 0.1 s, the pages are shared by
DataLoader workers and DDP ranks on one machine, and only the lengths (int32, from the offsets)
are held in memory.

Deviation from fairseq's ``MMapIndexedDataset``: plain numpy files instead of its own index
format; same idea (one flat token file plus offsets).
"""
from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Iterator

import numpy as np
import sentencepiece as spm

from ..common.reporting import CountProgress
from ..common.system import atomic_open, usable_cores
from .cache import DIGEST_CHARS, digest_of, file_digest, write_atomic
from .corpus import SplitSource
from .vocab import UNK

__all__ = ["TokenArray", "EncodedSplit", "UnknownPieces", "encode_split", "unknown_pieces", "unknown_warning",
           "CHUNK_LINES", "UNK_WARN_PERCENT"]

log = logging.getLogger(__name__)

CHUNK_LINES = 50_000  # lines encoded per SentencePiece call (bounded memory on any corpus size)
_FORMAT = 1  # bump when the stored layout changes
UNK_WARN_PERCENT = 1.0  # default: warn when more than this percent of a split side's pieces are <unk>
_COUNT_CHUNK = 1 << 24  # tokens compared per step when counting <unk> in a stored array


class TokenArray:
    """Read-only sentences of one side: ``len``, ``sizes`` (tokens per sentence, without eos),
    ``unk_pieces`` (how many of ``num_tokens`` are ``<unk>``) and ``array[i]`` (an ndarray view).
    The memory map is opened lazily in each process and is not pickled (a pickled ``np.memmap``
    would copy the whole file into every worker)."""

    def __init__(self, tokens_path: Path, offsets_path: Path, dtype: str, num_tokens: int,
                 unk_pieces: int = 0) -> None:
        self.tokens_path, self.offsets_path = Path(tokens_path), Path(offsets_path)
        self.dtype, self.num_tokens, self.unk_pieces = np.dtype(dtype), int(num_tokens), int(unk_pieces)
        self.offsets = np.load(self.offsets_path, mmap_mode="r")
        self.sizes = np.diff(self.offsets).astype(np.int32)
        self._tokens: np.ndarray | None = None

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            if self.num_tokens == 0:  # mmap refuses empty files
                self._tokens = np.empty(0, dtype=self.dtype)
            else:
                self._tokens = np.memmap(self.tokens_path, dtype=self.dtype, mode="r", shape=(self.num_tokens,))
        return self._tokens

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_tokens", "offsets", "sizes")}

    def __setstate__(self, state: dict) -> None:  # re-mapped in the receiving process
        self.__init__(state["tokens_path"], state["offsets_path"], state["dtype"], state["num_tokens"],
                      state["unk_pieces"])

    def count_unknown(self) -> int:
        """The ``<unk>`` pieces in the token file (a pass over the memory map in bounded steps)."""
        tokens = self.tokens
        return sum(int(np.count_nonzero(tokens[i:i + _COUNT_CHUNK] == UNK))
                   for i in range(0, len(tokens), _COUNT_CHUNK))


@dataclass
class EncodedSplit:
    """Both sides of one split, aligned: pair i is ``(src[i], tgt[i])``."""

    split: str
    src: TokenArray
    tgt: TokenArray

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True)
class UnknownPieces:
    """The pieces of one side of one split that the SentencePiece model could only encode as
    ``<unk>``: a character it has no piece for (another script, a character dropped by
    ``character_coverage``) becomes ``<unk>``, and a run of them one ``<unk>``."""

    split: str
    lang: str
    unknown: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.unknown / self.total if self.total else 0.0

    def text(self) -> str:
        """``45.21% of the el side of train (1374 of 3039 pieces)``."""
        return (f"{self.percent:.2f}% of the {self.lang} side of {self.split} ({self.unknown} of "
                f"{self.total} pieces)")


def unknown_pieces(encoded: dict[str, EncodedSplit], langs: tuple[str, str]) -> list[UnknownPieces]:
    """The stored ``<unk>`` counts of every split and side (source, target), in split order."""
    return [UnknownPieces(name, lang, array.unk_pieces, array.num_tokens)
            for name, split in encoded.items() for lang, array in zip(langs, (split.src, split.tgt))]


def unknown_warning(count: UnknownPieces, model: Path, percent: float, flag: str, fix: str) -> str:
    """The line warning that ``count`` is over ``percent``: the rate, what it means and ``fix``;
    ``flag`` names the threshold option as the command at hand spells it."""
    return (f"unknown pieces: {count.text()} are <unk>: the SentencePiece model {model} cannot spell that text "
            f"(another script or alphabet than it was trained on?), so the network never sees its words; {fix} "
            f"(threshold: {flag} {percent:g})")


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(lines, size)):
        yield chunk


def _paths(stem: Path) -> tuple[Path, Path, Path]:
    """(tokens, offsets, meta) files of one cache entry."""
    return tuple(stem.parent / f"{stem.name}{suffix}" for suffix in (".bin", ".offsets.npy", ".json"))


def _load_side(stem: Path) -> TokenArray | None:
    tokens_path, offsets_path, meta_path = _paths(stem)
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    array = TokenArray(tokens_path, offsets_path, meta["dtype"], meta["num_tokens"], meta.get("unk_pieces", 0))
    if "unk_pieces" not in meta:  # an entry of an earlier version: counted once, from the stored tokens
        array.unk_pieces = meta["unk_pieces"] = array.count_unknown()
        try:
            write_atomic(meta_path, json.dumps(meta, indent=1).encode())
        except OSError:
            pass  # a cache that cannot be written: counted again next time
    return array


def _side_name(source: SplitSource, side: int) -> str:
    """``train.en``, or ``train.tsv (target)`` for a TSV corpus: the text a progress line is about."""
    if source.layout == "files":
        return source.paths[side].name
    return f"{source.paths[0].name} ({'source' if side == 0 else 'target'})"


def _encode_side(source: SplitSource, side: int, processor: spm.SentencePieceProcessor,
                 stem: Path, pairs: int | None = None) -> TokenArray:
    tokens_path, offsets_path, meta_path = _paths(stem)
    dtype = np.uint16 if processor.piece_size() <= np.iinfo(np.uint16).max + 1 else np.int32
    lengths: list[np.ndarray] = []
    unknown = 0
    with atomic_open(tokens_path, "wb") as out, CountProgress(f"encoding {_side_name(source, side)}", pairs,
                                                              "sentences", log) as progress:
        for chunk in _chunks(source.lines(side), CHUNK_LINES):
            ids = processor.encode(chunk, out_type=int, num_threads=usable_cores())
            sizes = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(sizes.sum()))
            out.write(flat.tobytes())
            lengths.append(sizes)
            unknown += int(np.count_nonzero(flat == UNK))
            progress.advance(len(chunk))
    sizes = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    buffer = io.BytesIO()
    np.save(buffer, offsets)
    write_atomic(offsets_path, buffer.getvalue())
    meta = {"dtype": np.dtype(dtype).name, "num_tokens": int(offsets[-1]), "num_sentences": len(sizes),
            "unk_pieces": unknown, "source": [str(p) for p in source.paths], "side": side}
    write_atomic(meta_path, json.dumps(meta, indent=1).encode())  # last: marks the entry complete
    return TokenArray(tokens_path, offsets_path, meta["dtype"], meta["num_tokens"], unknown)


def encode_split(source: SplitSource, processor: spm.SentencePieceProcessor, model_path: Path,
                 cache_dir: Path) -> EncodedSplit:
    """Both sides of ``source`` as token arrays, encoded now unless cached.

    Before encoding, checks that the sides are line-aligned (a one-line :class:`DataError`
    naming both counts); a cached entry was made from the same bytes, so it passed already."""
    model = file_digest(model_path, cache_dir)
    stems = []
    for side in (0, 1):
        text = file_digest(source.paths[min(side, len(source.paths) - 1)], cache_dir)
        column = side if source.layout == "tsv" else None
        key = digest_of("tokens", _FORMAT, text, column, model)[:DIGEST_CHARS]
        stems.append(cache_dir / "tokens" / f"{source.split}-{key}")
    arrays = [_load_side(stem) for stem in stems]
    if any(array is None for array in arrays):
        pairs = source.check()
        arrays = [array if array is not None else _encode_side(source, side, processor, stem, pairs)
                  for side, (array, stem) in enumerate(zip(arrays, stems))]
    return EncodedSplit(source.split, *arrays)
