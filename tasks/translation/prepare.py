"""Build the SentencePiece model and the encoded token arrays of a parallel corpus ahead of training.

    rescale prepare-translation ROOT [--src_lang en] [--tgt_lang de] [--vocab_size 32000] ...

Does what ``TranslationDataModule.prepare_data`` does (the same caches, so a later run starts
at once) and prints the model, each split's size and what the cleaning options would drop from
``train``, plus the ``--data.*`` flags to use. Reading and encoding the text show progress (a live
line in a terminal, a line every 30 s in a log), SentencePiece training a line when it starts and ends. The languages, the model and its vocabulary size are
recorded beside the caches (:mod:`.prepared`), where ``rescale fit`` reads them. Cleaning is applied when the data are loaded, so
other cleaning options later need no new preparation. Options are the DataModule's names.

Each split's line gives the ``<unk>`` pieces of both sides (stored with the encoded arrays); a
side with more than ``--unk_warn_percent`` % of them (text the SentencePiece model cannot spell:
another script than it was trained on) gets one warning line saying what to change.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

from rescale_tasks.common.errors import ConfigError, UserArgumentParser

from .batching import batch_by_size, length_order, padding_efficiency
from .binarize import UNK_WARN_PERCENT, UnknownPieces, unknown_pieces, unknown_warning
from .cleaning import CleanOptions, count_truncated, select_train
from .corpus import LAYOUTS
from .pipeline import CorpusSettings, prepare_corpus
from .prepared import Prepared, record_prepared
from .vocab import MODEL_TYPES, SpmOptions, training_text

__all__ = ["main"]

log = logging.getLogger(__name__)


def _parser() -> UserArgumentParser:
    d, c = SpmOptions(), CleanOptions()
    p = UserArgumentParser(prog="rescale prepare-translation", description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="folder with train/valid/test as <split>.<lang> files or <split>.tsv")
    p.add_argument("--src_lang", default="en")
    p.add_argument("--tgt_lang", default="de")
    p.add_argument("--layout", default="auto", choices=LAYOUTS)
    p.add_argument("--spm_model", default=None, help="use this SentencePiece model instead of training one")
    p.add_argument("--vocab_size", type=int, default=d.vocab_size)
    p.add_argument("--model_type", default=d.model_type, choices=MODEL_TYPES)
    p.add_argument("--character_coverage", type=float, default=d.character_coverage)
    p.add_argument("--input_sentence_size", type=int, default=d.input_sentence_size,
                   help="sentences sampled to train SentencePiece (0 = all)")
    p.add_argument("--spm_seed", type=int, default=d.seed,
                   help="seed of the sentence sample (a model the DataModule finds by options uses 0)")
    p.add_argument("--cache_dir", default=None)
    p.add_argument("--unk_warn_percent", type=float, default=UNK_WARN_PERCENT,
                   help="warn when more than this percent of a split side's pieces are <unk>")
    # only reported here: cleaning and size limits act when the data are loaded
    p.add_argument("--max_len", type=int, default=c.max_len)
    p.add_argument("--len_ratio", type=float, default=c.len_ratio)
    p.add_argument("--keep_empty", action="store_true", help="keep pairs with an empty side")
    p.add_argument("--max_tokens", type=int, default=4096)
    p.add_argument("--max_source_positions", type=int, default=1024)
    p.add_argument("--max_target_positions", type=int, default=1024)
    return p


def _spelling_fix(args: argparse.Namespace, count: UnknownPieces) -> str:
    """What makes the model spell the text of ``count``, given the options it was made with."""
    if args.spm_model:
        return ("leave out --spm_model to train a model on this corpus's train split (both languages), or give "
                "one trained on text of both languages")
    if args.character_coverage < 1:
        return (f"raise --character_coverage (now {args.character_coverage:g}) to 1.0 to keep every character "
                "of the train split" + (", and add text of that script to it" if count.split != "train" else ""))
    if count.split == "train":
        return "set --input_sentence_size 0 to train the model on every sentence of the train split"
    return "add text of that script to the train split, which the model is trained on"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 <= args.unk_warn_percent <= 100:
        raise ConfigError(f"--unk_warn_percent must be a percentage in [0, 100], got {args.unk_warn_percent:g}.")
    options = SpmOptions(vocab_size=args.vocab_size, model_type=args.model_type,
                         character_coverage=args.character_coverage,
                         input_sentence_size=args.input_sentence_size, seed=args.spm_seed)
    settings = CorpusSettings(args.root, args.src_lang, args.tgt_lang, args.layout, args.spm_model,
                              options, args.cache_dir)
    clean = CleanOptions(drop_empty=not args.keep_empty, max_len=args.max_len or None,
                         len_ratio=args.len_ratio or None)
    start = time.perf_counter()
    prepared = prepare_corpus(settings, flags="--")  # errors in this command's flags
    limits = (args.max_source_positions, args.max_target_positions)
    log.info(f"SentencePiece model: {prepared.spm_model} ({prepared.processor.piece_size()} pieces)")
    log.info(f"cache: {prepared.cache_dir}")
    unknown = unknown_pieces(prepared.encoded, (args.src_lang, args.tgt_lang))
    for name, encoded in prepared.encoded.items():
        src, tgt = encoded.src.sizes, encoded.tgt.sizes
        s_unk, t_unk = (c for c in unknown if c.split == name)
        log.info(f"{name}: {len(encoded)} pairs, {int(src.sum())} + {int(tgt.sum())} tokens, "
                 f"<unk> {s_unk.unknown} + {t_unk.unknown} ({s_unk.percent:.2f}% + {t_unk.percent:.2f}%)")
        if name == "train":
            where = " and ".join(str(p) for p in prepared.sources[name].paths)
            kept, report = select_train(src, tgt, clean, *limits, args.max_tokens, where)
            s, t = (sizes + 1 for sizes in (src, tgt))
            order = length_order(kept, s, t, 0)
            batches = batch_by_size(order, np.maximum(s, t)[order], args.max_tokens)
            log.info(f"  cleaning: {report.line()}")
            log.info(f"  {len(batches)} batches of up to {args.max_tokens} tokens per epoch (one process), "
                     f"padding efficiency {padding_efficiency(batches, s, t):.3f}")
        elif truncated := count_truncated(src, tgt, *limits):
            log.info(f"  {truncated} pairs longer than the position limits (truncated when loaded)")
    for count in unknown:
        if count.percent > args.unk_warn_percent:
            log.warning(unknown_warning(count, prepared.spm_model, args.unk_warn_percent, "--unk_warn_percent",
                                        _spelling_fix(args, count)))
    trained = not args.spm_model
    record = record_prepared(args.root, prepared.cache_dir,
                             Prepared(args.src_lang, args.tgt_lang, prepared.processor.piece_size(),
                                      str(Path(prepared.spm_model).resolve()), options if trained else None,
                                      training_text(prepared.sources["train"], prepared.cache_dir) if trained else None,
                                      given=not trained))
    log.info(f"recorded in {record}: {args.src_lang}-{args.tgt_lang}, vocabulary "
             f"{prepared.processor.piece_size()} (`rescale fit` reads them: no --data.src_lang/--data.tgt_lang/--data.vocab_size to repeat)")
    log.info(f"done in {time.perf_counter() - start:.1f} s; train with --data.root {args.root}"
             + (f" --data.cache_dir {args.cache_dir}" if args.cache_dir else ""))
    return 0


if __name__ == "__main__":  # python -m rescale_tasks.translation.prepare
    from rescale_tasks.cli import main as rescale  # the command: its logging, its one-line errors

    sys.exit(rescale(["prepare-translation", *sys.argv[1:]]))
