"""Training data order that survives interruption and matches across process counts.

:class:`ResumableSampler` is a :class:`~torch.utils.data.DistributedSampler` (so Lightning never
replaces it under DDP) whose epoch permutation depends only on ``(seed, epoch)``; rank ``r`` of
``R`` takes positions ``r, r + R, ...``. One step of R processes with per-rank batch ``B`` therefore
sees exactly the samples of one step of a single process with batch ``R * B``.

:class:`ResumableDataLoader` counts the batches it has handed out this epoch and exposes them
through ``state_dict`` (Lightning stores the state of such loaders in every checkpoint and loads
it before creating the iterator on resume), so a run killed mid-epoch continues with the very
next batch of the same permutation instead of restarting the epoch.

Random augmentation is made independent of worker processes and iterator restarts by
:class:`PerSampleSeed`: the sampler hands out ``(index, seed)`` keys and every sample is
transformed under its own RNG seed derived from ``(seed, epoch, index)``.
"""
from __future__ import annotations

import atexit
import itertools
import multiprocessing
import random
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..errors import ConfigError
from ..system import ignore_in_worker

__all__ = ["ResumableSampler", "ResumableDataLoader", "UnrepeatedSampler", "PaddedEvalSampler", "MarkedPadding",
           "eval_sampler", "real_rows", "keep_real", "shards_parameters", "PerSampleSeed", "sample_seed",
           "worker_init", "sigterm_safe_worker_init", "ResumeMismatch", "refused_resume", "check_resume"]

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, epoch, index) over seeds


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one sample of one epoch (stable across processes and Python runs)."""
    value = (seed * _MIX + epoch * 1_000_003 + index) & 0xFFFFFFFFFFFFFFFF
    value ^= value >> 31
    value = (value * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return (value ^ (value >> 29)) & 0x7FFFFFFFFFFFFFFF


class ResumableSampler(DistributedSampler):
    """Seeded per-epoch permutation, sharded over ranks, able to start mid-epoch.

    Args:
        dataset: the (sized) data set.
        shuffle: permute each epoch (``False``: natural order).
        seed: permutation seed; the same on every rank.
        drop_last: drop the tail that does not divide evenly over the ranks.
        num_replicas, rank: defaults come from ``torch.distributed`` when initialised, else 1, 0.
        with_seeds: yield ``(index, per-sample seed)`` keys for :class:`PerSampleSeed`.
    """

    def __init__(self, dataset: Dataset, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 num_replicas: int | None = None, rank: int | None = None, with_seeds: bool = False) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.with_seeds = with_seeds
        self._resume: tuple[int, int] | None = None  # (epoch, samples of this rank's share done)

    def resume_at(self, epoch: int, start: int) -> None:
        """Skip the first ``start`` samples of this rank's share, if the next iteration is ``epoch``."""
        self._resume = (int(epoch), int(start))

    def pending_start(self) -> int:
        return self._resume[1] if self._resume and self._resume[0] == self.epoch else 0

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch, in order (the whole share)."""
        return list(super().__iter__())

    def __iter__(self) -> Iterator[Any]:
        start, self._resume = self.pending_start(), None
        for index in self.indices()[start:]:
            yield (index, sample_seed(self.seed, self.epoch, index)) if self.with_seeds else index


class UnrepeatedSampler(DistributedSampler):
    """Evaluation order sharded over ranks without repeating any item: rank ``r`` of ``R`` takes
    the ``r``-th of ``R`` contiguous, nearly equal chunks (sizes differ by one at most), in order.

    Lightning's default (a ``DistributedSampler``) pads the list to a multiple of ``R`` by repeating
    its first items; an evaluation that sums per-sample results (per-video view sums) would count
    those twice, and removing them needs every sample's result gathered by key. Without repeats the
    sums can simply be reduced. Contiguous chunks keep neighbouring items (a video's clips) in one
    process, where their decoder is reused. Fit only for evaluation (ranks may run one batch more
    than others; an evaluation step holds no collective) with at least ``R`` items (DDP syncs
    buffers at every rank's first forward).
    """

    def __init__(self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        n = len(dataset)
        if 0 < n < num_replicas:
            raise ConfigError(f"the evaluation set has {n} item(s) for {num_replicas} processes; evaluate with "
                              f"at most {n} (--trainer.devices) or on more data")
        self.start, self.stop = n * rank // num_replicas, n * (rank + 1) // num_replicas
        self.num_samples, self.total_size = self.stop - self.start, n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.num_samples


def shards_parameters(strategy: Any) -> bool:
    """Whether ``strategy``'s ranks hold shards of the parameters (FSDP, DeepSpeed, model parallel):
    each gathers them at every forward, a collective, so no rank may run a forward another does not
    (an :class:`UnrepeatedSampler`'s extra batch would leave the others waiting), and a rank's
    gradient norms are not the whole parameter's."""
    return isinstance(strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy))


class PaddedEvalSampler(DistributedSampler):
    """Evaluation order for strategies that shard the parameters: Lightning's ``DistributedSampler``
    (natural order, the split padded to a multiple of ``R`` with its first items, so every rank runs
    the same number of forwards: each one gathers the parameters), which knows its padding.

    On one rank the padding is the tail of its share, and a padded index is never also a real one
    of the same rank (rank ``r`` holds positions ``r, r + R, ...``; position ``p >= n`` repeats index
    ``(p - n) % n``, which is ``r - n`` modulo ``R``, not ``r``, unless ``n`` divides by ``R`` and
    nothing is padded). So the padded items of a rank are known by index alone: :meth:`padded`.
    """

    def __init__(self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)

    def padded(self) -> frozenset[int]:
        """The indices this rank is handed only to fill its share (repeats of other ranks' items)."""
        n = len(self.dataset)
        return frozenset((p - n) % n for p in range(self.rank, self.total_size, self.num_replicas) if p >= n)


class MarkedPadding(Dataset):
    """``dataset[index]`` with one more field, ``True`` where the item is real on this rank and
    ``False`` where a :class:`PaddedEvalSampler` repeats it as padding: collated, the batch ends
    with a boolean mask of its real rows (:func:`real_rows`); attributes are the wrapped data set's.

    An item the data set cannot read (``None``: a corrupt file it skips and counts) is replaced by
    the next readable item of the split, marked ``False``: run, never counted. A batch left empty
    would be skipped without a forward (:func:`~.empty_batches.nothing_to_evaluate`), and every
    forward is a collective under these strategies, so the other ranks would wait forever.
    """

    def __init__(self, dataset: Dataset, padded: frozenset[int]) -> None:
        self.dataset, self.padded = dataset, frozenset(padded)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        item, real = self.dataset[index], int(index) not in self.padded
        n = len(self.dataset)
        for step in range(1, n):
            if item is not None:
                break
            item, real = self.dataset[(int(index) + step) % n], False  # a stand-in: run, not counted
        if item is None:
            return None  # nothing of the split can be read
        return (*item, real)

    def __getattr__(self, name: str):
        # never a dunder: a wrapped ``__getitems__`` would be fetched in place of this one's items
        if name in ("dataset", "padded") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def eval_sampler(dataset: Dataset, strategy: Any) -> tuple[Dataset, DistributedSampler]:
    """``(data set, sampler)`` for evaluating ``dataset`` (validate, test, predict) under ``strategy``:
    the one place that chooses how an evaluation is sharded over processes.

    - Every item on one process (:class:`UnrepeatedSampler`), the data set as it is: sums and
      metrics reduce over ranks as they are.
    - Under a strategy that shards the parameters (:func:`shards_parameters`: FSDP, DeepSpeed, model
      parallel) every rank must run as many forwards as the others, so the split is padded
      (:class:`PaddedEvalSampler`) and each item carries whether it is real here
      (:class:`MarkedPadding`): a task's evaluation runs every forward and keeps only the rows
      :func:`real_rows` marks, so each item counts once, as in one process.

    A sampler that is a ``DistributedSampler`` is kept by Lightning as it is. Tasks that evaluate
    batch lists (:mod:`.batch_sampling`: detection, translation) pad by whole batches under every
    strategy, so every rank runs as many forwards, and count each item once by key (detection's
    COCO evaluation merges by image id) or mark the padding batches (translation's fillers); a
    detection batch whose every image was skipped as unreadable still runs a forward, on a stand-in
    image (``DetectionModule.evaluate_nothing``).
    """
    if not shards_parameters(strategy):
        return dataset, UnrepeatedSampler(dataset)
    sampler = PaddedEvalSampler(dataset)
    return MarkedPadding(dataset, sampler.padded()), sampler


def real_rows(batch: Sequence, fields: int) -> tuple[Sequence, Optional[torch.Tensor]]:
    """``(the batch's first fields, mask of its real rows or None)`` for an evaluation batch of
    ``fields`` fields: a batch from :class:`MarkedPadding` has one more, the mask (a 1-D boolean
    tensor: no task's field is one); other batches (no padding, or a batch every file of which was
    skipped) have none."""
    mask = batch[fields] if len(batch) == fields + 1 else None
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 1:
        return batch[:fields], mask
    return batch, None


def keep_real(real: Optional[torch.Tensor], *columns: "torch.Tensor | list") -> tuple:
    """The rows of each of ``columns`` (tensors or lists, one row per item) that ``real`` marks, all
    of them without a mask: a sharded strategy's padding is run, never counted (:func:`eval_sampler`)."""
    if real is None:
        return columns
    keep = real.tolist()
    return tuple(column[real.to(column.device)] if isinstance(column, torch.Tensor)
                 else list(itertools.compress(column, keep)) for column in columns)


class ResumeMismatch(ConfigError):
    """A training position saved mid-epoch under another data layout (batch size, processes, seed):
    continuing from the same batch index would skip some samples of the epoch and repeat others."""


# how to set each layout value of a training loader back to the checkpoint's
_LAYOUT_SETTINGS = {"batch_size": "--data.init_args.batch_size {}",
                    "num_replicas": "{} processes (--trainer.devices x --trainer.num_nodes)",
                    "seed": "--data.init_args.seed {}",
                    "max_tokens": "--data.init_args.max_tokens {}",
                    "num_batches": "the training data of the checkpoint's run ({} batches an epoch)",
                    "num_samples": "the training data of the checkpoint's run ({} samples)"}
#: layout values that checkpoints written before they were recorded lack: compared only when saved
_RECORDED_LATER = ("num_samples",)


def refused_resume(state: dict, layout: dict) -> Optional[tuple[int, str]]:
    """``(epoch, message)`` when a loader's saved ``state`` stopped inside an epoch whose batches
    mean other samples under this run's ``layout`` (None: the position can be continued, or there
    is none). The message is raised only if training does continue that epoch
    (:func:`check_resume`): from a checkpoint at an epoch's end the layout may change."""
    seen, epoch = int(state.get("batches_seen", 0)), int(state.get("epoch", 0))
    differ = [key for key, value in layout.items()
              if state.get(key) != value and (key in state or key not in _RECORDED_LATER)]
    if seen <= 0 or not differ:
        return None
    then = ", ".join(f"{key} {state.get(key, 'unrecorded')}" for key in differ)
    now = ", ".join(f"{key} {layout[key]}" for key in differ)
    settings = "; ".join(_LAYOUT_SETTINGS.get(key, key + " {}").format(state.get(key)) for key in differ
                         if state.get(key) is not None)
    return epoch, (f"cannot resume training in the middle of epoch {epoch}: the checkpoint stopped {seen} "
                   f"batches into it with {then}, this run has {now}, so the same position would be other samples "
                   f"(some skipped, some repeated). Resume with the checkpoint's settings ({settings or then}), or "
                   "from a checkpoint written at an epoch's end (epoch<NNN>.ckpt), after which they may change")


def check_resume(refused: Optional[tuple[int, str]], epoch: int) -> None:
    """Raise the :func:`refused_resume` message when training continues the refused ``epoch``."""
    if refused is not None and refused[0] == epoch:
        raise ResumeMismatch(refused[1])


class ResumableDataLoader(DataLoader):
    """A DataLoader over a :class:`ResumableSampler` that can resume mid-epoch.

    ``state_dict`` records the epoch and the number of batches handed out in it; after
    ``load_state_dict`` the iteration of that same epoch starts right after them, while any other
    epoch (the saved one had ended, e.g. at ``limit_train_batches``) starts from its top.
    ``len`` stays the full epoch, as Lightning's progress tracking expects. Iteration is lazy:
    workers start, and the permutation is drawn, at the first ``next()``, i.e. after Lightning
    has set the sampler's epoch (it creates the iterator before doing so). Continuing an epoch
    saved with another batch size, process count, seed or data set size (another data root, other
    files) is refused (:class:`ResumeMismatch`).
    """

    def __init__(self, dataset: Dataset, sampler: ResumableSampler, **kwargs: Any) -> None:
        if not isinstance(sampler, ResumableSampler):
            raise TypeError("ResumableDataLoader needs a ResumableSampler")
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.batches_seen = 0  # batches handed out in the current epoch
        self._refused: Optional[tuple[int, str]] = None

    def layout(self) -> dict[str, int]:
        """What must match for a saved position to mean the same samples."""
        sampler: ResumableSampler = self.sampler
        return {"seed": sampler.seed, "num_replicas": sampler.num_replicas, "batch_size": self.batch_size,
                "num_samples": len(sampler.dataset)}

    def __iter__(self):
        sampler: ResumableSampler = self.sampler
        check_resume(self._refused, sampler.epoch)
        self._refused = None
        self.batches_seen = sampler.pending_start() // self.batch_size
        for batch in super().__iter__():
            self.batches_seen += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        sampler: ResumableSampler = self.sampler
        return {"epoch": sampler.epoch, "batches_seen": self.batches_seen, **self.layout()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler: ResumableSampler = self.sampler
        self._refused = refused_resume(state, self.layout())  # positions only map onto the same layout
        seen = int(state.get("batches_seen", 0))
        if self._refused is None and 0 < seen < len(self):
            sampler.set_epoch(int(state["epoch"]))
            sampler.resume_at(int(state["epoch"]), seen * self.batch_size)
            self.batches_seen = seen


class PerSampleSeed(Dataset):
    """Applies ``dataset[index]`` under a seed of its own, for keys ``(index, seed)``.

    The RNG state of the calling process (main or worker) is saved and restored around each
    batch the loader fetches (each sample seeded on its own inside it), so the training loop's
    own random stream (dropout, mixup) is never disturbed and a sample's augmentation does not
    depend on which worker loads it or when. Only the CPU
    generator is seeded (augmentation runs on the CPU): ``torch.manual_seed`` would also reseed
    every CUDA generator, which is not restored, so with ``num_workers=0`` on a GPU dropout and
    mixup would draw the same device numbers at every step.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence) -> list:
        """The samples of a batch of keys (the DataLoader's fetcher calls this for a whole batch):
        the caller's random state saved once and restored once around the batch, each sample drawn
        under its own seed; the same samples as one ``dataset[key]`` after another (saving
        NumPy's state alone took 0.1 ms, more than loading a digit)."""
        if not any(isinstance(key, tuple) for key in keys):
            return [self.dataset[key] for key in keys]
        torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
        try:
            return [self._seeded(*key) if isinstance(key, tuple) else self.dataset[key] for key in keys]
        finally:
            torch.set_rng_state(torch_state)
            random.setstate(py_state)
            np.random.set_state(np_state)

    def _seeded(self, index, seed: int):
        torch.default_generator.manual_seed(seed)  # the CPU stream only, never the CUDA ones
        random.seed(seed)
        np.random.seed(seed % (2**32))
        return self.dataset[index]

    def __getattr__(self, name: str):
        # attribute access (e.g. ``skipped`` counters) goes to the wrapped data set
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def worker_init(worker_id: int) -> None:
    """DataLoader workers leave SIGTERM, SIGINT and the other stop signals to the main process
    (:mod:`..system.stop_signals`).

    A cluster's preemption signal reaches every process of the job, and a terminal's Ctrl-C or
    hang-up every process of its group; a worker dying of it would crash the run ("DataLoader
    worker ... killed by signal", or exited after its ``KeyboardInterrupt``) before the main
    process finishes its step and writes ``last.ckpt``. The main process stops its workers itself when it exits (and
    workers exit when it dies). Also seeds the worker as Lightning's ``seed_everything(workers=True)``
    would (augmentation itself is seeded per sample by :class:`PerSampleSeed`).
    """
    ignore_in_worker()
    from lightning.fabric.utilities.seed import pl_worker_init_function

    pl_worker_init_function(worker_id)


def sigterm_safe_worker_init():
    """:func:`worker_init`, after making sure the main process can still end its workers: at
    exit, multiprocessing terminates daemonic children with SIGTERM (ignored now) and waits for
    them; an exit hook registered after it (so run before it) kills them instead."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_kill_daemonic_children)
        _exit_hook_registered = True
    return worker_init


_exit_hook_registered = False


def _kill_daemonic_children() -> None:
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
