"""Token-budget batches spread over DDP ranks, in a seeded order that can resume mid-epoch.

Lightning cannot hand a distributed sampler to a custom batch sampler, and unequal step counts
hang DDP. So every rank builds the same batch list (:mod:`.batching`, from the same sizes and
seed), the epoch's list is padded to a multiple of the world size and rank r takes batches
``r, r + R, ...``. :class:`TokenBatchSampler` yields whole batches (:class:`~.dataset.BatchKey`)
to a DataLoader with ``batch_size=None``; it is a ``DistributedSampler`` so Lightning never
replaces it, with or without ``use_distributed_sampler``, and Lightning's ``set_epoch`` reaches it.

- Training (``shuffle=True``): the batches are fixed for the run (fairseq builds them once), their
  order is a permutation drawn from ``(seed, epoch)``; the padding repeats the first batches of
  that order (as ``DistributedSampler`` repeats samples).
- Evaluation (``shuffle=False``): length order, every pair exactly once over all ranks; the
  padding is *filler* batches (copies of the smallest batch marked ``filler``: ``id`` -1, target
  all pad, see :mod:`.dataset`), so BLEU and loss under DDP equal a single-process evaluation.

:class:`TokenBatchLoader` follows the contract of :class:`rescale_tasks.common.sampling.ResumableDataLoader`:
``state_dict`` holds the epoch and the batches handed out in it; Lightning stores it in every
checkpoint and loads it before iterating, and the same epoch then continues with the next batch.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from .batching import batch_by_size, length_order
from .dataset import BatchKey, PairDataset

__all__ = ["TokenBatchSampler", "TokenBatchLoader"]


class TokenBatchSampler(DistributedSampler):
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
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        indices = np.arange(len(dataset)) if indices is None else np.asarray(indices, dtype=np.int64)
        src, tgt = dataset.src_sizes, dataset.tgt_sizes
        order = length_order(indices, src, tgt, seed if shuffle else None)
        self.max_tokens = int(max_tokens)
        self.batches = batch_by_size(order, np.maximum(src, tgt)[order], self.max_tokens)
        self._resume: tuple[int, int] | None = None  # (epoch, batches of this rank's share done)

    def __len__(self) -> int:
        return -(-len(self.batches) // self.num_replicas)

    def epoch_keys(self) -> list[BatchKey]:
        """This rank's batches of the current epoch, in order (the whole share)."""
        n, world = len(self.batches), self.num_replicas
        total = len(self) * world
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
            order = np.resize(order, total)  # pads by repeating the first batches of the order
            return [BatchKey(self.batches[j]) for j in order[self.rank::world]]
        keys = [BatchKey(batch) for batch in self.batches]
        if total > n:
            smallest = min(range(n), key=lambda j: len(self.batches[j]))
            keys += [BatchKey(self.batches[smallest], filler=True)] * (total - n)
        return keys[self.rank::world]

    def resume_at(self, epoch: int, start: int) -> None:
        """Skip the first ``start`` batches of this rank's share, if the next iteration is ``epoch``."""
        self._resume = (int(epoch), int(start))

    def pending_start(self) -> int:
        return self._resume[1] if self._resume and self._resume[0] == self.epoch else 0

    def __iter__(self) -> Iterator[BatchKey]:
        start, self._resume = self.pending_start(), None
        yield from self.epoch_keys()[start:]


class TokenBatchLoader(DataLoader):
    """A DataLoader over a :class:`TokenBatchSampler` (whole batches) that resumes mid-epoch.

    ``state_dict``: epoch, batches handed out in it, and the layout (seed, world size,
    ``max_tokens``, batch count). ``load_state_dict`` resumes the same epoch after those batches
    when the layout is the same; any other epoch, or another layout (the positions would mean
    other batches), starts from the top. ``len`` is the full epoch. Iteration is lazy: the order
    is drawn at the first ``next()``, after Lightning has set the epoch.
    """

    def __init__(self, dataset: PairDataset, sampler: TokenBatchSampler, **kwargs: Any) -> None:
        if not isinstance(sampler, TokenBatchSampler):
            raise TypeError("TokenBatchLoader needs a TokenBatchSampler")
        kwargs.pop("batch_size", None)
        super().__init__(dataset, sampler=sampler, batch_size=None, **kwargs)
        self.batches_seen = 0  # batches handed out in the current epoch

    def __iter__(self):
        sampler: TokenBatchSampler = self.sampler
        self.batches_seen = sampler.pending_start()
        for batch in super().__iter__():
            self.batches_seen += 1
            yield batch

    def _layout(self) -> dict[str, int]:
        sampler: TokenBatchSampler = self.sampler
        return {"seed": sampler.seed, "num_replicas": sampler.num_replicas,
                "max_tokens": sampler.max_tokens, "num_batches": len(sampler.batches)}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batches_seen": self.batches_seen, **self._layout()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler: TokenBatchSampler = self.sampler
        same_layout = all(state.get(k) == v for k, v in self._layout().items())
        seen = int(state.get("batches_seen", 0))
        if same_layout and 0 < seen < len(self):
            sampler.set_epoch(int(state["epoch"]))
            sampler.resume_at(int(state["epoch"]), seen)
            self.batches_seen = seen
