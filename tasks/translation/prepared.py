"""What ``rescale prepare-translation`` recorded about a corpus, where ``rescale fit`` reads it.

``prepared.json`` in the corpus's cache folder (``<root>/rescale_cache/``, the user's cache
folder for a read-only root, or ``--cache_dir``) holds, per corpus folder, the language pairs
prepared there (newest last) with their SentencePiece model and its vocabulary size. A
:class:`~.data.TranslationDataModule` whose ``src_lang``, ``tgt_lang`` or ``vocab_size`` are not
set takes them from the newest entry that agrees with those set, so the values given to
``prepare-translation`` are not repeated on every run.

A model ``prepare-translation`` trained is recorded with its options and a digest of its training
text; it is used only while it is the model ``prepare-translation`` would train now (the same
text, SentencePiece and recipe): otherwise that model is trained (or found in the cache) instead,
said in one line. A model it was given (``--spm_model``) is used as it is.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from rescale_tasks.common.errors import ConfigError, DataError

from .cache import user_cache_dir, write_atomic
from .corpus import Layout, find_splits
from .vocab import SpmOptions, model_name, training_text

__all__ = ["Prepared", "RECORD", "record_prepared", "find_prepared", "record_folders", "unused_reason"]

RECORD = "prepared.json"


@dataclass(frozen=True)
class Prepared:
    src_lang: str
    tgt_lang: str
    vocab_size: int
    spm_model: str
    options: Optional[SpmOptions] = None  # how spm_model was trained (None: given, or not recorded)
    text: Optional[str] = None  # :func:`~.vocab.training_text` of what it was trained on
    given: bool = False  # spm_model was given to prepare-translation (--spm_model), not trained on the corpus


def _root_key(root: str | os.PathLike) -> str:
    return str(Path(os.path.expanduser(str(root))).resolve())


def record_folders(root: str | os.PathLike, cache_dir: Optional[str] = None) -> list[Path]:
    """Where a record of ``root`` may be, in the order :func:`~.cache.resolve_cache_dir` picks
    the cache folder (nothing is created)."""
    if cache_dir is not None:
        return [Path(os.path.expanduser(str(cache_dir)))]
    return [Path(os.path.expanduser(str(root))) / "rescale_cache", user_cache_dir()]


def _read(folder: Path) -> dict:
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_prepared(root: str | os.PathLike, cache_dir: Path, prepared: Prepared) -> Path:
    """Add ``prepared`` as the newest entry of ``root`` in ``cache_dir/prepared.json``."""
    data = _read(cache_dir)
    entries = [e for e in data.get(_root_key(root), []) if isinstance(e, dict)
               and (e.get("src_lang"), e.get("tgt_lang")) != (prepared.src_lang, prepared.tgt_lang)]
    data[_root_key(root)] = [*entries, asdict(prepared)]
    path = cache_dir / RECORD
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True).encode())
    return path


def find_prepared(root: str | os.PathLike, cache_dir: Optional[str] = None, src_lang: Optional[str] = None,
                  tgt_lang: Optional[str] = None) -> Optional[Prepared]:
    """The newest entry recorded for ``root`` that agrees with the languages given (None: any)."""
    for folder in record_folders(root, cache_dir):
        entries = _read(folder).get(_root_key(root))
        if not entries:
            continue
        for entry in reversed(entries):
            try:
                found = Prepared(str(entry["src_lang"]), str(entry["tgt_lang"]), int(entry["vocab_size"]),
                                 str(entry["spm_model"]), _options(entry.get("options")), entry.get("text"),
                                 bool(entry.get("given", False)))
            except (KeyError, TypeError, ValueError):
                continue
            if src_lang in (None, found.src_lang) and tgt_lang in (None, found.tgt_lang):
                return found
        return None
    return None


def _options(recorded: object) -> Optional[SpmOptions]:
    try:
        return SpmOptions(**recorded) if isinstance(recorded, dict) else None
    except (ConfigError, TypeError):
        return None  # not options this version trains with


def _outdated(root: str | os.PathLike, prepared: Prepared, layout: Layout, cache_dir: Optional[str]) -> Optional[str]:
    """Why the model ``prepared`` names is not the one ``prepare-translation`` would train on the
    training text of ``root`` now (None: it is, or there is no training text to tell)."""
    memo = next((f for f in record_folders(root, cache_dir) if (f / RECORD).is_file()), None)
    try:
        train = find_splits(root, prepared.src_lang, prepared.tgt_lang, layout).get("train")
        if train is None:
            return None
        text = training_text(train, memo)
        name = model_name(train, prepared.options, memo) if prepared.options else None
    except (ConfigError, DataError, OSError):
        return None  # the text cannot be read: setting the data up says why, in one line
    if prepared.text is not None and prepared.text != text:
        return f"was trained on other text than the current {' and '.join(p.name for p in train.paths)}"
    if name != Path(prepared.spm_model).name:
        return "was trained by another version of this suite or of SentencePiece"
    return None


def unused_reason(root: str | os.PathLike, prepared: Prepared, vocab_size: Optional[int], layout: Layout = "auto",
                  cache_dir: Optional[str] = None) -> Optional[str]:
    """One line saying which vocabulary is used instead of the SentencePiece model ``prepared``
    names for ``root``, and why (None: that model is used)."""
    if vocab_size not in (None, prepared.vocab_size):
        return (f"vocabulary: data.vocab_size is {vocab_size} but rescale prepare-translation recorded "
                f"{prepared.vocab_size} pieces for {root} ({prepared.spm_model}): a {vocab_size}-piece "
                "SentencePiece model of the training text is used (trained now unless cached); to use the "
                f"prepared one, set --data.vocab_size {prepared.vocab_size} or leave it unset")
    if not Path(prepared.spm_model).is_file():
        return (f"vocabulary: the SentencePiece model rescale prepare-translation recorded for {root} is gone "
                f"({prepared.spm_model}): a {prepared.vocab_size}-piece model of the training text is used "
                f"(trained now unless cached); run rescale prepare-translation {root} again to record it")
    why = None if prepared.given else _outdated(root, prepared, layout, cache_dir)
    if why:
        return (f"vocabulary: the SentencePiece model rescale prepare-translation recorded for {root} "
                f"({prepared.spm_model}) {why}: the {prepared.vocab_size}-piece model prepare-translation makes of "
                f"the current text is used (trained now unless cached); run rescale prepare-translation {root} "
                "again to record it")
    return None
