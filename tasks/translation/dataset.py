"""Sentence pairs to padded tensors: one call per batch (fairseq's ``LanguagePairDataset.collater``).

A batch (a dict), B pairs, right-padded with ``pad`` (fairseq left-pads the source by default,
an RNN-era speed trick; the core Transformer masks either side):

- ``id`` int64 [B]: line number (0-based) of each pair in its split's files, to write
  hypotheses back in corpus order; -1 marks a filler row (below).
- ``src_tokens`` int64 [B, S]: source + eos; ``src_lengths`` int64 [B].
- ``prev_output_tokens`` int64 [B, T]: bos + target (teacher forcing input).
- ``target`` int64 [B, T]: target + eos.
- ``ntokens`` int: non-pad target tokens; ``nsentences`` int: real rows (filler rows excluded).

A sentence longer than the position limits is cut to them, keeping its eos (only evaluation
splits can hold such sentences; training drops them, :mod:`.cleaning`).

Filler batches (``BatchKey.filler``) repeat real source sentences so every DDP rank runs the same
number of evaluation steps; their ``id`` is -1, their ``target`` is all pad (inputs stay real, so
attention never meets an all-pad row) and ``ntokens`` is 0: a summed loss and token count are
unchanged, and rows with ``id < 0`` are skipped when writing hypotheses or scoring BLEU.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from .binarize import EncodedSplit
from .vocab import BOS, EOS, PAD

__all__ = ["BatchKey", "PairDataset"]


class BatchKey(NamedTuple):
    """What the sampler hands the dataset: the pair ids of one batch, and whether it is filler."""

    ids: np.ndarray
    filler: bool = False


def _pad(rows: list[np.ndarray], prefix: int | None, suffix: int | None) -> torch.Tensor:
    extra = (prefix is not None) + (suffix is not None)
    width = max(len(r) for r in rows) + extra
    out = np.full((len(rows), width), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        start = 0
        if prefix is not None:
            out[i, 0], start = prefix, 1
        out[i, start:start + len(row)] = row
        if suffix is not None:
            out[i, start + len(row)] = suffix
    return torch.from_numpy(out)


class PairDataset(Dataset):
    """The pairs of one encoded split; ``dataset[BatchKey]`` is a collated batch."""

    def __init__(self, encoded: EncodedSplit, max_source_positions: int, max_target_positions: int) -> None:
        self.encoded = encoded
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def src_sizes(self) -> np.ndarray:
        """Source tokens per pair as batched: pieces + eos, cut to the position limit."""
        return np.minimum(self.encoded.src.sizes + 1, self.max_source_positions)

    @property
    def tgt_sizes(self) -> np.ndarray:
        """Target tensor length per pair: pieces + eos (or bos), cut to the position limit."""
        return np.minimum(self.encoded.tgt.sizes + 1, self.max_target_positions)

    def __getitem__(self, key: BatchKey) -> dict:
        ids = np.asarray(key.ids, dtype=np.int64)
        src = [self.encoded.src[i][:self.max_source_positions - 1] for i in ids]
        tgt = [self.encoded.tgt[i][:self.max_target_positions - 1] for i in ids]
        src_tokens = _pad(src, None, EOS)
        target, prev = _pad(tgt, None, EOS), _pad(tgt, BOS, None)
        if key.filler:  # inputs stay real (no all-pad rows for attention), nothing to score
            target.fill_(PAD)
            ids = np.full_like(ids, -1)
        return {
            "id": torch.from_numpy(ids),
            "src_tokens": src_tokens,
            "src_lengths": torch.tensor([len(s) + 1 for s in src], dtype=torch.int64),
            "prev_output_tokens": prev,
            "target": target,
            "ntokens": int(target.ne(PAD).sum()),
            "nsentences": 0 if key.filler else len(ids),
        }
