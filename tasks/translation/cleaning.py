"""Which training pairs are used: optional cleaning plus the size limits, every drop counted.

Cleaning follows Moses' ``clean-corpus-n.perl`` as fairseq's WMT14 En-De recipe runs it
(``-ratio 1.5 ... 1 250``, on subword tokens): a pair is dropped when a side is empty
(``drop_empty``), longer than ``max_len`` pieces (``max_len``), or one side has more than
``len_ratio`` times the pieces of the other (``len_ratio``). Then the model's limits, as fairseq's
``filter_by_size``: a side longer than ``max_source_positions`` / ``max_target_positions`` tokens
with its eos, or a pair that alone exceeds ``max_tokens`` (it could never be batched; fairseq
stops with an error instead). Each dropped pair is counted once, under the first rule it breaks,
in that order.

Deviations: the rules act on the encoded lengths at load time, not on rewritten text files, so
changing them never re-encodes the corpus. The ratio compares piece counts with a floor of 1
(an empty side against 3 pieces has ratio 3). Only ``train`` is filtered: ``valid``/``test`` keep
every line so BLEU is computed against every reference; a sentence there longer than the
position limits is truncated (keeping its eos) and counted as ``truncated``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from rescale_tasks.common.errors import ConfigError, DataError

__all__ = ["CleanOptions", "CleanReport", "select_train", "count_truncated"]


@dataclass(frozen=True)
class CleanOptions:
    """Training-pair cleaning (``None`` switches a rule off)."""

    drop_empty: bool = True
    max_len: int | None = 250  # pieces per side, eos not counted
    len_ratio: float | None = 1.5  # longer side / shorter side, in pieces

    def __post_init__(self) -> None:
        if self.max_len is not None and self.max_len < 1:
            raise ConfigError(f"data.clean.max_len must be at least 1 (or null), got {self.max_len}.")
        if self.len_ratio is not None and self.len_ratio < 1:
            raise ConfigError(f"data.clean.len_ratio must be at least 1 (or null), got {self.len_ratio}.")


@dataclass
class CleanReport:
    """What happened to the pairs of one split."""

    split: str
    total: int
    kept: int
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0
    over_positions: int = 0
    over_max_tokens: int = 0
    truncated: int = 0  # valid/test: sentences cut to the position limits (kept)

    @property
    def dropped(self) -> int:
        return self.total - self.kept

    def line(self) -> str:
        counts = [f"{f.name} {getattr(self, f.name)}" for f in fields(self)[3:] if getattr(self, f.name)]
        tail = f" ({', '.join(counts)})" if counts else ""
        return f"{self.split}: {self.kept} of {self.total} pairs kept{tail}"


def select_train(src_sizes: np.ndarray, tgt_sizes: np.ndarray, options: CleanOptions,
                 max_source_positions: int, max_target_positions: int, max_tokens: int,
                 where: str) -> tuple[np.ndarray, CleanReport]:
    """Indices (ascending) of the training pairs kept, and the counts; ``sizes`` exclude eos."""
    src, tgt = np.asarray(src_sizes, dtype=np.int64), np.asarray(tgt_sizes, dtype=np.int64)
    alive = np.ones(len(src), dtype=bool)
    counts: dict[str, int] = {}

    def drop(name: str, broken: np.ndarray) -> None:
        hit = alive & broken
        counts[name] = int(hit.sum())
        alive[hit] = False

    drop("empty", (src == 0) | (tgt == 0) if options.drop_empty else np.zeros_like(alive))
    drop("too_long", np.maximum(src, tgt) > options.max_len if options.max_len else np.zeros_like(alive))
    if options.len_ratio:
        lo, hi = np.maximum(np.minimum(src, tgt), 1), np.maximum(src, tgt)
        drop("bad_ratio", hi > options.len_ratio * lo)
    else:
        drop("bad_ratio", np.zeros_like(alive))
    drop("over_positions", (src + 1 > max_source_positions) | (tgt + 1 > max_target_positions))
    drop("over_max_tokens", np.maximum(src, tgt) + 1 > max_tokens)
    kept = np.flatnonzero(alive)
    report = CleanReport("train", len(src), len(kept), **counts)
    if len(kept) == 0:
        raise DataError(
            f"no training pairs left after cleaning {where}: {report.line()}; relax data.clean "
            "(max_len, len_ratio, drop_empty) or raise data.max_tokens / data.max_*_positions.")
    return kept, report


def count_truncated(src_sizes: np.ndarray, tgt_sizes: np.ndarray, max_source_positions: int,
                    max_target_positions: int) -> int:
    """Pairs of an evaluation split with a side longer than its position limit (eos included)."""
    return int(((np.asarray(src_sizes) + 1 > max_source_positions)
                | (np.asarray(tgt_sizes) + 1 > max_target_positions)).sum())
