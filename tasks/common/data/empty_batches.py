"""A batch left empty by bad files is no step and no score: one mechanism for every task, stage
and callback.

The data modules that can drop files (``data.skip_corrupt`` for images, ``data.skip_bad`` for
videos) hand the training step a batch without samples when every file of it was bad (a batch
of one truncated JPEG; a zero-byte mp4 and a text file renamed ``.avi`` in a batch of two).
Such a batch trains nothing, wherever it falls in the epoch and whatever the process count:

* One process: ``training_step`` returns None. Lightning runs no backward and the optimizer
  finds no gradient, so no parameter, momentum buffer or weight decay moves; with gradient
  accumulation the other batches of the window keep their gradients and the window still ends
  in its step. (Lightning's "`training_step` returned `None`" warning is silenced: skipping is
  documented behaviour here, not a mistake.)
* Several processes: Lightning refuses None (a rank leaving the step would leave the others
  waiting in the gradient all-reduce), so every rank votes
  (:func:`~..system.distributed.every_rank_has_samples`, host integers over gloo) and, when any rank's
  batch is empty, all of them return ``{"loss": zero_loss, "skipped": True}``: a zero gradient
  on every parameter (momentum and weight decay act as after any zero-gradient batch).
* Callbacks: ``on_train_batch_end`` receives ``{}`` (one process) or that dict (several);
  :func:`is_skipped` tells both from a trained batch, so a callback reading the loss or the
  batch (divergence monitor, run summary, analysis plots) passes over it instead of failing on
  a missing ``"loss"`` or probing a network with zero samples.

The task module base (:class:`~rescale_tasks.common.module.RescaleTaskModule`) calls
:func:`data_may_skip_files` in ``setup`` and, first thing in ``training_step``, ``if
must_skip(samples, may_skip): return skipped_step(self)``, for every task.

Evaluation (validate, test, predict) meets the same batches: a validation set with a run of
corrupt files, a batch of one bad video. First thing in the base's ``validation_step`` and
``test_step``, ``if nothing_to_evaluate(batch): return None``, and in its ``predict_step`` ``return
skipped_prediction()`` (which also silences Lightning's warning about a None prediction): the
batch adds nothing to the metrics (they cover the samples that were read, not a batch of zero
samples, which torchmetrics and the multi-view evaluation cannot take) and no prediction. No vote
is needed: under DDP evaluation steps exchange nothing between ranks, each rank passes over its own
empty batches. Under a strategy that shards the parameters (FSDP) every forward is a collective, so there
an unreadable item is replaced by a readable one marked as padding, run and never counted
(:class:`~.sampling.MarkedPadding`), and no batch is left empty; a task whose evaluation batches
are lists of keys (detection) runs its forward on a stand-in input counted nowhere instead (the
module's ``evaluate_nothing``, called by the base's steps for every empty evaluation batch, under
every strategy: a stand-in forward costs one small image, and a module run by torch's own FSDP
wrapping has no Lightning strategy to ask).
The skipped files are counted by the data module and reported by
:class:`~..run.data_report.SkippedDataReport` after every stage.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Optional

import torch

from ..system import every_rank_has_samples, world_size, zero_loss
from .throughput import batch_size

__all__ = ["SKIPPED", "data_may_skip_files", "is_skipped", "must_skip", "nothing_to_evaluate",
           "skipped_prediction", "skipped_step"]

#: the key marking a skipped batch in ``training_step``'s output under DDP
SKIPPED = "skipped"

def data_may_skip_files(datamodule: Any) -> bool:
    """Whether ``datamodule`` can hand out batches with fewer samples than asked for (it skips
    bad files); True without a data module (plain dataloaders: the empty-batch vote is kept).

    The same on every rank (one config), so either every rank votes at every step or none does.
    """
    if datamodule is None:
        return True
    return bool(getattr(datamodule, "skip_corrupt", False) or getattr(datamodule, "skip_bad", False))


def must_skip(samples: int, may_skip: bool = True) -> bool:
    """True when this step's batch must be skipped on every rank: it has no samples here or,
    under DDP, on another rank. A collective where the data may skip files (call it on every
    rank at every step); elsewhere only an empty batch (which such data never makes) skips."""
    if not may_skip and samples > 0:
        return False
    return not every_rank_has_samples(samples)


def skipped_step(module: torch.nn.Module) -> Optional[dict]:
    """What ``training_step`` returns for a skipped batch: None in one process, else a zero
    loss reaching every parameter, marked :data:`SKIPPED` for the callbacks."""
    if world_size() == 1:
        # Lightning warns about a None it cannot tell from a forgotten return; here it is the plan
        warnings.filterwarnings("ignore", message=r"`training_step` returned `None`")
        return None
    return {"loss": zero_loss(module), SKIPPED: True}


def is_skipped(outputs: Any) -> bool:
    """Whether ``on_train_batch_end``'s ``outputs`` belong to a skipped batch (``{}`` or None
    from one process, the :data:`SKIPPED` mark from several)."""
    if outputs is None:
        return True
    if isinstance(outputs, Mapping):
        return not outputs or outputs.get("loss") is None or bool(outputs.get(SKIPPED, False))
    return False


def nothing_to_evaluate(batch: Any) -> bool:
    """Whether a validation, test or predict ``batch`` holds no sample (every file of it was bad and
    skipped): its step then counts nothing and returns None (after the module's ``evaluate_nothing``,
    a stand-in forward for a task that needs one). This rank's batch only, never a collective."""
    return batch_size(batch) == 0


def skipped_prediction() -> None:
    """What ``predict_step`` returns for a batch without samples: no prediction (None)."""
    # Lightning warns about a None it cannot tell from a forgotten return; here it is the plan
    warnings.filterwarnings("ignore", message=r"predict returned None")
    return None
