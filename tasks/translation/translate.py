"""``rescale translate``: translate text with a trained checkpoint, as ``fairseq-interactive`` does.

    rescale translate --ckpt_path runs/rescale-wmt/<id>/checkpoints/last.ckpt < news.en > news.de
    rescale translate --ckpt_path avg.ckpt --input news.en --output news.de --beam 5

Reads one source sentence per line (a file or stdin, UTF-8), encodes it with the SentencePiece model
stored in the checkpoint, translates in token-budget batches of length-sorted sentences (beam
search, or greedy with ``--beam 1``; settings default to the checkpoint's), and writes one
detokenized translation per line in input order. An empty input line (or one of characters the
SentencePiece model's normalisation drops, such as a zero-width space) gives an empty line.

A line longer than the model's source positions is translated from the pieces that fit and one
warning line names it: one output line per input line, as scoring against references needs
(``fairseq-interactive`` refuses such a line instead; splitting it would translate fragments the
model never saw as sentences). Split such lines into sentences to have them translated whole.
A checkpoint whose weights hold NaN or infinite values (saved after its run diverged) is refused
in one line: none of its hypotheses would finish, and every output line would be empty.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Iterable, Optional, TextIO

import numpy as np
import torch

from rescale_core.generation import GenerationConfig, best_tokens, generate

from ..common.checkpoints import load_into_module, safe_load
from ..common.errors import UserArgumentParser, UserError
from ..common.system import atomic_open, require_writable, resolve_device
from ..common.training import init_parameters
from .batching import batch_by_size
from .corpus import CR_ONLY, read_lines
from .module import TranslationModule, refuse_diverged_weights

__all__ = ["load_translator", "translate_lines", "cut_lines", "cut_warning", "main"]

log = logging.getLogger(__name__)


def load_translator(path: str, device: str | torch.device = "cpu") -> TranslationModule:
    """The translation module of a checkpoint written by ``rescale fit`` (weights, subword model)."""
    checkpoint = safe_load(path)
    if "sentencepiece" not in checkpoint or "hyper_parameters" not in checkpoint:
        raise UserError(f"{path} is not a translation checkpoint of this suite (no SentencePiece model "
                        "inside); give a checkpoint written by rescale fit with a TranslationModule config")
    refuse_diverged_weights(checkpoint, f"checkpoint {path} (--ckpt_path)")
    accepted = init_parameters(TranslationModule)  # its own arguments and the shared ones it hands on
    hparams = {k: v for k, v in checkpoint["hyper_parameters"].items() if k in accepted}
    module = TranslationModule(**hparams)
    load_into_module(module, checkpoint, f"checkpoint {path} (--ckpt_path)", ckpt_path=path)
    return module.to(device).eval()


def _encode(module: TranslationModule, line: str) -> tuple[list[int], int]:
    """The model input of one line (the pieces that fit its source positions, then eos) and the
    number of pieces left out."""
    limit = module.net.config.max_positions - 1
    pieces = module.processor.encode(line, out_type=int)
    return pieces[:limit] + [module.eos_index], max(0, len(pieces) - limit)


def cut_lines(module: TranslationModule, lines: list[str]) -> dict[int, int]:
    """Line index -> pieces the model's source positions leave out, for the lines too long for them."""
    cut = {i: _encode(module, line)[1] for i, line in enumerate(lines) if line.strip()}
    return {i: n for i, n in cut.items() if n}


def cut_warning(cut: dict[int, int], total: int, positions: int, where: str, shown: int = 5) -> str:
    """One line naming the lines ``cut`` (0-based indices) leaves short, for the user."""
    named = ", ".join(f"line {i + 1} ({n} piece{'s' if n != 1 else ''} cut)" for i, n in list(cut.items())[:shown])
    more = f" and {len(cut) - shown} more" if len(cut) > shown else ""
    are, them, their = ("is", "it", "its") if len(cut) == 1 else ("are", "them", "their")
    return (f"warning: {len(cut)} of {total} lines of {where} {are} longer than the model's {positions} source "
            f"positions and {are} translated from {their} first {positions - 1} pieces only: {named}{more}; split "
            f"{them} into sentences to translate {them} whole")


@torch.no_grad()
def translate_lines(module: TranslationModule, lines: list[str], config: GenerationConfig,
                    max_tokens: int = 4096) -> list[str]:
    """Translations of ``lines`` in their order; batches of length-sorted sentences whose padded
    source fits ``max_tokens`` (padding never changes a translation, so order only saves time)."""
    out = [""] * len(lines)
    # a line without a piece (empty, or only characters the model's normalisation drops, such as
    # a zero-width space) is an empty translation, as rescale test writes it
    encoded = {i: _encode(module, line)[0] for i, line in enumerate(lines) if line.strip()}
    todo = [i for i, tokens in encoded.items() if len(tokens) > 1]
    if not todo:
        return out
    order = np.array(sorted(todo, key=lambda i: (len(encoded[i]), i)), dtype=np.int64)
    sizes = np.array([len(encoded[i]) for i in order], dtype=np.int64)
    device = next(module.parameters()).device
    for batch in batch_by_size(order, sizes, max_tokens):
        rows = [torch.tensor(encoded[int(i)]) for i in batch]
        src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=module.pad_index).to(device)
        results = generate(module.net, src, bos=module.bos_index, eos=module.eos_index, config=config)
        for i, nbest in zip(batch.tolist(), results):
            out[i] = module.detokenize(best_tokens(nbest).cpu())
    return out


def _read_input(path: str) -> list[str]:
    """The source lines of ``--input`` (``-``: stdin), read as bytes and decoded strictly: text that
    is not UTF-8 is one line naming the line, never a tokenizer's traceback (stdin's text layer
    would pass undecodable bytes on as surrogates, which SentencePiece cannot take). Text whose
    lines break with ``\\r`` alone is one line here (lines split on ``\\n``): refused, since its
    one translation would stand for all of its lines."""
    where = "standard input" if path == "-" else f"{path} (--input)"
    if path == "-":
        if sys.stdin.isatty():  # else the command waits without a word (on stderr: stdout may be the output file)
            log.warning("warning: standard input is this terminal: type the source sentences, one per line, and end "
                        "them with Ctrl-D (Ctrl-Z then Enter on Windows) to have them all translated; or give "
                        "--input FILE or a pipe (< news.en)")
        lines = read_lines(sys.stdin.buffer, where)
    else:
        try:
            with open(path, "rb") as f:
                lines = read_lines(f, where)
        except OSError as err:
            raise UserError(f"cannot read --input {path}: {err.strerror}") from None
    if len(lines) == 1 and "\r" in lines[0]:
        raise UserError(f"{where} breaks {CR_ONLY}; as it is, all of it is one line and would be translated "
                        "as one sentence")
    return lines


def _write(lines: Iterable[str], stream: TextIO) -> None:
    stream.writelines(line + "\n" for line in lines)
    stream.flush()


def _check_streams(source: str, target: str) -> None:
    """Refuse, before any work, what would end the command once it has translated: a closed
    standard stream it reads or writes, an ``--output`` that cannot be written or that is
    ``--input`` itself (the translations would replace the source text)."""
    if source == "-" and sys.stdin is None:
        raise UserError("standard input is closed: give the source sentences with --input FILE or on a pipe "
                        "(rescale translate --ckpt_path CKPT < news.en)")
    if target == "-":
        if sys.stdout is None:
            raise UserError("standard output is closed: give --output FILE or redirect it "
                            "(rescale translate --ckpt_path CKPT > news.de)")
        return
    if os.path.isdir(target):
        raise UserError(f"--output {target} is a folder: give the file the translations go to")
    require_writable(os.path.dirname(os.path.abspath(target)), "the folder of --output",
                     f"give an --output other than {target}, in a folder you can write")
    if source != "-" and os.path.exists(source) and os.path.exists(target) and os.path.samefile(source, target):
        raise UserError(f"--output {target} is the --input file: the translations would replace the source "
                        "text; give --output another file")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def main(argv: Optional[list[str]] = None) -> int:
    p = UserArgumentParser(prog="rescale translate", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt_path", required=True, help="checkpoint of a translation run (or an averaged one)")
    p.add_argument("--input", default="-", help="source sentences, one per line (default: stdin)")
    p.add_argument("--output", default="-", help="where the translations go (default: stdout)")
    p.add_argument("--beam", type=int, help="beam size (1: greedy; default: the checkpoint's)")
    p.add_argument("--len_penalty", type=float, help="length penalty alpha (default: the checkpoint's)")
    p.add_argument("--length_penalty_style", choices=("fairseq", "gnmt"),
                   help="len^alpha or ((5+len)/6)^alpha, len counting eos (default: the checkpoint's)")
    p.add_argument("--max_len_a", type=float, help="at most int(a * source tokens, eos counted, + b) tokens "
                   "(default: the checkpoint's)")
    p.add_argument("--max_len_b", type=int, help="see --max_len_a (default: the checkpoint's)")
    p.add_argument("--max_tokens", type=_positive, default=4096, help="source tokens per batch (padded), >= 1")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (auto: a GPU when there is one)")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    _check_streams(args.input, args.output)
    module = load_translator(args.ckpt_path, device)
    defaults = module.generation
    try:
        config = GenerationConfig(
            beam=args.beam if args.beam is not None else defaults.beam,
            len_penalty=args.len_penalty if args.len_penalty is not None else defaults.len_penalty,
            length_penalty_style=args.length_penalty_style or defaults.length_penalty_style,
            max_len_a=args.max_len_a if args.max_len_a is not None else defaults.max_len_a,
            max_len_b=args.max_len_b if args.max_len_b is not None else defaults.max_len_b)
    except ValueError as err:
        raise UserError(f"rescale translate: {err}") from None
    lines = _read_input(args.input)
    cut = cut_lines(module, lines)
    if cut:
        where = "standard input" if args.input == "-" else f"{args.input} (--input)"
        log.warning(cut_warning(cut, len(lines), module.net.config.max_positions, where))
    translations = translate_lines(module, lines, config, args.max_tokens)
    if args.output == "-":
        _write(translations, sys.stdout)
    else:
        with atomic_open(args.output) as f:
            _write(translations, f)
    return 0
