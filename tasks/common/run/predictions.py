"""What ``rescale predict`` writes, the same way for every task.

- Where: ``predictions.<split>.<ext>`` (:data:`PREDICTIONS_FILE`; the split is the one the data
  module's ``predict_dataloader`` reads: the test split of classification, video and translation)
  in :func:`~.outputs.results_folder`, where ``test`` writes too: ``--output_dir``, else
  ``results/<checkpoint name>/`` beside the run that wrote the checkpoint. Written whole or not at
  all (:mod:`..system.atomic`; a write that fails, on a full disk, is one line), once, on rank 0, and named in the command's closing line
  (:func:`write_result`, :func:`~.outputs.note_result_file`).
- Under DDP every rank predicts a shard: the rows, keyed by sample, are gathered onto rank 0
  (:func:`~..system.distributed.gather_by_key`), so a sample that ``DistributedSampler``'s padding hands to
  two ranks is written once, and in the split's order.
- Class predictions (classification, video; :func:`class_predictions_csv`): one CSV row per sample,
  ``index`` (in the split), ``path`` where the data has files, ``label`` (the true class), then
  ``top1``, ``top1_prob`` ... ``top5``, ``top5_prob``, the classes named as the checkpoint names them
  (:mod:`..data.labels`); ``pandas.read_csv`` or any spreadsheet reads it.
- Which samples a batch holds: Lightning tracks the indices the sampler drew for each predict batch
  (through DDP's ``DistributedSampler`` too) for prediction writers only; :class:`PredictedSamples`
  is one and hands them to the task module (:func:`kept_samples` leaves out the files a data module
  skipped as unreadable).
"""
from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from ..data import Labels
from ..errors import UserError
from ..system import write_atomically, write_failure
from .outputs import note_result_file, results_folder

__all__ = ["PREDICTIONS_FILE", "TOP_K", "PredictedSamples", "class_predictions_csv", "class_rows", "kept_samples",
           "output_names", "predict_dataset", "sample_path", "stage_dataset", "top_classes", "write_result"]

#: the file ``predict`` writes: the split it predicted, the format's extension
PREDICTIONS_FILE = "predictions.{split}.{ext}"
#: the classes a class prediction names per sample
TOP_K = 5


def write_result(trainer: L.Trainer, name: str, data: str | bytes, count: Optional[int], unit: str,
                 note: bool = True) -> str:
    """``data`` written whole as ``name`` (a subfolder in it made where missing) in the results folder
    (:func:`~.outputs.results_folder`) and, with ``note``, noted for the closing line (``count`` ``unit``:
    270 predictions); returns the path. Rank 0 calls it."""
    path = os.path.join(results_folder(trainer), name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomically(path, data)
    except OSError as err:  # a full disk or quota, a folder turned read-only: the target is as it was
        fix = write_failure(err, "--output_dir") or "give --output_dir a folder you can write"
        raise UserError(f"cannot write {path}: {err.strerror or err} ([Errno {err.errno}]); nothing of it was written "
                        f"(an earlier file there is as it was): {fix}") from None
    if note:
        note_result_file(trainer, path, count, unit)
    return path


def output_names(labels: Optional[Labels], count: int) -> list[str]:
    """The name of each of a network's ``count`` outputs: the labels it was trained on, else the
    output's index as text (a checkpoint and data that name none)."""
    if labels is not None and len(labels.names) == count:
        return list(labels.names)
    return [str(i) for i in range(count)]


def top_classes(probs: torch.Tensor, names: Sequence[str], k: int = TOP_K) -> list[list[tuple[str, float]]]:
    """For every row of ``probs`` ``[N, classes]``: its ``k`` most probable classes (all of them when
    there are fewer), most probable first, as ``(name, probability)``."""
    values, indices = probs.detach().float().cpu().topk(min(k, probs.shape[-1]), dim=-1)
    return [[(names[i], p) for i, p in zip(row, ps)] for row, ps in zip(indices.tolist(), values.tolist())]


def class_rows(probs: torch.Tensor, names: Sequence[str], indices: Sequence[int],
               labels: Optional[Sequence[int]] = None, dataset: Any = None,
               **columns: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """The rows of :func:`class_predictions_csv` for ``probs`` ``[N, classes]``, keyed by sample:
    ``indices`` the samples' indices in the split, ``labels`` their true classes (network outputs;
    None: the split has none), ``dataset`` where their files are (:func:`sample_path`), ``columns``
    more values per sample (``views=[...]``)."""
    rows = {}
    for j, (index, top) in enumerate(zip(indices, top_classes(probs, names))):
        rows[int(index)] = {"index": int(index), "path": sample_path(dataset, int(index)),
                            "label": None if labels is None else names[int(labels[j])],
                            **{name: values[j] for name, values in columns.items()}, "top": top}
    return rows


def class_predictions_csv(rows: Iterable[dict[str, Any]]) -> str:
    """The CSV text of class predictions, one row each: ``{"index": i, "path": ..., "label": ...,
    <other columns>..., "top": [(name, probability), ...]}`` (``path``, ``label`` and the other
    columns may be left out or None). Columns: ``index``, ``path`` and ``label`` where any row has
    one, the other columns in their order, then ``top1``, ``top1_prob`` ... for the longest ``top``."""
    rows = list(rows)
    columns = ["index"] + [c for c in ("path", "label") if any(r.get(c) is not None for r in rows)]
    for row in rows:
        columns += [c for c in row if c not in columns and c not in ("top", "path", "label")]
    k = max((len(r["top"]) for r in rows), default=0)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns + [name for i in range(1, k + 1) for name in (f"top{i}", f"top{i}_prob")])
    for row in rows:
        writer.writerow([("" if row.get(c) is None else row[c]) for c in columns]
                        + [value for name, p in row["top"] for value in (name, f"{p:.6f}")])
    return out.getvalue()


def stage_dataset(trainer: L.Trainer, stage: str) -> Any:
    """The data set the ``stage`` loader reads (``val``, ``test``, ``predict``: its first loader's),
    None where there is none."""
    loaders = getattr(trainer, f"{stage}_dataloaders", None)
    loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
    return getattr(loader, "dataset", None)


def predict_dataset(trainer: L.Trainer) -> Any:
    """The data set the predict loader reads (:func:`stage_dataset`)."""
    return stage_dataset(trainer, "predict")


def sample_path(dataset: Any, index: int) -> Optional[str]:
    """The file sample ``index`` of ``dataset`` was read from, for data sets listing theirs as
    ``samples`` of ``(path, label)`` (image and video folders); None for data held in memory."""
    samples = getattr(dataset, "samples", None)
    if samples is None:
        return None
    sample = samples[index]
    return os.path.abspath(str(sample[0])) if isinstance(sample, (tuple, list)) else None


def kept_samples(dataset: Any, indices: Sequence[int], count: int) -> list[int]:
    """The split indices of the ``count`` samples a predict batch holds, of the ``indices`` its sampler
    drew: a data set that drops unreadable files (``data.skip_corrupt``) flags them in its
    ``corrupt`` tensor, and they are left out."""
    kept = [int(i) for i in indices]
    corrupt = getattr(dataset, "corrupt", None)
    if len(kept) != count and corrupt is not None:
        kept = [i for i in kept if not bool(corrupt[i])]
    if len(kept) != count:
        raise RuntimeError(f"a predict batch holds {count} samples but its sampler drew {len(indices)} "
                           f"({len(kept)} readable): cannot tell which samples its predictions belong to")
    return kept


class PredictedSamples(BasePredictionWriter):
    """After every predict batch with predictions, ``pl_module.on_predicted(prediction, batch,
    indices)``: ``indices`` the split indices of the samples its sampler drew (Lightning tracks them
    only for prediction writers). A task module that names its predictions by sample returns one
    from ``configure_callbacks``."""

    def __init__(self) -> None:
        super().__init__(write_interval="batch")

    def write_on_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, prediction: Any,
                           batch_indices: Optional[Sequence[int]], batch: Any, batch_idx: int,
                           dataloader_idx: int = 0) -> None:
        if prediction is not None:  # None: a batch without samples (common.data.empty_batches)
            pl_module.on_predicted(prediction, batch, list(batch_indices or ()))
