"""Parallel text as people have it: where each split is and how its lines are read.

Two layouts under ``root``, per split ``train``, ``valid``, ``test``:

- ``files``: line-aligned plain text, one file per language, ``<split>.<lang>`` (``train.en`` and
  ``train.de``): line i of one side translates line i of the other (fairseq-preprocess's
  ``--trainpref train --source-lang en --target-lang de``).
- ``tsv``: one file ``<split>.tsv`` of ``source<TAB>target`` lines.

``auto`` reads each split its own way: its ``<split>.<lang>`` files where there is one, else its
``<split>.tsv`` (``train.en``/``train.de`` beside ``valid.tsv`` and ``test.tsv``).

Lines are split on ``\\n`` only (a trailing ``\\r`` is removed): Python's text mode and
``str.splitlines`` also break at ``\\r``, form feeds and U+2028, which real corpora contain
inside sentences, and a single extra break would shift every later pair. Text must be UTF-8; a
byte-order mark at the start of a file (Windows editors write one) is not part of its first line, and
a UTF-16 file (Windows PowerShell's ``>``) is refused in one line saying so, and so is a file whose
lines break with ``\\r`` alone (classic Mac OS): all of it one line here, one pair for a whole split.
"""
from __future__ import annotations

import os
from codecs import BOM_UTF8
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Literal

from rescale_tasks.common.data import is_utf16, to_utf8_advice
from rescale_tasks.common.errors import ConfigError, DataError

__all__ = ["SPLITS", "LAYOUTS", "SplitSource", "find_splits", "count_lines", "read_lines", "option_name",
           "breaks_with_cr_only", "CR_ONLY"]

SPLITS = ("train", "valid", "test")
LAYOUTS = ("auto", "files", "tsv")
Layout = Literal["auto", "files", "tsv"]


def count_lines(path: Path) -> int:
    """Lines as :meth:`SplitSource.lines` yields them (a last line without ``\\n`` counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def breaks_with_cr_only(path: Path) -> bool:
    """Whether ``path`` breaks lines with ``\\r`` and never with ``\\n`` (classic Mac OS line breaks): all
    of it one line here. A ``\\r`` that only ends the file breaks nothing."""
    inner = pending = False
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            if b"\n" in block:
                return False
            inner = inner or pending or b"\r" in block[:-1]
            pending = block.endswith(b"\r")
    return inner


#: what breaking lines with ``\\r`` only is, and its mend (after "<file> breaks")
CR_ONLY = "lines with \\r only (classic Mac OS line endings): convert the \\r to \\n (e.g. tr '\\r' '\\n')"


def _refuse_cr_only(path: Path) -> None:
    """A one-line DataError for a file whose lines break with ``\\r`` only: read on ``\\n``, it is one
    line, so one sentence (or pair) would stand for the whole file."""
    if breaks_with_cr_only(path):
        raise DataError(f"{path} breaks {CR_ONLY}; as it is, all of it is one line (lines are split on \\n), "
                        "one sentence pair for the whole file.")


def _decode(raw: bytes, path: "Path | str", number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        advice = to_utf8_advice(raw if number == 1 else b"")
        raise DataError(f"{path} line {number} is not UTF-8 ({err.reason} at byte {err.start}); {advice}.") from None


def _refuse_utf16(path: Path) -> None:
    """A one-line DataError for a UTF-16 file, whose lines cannot even be counted as UTF-8 lines."""
    with open(path, "rb") as f:
        head = f.read(2)
    if is_utf16(head):
        raise DataError(f"{path} is not UTF-8: {to_utf8_advice(head)}.")


def _split_lines(stream: BinaryIO) -> Iterator[bytes]:
    for number, raw in enumerate(stream):  # binary iteration splits on b"\n" only
        if number == 0:
            raw = raw.removeprefix(BOM_UTF8)
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        yield raw[:-1] if raw.endswith(b"\r") else raw


def _raw_lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        yield from _split_lines(f)


def read_lines(stream: BinaryIO, where: str) -> list[str]:
    """The lines of a binary stream (a file opened ``rb``, ``sys.stdin.buffer``) split and decoded
    as the corpora are: on ``\\n`` only, UTF-8 without a leading byte-order mark, a line that is
    not UTF-8 one :class:`DataError` naming ``where`` and its line number."""
    return [_decode(raw, where, number) for number, raw in enumerate(_split_lines(stream), 1)]


@dataclass(frozen=True)
class SplitSource:
    """One split on disk: ``paths`` = (source file, target file) or (tsv file,)."""

    split: str
    layout: Literal["files", "tsv"]
    paths: tuple[Path, ...]

    def check(self) -> int:
        """The number of pairs; a :class:`DataError` when the two sides are not line-aligned."""
        for path in self.paths:  # its line breaks are \n\0: counted, they would misname the problem
            _refuse_utf16(path)
            _refuse_cr_only(path)
        if self.layout == "tsv":
            return count_lines(self.paths[0])
        src, tgt = self.paths
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            raise DataError(
                f"{src.name} has {n_src} lines but {tgt.name} has {n_tgt} (in {src.parent}): the two "
                "sides must be line-aligned, one sentence pair per line number; fix or remove the unmatched lines.")
        return n_src

    def lines(self, side: int) -> Iterator[str]:
        """The text of side 0 (source) or 1 (target), one string per pair, in file order."""
        if self.layout == "files":
            path = self.paths[side]
            for number, raw in enumerate(_raw_lines(path), 1):
                yield _decode(raw, path, number)
            return
        path = self.paths[0]
        for number, raw in enumerate(_raw_lines(path), 1):
            fields = raw.split(b"\t")
            if len(fields) != 2:
                raise DataError(f"{path} line {number} {_tsv_problem(raw, len(fields))}.")
            yield _decode(fields[side], path, number)


def _tsv_problem(raw: bytes, fields: int) -> str:
    """What is wrong with a TSV line that does not hold two tab-separated fields, and the fix."""
    needs = "a TSV corpus needs exactly 2 tab-separated fields per line (source<TAB>target)"
    if not raw.strip():
        return f"is blank; {needs}: remove the line, or write a tab on it for a pair of empty sentences"
    if fields == 1:
        return f"has no tab; {needs}: put a tab between the source and the target sentence"
    return f"has {fields} tab-separated fields; {needs}: remove tabs inside sentences or extra columns"


def option_name(option: str, flags: str = "--data.") -> str:
    """How a message names ``option`` for the command at hand (``flags`` as :func:`find_splits`
    takes them): ``data.root`` for ``rescale fit``; ``--cache_dir`` for ``rescale
    prepare-translation``, whose corpus folder is its root argument."""
    if flags == "--data.":
        return f"data.{option}"
    return "the root argument" if option == "root" else f"{flags}{option}"


def _check_lang(name: str, value: str, flags: str) -> None:
    if not value or os.sep in value or value.startswith("."):
        raise ConfigError(f"{option_name(name, flags)} must be a language code such as 'en', got {value!r}.")


def languages_in(folder: Path) -> list[str]:
    """The ``<lang>`` of every ``<split>.<lang>`` file in ``folder`` (``train.en`` -> ``en``)."""
    found = {p.suffix[1:] for p in folder.iterdir() if p.is_file() and p.stem in SPLITS and len(p.suffix) > 1}
    return sorted(found - {"tsv"})


def _language_hint(folder: Path, src_lang: str, tgt_lang: str, missing_side: str | None, flags: str) -> str:
    """``; the folder holds en, es: pass --tgt_lang es`` (empty when the folder names no other language)."""
    langs = languages_in(folder)
    if missing_side is not None:
        kept = tgt_lang if missing_side == "src" else src_lang
        others = [lang for lang in langs if lang not in (src_lang, tgt_lang, kept)]
        if not others:
            return ""
        choice = others[0] if len(others) == 1 else f"one of {', '.join(others)}"
        wanted = src_lang if missing_side == "src" else tgt_lang
        return (f"; {flags}{missing_side}_lang is {wanted} but the folder holds languages {', '.join(langs)}: "
                f"pass {flags}{missing_side}_lang {choice}")
    if len(langs) < 2:
        return ""
    return (f"; the folder holds languages {', '.join(langs)}: pass {flags}src_lang and {flags}tgt_lang "
            f"(e.g. {flags}src_lang {langs[0]} {flags}tgt_lang {langs[1]})")


def find_splits(root: str | os.PathLike, src_lang: str, tgt_lang: str,
                layout: Layout = "auto", flags: str = "--data.") -> dict[str, SplitSource]:
    """The splits present under ``root`` (at least ``train``, or ``valid``/``test`` alone).

    ``flags``: how the command at hand spells the options in its messages (``--data.`` for
    ``rescale fit``, ``--`` for ``rescale prepare-translation``)."""
    name = lambda option: option_name(option, flags)  # noqa: E731
    _check_lang("src_lang", src_lang, flags)
    _check_lang("tgt_lang", tgt_lang, flags)
    if src_lang == tgt_lang:
        raise ConfigError(f"{name('src_lang')} and {name('tgt_lang')} are both {src_lang!r}; give two languages.")
    if layout not in LAYOUTS:
        raise ConfigError(f"{name('layout')} must be one of {', '.join(LAYOUTS)}, got {layout!r}.")
    folder = Path(os.path.expanduser(str(root)))
    if not folder.is_dir():
        point = f"point {flags}root at" if flags == "--data." else "pass"
        raise DataError(f"translation data folder not found: {folder} ({name('root')}); {point} the folder "
                        f"holding train.{src_lang}/train.{tgt_lang} (or train.tsv).")
    def per_language(split: str) -> bool:
        return any((folder / f"{split}.{lang}").exists() for lang in (src_lang, tgt_lang))

    def tsv_only(split: str) -> bool:
        return not per_language(split) and (folder / f"{split}.tsv").exists()

    asked = layout
    if layout == "auto":  # for the messages: tsv when a split has a .tsv and no split a per-language file
        layout = "tsv" if not any(per_language(s) for s in SPLITS) and any(tsv_only(s) for s in SPLITS) else "files"
    found: dict[str, SplitSource] = {}
    for split in SPLITS:
        # auto: each split its own way (train.en/train.de beside valid.tsv and test.tsv)
        if layout == "tsv" or (asked == "auto" and tsv_only(split)):
            paths: tuple[Path, ...] = (folder / f"{split}.tsv",)
        else:
            paths = (folder / f"{split}.{src_lang}", folder / f"{split}.{tgt_lang}")
        present = [p.is_file() for p in paths]
        if all(present):
            found[split] = SplitSource(split, "tsv" if len(paths) == 1 else "files", paths)
        elif any(present):  # one side without the other
            missing = paths[present.index(False)]
            hint = _language_hint(folder, src_lang, tgt_lang, "src" if missing == paths[0] else "tgt", flags)
            raise DataError(f"{missing.name} is missing in {folder} ({name('root')}) although "
                            f"{paths[present.index(True)].name} is there"
                            + (hint or "; add it or remove the other side."))
    if not found:
        wanted = "train.tsv" if layout == "tsv" else f"train.{src_lang} and train.{tgt_lang}"
        listing = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
        hint = _language_hint(folder, src_lang, tgt_lang, None, flags) if layout == "files" else ""
        raise DataError(f"no parallel text in {folder} ({name('root')}): expected {wanted} (layout {layout}), "
                        f"found {listing}"
                        + (hint or f"; check {name('root')}, {name('src_lang')}/{name('tgt_lang')} and "
                           f"{name('layout')}."))
    return found
