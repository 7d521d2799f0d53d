"""Token-budget batches spread over DDP ranks, in a seeded order that can resume mid-epoch.

Built on :mod:`rescale_tasks.common.data.batch_sampling` (every rank builds the same batch list, pads
it to a multiple of the world size and takes batches ``r, r + R, ...``; the loader resumes
mid-epoch). What is special to translation:

- Training (``shuffle=True``): the batches are fixed for the run (fairseq builds them once), their
  order is a permutation drawn from ``(seed, epoch)``; the padding repeats the first batches of
  that order (as ``DistributedSampler`` repeats samples).
- Evaluation (``shuffle=False``): length order, every pair exactly once over all ranks; the
  padding is *filler* batches (copies of the smallest batch marked ``filler``: ``id`` -1, target
  all pad, see :mod:`.dataset`), so BLEU and loss under DDP equal a single-process evaluation.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rescale_tasks.common.data import BatchListLoader, BatchListSampler

from .batching import batch_by_size, length_order
from .dataset import BatchKey, PairDataset

__all__ = ["TokenBatchSampler", "TokenBatchLoader"]


class TokenBatchSampler(BatchListSampler):
    """Length-bucketed ``max_tokens`` batches of ``indices`` (default: every pair), sharded.

    Args:
        dataset: the :class:`PairDataset` (its ``src_sizes``/``tgt_sizes`` size the batches).
        indices: the pair ids to use (the training pairs kept by cleaning).
        max_tokens: padded positions per batch tensor (``batch * max(size)``).
        shuffle: training order (seeded tie-break and per-epoch batch order); else evaluation.
        seed: the same on every rank.
        num_replicas, rank: default from ``torch.distributed`` when initialised, else 1, 0.
    """

    def __init__(self, dataset: PairDataset, indices: np.ndarray | None = None, max_tokens: int = 4096,
                 shuffle: bool = True, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None) -> None:
        super().__init__(dataset, shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank)
        indices = np.arange(len(dataset)) if indices is None else np.asarray(indices, dtype=np.int64)
        src, tgt = dataset.src_sizes, dataset.tgt_sizes
        order = length_order(indices, src, tgt, seed if shuffle else None)
        self.max_tokens = int(max_tokens)
        self.batches = batch_by_size(order, np.maximum(src, tgt)[order], self.max_tokens)

    def num_batches(self) -> int:
        return len(self.batches)

    def epoch_batches(self) -> list[Sequence[int]]:
        if not self.shuffle:
            return list(self.batches)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.batches))
        return [self.batches[j] for j in order]

    def padding(self, batches: list, count: int) -> list:
        if self.shuffle:
            return super().padding(batches, count)
        smallest = min(batches, key=len)
        return [BatchKey(smallest, filler=True)] * count

    def as_key(self, batch) -> BatchKey:
        return batch if isinstance(batch, BatchKey) else BatchKey(batch)

    def layout(self) -> dict[str, int]:
        return {**super().layout(), "max_tokens": self.max_tokens}


class TokenBatchLoader(BatchListLoader):
    """A DataLoader over a :class:`TokenBatchSampler` (whole batches) that resumes mid-epoch."""
