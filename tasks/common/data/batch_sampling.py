"""Whole batches built by the task (token budgets, aspect-ratio groups), spread over DDP ranks in a
seeded order that can resume mid-epoch.

Lightning cannot hand a distributed sampler to a custom batch sampler, and unequal step counts
hang DDP. So every rank builds the same list of batches for an epoch (from the same sizes, seed
and epoch), the list is padded to a multiple of the world size and rank r takes batches
``r, r + R, ...``. A :class:`BatchListSampler` yields whole batches (lists of sample indices) to a
DataLoader with ``batch_size=None``; it is a ``DistributedSampler`` so Lightning never replaces it,
with or without ``use_distributed_sampler``, and Lightning's ``set_epoch`` reaches it.

Subclasses say how an epoch's batches are made (:meth:`BatchListSampler.epoch_batches`), how
many there are (the same number every epoch, so ``len`` and resume positions are fixed), and what
pads the list (training: the first batches of the epoch's order again, as ``DistributedSampler``
repeats samples; evaluation: whatever the task can recognise and ignore).

:class:`BatchListLoader` follows the contract of :class:`~rescale_tasks.common.data.ResumableDataLoader`:
``state_dict`` holds the epoch, the batches handed out in it and the layout; Lightning stores it
in every checkpoint and loads it before iterating, and the same epoch then continues with the
next batch when the layout is unchanged; continuing it under another layout (other positions
would mean other batches) is refused in one line (:func:`~rescale_tasks.common.data.refused_resume`).
"""
from __future__ import annotations

import abc
from typing import Any, Iterator, Optional, Sequence

import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .sampling import check_resume, refused_resume

__all__ = ["BatchListSampler", "BatchListLoader"]


class BatchListSampler(DistributedSampler, abc.ABC):
    """Yields this rank's share of the epoch's batches; see the module docstring.

    Args:
        dataset: the data set (only its length is used by ``DistributedSampler``).
        shuffle: training (a per-epoch order drawn from ``(seed, epoch)``) or evaluation.
        seed: the same on every rank.
        num_replicas, rank: default from ``torch.distributed`` when initialised, else 1, 0.
    """

    def __init__(self, dataset: Dataset, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self._resume: tuple[int, int] | None = None  # (epoch, batches of this rank's share done)

    # --- what a task defines ----------------------------------------------------------------
    @abc.abstractmethod
    def num_batches(self) -> int:
        """Batches in one epoch over all ranks, before padding (the same every epoch)."""

    @abc.abstractmethod
    def epoch_batches(self) -> list[Sequence[int]]:
        """The batches of epoch ``self.epoch`` in order, identical on every rank."""

    def padding(self, batches: list, count: int) -> list:
        """``count`` extra batches making the list divisible by the world size: by default the
        first batches of the epoch again (training; evaluation should override)."""
        return [batches[i % len(batches)] for i in range(count)]

    def as_key(self, batch: Any) -> Any:
        """What the DataLoader hands to the data set for one batch (default: the batch itself)."""
        return batch

    def layout(self) -> dict[str, int]:
        """What must match for a saved position to mean the same batches."""
        return {"seed": self.seed, "num_replicas": self.num_replicas, "num_batches": self.num_batches(),
                "num_samples": len(self.dataset)}

    # --- sharding and resume ----------------------------------------------------------------
    def __len__(self) -> int:
        return -(-self.num_batches() // self.num_replicas)

    def epoch_keys(self) -> list:
        """This rank's batches of the current epoch, in order (the whole share)."""
        batches = list(self.epoch_batches())
        extra = len(self) * self.num_replicas - len(batches)
        if extra > 0 and batches:
            batches += self.padding(batches, extra)
        return [self.as_key(b) for b in batches[self.rank::self.num_replicas]]

    def resume_at(self, epoch: int, start: int) -> None:
        """Skip the first ``start`` batches of this rank's share, if the next iteration is ``epoch``."""
        self._resume = (int(epoch), int(start))

    def pending_start(self) -> int:
        return self._resume[1] if self._resume and self._resume[0] == self.epoch else 0

    def __iter__(self) -> Iterator[Any]:
        start, self._resume = self.pending_start(), None
        yield from self.epoch_keys()[start:]


class BatchListLoader(DataLoader):
    """A DataLoader over a :class:`BatchListSampler` (whole batches) that resumes mid-epoch.

    ``len`` is the full epoch. Iteration is lazy: the order is drawn at the first ``next()``,
    after Lightning has set the epoch.
    """

    def __init__(self, dataset: Dataset, sampler: BatchListSampler, **kwargs: Any) -> None:
        if not isinstance(sampler, BatchListSampler):
            raise TypeError(f"{type(self).__name__} needs a BatchListSampler")
        kwargs.pop("batch_size", None)
        super().__init__(dataset, sampler=sampler, batch_size=None, **kwargs)
        self.batches_seen = 0  # batches handed out in the current epoch
        self._refused: Optional[tuple[int, str]] = None

    def __iter__(self):
        sampler: BatchListSampler = self.sampler
        check_resume(self._refused, sampler.epoch)
        self._refused = None
        self.batches_seen = sampler.pending_start()
        for batch in super().__iter__():
            self.batches_seen += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batches_seen": self.batches_seen, **self.sampler.layout()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler: BatchListSampler = self.sampler
        self._refused = refused_resume(state, sampler.layout())
        seen = int(state.get("batches_seen", 0))
        if self._refused is None and 0 < seen < len(self):
            sampler.set_epoch(int(state["epoch"]))
            sampler.resume_at(int(state["epoch"]), seen)
            self.batches_seen = seen
