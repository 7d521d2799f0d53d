"""The joint source/target SentencePiece model (Kudo & Richardson 2018): trained once, cached.

Special ids are fixed in every model this suite trains or accepts, in fairseq's ``Dictionary``
order: ``<s>`` (bos) = 0, ``<pad>`` = 1, ``</s>`` (eos) = 2, ``<unk>`` = 3. So ``pad_index`` is 1,
the core Transformer's default, and ids mean the same in every run. A model made elsewhere
must use these ids (``spm_train --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3``).

One model for both languages (shared vocabulary, as for WMT En-De in Vaswani et al. 2017 and
fairseq's ``--joined-dictionary``) trained on the non-empty lines of both sides of ``train``,
with ``character_coverage`` 1.0 (all characters; 0.9995 suits languages with large alphabets).
``input_sentence_size`` caps the sentences SentencePiece loads (a seeded random sample) so a
4.5M-pair corpus trains in minutes, as SentencePiece's own documentation recommends; 0 = all.
The cache name hashes the training text, every option, the special ids and SentencePiece's
version: a second call with the same text and options returns the stored model untouched.
"""
from __future__ import annotations

import io
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Literal

import sentencepiece as spm

from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.reporting import CountProgress
from rescale_tasks.common.system import usable_cores

from .cache import DIGEST_CHARS, digest_of, file_digest, write_atomic
from .corpus import SplitSource, option_name

__all__ = ["BOS", "PAD", "EOS", "UNK", "SPECIAL_IDS", "MODEL_TYPES", "SpmOptions", "train_spm",
           "load_spm", "model_name", "training_text"]

log = logging.getLogger(__name__)

BOS, PAD, EOS, UNK = 0, 1, 2, 3
SPECIAL_IDS = {"bos": BOS, "pad": PAD, "eos": EOS, "unk": UNK}
MODEL_TYPES = ("bpe", "unigram")
_RECIPE = 1  # bump when the training call changes in a way that changes the model
MAX_SENTENCE_BYTES = 4192  # SentencePiece's max_sentence_length (its default): longer lines are left out


@dataclass(frozen=True)
class SpmOptions:
    """How the SentencePiece model is trained (every field is part of the cache name)."""

    vocab_size: int = 32000
    model_type: Literal["bpe", "unigram"] = "bpe"
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(f"model_type must be one of {', '.join(MODEL_TYPES)}, got {self.model_type!r}.")
        if self.vocab_size <= len(SPECIAL_IDS):
            raise ConfigError(f"vocab_size must exceed the {len(SPECIAL_IDS)} special tokens, got {self.vocab_size}.")
        if not 0 < self.character_coverage <= 1:
            raise ConfigError(f"character_coverage must be in (0, 1], got {self.character_coverage}.")
        if self.input_sentence_size < 0:
            raise ConfigError(f"input_sentence_size must be 0 (all) or more, got {self.input_sentence_size}.")


def _texts(train: SplitSource, cache_dir: Path | None) -> list[str]:
    return [file_digest(p, cache_dir) for p in train.paths]


def training_text(train: SplitSource, cache_dir: Path | None = None) -> str:
    """A digest of the text a model of ``train`` is trained on (the files' digests are remembered
    in ``cache_dir``)."""
    return digest_of(train.layout, _texts(train, cache_dir))


def model_name(train: SplitSource, options: SpmOptions, cache_dir: Path | None = None) -> str:
    """The file name of the cached model of ``train`` and ``options`` (``spm-bpe32000-<key>.model``)."""
    key = digest_of("spm", _RECIPE, spm.__version__, train.layout, _texts(train, cache_dir), asdict(options),
                    SPECIAL_IDS)
    return f"spm-{options.model_type}{options.vocab_size}-{key[:DIGEST_CHARS]}.model"


def train_spm(train: SplitSource, options: SpmOptions, cache_dir: Path, flags: str = "--data.") -> Path:
    """The cached model for ``train`` and ``options``, trained now if there is none yet; ``flags``:
    how the command at hand spells the options in its messages."""
    path = cache_dir / model_name(train, options, cache_dir)
    if path.is_file():
        return path
    pairs = train.check()  # line-aligned before spending minutes on it
    failures: list[DataError] = []
    where = " and ".join(p.name for p in train.paths)
    log.info(f"SentencePiece: reading {where} to train a {options.model_type} model of {options.vocab_size} "
             f"pieces -> {path.name}")

    kept = too_long = 0

    def sentences():
        nonlocal kept, too_long
        with CountProgress(f"reading {where}", 2 * pairs, "lines", log) as progress:
            try:
                for line in chain(train.lines(0), train.lines(1)):
                    progress.advance(1)
                    if line.strip():
                        kept += 1
                        too_long += len(line) * 4 > MAX_SENTENCE_BYTES and len(line.encode()) > MAX_SENTENCE_BYTES
                        yield line
            except DataError as err:  # SentencePiece would wrap it into a RuntimeError with a traceback
                failures.append(err)
        sample = min(kept, options.input_sentence_size or kept)
        log.info(f"SentencePiece: training on {sample} of {kept} sentences (its own log is silenced)")

    model = io.BytesIO()
    spm.set_random_generator_seed(options.seed)  # the sample of input_sentence_size
    started = time.perf_counter()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_writer=model, vocab_size=options.vocab_size,
            model_type=options.model_type, character_coverage=options.character_coverage,
            input_sentence_size=options.input_sentence_size, shuffle_input_sentence=True,
            bos_id=BOS, pad_id=PAD, eos_id=EOS, unk_id=UNK,
            bos_piece="<s>", pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
            max_sentence_length=MAX_SENTENCE_BYTES, num_threads=usable_cores(), minloglevel=2)
    except RuntimeError as err:
        if failures:
            raise failures[0] from None
        raise _training_error(err, train, options, flags, too_long == kept > 0) from None
    if failures:
        raise failures[0]
    write_atomic(path, model.getvalue())
    log.info(f"SentencePiece: model trained in {time.perf_counter() - started:.1f} s")
    return path


def _training_error(err: RuntimeError, train: SplitSource, options: SpmOptions, flags: str = "--data.",
                    all_too_long: bool = False) -> Exception:
    message = " ".join(str(err).split())
    where = " and ".join(p.name for p in train.paths)
    limit = re.search(r"value <= (\d+)", message)
    if limit:
        return DataError(f"vocab_size={options.vocab_size} is too large for the text of {where} in "
                         f"{train.paths[0].parent}: SentencePiece can make at most {limit.group(1)} "
                         f"pieces from it; use {flags}vocab_size {limit.group(1)} or less (or more text).")
    if "empty" in message.lower() or "no sentence" in message.lower():
        if not all_too_long:
            return DataError(f"no text to train SentencePiece on in {where} ({train.paths[0].parent}): "
                             "every line is empty; check the files.")
        return DataError(f"no text to train SentencePiece on in {where} ({train.paths[0].parent}): every line is "
                         f"longer than SentencePiece's limit of {MAX_SENTENCE_BYTES} bytes, which it leaves out; "
                         "put one sentence on each line.")
    return DataError(f"SentencePiece training on {where} failed: {message}")


def load_spm(path: str | os.PathLike, flags: str = "--data.") -> spm.SentencePieceProcessor:
    """A SentencePiece model with this suite's special ids; one-line errors otherwise (``flags``:
    how the command at hand spells the options in its messages)."""
    path = Path(os.path.expanduser(str(path)))
    option = option_name("spm_model", flags)
    train_one = f"leave {option} empty" if flags == "--data." else f"leave out {option}"
    if not path.is_file():
        raise DataError(f"SentencePiece model not found: {path} ({option}); give an existing "
                        f".model file, or {train_one} to train one on the training text.")
    processor = spm.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (OSError, RuntimeError):
        raise DataError(f"{path} ({option}) is not a SentencePiece model; give the .model file "
                        "that spm_train or `rescale prepare-translation` wrote.") from None
    found = {"bos": processor.bos_id(), "pad": processor.pad_id(), "eos": processor.eos_id(),
             "unk": processor.unk_id()}
    if found != SPECIAL_IDS:
        show = lambda ids: " ".join(f"{k}={v}" for k, v in ids.items())  # noqa: E731
        raise DataError(
            f"{path} ({option}) has special ids {show(found)} but this suite needs {show(SPECIAL_IDS)}; "
            f"retrain it with spm_train --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3, or {train_one} "
            "to train one.")
    return processor
